// glibc ptmalloc's private structure layout, as the heap walker reads it.
//
// None of this is public glibc API: offsets come from malloc/malloc.c and
// malloc/arena.c of the versions listed in supported_glibc(), 64-bit only.
// The walker never trusts them blindly: it checks the version first, then
// validates what it reads (main_arena's self-referencing empty bins, each
// heap_info's ar_ptr, a chunk walk that must land exactly on top) and
// refuses the dump on any mismatch. Header-only constants; no state.
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

// struct malloc_state (glibc >= 2.27: int mutex, int flags, int
// have_fastchunks, then pointers).
inline constexpr size_t kArenaFlags = 4;
inline constexpr size_t kArenaFastbins = 16;
inline constexpr size_t kNFastbins = 10;
inline constexpr size_t kArenaTop = 96;
inline constexpr size_t kArenaBins = 112;
inline constexpr size_t kNBinPairs = 127;  // (NBINS * 2 - 2) / 2
inline constexpr size_t kArenaNext = 2160;
inline constexpr size_t kArenaSystemMem = 2184;
inline constexpr size_t kArenaSize = 2200;
inline constexpr uint32_t kNonContiguousBit = 0x2;  // av->flags

// struct _heap_info (glibc >= 2.35 has the pagesize field: 48 bytes).
inline constexpr size_t kHeapInfoArPtr = 0;
inline constexpr size_t kHeapInfoPrev = 8;
inline constexpr size_t kHeapInfoSize = 16;
inline constexpr size_t kHeapInfoBytes = 48;
// HEAP_MAX_SIZE = 2 * DEFAULT_MMAP_THRESHOLD_MAX on 64-bit (without the
// hugetlb tunable, which the walker detects through the ar_ptr check).
inline constexpr uint64_t kHeapMax = 64ull << 20;

// struct tcache_perthread_struct: uint16_t counts[64]; tcache_entry*
// entries[64]; allocated as an ordinary chunk of this size. An entry is the
// user memory of a cached chunk: {next (safe-linked), key}.
inline constexpr size_t kTcacheBins = 64;
inline constexpr size_t kTcacheEntriesOffset = 128;
inline constexpr uint64_t kTcacheStructChunk = 0x290;

// Safe-linking (glibc >= 2.32): a singly linked "next" stored at `pos`
// holds next ^ (pos >> 12).
inline constexpr uint64_t reveal(uint64_t pos, uint64_t stored) {
  return (pos >> 12) ^ stored;
}

// Chunk size of fastbin/tcache bin i.
inline constexpr uint64_t bin_chunk_size(size_t i) {
  return kMinSize + kAlign * i;
}

// The first chunk of a non-main heap: after heap_info, and for the heap
// that holds the arena, after the malloc_state too, aligned so that user
// memory is 16-byte aligned.
inline constexpr uint64_t first_chunk_of_heap(uint64_t heap, bool holds_arena) {
  const uint64_t p = heap + kHeapInfoBytes + (holds_arena ? kArenaSize : 0);
  return (p + kAlign - 1) & ~(kAlign - 1);
}

// True for the glibc versions whose layout the constants above describe:
// 2.35 (heap_info.pagesize) up to the newest checked against the source.
bool supported_glibc(const char* version);

}  // namespace mi::heapwalk::pt

#endif
