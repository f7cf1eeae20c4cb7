// Shared state of the interposer (this directory is one link unit:
// libmallocinfo_preload.so). Owned here: the one Tracker, the resolved next
// allocator, the re-entrancy guard and the start-up state machine.
#ifndef MALLOCINFO_PRELOAD_RUNTIME_H
#define MALLOCINFO_PRELOAD_RUNTIME_H

#include <atomic>
#include <cstddef>

#include "../track/tracker.h"

namespace mi::preload {

// The allocator after us in the symbol search order (glibc, or jemalloc /
// tcmalloc when preloaded after us), resolved with dlsym(RTLD_NEXT).
struct Next {
  void* (*malloc)(size_t);
  void (*free)(void*);
  void* (*calloc)(size_t, size_t);
  void* (*realloc)(void*, size_t);
  void* (*reallocarray)(void*, size_t, size_t);
  int (*posix_memalign)(void**, size_t, size_t);
  void* (*aligned_alloc)(size_t, size_t);
  void* (*memalign)(size_t, size_t);
  void* (*valloc)(size_t);
  void* (*pvalloc)(size_t);
  char* (*strdup)(const char*);
  char* (*strndup)(const char*, size_t);
  // Not interposed; null when the next allocator has none (the byte
  // counters then count requested bytes, see track/tracker.h).
  size_t (*malloc_usable_size)(void*);
};

enum : int { kUninit = 0, kInitializing = 1, kReady = 2 };

// The hooks' one-load fast path. kGatePass: start-up is done and nothing is
// recorded (executable not matched, or mode off): forward at once.
// kGateSample: an allocation runs the thread's sample countdown and a free
// tests the pointer's page offset, and only the rare hit leaves the
// exported function. kGateInit, kGateFull, kGateCounters: the slow path
// (start-up, or a mode that sees every call), which reads the tracker's
// real mode. Written with release after start-up and on every mode change.
enum : int { kGatePass = 0, kGateInit = 1, kGateFull = 2, kGateCounters = 3, kGateSample = 4 };
extern std::atomic<int> g_gate;
// Re-derives g_gate from g_recording and the tracker's mode.
void update_gate();
// Switches the tracker's mode and the gate together, serialised against
// other switches. Not for hooks (takes a mutex). False for a bad mode.
bool change_mode(uint32_t mode);

extern Next g_next;

// True when the next allocator is glibc's and its chunk header gives
// malloc_usable_size exactly for heap chunks (checked at start against the
// real function on heap blocks of every kind): the hooks then read it
// inline, a few instructions instead of a call.
extern bool g_glibc_chunks;
// ptmalloc: the size field precedes the block; bits 0-2 are flags, bit 1
// IS_MMAPPED. A heap chunk in use holds size - 8 usable bytes.
inline bool glibc_mmapped(const void* p) {
  return (static_cast<const size_t*>(p)[-1] & 2) != 0;
}
inline size_t glibc_usable_size(const void* p) {
  return (static_cast<const size_t*>(p)[-1] & ~size_t{7}) - 8;
}
// Usable size of p (a block of the next allocator), 0 for nullptr or when
// the next allocator cannot say. Never allocates, no lock. Mmapped chunks
// (rare, and costly anyway) are asked of glibc: the start-up check does not
// make one (see check_glibc_chunks).
inline size_t next_usable_size(void* p) {
  if (p == nullptr) return 0;
  if (g_glibc_chunks && !glibc_mmapped(p)) [[likely]]
    return glibc_usable_size(p);
  return g_next.malloc_usable_size != nullptr ? g_next.malloc_usable_size(p) : 0;
}
extern std::atomic<int> g_state;
extern bool g_recording;  // this executable matched MALLOCINFO_TRACE_EXE
extern mi::track::Tracker g_tracker;

// Set while this thread is inside a hook (or initialising): any allocation
// it makes meanwhile is forwarded untracked. initial-exec TLS.
extern __thread bool t_in_hook;

// Non-zero while this thread works for mallocinfo (mi_preload_abi.quiet:
// the NIF sets it around every call; it nests). Its allocations and
// mappings are then forwarded and counted as mallocinfo's own, never
// recorded; its frees still remove what the table holds. initial-exec TLS.
extern __thread uint32_t t_quiet;
inline bool quiet() {
  return t_quiet != 0;
}

// Runs start-up once (first hook call of the process). True when the
// caller may use g_next; false when start-up is in progress (re-entry from
// dlsym, or another thread racing the first call): use the bootstrap pool.
bool ensure_init();

// attach() (attach.cpp), before any slot points at a hook: makes `next`
// (the values the patched slots held) the next allocator and switches
// recording on in this process whatever MALLOCINFO_TRACE_EXE says. The
// first call maps the tables with `config`; later calls keep the tables,
// forget what was recorded and apply config.mode. Not for hooks;
// serialised by the caller. False when the tables cannot be mapped.
bool start_attached(const Next& next, const mi::track::Config& config);

// Static bootstrap pool for allocations made before the next allocator is
// known. Memory is never reused (it is zero, as calloc needs).
void* pool_alloc(size_t size, size_t align);
size_t pool_size_of(const void* p);
constexpr size_t kPoolBytes = 1 << 20;
extern char g_pool[kPoolBytes];
inline bool pool_owns(const void* p) {
  // Unsigned wrap-around makes this one compare.
  return static_cast<size_t>(static_cast<const char*>(p) - g_pool) < kPoolBytes;
}

}  // namespace mi::preload

#endif
