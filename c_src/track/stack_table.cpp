#include "stack_table.h"

#include <bit>

#include "os_mem.h"

namespace mi::track {

namespace {
// Four independent lanes (multiply, add, rotate) so the CPU overlaps the
// multiplications: a stack of 16-32 frames hashes in a few ns instead of a
// serial multiply chain. Lanes are mixed at the end; the rotation keeps the
// order of frames within a lane significant.
uint64_t hash_frames(const uintptr_t* frames, unsigned n) {
  constexpr uint64_t k[4] = {0x9E3779B97F4A7C15ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull,
                             0xD6E8FEB86659FD93ull};
  uint64_t lane[4] = {n, n ^ k[0], n ^ k[1], n ^ k[2]};
  unsigned i = 0;
  for (; i + 4 <= n; i += 4)
    for (unsigned j = 0; j < 4; ++j) lane[j] = std::rotl(lane[j] + frames[i + j] * k[j], 29);
  for (unsigned j = 0; i < n; ++i, ++j) lane[j] = std::rotl(lane[j] + frames[i] * k[j], 29);
  uint64_t h = lane[0] ^ std::rotl(lane[1], 16) ^ std::rotl(lane[2], 32) ^ std::rotl(lane[3], 48);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

bool StackTable::init(size_t capacity, unsigned depth) {
  size_t cap = kWindow;
  while (cap < capacity) cap <<= 1;
  const size_t header_bytes = cap * sizeof(Header);
  const size_t frame_bytes = cap * depth * sizeof(uintptr_t);
  void* mem = os_map(header_bytes + frame_bytes);
  if (mem == nullptr) return false;
  headers_ = static_cast<Header*>(mem);
  frames_ = reinterpret_cast<uintptr_t*>(static_cast<char*>(mem) + header_bytes);
  mask_ = cap - 1;
  depth_ = depth;
  bytes_ = header_bytes + frame_bytes;
  return true;
}

void StackTable::destroy() {
  os_unmap(headers_, bytes_);
  headers_ = nullptr;
  frames_ = nullptr;
  bytes_ = 0;
}

bool StackTable::equal(size_t slot, uint64_t hash, const uintptr_t* frames, unsigned n) const {
  const Header& h = headers_[slot];
  if (h.hash != hash || h.depth != n) return false;
  const uintptr_t* f = frames_ + slot * depth_;
  for (unsigned i = 0; i < n; ++i)
    if (f[i] != frames[i]) return false;
  return true;
}

uint32_t StackTable::intern(const uintptr_t* frames, unsigned n) {
  if (n == 0) return 0;
  if (n > depth_) n = depth_;
  const uint64_t hash = hash_frames(frames, n);
  const size_t start = static_cast<size_t>(hash * 0x9E3779B97F4A7C15ull >> 17) & mask_;
  for (size_t i = 0; i < kWindow; ++i) {
    const size_t slot = (start + i) & mask_;
    Header& h = headers_[slot];
    uint32_t st = h.state.load(std::memory_order_acquire);
    if (st == kEmpty) {
      if (h.state.compare_exchange_strong(st, kWriting, std::memory_order_acquire,
                                          std::memory_order_acquire)) {
        h.hash = hash;
        h.depth = n;
        uintptr_t* f = frames_ + slot * depth_;
        for (unsigned j = 0; j < n; ++j) f[j] = frames[j];
        h.state.store(kReady, std::memory_order_release);
        count_.fetch_add(1, std::memory_order_relaxed);
        return static_cast<uint32_t>(slot + 1);
      }
      // Lost the race: st now holds the winner's state; examine it below.
    }
    for (int spin = 0; st == kWriting && spin < 256; ++spin) {
      cpu_relax();
      st = h.state.load(std::memory_order_acquire);
    }
    if (st == kReady && equal(slot, hash, frames, n)) return static_cast<uint32_t>(slot + 1);
  }
  dropped_.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

unsigned StackTable::get(uint32_t id, uint64_t* out, unsigned max) const {
  if (id == 0 || id > mask_ + 1) return 0;
  const size_t slot = id - 1;
  const Header& h = headers_[slot];
  if (h.state.load(std::memory_order_acquire) != kReady) return 0;
  const unsigned n = h.depth;
  const uintptr_t* f = frames_ + slot * depth_;
  for (unsigned i = 0; i < n && i < max; ++i) out[i] = f[i];
  return n;
}

}  // namespace mi::track
