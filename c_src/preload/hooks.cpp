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
//
// mallocinfo's own work (a NIF call: t_quiet, see runtime.h) is forwarded
// and counted apart: an allocation made while quiet is never recorded, so
// no view shows mallocinfo's buffers as the node's memory. The test costs
// one TLS load on the paths that record or count (counters, full, and
// sample mode's sample points), nothing on the fast paths.
//
// Cost by gate (g_gate, one load):
//  - pass (executable not matched, or off): a compare and a tail call;
//  - sample: an allocation subtracts its size from the thread's countdown
//    (Tracker::sample_due) and a free tests the pointer's page offset
//    (Tracker::sampled_address), then tail-call; only a sample point, or
//    the free of a block that may be sampled, takes a slow path;
//  - counters, full: the slow path for every call.
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
  return !t_in_hook && g_gate.load(std::memory_order_relaxed) >= kGateFull;
}

inline bool ready() {
  return g_state.load(std::memory_order_acquire) == kReady || ensure_init();
}

// A call made inside a hook (t_in_hook) while a counting mode is on.
inline bool nested_count() {
  return t_in_hook && g_gate.load(std::memory_order_relaxed) >= kGateFull &&
         g_state.load(std::memory_order_relaxed) == kReady;
}

inline int gate() {
  return g_gate.load(std::memory_order_acquire);
}

size_t page_size() {
  static size_t cached = 0;  // a plain word: racing writers store the same value
  if (cached == 0) cached = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return cached;
}

// How place_sampled() fills a block it has to move.
enum class Fill { kNone, kZero, kCopy };

// Sample mode: `p` (size bytes, aligned to `align`) was just allocated and
// the sampler picked it. The tracker can only find a sampled block on free
// if sampled_address() holds for it (track/tracker.h says why): keep p if
// it does, else move it to a page-aligned block, filled as `fill` says.
// *ok is false when no such block could be had: p is then returned and must
// not be recorded.
void* place_sampled(void* p, size_t size, size_t align, Fill fill, bool* ok) {
  *ok = p != nullptr;
  if (p == nullptr || mi::track::Tracker::sampled_address(p)) return p;
  void* q = nullptr;
  if (g_next.posix_memalign(&q, align > 4096 ? align : 4096, size) != 0 || q == nullptr) {
    *ok = false;
    return p;
  }
  if (fill == Fill::kZero) ::memset(q, 0, size);
  if (fill == Fill::kCopy) ::memcpy(q, p, size);
  g_next.free(p);
  return q;
}

// A power of two, at least a pointer: what posix_memalign accepts. Sampled
// aligned allocations use it; anything else goes to the next allocator
// unsampled, which then answers the odd alignment as it always does.
bool plain_alignment(size_t align) {
  return align >= sizeof(void*) && (align & (align - 1)) == 0;
}

// realloc semantics shared by realloc and reallocarray (which passes its
// overflow-checked product as `size`). In full and counters modes p's
// usable size is measured before the call: if it succeeds, p has left the
// live set (moved, resized in place, or freed by realloc(p, 0)) and the new
// block is counted as allocated.
void* do_realloc(mi_fn fn, void* p, size_t size) {
  if (!tracking()) {
    if (!nested_count()) return g_next.realloc(p, size);
    const size_t old = next_usable_size(p);
    void* r = g_next.realloc(p, size);
    if (r != nullptr || size == 0) {
      g_tracker.count_bytes(false, old);
      g_tracker.count_bytes(true, next_usable_size(r));
    }
    return r;
  }
  Guard g;
  const uint32_t mode = g_tracker.mode();
  mi::track::LiveEntry old{};
  if (quiet()) [[unlikely]] {
    // mallocinfo's own block, or (in principle) a block of the node's that
    // the table holds: that one leaves the live set as usual; the new
    // block is mallocinfo's either way.
    const bool had = p != nullptr && mode != MI_MODE_COUNTERS && g_tracker.take(p, &old);
    void* r = g_next.realloc(p, size);
    if (r == nullptr && size != 0) {
      if (had) g_tracker.restore(old);
      return r;
    }
    if (had) g_tracker.freed(fn, &old, 0);
    if (r != nullptr) {
      if (mode == MI_MODE_SAMPLE) {
        if (g_tracker.sample_take(size)) g_tracker.count_self_sampled(size);
      } else {
        g_tracker.count_self(size);
      }
    }
    return r;
  }
  if (mode == MI_MODE_SAMPLE) {
    const bool had =
        p != nullptr && mi::track::Tracker::sampled_address(p) && g_tracker.take(p, &old);
    void* r = g_next.realloc(p, size);
    if (r == nullptr && size != 0) {  // failure: p is untouched and still live
      if (had) g_tracker.restore(old);
      return r;
    }
    if (p != nullptr) g_tracker.freed(fn, had ? &old : nullptr, 0);
    if (r == nullptr || !g_tracker.sample_take(size)) return r;
    bool ok;
    r = place_sampled(r, size, 16, Fill::kCopy, &ok);
    if (ok) g_tracker.on_sampled_alloc(fn, r, size);
    return r;
  }
  const size_t old_usable = next_usable_size(p);
  const bool had = g_tracker.take(p, &old);
  void* r = g_next.realloc(p, size);
  if (r == nullptr && size != 0) {
    // Failure: p is untouched and still live.
    if (had) g_tracker.restore(old);
    g_tracker.count(fn);
    return r;
  }
  if (p != nullptr) g_tracker.freed(fn, had ? &old : nullptr, old_usable);
  if (r == nullptr) {  // realloc(p, 0): glibc frees p
    g_tracker.count(fn);
    return r;
  }
  g_tracker.on_alloc(fn, r, size);
  return r;
}

