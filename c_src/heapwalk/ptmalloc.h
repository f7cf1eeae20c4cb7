// glibc ptmalloc's private structure layout, as the heap walker reads it.
//
// None of this is public glibc API: offsets come from malloc/malloc.c and
// malloc/arena.c of the releases layout_for() knows, 64-bit only.
// The walker never trusts them blindly: it checks the version first, then
// validates what it reads (main_arena's self-referencing empty bins, each
// heap_info's ar_ptr, a chunk walk that must land exactly on top) and
// refuses the dump on any mismatch. Constants and two pure functions
// (arena_probe.cpp); no state.
#ifndef MALLOCINFO_HEAPWALK_PTMALLOC_H
#define MALLOCINFO_HEAPWALK_PTMALLOC_H

#include <cstddef>
#include <cstdint>

namespace mi::heapwalk::pt {

// Chunk header: prev_size, size|flags; user memory starts 16 bytes in.
inline constexpr uint64_t kPrevInuse = 0x1;
inline constexpr uint64_t kIsMmapped = 0x2;
inline constexpr uint64_t kNonMainArena = 0x4;
inline constexpr uint64_t kFlagBits = 0x7;
inline constexpr uint64_t kChunkHeader = 16;  // CHUNK_HDR_SZ
inline constexpr uint64_t kMinSize = 32;      // MINSIZE
inline constexpr uint64_t kAlign = 16;        // MALLOC_ALIGNMENT
// sizeof(struct malloc_chunk): what mtrim (malloc_trim) keeps at the start
// of a free chunk before the first page it may release.
inline constexpr uint64_t kMallocChunkStruct = 48;

// struct malloc_state, common to every supported release: int mutex, int
// flags at 4; then (up to 2.42) int have_fastchunks and the fastbins;
// top, last_remainder, the bins, binmap, next, next_free,
// attached_threads, system_mem, max_system_mem. Offsets that move are in
// Layout below.
inline constexpr size_t kArenaFlags = 4;
inline constexpr size_t kNBinPairs = 127;  // (NBINS * 2 - 2) / 2
inline constexpr size_t kMaxArenaSize = 2200;
inline constexpr uint32_t kNonContiguousBit = 0x2;  // av->flags

// struct _heap_info (glibc >= 2.35 has the pagesize field: 48 bytes).
inline constexpr size_t kHeapInfoArPtr = 0;
inline constexpr size_t kHeapInfoPrev = 8;
inline constexpr size_t kHeapInfoSize = 16;
inline constexpr size_t kHeapInfoBytes = 48;
// HEAP_MAX_SIZE = 2 * DEFAULT_MMAP_THRESHOLD_MAX on 64-bit (without the
// hugetlb tunable, which the walker detects through the ar_ptr check).
inline constexpr uint64_t kHeapMax = 64ull << 20;

// What differs between the releases the walker knows, each read from that
// release's malloc/malloc.c (64-bit, MALLOC_ALIGNMENT 16):
//
// - 2.35 to 2.41: malloc_state with have_fastchunks and 10 fastbins (top at
//   96, 2200 bytes); tcache_perthread_struct { uint16_t counts[64];
//   tcache_entry* entries[64]; } (a 0x290 chunk), counts[i] the entries in
//   bin i.
// - 2.42: the same arena; the tcache gained 12 "large" bins, one per power
//   of two from 1 KiB to 4 MiB, each a list sorted by size (76 bins, a
//   0x300 chunk), and counts became num_slots: the entries bin i may still
//   take, counting down from mp_.tcache_count (7 by default).
// - 2.43: no fastbins (have_fastchunks and fastbinsY gone: top at 8, 2112
//   bytes); the 2.42 tcache, filled to 16 by default; an mmapped chunk's
//   size no longer counts the 16-byte header glibc now keeps after it.
//
// The heap_info and chunk layouts above are the same in all of them.
struct Layout {
  const char* releases;   // for messages: "2.35-2.41", "2.42", "2.43"
  size_t arena_fastbins;  // offset of fastbinsY; n_fastbins 0: none
  size_t n_fastbins;
  size_t arena_top;
  size_t arena_bins;
  size_t arena_next;
  size_t arena_system_mem;
  size_t arena_size;
  size_t tcache_bins;        // all of them
  size_t tcache_small_bins;  // one chunk size each; the rest: large bins
  size_t tcache_entries;     // offset of entries[]
  uint64_t tcache_chunk;     // chunk size of a tcache_perthread_struct
  bool tcache_free_slots;    // num_slots[] (free slots), not counts[]
  bool mmap_trailer;         // mmapped chunk sizes leave out a trailing header
  unsigned tcache_fill;      // TCACHE_FILL_COUNT: entries per bin by default
};

inline constexpr size_t kMaxTcacheBins = 76;

inline constexpr Layout kLayout235{"2.35-2.41", 16, 10,  96,    112,   2160,  2184, 2200,
                                   64,          64, 128, 0x290, false, false, 7};
inline constexpr Layout kLayout242{"2.42", 16, 10,  96,    112,  2160,  2184, 2200,
                                   76,     64, 152, 0x300, true, false, 7};
inline constexpr Layout kLayout243{"2.43", 0,  0,   8,     24,   2072, 2096, 2112,
                                   76,     64, 152, 0x300, true, true, 16};

// Each layout is the structures above laid out by the C rules: top after
// the fastbins (or right after flags), last_remainder, 254 bin pointers,
// four binmap words, three pointers and system_mem; entries[] after the
// uint16_t counts, the whole struct rounded up to a chunk (request2size).
constexpr bool consistent(const Layout& l) {
  const size_t top = l.n_fastbins == 0 ? 8 : l.arena_fastbins + 8 * l.n_fastbins;
  const size_t entries = (2 * l.tcache_bins + 7) & ~size_t{7};
  const size_t tcache_chunk = (entries + 8 * l.tcache_bins + 8 + 15) & ~size_t{15};
  return l.arena_top == top && l.arena_bins == top + 16 &&
         l.arena_next == l.arena_bins + 2032 + 16 && l.arena_system_mem == l.arena_next + 24 &&
         l.arena_size == l.arena_system_mem + 16 && l.arena_size <= kMaxArenaSize &&
         l.tcache_entries == entries && l.tcache_chunk == tcache_chunk &&
         l.tcache_bins <= kMaxTcacheBins;
}
static_assert(consistent(kLayout235) && consistent(kLayout242) && consistent(kLayout243));

// The layout of glibc `version` ("2.41", "2.43.9000"), or nullptr for a
// release the walker was not checked against: before 2.35 (no
// heap_info.pagesize) or after 2.43. Pure; thread-safe.
const Layout* layout_for(const char* version);

// Whether a chunk of `size` bytes may sit in tcache bin `bin`: exactly
// bin_chunk_size(bin) for a small bin; for large bin k (counted from the
// first large one) a size in [2^(10+k), 2^(11+k)) above the small bins.
bool fits_tcache_bin(const Layout& l, size_t bin, uint64_t size);

// Safe-linking (glibc >= 2.32): a singly linked "next" stored at `pos`
// holds next ^ (pos >> 12).
inline constexpr uint64_t reveal(uint64_t pos, uint64_t stored) {
  return (pos >> 12) ^ stored;
}

// Chunk size of fastbin i, and of tcache bin i for the small bins.
inline constexpr uint64_t bin_chunk_size(size_t i) {
  return kMinSize + kAlign * i;
}

// The first chunk of a non-main heap: after heap_info, and for the heap
// that holds the arena, after the malloc_state too, aligned so that user
// memory is 16-byte aligned.
inline constexpr uint64_t first_chunk_of_heap(const Layout& l, uint64_t heap, bool holds_arena) {
  const uint64_t p = heap + kHeapInfoBytes + (holds_arena ? l.arena_size : 0);
  return (p + kAlign - 1) & ~(kAlign - 1);
}

}  // namespace mi::heapwalk::pt

#endif
