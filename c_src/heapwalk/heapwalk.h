// The heap walker: a chunk-by-chunk dump of every glibc arena of this
// process, in the format of dump_format.h, with a summary per arena.
//
// How it stays safe on a live, multi-threaded node: dump() forks. glibc's
// fork handlers hold every arena lock across fork(), so the child's
// copy-on-write image has every arena in a consistent state; the child walks
// that frozen image, writes the file and a summary into a pipe, and exits.
// The parent only waits (bounded by a timeout, after which the child is
// killed). Other threads keep allocating in the parent the whole time.
//
// The child never allocates through the heap it is walking (its buffers are
// mmapped) and never trusts a pointer before checking it lies inside a heap
// segment it has validated; a fault in the child is caught and reported.
//
// No erl_nif here: linked into the NIF and the Catch2 binary. dump() may
// allocate (in the parent), blocks the calling thread for the whole walk,
// and is thread-safe (concurrent dumps are independent children).
#ifndef MALLOCINFO_HEAPWALK_HEAPWALK_H
#define MALLOCINFO_HEAPWALK_HEAPWALK_H

#include <cstdint>
#include <functional>
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

enum class Failure {
  none,
  os_error,           // errno in `err` (file, fork, pipe)
  unsupported_glibc,  // a release pt::layout_for() does not know, or a layout check failed
  walk_failed,        // an inconsistency found in the heap (detail says where)
  timeout,            // the child did not finish in time and was killed
};

struct DumpStatus {
  Failure failure = Failure::none;
  int err = 0;
  std::string detail;  // e.g. "main_arena", "fastbin", "chunk_overrun", "fault"
};

// Turns a site's frames into the label written in its SITE record; runs in
// the parent after the child has exited (it may allocate and read files).
// It is the caller's: whatever it throws (the NIF's symbolizer: only
// std::bad_alloc) passes through dump() after the temporary file is removed.
using SiteLabeler = std::function<std::string(const std::vector<uint64_t>& frames)>;

// Writes the dump to `path` atomically (a temporary file beside it, fsynced
// and renamed into place only when complete; nothing left behind on
// failure). Only a missing name or a regular file is replaced: a directory
// fails with os_error EISDIR, a symbolic link, device, FIFO or socket with
// EEXIST, before anything is walked, and is left untouched
// (../glibc/atomic_file.h). An empty path walks and summarises without
// writing a file. Blocks until the child is done. See the file comment for
// the safety argument.
DumpStatus dump(const std::string& path, const DumpOptions& options, const SiteLabeler& label,
                DumpResult& out);

namespace pt {
struct Layout;
}

// Where main_arena lives, found from this process without debug symbols:
// the 8-byte-aligned spot of libc's writable data whose 127 bin pairs (at
// layout `l`'s offsets: pt::layout_for(this glibc)) are each either empty
// (pointing at themselves) or a pair of chunk pointers. 0 when not found.
// Cached after the first success. Thread-safe.
uint64_t find_main_arena(const pt::Layout& l);

}  // namespace mi::heapwalk

#endif