// An allocation of `size` bytes through `call` (the next allocator's
// function, returning its block, aligned to `align`), in whatever mode the
// tracker is in. `fill`: what a sampled block must hold if it is moved.
template <class Call>
void* tracked_alloc(mi_fn fn, size_t size, size_t align, Fill fill, Call call) {
  if (!tracking()) {
    void* p = call();
    if (nested_count()) g_tracker.count_bytes(true, next_usable_size(p));
    return p;
  }
  Guard g;
  if (quiet()) [[unlikely]] {
    void* p = call();
    if (p == nullptr) return p;
    if (g_tracker.mode() != MI_MODE_SAMPLE)
      g_tracker.count_self(size);
    else if (g_tracker.sample_take(size))  // re-arms the countdown either way
      g_tracker.count_self_sampled(size);
    return p;
  }
  switch (g_tracker.mode()) {
    case MI_MODE_COUNTERS: {
      void* p = call();
      g_tracker.count_alloc(fn, next_usable_size(p));
      return p;
    }
    case MI_MODE_SAMPLE: {
      if (!g_tracker.sample_take(size)) return call();
      bool ok;
      void* p = place_sampled(call(), size, align, fill, &ok);
      if (ok) g_tracker.on_sampled_alloc(fn, p, size);
      return p;
    }
    default: {
      void* p = call();
      g_tracker.on_alloc(fn, p, size);
      return p;
    }
  }
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
  if (tracking() && g_tracker.mode() == MI_MODE_SAMPLE && !quiet()) {
    // A sampled malloc is allocated page-aligned at once, not moved.
    Guard g;
    if (!g_tracker.sample_take(size)) return g_next.malloc(size);
    void* p = nullptr;
    if (g_next.posix_memalign(&p, 4096, size) != 0 || p == nullptr) return g_next.malloc(size);
    g_tracker.on_sampled_alloc(MI_FN_MALLOC, p, size);
    return p;
  }
  return tracked_alloc(MI_FN_MALLOC, size, 16, Fill::kNone, [&] { return g_next.malloc(size); });
}

// Counters mode's free: count, then forward (a tail call). mallocinfo's
// own frees count nothing (there is no table to tell whose block it is,
// and its own blocks were not counted either).
[[gnu::noinline]] void counters_free(void* p) noexcept {
  if (!quiet()) [[likely]]
    g_tracker.count_free(MI_FN_FREE, next_usable_size(p));
  return g_next.free(p);
}

[[gnu::noinline]] void slow_free(void* p) noexcept {
  if (!ready()) [[unlikely]]
    return;  // not reachable with a real pointer: nothing was allocated yet
  if (!tracking()) {
    if (nested_count()) g_tracker.count_bytes(false, next_usable_size(p));
    return g_next.free(p);
  }
  Guard g;
  if (g_tracker.mode() == MI_MODE_COUNTERS) {
    if (!quiet()) g_tracker.count_free(MI_FN_FREE, next_usable_size(p));
  } else {
    g_tracker.on_free(MI_FN_FREE, p, quiet());
  }
  g_next.free(p);
}

