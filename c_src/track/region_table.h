// The region table: the live memory mappings made through the mmap family
// (mmap, mmap64, munmap, mremap), one entry per recorded region, with the
// frames of the call that mapped it. Kept apart from the live table: a few
// hundred regions live at once and a few calls a second is normal (ERTS
// maps carriers in 1-8 MiB steps), so a dense array under a spinlock is
// plenty, and the malloc path never touches it.
//
// Exact arithmetic. Regions are half-open byte ranges [start, end) that
// never overlap. unmap() cuts a range out of every region it overlaps: a
// region wholly inside is removed, one cut at its head or tail shrinks, one
// cut in its middle splits in two. add() first cuts its range out (a
// MAP_FIXED mapping replaces whatever was there). Ranges are whatever the
// caller passes; the hooks round lengths up to pages, as the kernel does.
//
// Frames are stored inline (kRegionFrames at most), not as stack-table ids:
// a region lives as long as its mapping, often the node's lifetime, and an
// id would have to be kept alive through every stack sweep; a few hundred
// regions of 64 frames cost less than teaching the sweep a second table.
//
// Concurrency: every method is thread-safe. Writers and readers take one
// spinlock, held only while the array is edited or copied, never across a
// call out (no system call, no allocation, no unwinding under it), so a
// hook never waits for anything but another thread's table edit (a few us
// at most for a full table). A blocking mutex would not do: a hook runs
// with whatever locks its caller holds, and a spinlock has no waiter
// queue to corrupt. The lock word lives in a MADV_WIPEONFORK page when
// the kernel has it: a child forked while another thread held it starts
// unlocked (the entry being edited may then be off by that one edit).
//
// Never allocates through malloc: memory from os_map, at init.
#ifndef MALLOCINFO_TRACK_REGION_TABLE_H
#define MALLOCINFO_TRACK_REGION_TABLE_H

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "../common/mi_abi.h"

namespace mi::track {

constexpr unsigned kRegionFrames = MI_REGION_FRAMES;

// One recorded region: the ABI's own record (mi_abi.h), so a reader's
// copy is one memcpy. [start, start + length); `flags` are MI_REGION_*.
using Region = mi_abi_region;

inline uint64_t region_end(const Region& r) {
  return r.start + r.length;
}

class RegionTable {
 public:
  // Reserves room for `capacity` regions. False when memory cannot be
  // mapped. Not thread-safe; call once.
  bool init(size_t capacity);
  // Unmaps. Tests only; no thread may use the table after.
  void destroy();

  // Records [r.start, region_end(r)) after cutting that range out of
  // every recorded region. False (and counted in dropped()) when the table
  // is full. Precondition: r.length > 0.
  bool add(const Region& r);
  // Cuts [start, end) out of every recorded region. A split that needs a
  // slot when the table is full loses the upper piece (counted in
  // dropped()). Returns the bytes cut.
  uint64_t unmap(uint64_t start, uint64_t end);
  // Copies the region containing `address` into *out (frames, flags,
  // timestamp; start/length are the whole region's). False when none does.
  bool find(uint64_t address, Region* out) const;
  // Copies up to `max` regions, in no particular order, into out; returns
  // how many regions are live (which may exceed max). One consistent view.
  size_t copy(Region* out, size_t max) const;
  // Forgets every region.
  void clear();

  size_t capacity() const { return capacity_; }
  size_t bytes_reserved() const { return bytes_; }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  // Live regions and their bytes right now.
  void totals(uint64_t* regions, uint64_t* bytes) const;

 private:
  struct Control {
    std::atomic<uint32_t> lock;
  };
  void lock() const;
  void unlock() const;
  // Both under the lock.
  void cut(uint64_t start, uint64_t end, uint64_t* bytes);
  bool push(const Region& r);

  Control* control_ = nullptr;  // its own page (MADV_WIPEONFORK)
  bool control_wipes_ = false;
  Region* regions_ = nullptr;
  size_t capacity_ = 0;
  size_t bytes_ = 0;
  size_t used_ = 0;  // regions_[0, used_) are live; guarded by the lock
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace mi::track

#endif
