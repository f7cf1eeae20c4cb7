// The interposed malloc family. Each hook forwards to the next allocator
// and tells the tracker; the order matters:
//  - on allocation, record after the real call (we need the address);
//  - on free, forget BEFORE the real call: once freed, the address can be
//    returned to another thread and recorded again, and removing it after
//    would delete that thread's entry.
// Hooks never allocate through malloc (the tracker's memory is mmapped),
// never recurse (t_in_hook: anything allocated while inside a hook, by
// dlsym at start-up say, is forwarded untracked), never throw, never lock,
// and never wait for a lock their caller may hold: stack capture calls
// neither libunwind nor the loader (track/unwind.h).
// A process whose executable did not match MALLOCINFO_TRACE_EXE (or with
// tracking off) pays one load, one compare and a tail call per call.
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cstdint>

#include "../common/mi_abi.h"
#include "runtime.h"

#define MI_EXPORT extern "C" __attribute__((visibility("default")))

namespace mi::preload {
namespace {

struct Guard {
  Guard() { t_in_hook = true; }
  ~Guard() { t_in_hook = false; }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
};

// True when the call should be recorded: the gate says this executable
// records and tracking is on, and this is not a re-entry from a hook.
// Callers must have checked ready() (g_next usable) first.
inline bool tracking() {
  return !t_in_hook && g_gate.load(std::memory_order_relaxed) == kGateTrack;
}

inline bool ready() {
  return g_state.load(std::memory_order_acquire) == kReady || ensure_init();
}

// The exported hooks' fast path: start-up done and nothing to record.
inline bool pass_through() {
  return g_gate.load(std::memory_order_acquire) == kGatePass;
}

// Calls the next allocator and, when tracking, records the block it
// returns as `size` bytes allocated by `fn`.
template <class Call>
void* forward_and_record(mi_fn fn, size_t size, Call call) {
  if (!tracking()) return call();
  Guard g;
  void* p = call();
  g_tracker.on_alloc(fn, p, size);
  return p;
}

size_t page_size() {
  static size_t cached = 0;  // a plain word: racing writers store the same value
  if (cached == 0) cached = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return cached;
}

// realloc semantics shared by realloc and reallocarray (which passes its
// overflow-checked product as `size`).
void* do_realloc(mi_fn fn, void* p, size_t size) {
  if (!tracking()) return g_next.realloc(p, size);
  Guard g;
  mi::track::LiveEntry old{};
  const bool had = g_tracker.take(p, &old);
  void* r = g_next.realloc(p, size);
  if (r == nullptr && size != 0) {
    // Failure: p is untouched and still live.
    if (had) g_tracker.restore(old);
    g_tracker.count(fn);
    return r;
  }
  if (r == nullptr) {  // realloc(p, 0): glibc frees p
    g_tracker.count(fn);
    return r;
  }
  g_tracker.on_alloc(fn, r, size);
  return r;
}

void* pool_realloc(void* p, size_t size) {
  // A block from the bootstrap pool: move it to the real heap. Size 0 frees
  // it (pool blocks are never reused), as glibc's realloc(p, 0) does.
  if (size == 0) return nullptr;
  void* r = ::malloc(size);
  if (r != nullptr) {
    const size_t old = pool_size_of(p);
    ::memcpy(r, p, old < size ? old : size);
  }
  return r;
}

}  // namespace
}  // namespace mi::preload

using namespace mi::preload;

namespace {

// Slow paths: start-up, tracking. Kept out of line so that the exported
// fast paths below are a load, a compare and a tail call.

[[gnu::noinline]] void* slow_malloc(size_t size) noexcept {
  if (!ready()) [[unlikely]]
    return pool_alloc(size, 16);
  return forward_and_record(MI_FN_MALLOC, size, [&] { return g_next.malloc(size); });
}

[[gnu::noinline]] void slow_free(void* p) noexcept {
  if (!ready()) [[unlikely]]
    return;  // not reachable with a real pointer: nothing was allocated yet
  if (!tracking()) return g_next.free(p);
  Guard g;
  g_tracker.on_free(MI_FN_FREE, p);
  g_next.free(p);
}

[[gnu::noinline]] void* slow_calloc(size_t n, size_t size) noexcept {
  if (!ready()) [[unlikely]] {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
      errno = ENOMEM;
      return nullptr;
    }
    return pool_alloc(total, 16);
  }
  // On overflow the next calloc returns NULL (ENOMEM) and nothing is
  // recorded, so the wrapped product is never used.
  return forward_and_record(MI_FN_CALLOC, n * size, [&] { return g_next.calloc(n, size); });
}

[[gnu::noinline]] void* slow_realloc(void* p, size_t size) noexcept {
  if (pool_owns(p)) [[unlikely]]
    return pool_realloc(p, size);
  if (!ready()) [[unlikely]]
    return pool_alloc(size, 16);
  return do_realloc(MI_FN_REALLOC, p, size);
}

[[gnu::noinline]] void* slow_reallocarray(void* p, size_t n, size_t size) noexcept {
  size_t total;
  if (__builtin_mul_overflow(n, size, &total)) {
    errno = ENOMEM;
    return nullptr;
  }
  if (pool_owns(p)) [[unlikely]]
    return pool_realloc(p, total);
  if (!ready()) [[unlikely]]
    return pool_alloc(total, 16);
  return do_realloc(MI_FN_REALLOCARRAY, p, total);
}