[[gnu::noinline]] void* slow_calloc(size_t n, size_t size) noexcept {
  size_t total;
  if (__builtin_mul_overflow(n, size, &total)) {
    // The next calloc says ENOMEM; nothing is allocated, nothing recorded.
    if (!ready()) [[unlikely]] {
      errno = ENOMEM;
      return nullptr;
    }
    if (tracking() && g_tracker.mode() != MI_MODE_SAMPLE && !quiet()) {
      Guard g;
      g_tracker.count_alloc(MI_FN_CALLOC, 0);
    }
    return g_next.calloc(n, size);
  }
  if (!ready()) [[unlikely]]
    return pool_alloc(total, 16);
  return tracked_alloc(MI_FN_CALLOC, total, 16, Fill::kZero,
                       [&] { return g_next.calloc(n, size); });
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
  if (!plain_alignment(align) && tracking() && g_tracker.mode() == MI_MODE_SAMPLE)
    return g_next.posix_memalign(out, align, size);
  int rc = 0;
  void* p = tracked_alloc(MI_FN_POSIX_MEMALIGN, size, align, Fill::kNone, [&]() -> void* {
    void* r = nullptr;
    rc = g_next.posix_memalign(&r, align, size);
    return rc == 0 ? r : nullptr;
  });
  if (rc == 0) *out = p;
  return rc;
}

[[gnu::noinline]] void* slow_aligned_alloc(size_t align, size_t size) noexcept {
  if (!ready()) [[unlikely]]
    return pool_alloc(size, align);
  if (!plain_alignment(align) && tracking() && g_tracker.mode() == MI_MODE_SAMPLE)
    return g_next.aligned_alloc(align, size);
  return tracked_alloc(MI_FN_ALIGNED_ALLOC, size, align, Fill::kNone,
                       [&] { return g_next.aligned_alloc(align, size); });
}

[[gnu::noinline]] void* slow_memalign(size_t align, size_t size) noexcept {
  if (!ready()) [[unlikely]]
    return pool_alloc(size, align);
  if (!plain_alignment(align) && tracking() && g_tracker.mode() == MI_MODE_SAMPLE)
    return g_next.memalign(align, size);
  return tracked_alloc(MI_FN_MEMALIGN, size, align, Fill::kNone,
                       [&] { return g_next.memalign(align, size); });
}

[[gnu::noinline]] void* slow_valloc(size_t size) noexcept {
  if (!ready()) [[unlikely]]
    return pool_alloc(size, page_size());
  return tracked_alloc(MI_FN_VALLOC, size, page_size(), Fill::kNone,
                       [&] { return g_next.valloc(size); });
}

[[gnu::noinline]] void* slow_pvalloc(size_t size) noexcept {
  if (!ready()) [[unlikely]] {
    const size_t ps = page_size();
    return pool_alloc((size + ps - 1) & ~(ps - 1), ps);
  }
  return tracked_alloc(MI_FN_PVALLOC, size, page_size(), Fill::kNone,
                       [&] { return g_next.pvalloc(size); });
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
  if (tracking() && !quiet()) g_tracker.count(MI_FN_STRDUP);
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
  if (tracking() && !quiet()) g_tracker.count(MI_FN_STRNDUP);
  return g_next.strndup(s, n);
}

}  // namespace

using mi::track::Tracker;

// Exported fast paths. [[likely]] marks the pass gate and sample mode's
// unsampled calls: the cases that must cost next to nothing.
// Counters mode's malloc and free stay here too: a call, a usable size
// read, two plain stores. No re-entrancy guard: counting reaches no code
// that allocates but the first pthread_setspecific of a thread, and that
// nested call finds the thread's state already set (acquire_state). The
// tracker's mode is not read again: kGateCounters is only ever stored while
// the tracker is in counters mode (change_mode moves the gate to kGateFull
// before it switches), and a call that raced a switch is counted either way.
MI_EXPORT void* malloc(size_t size) noexcept {
  const int g = gate();
  if (g == kGatePass) [[likely]]
    return g_next.malloc(size);
  if (g == kGateSample && !Tracker::sample_due(size)) [[likely]]
    return g_next.malloc(size);
  if (g == kGateCounters) {
    void* p = g_next.malloc(size);
    if (quiet()) [[unlikely]]
      g_tracker.count_self(size);
    else
      g_tracker.count_alloc(MI_FN_MALLOC, next_usable_size(p));
    return p;
  }
  return slow_malloc(size);
}

