// The heap walker's vocabulary: the options of a dump and the figures it
// returns, shared by the parent (heapwalk.cpp), the forked child
// (child.cpp) and the pipe protocol between them (reply.h), below the
// folder's API (heapwalk.h), so every include points down. Plain data:
// nothing here locks or has code; ArenaSummary is trivially copyable (the
// child sends it raw), the others hold std::string and std::vector and
// are filled by the parent only.
#ifndef MALLOCINFO_HEAPWALK_DUMP_TYPES_H
#define MALLOCINFO_HEAPWALK_DUMP_TYPES_H

#include <cstdint>
#include <string>
#include <vector>

#include "../common/mi_abi.h"
#include "../glibc/glibc_introspect.h"

namespace mi::heapwalk {

// Bytes of chunks of each dump_format.h kind (indexed by Kind).
inline constexpr int kKinds = 7;

// One arena's figures, as doc/heapmap.md and dump_format.h define them.
struct ArenaSummary {
  uint32_t index = 0;
  uint64_t address = 0;
  uint64_t system_bytes = 0;
  uint64_t by_kind[kKinds] = {};
  uint64_t chunks = 0;
  uint64_t free_chunks = 0;  // kinds free, fast, tcache
  uint64_t largest_free = 0;
  uint64_t resident_bytes = 0;
  uint64_t trimmable_bytes = 0;
  uint64_t pinned_bytes = 0;
  uint64_t live_bytes = 0;  // tracker: in_use chunks with a site
  uint64_t live_chunks = 0;
  uint64_t unrecorded_bytes = 0;  // tracker: in_use chunks without one
  uint64_t segments = 0;
};

// A call site of live blocks, for the SITE records (tracker only).
struct Site {
  uint32_t id = 0;
  uint64_t live_bytes = 0;
  uint64_t live_blocks = 0;
  std::vector<uint64_t> frames;  // return addresses, innermost first
};

struct DumpResult {
  std::vector<ArenaSummary> arenas;
  uint64_t chunks = 0;
  uint64_t segments = 0;
  // mmapped blocks found through the tracker's live table (the MMAP
  // records): glibc keeps no list of them, so without the tracker these are
  // 0 while mallinfo.hblks/hblkhd count them all.
  uint64_t mmap_chunks = 0;
  uint64_t mmap_bytes = 0;
  uint64_t file_bytes = 0;
  bool tracker = false;
  glibc::Mallinfo mallinfo{};  // taken in the child right after the walk
  std::string info_xml;        // malloc_info() in the child, when asked
  std::vector<Site> sites;
  uint64_t walk_ns = 0;  // child's walk + write time
  uint64_t fork_ns = 0;  // the parent's fork() call: the only time it is held
};

struct DumpOptions {
  // The tracker's ABI when the interposer records in this process, else
  // nullptr. With it, in_use chunks are matched against live blocks.
  const mi_preload_abi* tracker = nullptr;
  uint32_t max_sites = 1000;  // sites kept by live bytes, <= 65534
  int timeout_ms = 120000;
  bool want_info_xml = false;
};

}  // namespace mi::heapwalk

#endif
