// The heap walker's child-to-parent protocol: one ReplyHeader, then (on
// kOk) n_arenas ArenaSummary records, then n_sites ReplySite records each
// followed by `depth` frames, written to a pipe by the child (child.cpp)
// and read and parsed by the parent (heapwalk.cpp). Both ends are the same
// binary, so the records are raw structs. Also the fd helpers both sides
// use. Nothing here is thread-safe beyond being reentrant.
#ifndef MALLOCINFO_HEAPWALK_REPLY_H
#define MALLOCINFO_HEAPWALK_REPLY_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "dump_types.h"

namespace mi::heapwalk::detail {

// Arenas one walk handles at most.
constexpr size_t kMaxArenas = 4096;

// What the child sends the parent through the pipe.

constexpr uint32_t kReplyMagic = 0x4d495257;  // "MIRW"

enum ChildStatus : uint32_t {
  kOk = 0,
  kUnsupported = 1,
  kWalkFailed = 2,
  kOsError = 3,
};

struct ReplyHeader {
  uint32_t magic = kReplyMagic;
  uint32_t status = kOk;
  int32_t err = 0;
  uint32_t n_arenas = 0;
  char detail[32] = {};
  uint64_t chunks = 0, segments = 0, mmap_chunks = 0, mmap_bytes = 0, file_bytes = 0;
  uint64_t walk_ns = 0;
  uint32_t tracker = 0;
  uint32_t n_sites = 0;
  glibc::Mallinfo mallinfo{};
  uint64_t xml_len = 0;  // ~0: malloc_info failed in the child
};

struct ReplySite {
  uint32_t id;
  uint32_t depth;
  uint64_t live_bytes;
  uint64_t live_blocks;
};

static_assert(std::is_trivially_copyable_v<ArenaSummary>);

// CLOCK_MONOTONIC in ns. Async-signal-safe.
uint64_t mono_ns();

// Writes all n bytes, retrying on EINTR; false with errno set on error.
// Does not allocate (the child uses it).
bool write_all(int fd, const void* p, size_t n);

// Reads `fd` until EOF or `timeout_ms`, appending to `out` (allocates).
// 0, ETIMEDOUT, or the errno of a failed read.
int read_reply(int fd, int timeout_ms, std::string& out);

// Parses the whole reply `r` (header `h` already read from its start) into
// `out`'s arenas, sites and figures; false when it is short, long or
// malformed. Allocates.
bool parse_reply(const std::string& r, const ReplyHeader& h, DumpResult& out);

}  // namespace mi::heapwalk::detail

#endif