MI_EXPORT void free(void* p) noexcept {
  // Blocks from the bootstrap pool were never the next allocator's.
  if (pool_owns(p)) [[unlikely]]
    return;
  const int g = gate();
  if (g == kGatePass) [[likely]]
    return g_next.free(p);
  if (g == kGateSample && !Tracker::sampled_address(p)) [[likely]]
    return g_next.free(p);
  // Out of line: its counting call would otherwise give every free a frame.
  if (g == kGateCounters) return counters_free(p);
  slow_free(p);
}

MI_EXPORT void* calloc(size_t n, size_t size) noexcept {
  const int g = gate();
  if (g == kGatePass) [[likely]]
    return g_next.calloc(n, size);
  // On overflow the wrapped product only moves the countdown; the next
  // calloc fails.
  if (g == kGateSample && !Tracker::sample_due(n * size)) [[likely]]
    return g_next.calloc(n, size);
  return slow_calloc(n, size);
}

MI_EXPORT void* realloc(void* p, size_t size) noexcept {
  if (!pool_owns(p)) [[likely]] {
    const int g = gate();
    if (g == kGatePass) [[likely]]
      return g_next.realloc(p, size);
    if (g == kGateSample && !Tracker::sample_due(size) && p != nullptr &&
        !Tracker::sampled_address(p)) [[likely]]
      return g_next.realloc(p, size);
  }
  return slow_realloc(p, size);
}

MI_EXPORT void* reallocarray(void* p, size_t n, size_t size) noexcept {
  if (!pool_owns(p) && g_next.reallocarray != nullptr) [[likely]] {
    const int g = gate();
    if (g == kGatePass) [[likely]]
      return g_next.reallocarray(p, n, size);
    size_t total;
    if (g == kGateSample && !__builtin_mul_overflow(n, size, &total) &&
        !Tracker::sample_due(total) && p != nullptr && !Tracker::sampled_address(p)) [[likely]]
      return g_next.reallocarray(p, n, size);
  }
  return slow_reallocarray(p, n, size);
}

MI_EXPORT int posix_memalign(void** out, size_t align, size_t size) noexcept {
  const int g = gate();
  if (g == kGatePass) [[likely]]
    return g_next.posix_memalign(out, align, size);
  if (g == kGateSample && !Tracker::sample_due(size)) [[likely]]
    return g_next.posix_memalign(out, align, size);
  return slow_posix_memalign(out, align, size);
}

MI_EXPORT void* aligned_alloc(size_t align, size_t size) noexcept {
  const int g = gate();
  if (g == kGatePass) [[likely]]
    return g_next.aligned_alloc(align, size);
  if (g == kGateSample && !Tracker::sample_due(size)) [[likely]]
    return g_next.aligned_alloc(align, size);
  return slow_aligned_alloc(align, size);
}

MI_EXPORT void* memalign(size_t align, size_t size) noexcept {
  const int g = gate();
  if (g == kGatePass) [[likely]]
    return g_next.memalign(align, size);
  if (g == kGateSample && !Tracker::sample_due(size)) [[likely]]
    return g_next.memalign(align, size);
  return slow_memalign(align, size);
}

MI_EXPORT void* valloc(size_t size) noexcept {
  const int g = gate();
  if (g == kGatePass) [[likely]]
    return g_next.valloc(size);
  if (g == kGateSample && !Tracker::sample_due(size)) [[likely]]
    return g_next.valloc(size);
  return slow_valloc(size);
}

MI_EXPORT void* pvalloc(size_t size) noexcept {
  const int g = gate();
  if (g == kGatePass) [[likely]]
    return g_next.pvalloc(size);
  if (g == kGateSample && !Tracker::sample_due(size)) [[likely]]
    return g_next.pvalloc(size);
  return slow_pvalloc(size);
}

// Sample mode does not count strdup/strndup (the malloc they make is
// sampled like any other).
MI_EXPORT char* strdup(const char* s) noexcept {
  const int g = gate();
  if (g == kGatePass || g == kGateSample) [[likely]]
    return g_next.strdup(s);
  return slow_strdup(s);
}

MI_EXPORT char* strndup(const char* s, size_t n) noexcept {
  const int g = gate();
  if (g == kGatePass || g == kGateSample) [[likely]]
    return g_next.strndup(s, n);
  return slow_strndup(s, n);
}
