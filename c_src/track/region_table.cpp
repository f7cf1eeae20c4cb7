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
  bytes_ = capacity * (sizeof(Region) + sizeof(uint32_t));
  void* mem = os_map(bytes_);
  if (mem == nullptr) {
    os_unmap(control, kControlBytes);
    bytes_ = 0;
    return false;
  }
  control_ = static_cast<Control*>(control);
  regions_ = static_cast<Region*>(mem);
  moving_ = reinterpret_cast<uint32_t*>(regions_ + capacity);
  capacity_ = capacity;
  used_ = moving_count_ = 0;
  return true;
}

void RegionTable::destroy() {
  os_unmap(regions_, bytes_);
  os_unmap(control_, kControlBytes);
  regions_ = nullptr;
  moving_ = nullptr;
  control_ = nullptr;
  capacity_ = bytes_ = used_ = moving_count_ = 0;
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

bool RegionTable::push(const Region& r, uint32_t moving) {
  if (used_ == capacity_) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  moving_[used_] = moving;
  if (moving != 0) ++moving_count_;
  regions_[used_++] = r;
  return true;
}

// Slot i's region is gone: the last slot takes its place.
void RegionTable::remove(size_t i) {
  if (moving_[i] != 0) --moving_count_;
  --used_;
  regions_[i] = regions_[used_];
  moving_[i] = moving_[used_];
}

void RegionTable::cut(uint64_t start, uint64_t end, uint64_t* bytes) {
  // Walks backwards: removing slot i moves the last slot (already visited,
  // or i itself) into i, and a split appends its upper piece past the
  // walk, where it cannot overlap [start, end) again. Moving pieces are
  // not touched (see the header).
  for (size_t i = used_; i-- > 0;) {
    Region& r = regions_[i];
    const uint64_t r_end = region_end(r);
    if (r_end <= start || r.start >= end || !live(i)) continue;
    const uint64_t lo = r.start > start ? r.start : start;
    const uint64_t hi = r_end < end ? r_end : end;
    *bytes += hi - lo;
    if (start <= r.start && end >= r_end) {
      remove(i);
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

// Splits the live region strictly containing `address` (if any) in two at
// `address`.
void RegionTable::split_at(uint64_t address) {
  for (size_t i = 0; i < used_; ++i) {
    Region& r = regions_[i];
    const uint64_t r_end = region_end(r);
    if (!live(i) || address <= r.start || address >= r_end) continue;
    Region upper = r;
    upper.start = address;
    upper.length = r_end - address;
    r.length = address - r.start;
    push(upper);
    return;  // live regions do not overlap: at most one contains it
  }
}

uint32_t RegionTable::begin_move(uint64_t start, uint64_t end) {
  lock();
  if (++next_ticket_ == 0) ++next_ticket_;
  const uint32_t ticket = next_ticket_;
  if (start < end) {
    split_at(start);
    split_at(end);
    for (size_t i = 0; i < used_; ++i) {
      const Region& r = regions_[i];
      if (live(i) && r.start >= start && region_end(r) <= end) {
        moving_[i] = ticket;
        ++moving_count_;
      }
    }
  }
  unlock();
  return ticket;
}

void RegionTable::finish_move(uint32_t ticket, uint64_t start, uint64_t old_length, uint64_t to,
                              uint64_t new_length) {
  const uint64_t new_end = to + new_length;
  uint64_t bytes = 0;
  lock();
  cut(to, new_end, &bytes);
  // Backwards, as cut(): a removal moves an already visited slot into i.
  for (size_t i = used_; i-- > 0;) {
    if (moving_[i] != ticket) continue;
    Region& r = regions_[i];
    const bool reached_end = region_end(r) == start + old_length;
    const uint64_t moved = r.start - start + to;
    if (moved >= new_end) {
      remove(i);
      continue;
    }
    uint64_t moved_end = moved + r.length;
    if (moved_end > new_end || (reached_end && new_length > old_length)) moved_end = new_end;
    r.start = moved;
    r.length = moved_end - moved;
    r.flags |= MI_REGION_REMAPPED;
    moving_[i] = 0;
    --moving_count_;
  }
  unlock();
}

void RegionTable::cancel_move(uint32_t ticket) {
  lock();
  for (size_t i = 0; i < used_; ++i) {
    if (moving_[i] != ticket) continue;
    moving_[i] = 0;
    --moving_count_;
  }
  unlock();
}

void RegionTable::copy_range(uint64_t start, uint64_t end, uint64_t to, uint64_t length) {
  const uint64_t new_end = to + length;
  uint64_t bytes = 0;
  lock();
  cut(to, new_end, &bytes);
  // Only the slots there before: the copies are appended past them.
  const size_t n = used_;
  for (size_t i = 0; i < n; ++i) {
    const Region& r = regions_[i];
    const uint64_t r_end = region_end(r);
    if (!live(i) || r_end <= start || r.start >= end) continue;
    const uint64_t lo = r.start > start ? r.start : start;
    const uint64_t hi = r_end < end ? r_end : end;
    const uint64_t moved = lo - start + to;
    if (moved >= new_end) continue;
    const uint64_t moved_end = hi - start + to < new_end ? hi - start + to : new_end;
    Region copy = r;
    copy.start = moved;
    copy.length = moved_end - moved;
    copy.flags |= MI_REGION_REMAPPED;
    push(copy);
  }
  unlock();
}

bool RegionTable::find(uint64_t address, Region* out) const {
  bool found = false;
  lock();
  for (size_t i = 0; i < used_; ++i) {
    if (!live(i)) continue;
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
  size_t n = used_;
  if (moving_count_ == 0) {
    std::memcpy(out, regions_, (n < max ? n : max) * sizeof(Region));
  } else {
    n = 0;
    for (size_t i = 0; i < used_; ++i) {
      if (!live(i)) continue;
      if (n < max) out[n] = regions_[i];
      ++n;
    }
  }
  unlock();
  return n;
}

void RegionTable::clear() {
  lock();
  used_ = moving_count_ = 0;
  unlock();
}

void RegionTable::totals(uint64_t* regions, uint64_t* bytes) const {
  uint64_t b = 0, n = 0;
  lock();
  for (size_t i = 0; i < used_; ++i) {
    if (!live(i)) continue;
    b += regions_[i].length;
    ++n;
  }
  unlock();
  *regions = n;
  *bytes = b;
}

}  // namespace mi::track
