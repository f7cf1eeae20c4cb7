// The dump file's output buffer for the heap walker's child: records
// (dump_format.h) are appended to a 1 MiB mmapped buffer and written out
// when it fills. Never calls malloc (the child may not); the first write
// error sticks and later calls do nothing. fd -1: counts, writes nothing.
// Not thread-safe.
#ifndef MALLOCINFO_HEAPWALK_RECORD_WRITER_H
#define MALLOCINFO_HEAPWALK_RECORD_WRITER_H

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "reply.h"

namespace mi::heapwalk::detail {

class Writer {
 public:
  explicit Writer(int fd) : fd_(fd) {
    void* p = ::mmap(nullptr, kBuf, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      err_ = errno;
    } else {
      buf_ = static_cast<char*>(p);
    }
  }
  ~Writer() {
    if (buf_ != nullptr) ::munmap(buf_, kBuf);
  }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  void bytes(const void* p, size_t n) {
    if (fd_ < 0 || err_ != 0) return;
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      if (len_ == kBuf) flush();
      if (err_ != 0) return;
      const size_t k = std::min(n, kBuf - len_);
      std::memcpy(buf_ + len_, c, k);
      len_ += k;
      c += k;
      n -= k;
    }
  }
  void u32(uint32_t v) { bytes(&v, 4); }
  void u64(uint64_t v) { bytes(&v, 8); }
  void record(uint32_t tag, uint32_t len) {
    u32(tag);
    u32(len);
  }
  void flush() {
    if (fd_ < 0 || err_ != 0 || len_ == 0) return;
    if (!write_all(fd_, buf_, len_)) err_ = errno;
    total_ += len_;
    len_ = 0;
  }
  int error() const { return err_; }
  uint64_t total() const { return total_ + len_; }

 private:
  static constexpr size_t kBuf = 1 << 20;
  int fd_;
  char* buf_ = nullptr;
  size_t len_ = 0;
  uint64_t total_ = 0;
  int err_ = 0;
};

}  // namespace mi::heapwalk::detail

#endif
