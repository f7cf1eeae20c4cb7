#include "region_table.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "os_mem.h"

namespace mi::track {

namespace {
constexpr size_t kControlBytes = 4096;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

bool RegionTable::init(size_t capacity) {
  if (capacity == 0) capacity = 1;
  void* control = os_map(kControlBytes);
  if (control == nullptr) return false;
  control_wipes_ = ::madvise(control, kControlBytes, MADV_WIPEONFORK) == 0;
  bytes_ = capacity * sizeof(Region);
  void* mem = os_map(bytes_);
  if (mem == nullptr) {
    os_unmap(control, kControlBytes);
    bytes_ = 0;
    return false;
  }
  control_ = static_cast<Control*>(control);
  regions_ = static_cast<Region*>(mem);
  capacity_ = capacity;
  used_ = 0;
  return true;
}

void RegionTable::destroy() {
  os_unmap(regions_, bytes_);
  os_unmap(control_, kControlBytes);
  regions_ = nullptr;
  control_ = nullptr;
  capacity_ = bytes_ = used_ = 0;
}

void RegionTable::lock() const {
  std::atomic<uint32_t>& l = control_->lock;
  for (;;) {
    uint32_t expected = 0;
    if (l.compare_exchange_weak(expected, 1, std::memory_order_acquire)) return;
    while (l.load(std::memory_order_relaxed) != 0) cpu_relax();
  }
}

void RegionTable::unlock() const {
  control_->lock.store(0, std::memory_order_release);
}

bool RegionTable::push(const Region& r) {
  if (used_ == capacity_) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  regions_[used_++] = r;
  return true;
}

void RegionTable::cut(uint64_t start, uint64_t end, uint64_t* bytes) {
  // Walks backwards: removing slot i moves the last slot (already visited,
  // or i itself) into i, and a split appends its upper piece past the
  // walk, where it cannot overlap [start, end) again.
  for (size_t i = used_; i-- > 0;) {
    Region& r = regions_[i];
    const uint64_t r_end = region_end(r);
    if (r_end <= start || r.start >= end) continue;
    const uint64_t lo = r.start > start ? r.start : start;
    const uint64_t hi = r_end < end ? r_end : end;
    *bytes += hi - lo;
    if (start <= r.start && end >= r_end) {
      regions_[i] = regions_[--used_];
    } else if (start <= r.start) {  // head cut
      r.length = r_end - end;
      r.start = end;
    } else if (end >= r_end) {  // tail cut
      r.length = start - r.start;
    } else {  // middle: split in two
      Region upper = r;
      upper.start = end;
      upper.length = r_end - end;
      r.length = start - r.start;
      push(upper);
    }
  }
}

bool RegionTable::add(const Region& r) {
  uint64_t bytes = 0;
  lock();
  cut(r.start, region_end(r), &bytes);
  const bool ok = push(r);
  unlock();
  return ok;
}

uint64_t RegionTable::unmap(uint64_t start, uint64_t end) {
  uint64_t bytes = 0;
  if (start >= end) return 0;
  lock();
  cut(start, end, &bytes);
  unlock();
  return bytes;
}

bool RegionTable::find(uint64_t address, Region* out) const {
  bool found = false;
  lock();
  for (size_t i = 0; i < used_; ++i) {
    if (address >= regions_[i].start && address < region_end(regions_[i])) {
      *out = regions_[i];
      found = true;
      break;
    }
  }
  unlock();
  return found;
}

size_t RegionTable::copy(Region* out, size_t max) const {
  lock();
  const size_t n = used_;
  std::memcpy(out, regions_, (n < max ? n : max) * sizeof(Region));
  unlock();
  return n;
}

void RegionTable::clear() {
  lock();
  used_ = 0;
  unlock();
}

void RegionTable::totals(uint64_t* regions, uint64_t* bytes) const {
  uint64_t b = 0;
  lock();
  const size_t n = used_;
  for (size_t i = 0; i < n; ++i) b += regions_[i].length;
  unlock();
  *regions = n;
  *bytes = b;
}

}  // namespace mi::track
