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
// This header is the folder's API (dump() and how it fails); the records
// it fills are dump_types.h's, which the child and the reply share.
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

#include "dump_types.h"

namespace mi::heapwalk {

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

}  // namespace mi::heapwalk

#endif
