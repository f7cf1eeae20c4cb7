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
// mremap moves a range in two steps around the real call: begin_move()
// marks the pieces of the old range as moving (split at its ends), then
// finish_move() relocates every marked piece, each keeping its own frames
// and timestamp, or cancel_move() unmarks them when the call failed, so a
// failed mremap over several recorded regions leaves each as it was. A
// moving piece is hidden from find(), copy() and totals(), as if cut, and
// other calls' cuts leave it alone: once the kernel has moved the range,
// another thread may map at the old addresses before finish_move() runs,
// and its region must neither cut the moving pieces nor be moved with
// them.
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
  // Marks the pieces recorded in [start, end) as moving, splitting the
  // regions that cross start or end (a split that needs a slot when the
  // table is full loses the upper piece, counted in dropped()). Returns the
  // move's ticket (never 0) for finish_move() or cancel_move(); exactly one
  // of them must follow.
  uint32_t begin_move(uint64_t start, uint64_t end);
  // The range [start, start + old_length) marked by `ticket` now lives at
  // [to, to + new_length): whatever was recorded there is cut out, then
  // every moving piece moves by to - start, keeps what falls inside the
  // new range (the piece that reached the old end grows to the new end
  // when the range grew), is flagged MI_REGION_REMAPPED and stops moving.
  void finish_move(uint32_t ticket, uint64_t start, uint64_t old_length, uint64_t to,
                   uint64_t new_length);
  // The move did not happen: the pieces of `ticket` are live again, as they
  // were.
  void cancel_move(uint32_t ticket);
  // A copy of what is recorded in [start, end) now also lives at [to, to +
  // length) (mremap that keeps the old range: MREMAP_DONTUNMAP, or an
  // old_length of 0): whatever was recorded there is cut out, then each
  // piece is added there too, shifted by to - start, cut to the new range
  // and flagged MI_REGION_REMAPPED. A piece that finds the table full is
  // counted in dropped().
  void copy_range(uint64_t start, uint64_t end, uint64_t to, uint64_t length);
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
  // All under the lock.
  void cut(uint64_t start, uint64_t end, uint64_t* bytes);
  bool push(const Region& r, uint32_t moving = 0);
  void remove(size_t i);
  void split_at(uint64_t address);
  bool live(size_t i) const { return moving_[i] == 0; }

  Control* control_ = nullptr;  // its own page (MADV_WIPEONFORK)
  bool control_wipes_ = false;
  Region* regions_ = nullptr;
  // Per slot: the ticket of the move it is part of, 0 when it is not
  // moving. Beside the regions (not in them) so a copy with nothing moving
  // stays one memcpy.
  uint32_t* moving_ = nullptr;
  size_t capacity_ = 0;
  size_t bytes_ = 0;
  size_t used_ = 0;           // regions_[0, used_) are in use; guarded by the lock
  size_t moving_count_ = 0;   // slots with a ticket; guarded by the lock
  uint32_t next_ticket_ = 0;  // guarded by the lock
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace mi::track

#endif