[[gnu::noinline]] int slow_posix_memalign(void** out, size_t align, size_t size) noexcept {
  if (!ready()) [[unlikely]] {
    if (align == 0 || (align & (align - 1)) != 0 || align % sizeof(void*) != 0) return EINVAL;
    void* p = pool_alloc(size, align);
    if (p == nullptr) return ENOMEM;
    *out = p;
    return 0;
  }
  if (!tracking()) return g_next.posix_memalign(out, align, size);
  Guard g;
  const int rc = g_next.posix_memalign(out, align, size);
  g_tracker.on_alloc(MI_FN_POSIX_MEMALIGN, rc == 0 ? *out : nullptr, size);
  return rc;
}

[[gnu::noinline]] void* slow_aligned_alloc(size_t align, size_t size) noexcept {
  if (!ready()) [[unlikely]]
    return pool_alloc(size, align);
  return forward_and_record(MI_FN_ALIGNED_ALLOC, size,
                            [&] { return g_next.aligned_alloc(align, size); });
}

[[gnu::noinline]] void* slow_memalign(size_t align, size_t size) noexcept {
  if (!ready()) [[unlikely]]
    return pool_alloc(size, align);
  return forward_and_record(MI_FN_MEMALIGN, size, [&] { return g_next.memalign(align, size); });
}

[[gnu::noinline]] void* slow_valloc(size_t size) noexcept {
  if (!ready()) [[unlikely]]
    return pool_alloc(size, page_size());
  return forward_and_record(MI_FN_VALLOC, size, [&] { return g_next.valloc(size); });
}

[[gnu::noinline]] void* slow_pvalloc(size_t size) noexcept {
  if (!ready()) [[unlikely]] {
    const size_t ps = page_size();
    return pool_alloc((size + ps - 1) & ~(ps - 1), ps);
  }
  return forward_and_record(MI_FN_PVALLOC, size, [&] { return g_next.pvalloc(size); });
}

// strdup/strndup are counted here; the block itself is recorded by the
// malloc hook that glibc's strdup calls (its stack then starts in strdup).
[[gnu::noinline]] char* slow_strdup(const char* s) noexcept {
  if (!ready()) [[unlikely]] {
    const size_t n = ::strlen(s) + 1;
    char* p = static_cast<char*>(pool_alloc(n, 16));
    if (p != nullptr) ::memcpy(p, s, n);
    return p;
  }
  if (tracking()) g_tracker.count(MI_FN_STRDUP);
  return g_next.strdup(s);
}

[[gnu::noinline]] char* slow_strndup(const char* s, size_t n) noexcept {
  if (!ready()) [[unlikely]] {
    const size_t len = ::strnlen(s, n);
    char* p = static_cast<char*>(pool_alloc(len + 1, 16));
    if (p != nullptr) {
      ::memcpy(p, s, len);
      p[len] = '\0';
    }
    return p;
  }
  if (tracking()) g_tracker.count(MI_FN_STRNDUP);
  return g_next.strndup(s, n);
}

}  // namespace

// Exported fast paths.
MI_EXPORT void* malloc(size_t size) noexcept {
  if (pass_through()) [[likely]]
    return g_next.malloc(size);
  return slow_malloc(size);
}

MI_EXPORT void free(void* p) noexcept {
  // Blocks from the bootstrap pool were never the next allocator's.
  if (pool_owns(p)) [[unlikely]]
    return;
  if (pass_through()) [[likely]]
    return g_next.free(p);
  slow_free(p);
}

MI_EXPORT void* calloc(size_t n, size_t size) noexcept {
  if (pass_through()) [[likely]]
    return g_next.calloc(n, size);
  return slow_calloc(n, size);
}

MI_EXPORT void* realloc(void* p, size_t size) noexcept {
  if (!pool_owns(p) && pass_through()) [[likely]]
    return g_next.realloc(p, size);
  return slow_realloc(p, size);
}

MI_EXPORT void* reallocarray(void* p, size_t n, size_t size) noexcept {
  if (!pool_owns(p) && pass_through() && g_next.reallocarray != nullptr) [[likely]]
    return g_next.reallocarray(p, n, size);
  return slow_reallocarray(p, n, size);
}

MI_EXPORT int posix_memalign(void** out, size_t align, size_t size) noexcept {
  if (pass_through()) [[likely]]
    return g_next.posix_memalign(out, align, size);
  return slow_posix_memalign(out, align, size);
}

MI_EXPORT void* aligned_alloc(size_t align, size_t size) noexcept {
  if (pass_through()) [[likely]]
    return g_next.aligned_alloc(align, size);
  return slow_aligned_alloc(align, size);
}

MI_EXPORT void* memalign(size_t align, size_t size) noexcept {
  if (pass_through()) [[likely]]
    return g_next.memalign(align, size);
  return slow_memalign(align, size);
}

MI_EXPORT void* valloc(size_t size) noexcept {
  if (pass_through()) [[likely]]
    return g_next.valloc(size);
  return slow_valloc(size);
}

MI_EXPORT void* pvalloc(size_t size) noexcept {
  if (pass_through()) [[likely]]
    return g_next.pvalloc(size);
  return slow_pvalloc(size);
}

MI_EXPORT char* strdup(const char* s) noexcept {
  if (pass_through()) [[likely]]
    return g_next.strdup(s);
  return slow_strdup(s);
}

MI_EXPORT char* strndup(const char* s, size_t n) noexcept {
  if (pass_through()) [[likely]]
    return g_next.strndup(s, n);
  return slow_strndup(s, n);
}
