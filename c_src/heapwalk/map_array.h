// Growable arrays for the heap walker's child, in memory from mmap.
// The child runs in a fork of a multi-threaded process, where malloc's
// locks may be held by threads that no longer exist: it must never call
// malloc, so its containers map their own pages. Not thread-safe; failure
// to grow is returned (false), never thrown.
#ifndef MALLOCINFO_HEAPWALK_MAP_ARRAY_H
#define MALLOCINFO_HEAPWALK_MAP_ARRAY_H

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <type_traits>

namespace mi::heapwalk::detail {

// Child-side memory: mmapped, growable, for trivially copyable T. Never
// touches malloc. Allocation failure is reported, not thrown.

template <class T>
class MapArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  MapArray() = default;
  MapArray(const MapArray&) = delete;
  MapArray& operator=(const MapArray&) = delete;
  ~MapArray() {
    if (data_ != nullptr) ::munmap(data_, cap_ * sizeof(T));
  }
  bool reserve(size_t n) {
    if (n <= cap_) return true;
    size_t cap = cap_ == 0 ? 4096 : cap_;
    while (cap < n) cap *= 2;
    void* p = data_ == nullptr ? ::mmap(nullptr, cap * sizeof(T), PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                               : ::mremap(data_, cap_ * sizeof(T), cap * sizeof(T), MREMAP_MAYMOVE);
    if (p == MAP_FAILED) return false;
    data_ = static_cast<T*>(p);
    cap_ = cap;
    return true;
  }
  bool push(const T& v) {
    if (size_ == cap_ && !reserve(size_ + 1)) return false;
    data_[size_++] = v;
    return true;
  }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  T& operator[](size_t i) { return data_[i]; }
  size_t size() const { return size_; }
  void clear() { size_ = 0; }
  void truncate(size_t n) { size_ = std::min(size_, n); }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t cap_ = 0;
};

}  // namespace mi::heapwalk::detail

#endif
