// glibc malloc introspection: the core behind mallocinfo's glibc API.
//
// No erl_nif here: these functions are linked into the NIF and into the Catch2
// binary. Every function is thread-safe in the sense that glibc's own entry
// points are (they take arena locks one at a time); none may be called from
// inside a malloc hook. Errors are reported as errno values (int), never as
// partially filled results and never as exceptions; the only exception that
// may leave a function here is std::bad_alloc from a std::string
// (doc/architecture.md, "Errors").
#ifndef MALLOCINFO_GLIBC_GLIBC_INTROSPECT_H
#define MALLOCINFO_GLIBC_GLIBC_INTROSPECT_H

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mi::glibc {

// Every field of glibc's `struct mallinfo2`, widened to 64 bits.
// Locks every arena in turn; allocates nothing.
struct Mallinfo {
  uint64_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};
Mallinfo read_mallinfo();

// glibc `malloc_info(0, ...)` XML in memory (open_memstream), into `out`.
// Returns 0, or an errno value (open_memstream's or malloc_info's; EIO if
// the stream produced nothing) with `out` unchanged. Allocates.
int info_xml(std::string& out);

// Writes the same XML to `path` so that no reader ever sees half a document
// and nothing but a regular file is ever replaced (atomic_file.h): the XML
// goes to a temporary file beside `path`, is flushed and fsynced, then
// renamed over `path`. Returns 0 or an errno value (EISDIR for a directory,
// EEXIST for a link, device, FIFO or socket, which are left untouched); on
// failure nothing is left behind.
int write_info_file(const std::string& path);

// The text glibc `malloc_stats()` prints, taken from one frozen snapshot of
// the whole heap: the caller forks, the child (whose arenas glibc's fork
// handlers leave consistent) runs malloc_stats() with fd 2 on a pipe, then
// appends two lines malloc_stats() does not print but `summary()` needs:
//   "mmap regions     = N" and "mmap bytes       = N" (mallinfo2 hblks/hblkhd).
// Blocks the calling thread until the child exits (bounded by `timeout_ms`,
// after which the child is killed and ETIMEDOUT returned). Returns 0 or errno.
// Call it from a thread that may block (a dirty scheduler).
int capture_stats(std::string& out, int timeout_ms = 10000);

// Resident set size of this process in bytes (/proc/self/statm), or nullopt
// when /proc is unavailable.
std::optional<uint64_t> resident_bytes();

// malloc_trim(pad): true when glibc released memory to the system.
bool trim(size_t pad);

// The mallopt(3) parameters mallocinfo exposes.
enum class Param {
  arena_max,
  arena_test,
  mmap_threshold,
  mmap_max,
  trim_threshold,
  top_pad,
  perturb
};
// Maps an API name ("arena_max", ...) to a Param; nullopt for unknown names.
std::optional<Param> param_from_name(std::string_view name);
// mallopt(3). Returns 0 on success, EINVAL when the value is out of the
// range glibc acts on (arena_max/arena_test <= 0, mmap_threshold outside
// 0..32 MiB, negative mmap_max/top_pad, trim_threshold < -1) or glibc
// rejects it. Takes the main arena lock.
int set_param(Param p, int value);

// "enoent" for ENOENT: the lower-case POSIX name of an errno value, or
// "unknown" when glibc has no name for it. Never allocates; thread-safe.
const char* errno_name(int err);

// gnu_get_libc_version(), e.g. "2.36".
const char* libc_version();

}  // namespace mi::glibc

#endif
