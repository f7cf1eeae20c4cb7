// The heap dump file format, version 1: the contract between the dumper
// (heapwalk/, running in a forked child) and every reader (the Erlang
// reader mallocinfo_heapmap_read, behind mallocinfo_heapmap and the
// escript; src/mallocinfo_heapdump.hrl is the Erlang copy of the constants
// below, shared with the tests' writer). For operators: doc/dump-format.md.
//
// Design goals: streamable (written front to back with no seeking, read the
// same way), compact (8 bytes per chunk: the address is implied), and
// self-checking (a reader detects truncation and corruption instead of
// drawing a partial picture).
//
// Layout. All integers are little-endian. The file starts with the 8 magic
// bytes "MIHEAPD\n", then a sequence of records:
//
//     u32 tag | u32 payload_len | payload[payload_len]
//
// The first record is HEADER, the last END. Nothing may follow END. A reader
// must reject unknown tags (the version is bumped for incompatible changes),
// payloads whose length does not fit the tag, and a file without END.
//
// Records, in order of appearance:
//
//   HEADER (1): u32 version (=1) | u32 page_size | u32 alignment (=16)
//               | u32 flags (bit 0: tracker data present, i.e. sites and
//               mmap records may appear and site 0 on an in_use chunk means
//               "not in the tracker's live table")
//               | u64 pid | u64 unix_time_ms | u64 heap_max (size and
//               alignment of a non-main heap) | glibc version (rest, ASCII)
//
//   For each arena (index 0 is the main arena), in arena-list order:
//   ARENA (2):  u32 index | u32 flags (bit 0: main arena) | u64 address
//               | u64 system_mem | u64 top_address | u64 top_size
//     For each heap segment of that arena (the sbrk heap for main, each
//     heap_info heap for the others, oldest first):
//     SEGMENT (3): u32 arena index | u32 flags (bit 0: main sbrk heap)
//               | u64 base (heap start) | u64 size (bytes of the segment)
//               | u64 first_chunk (address of the first chunk header;
//               bytes in [base, first_chunk) are heap/arena headers)
//       CHUNKS (4): n × u64 chunk words (n = payload_len / 8, n <= 65536),
//               one or more records. The first chunk is at first_chunk,
//               each next one at previous + size. The chunks of a segment
//               cover [first_chunk, base + size) exactly, except that a
//               non-main heap may end in glibc's fenceposts, which are
//               emitted as chunks of kind meta.
//       PAGES (5): u64 first_page (page-aligned) | u64 n_pages
//               | ceil(n_pages / 8) bytes of bitmap: bit (i % 8) of byte
//               i / 8 (LSB first) is 1 when page i is resident (mincore).
//               Exactly one per segment, after its chunks, covering
//               [floor(base), ceil(base + size)).
//   MMAP (6):   n × (u64 chunk address | u64 chunk word), kind mmap; only
//               blocks the tracker knows (glibc keeps no list of them).
//   SITE (7):   u32 id (1..65535) | u32 reserved (0) | u64 live_bytes
//               | u64 live_blocks | label (rest, UTF-8: innermost symbolized
//               frames joined by " < ")
//   END (8):    u64 chunk count (all CHUNKS words) | u64 segment count
//               | u32 arena count | u32 reserved (0)
//
// Chunk word: bits 0-3 kind, bits 4-47 size >> 4 (so size = word &
// 0x0000fffffffffff0; sizes are multiples of 16), bits 48-63 site id
// (0 = none; 65535 = a live block of a site outside the dumped top sites).
#pragma once

#include <cstdint>

namespace mi::heapdump {

inline constexpr char kMagic[8] = {'M', 'I', 'H', 'E', 'A', 'P', 'D', '\n'};
inline constexpr uint32_t kVersion = 1;

enum Tag : uint32_t {
  kHeaderRec = 1,
  kArenaRec = 2,
  kSegmentRec = 3,
  kChunksRec = 4,
  kPagesRec = 5,
  kMmapRec = 6,
  kSiteRec = 7,
  kEndRec = 8,
};

// What ptmalloc (and the tracker, when present) says a chunk is.
enum Kind : uint8_t {
  kInUse = 0,   // allocated (with the tracker: site != 0 means live)
  kFree = 1,    // in a regular bin (unsorted, small, large)
  kFast = 2,    // in a fastbin: free to the application, in use to ptmalloc
  kTcache = 3,  // in a thread's tcache: likewise
  kTop = 4,     // the arena's top chunk
  kMmap = 5,    // an mmapped block (tracker only)
  kMeta = 6,    // glibc bookkeeping: fenceposts at the end of a heap
};

inline constexpr uint32_t kMaxChunksPerRecord = 65536;
inline constexpr uint16_t kSiteOther = 65535;
inline constexpr uint64_t kSizeMask = 0x0000fffffffffff0ULL;

inline constexpr uint64_t chunk_word(uint64_t size, Kind kind, uint16_t site) {
  return (size & kSizeMask) | uint64_t(kind) | (uint64_t(site) << 48);
}

}  // namespace mi::heapdump
