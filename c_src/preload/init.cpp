// Start-up of the interposer: resolve the next allocator, read the
// environment without malloc, decide whether this executable records, and
// map the tracker's tables. Runs inside the first malloc call.
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "../common/mi_limits.h"
#include "glob.h"
#include "map_runtime.h"
#include "runtime.h"

extern char** environ;
// Linker-provided bounds of this object's image: the hooks' and tracker's
// own frames lie in [__ehdr_start, etext) and are cut from captured stacks.
extern "C" char __ehdr_start;
extern "C" char etext;

namespace mi::preload {

constinit Next g_next{};
constinit std::atomic<int> g_state{kUninit};
constinit std::atomic<int> g_gate{kGateInit};
alignas(64) char g_pool[kPoolBytes];
constinit bool g_recording = false;
constinit bool g_glibc_chunks = false;
constinit mi::track::Tracker g_tracker;
__thread bool t_in_hook = false;
__thread uint32_t t_quiet = 0;

namespace {

// --- bootstrap pool ---------------------------------------------------------
std::atomic<size_t> g_pool_used{0};

// --- environment, read without malloc --------------------------------------
const char* env_find(const char* name) {
  const size_t len = std::strlen(name);
  for (char** e = environ; e != nullptr && *e != nullptr; ++e)
    if (std::strncmp(*e, name, len) == 0 && (*e)[len] == '=') return *e + len + 1;
  return nullptr;
}

// "4096", "512k", "64M", "1g": a byte count or an entry count. 0 when the
// text is not a number (the caller keeps its default).
uint64_t parse_count(const char* s) {
  if (s == nullptr || *s < '0' || *s > '9') return 0;
  uint64_t v = 0;
  for (; *s >= '0' && *s <= '9'; ++s) {
    if (v > UINT64_MAX / 10) return 0;
    v = v * 10 + static_cast<uint64_t>(*s - '0');
  }
  uint64_t mult = 1;
  switch (*s) {
    case 'k':
    case 'K':
      mult = uint64_t{1} << 10;
      ++s;
      break;
    case 'm':
    case 'M':
      mult = uint64_t{1} << 20;
      ++s;
      break;
    case 'g':
    case 'G':
      mult = uint64_t{1} << 30;
      ++s;
      break;
    default:
      break;
  }
  if (*s != '\0' || v > UINT64_MAX / mult) return 0;
  return v * mult;
}

void warn(const char* what, const char* value) {
  // stderr through write(2): no stdio buffers, no malloc.
  const char* parts[] = {"mallocinfo: ignoring ", what, "=", value, "\n"};
  for (const char* p : parts) {
    const ssize_t n = ::write(2, p, std::strlen(p));
    (void)n;
  }
}

bool parse_mode(const char* s, uint32_t* mode) {
  if (std::strcmp(s, "full") == 0)
    *mode = MI_MODE_FULL;
  else if (std::strcmp(s, "sample") == 0)
    *mode = MI_MODE_SAMPLE;
  else if (std::strcmp(s, "counters") == 0)
    *mode = MI_MODE_COUNTERS;
  else if (std::strcmp(s, "off") == 0)
    *mode = MI_MODE_OFF;
  else
    return false;
  return true;
}

// Base name of this process's executable (readlink: a system call, no
// malloc). Empty when /proc is unavailable.
void exe_basename(char* out, size_t cap) {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  out[0] = '\0';
  if (n <= 0) return;
  path[n] = '\0';
  const char* base = std::strrchr(path, '/');
  base = base != nullptr ? base + 1 : path;
  size_t i = 0;
  for (; base[i] != '\0' && i + 1 < cap; ++i) out[i] = base[i];
  out[i] = '\0';
}

template <class F>
void resolve(F*& slot, const char* name) {
  slot = reinterpret_cast<F*>(::dlsym(RTLD_NEXT, name));
}

void resolve_next() {
  resolve(g_next.malloc, "malloc");
  resolve(g_next.free, "free");
  resolve(g_next.calloc, "calloc");
  resolve(g_next.realloc, "realloc");
  resolve(g_next.reallocarray, "reallocarray");
  resolve(g_next.posix_memalign, "posix_memalign");
  resolve(g_next.aligned_alloc, "aligned_alloc");
  resolve(g_next.memalign, "memalign");
  resolve(g_next.valloc, "valloc");
  resolve(g_next.pvalloc, "pvalloc");
  resolve(g_next.strdup, "strdup");
  resolve(g_next.strndup, "strndup");
  resolve(g_next.malloc_usable_size, "malloc_usable_size");
}

// Whether glibc_usable_size() agrees with the next allocator's own
// malloc_usable_size: the next malloc must be libc's, and the two must agree
// on heap blocks of every kind (tiny, small, large, memaligned). Only sizes
// under glibc's default mmap threshold (128 KiB): freeing an mmapped block
// raises glibc's dynamic threshold to its size, and a check that did so
// would change how every preloaded process allocates from then on (blocks
// of 128 KiB..4 MiB would come from the arenas instead of mmap). Mmapped
// chunks are not read inline (next_usable_size asks glibc for them).
bool check_glibc_chunks() {
  if (g_next.malloc_usable_size == nullptr || g_next.malloc == nullptr ||
      g_next.memalign == nullptr)
    return false;
  // _dl_find_object, not dladdr: it takes no loader lock (this runs inside
  // the process's first malloc, whoever holds that lock).
  dl_find_object obj{};
  if (::_dl_find_object(reinterpret_cast<void*>(g_next.malloc), &obj) != 0 ||
      obj.dlfo_link_map == nullptr || obj.dlfo_link_map->l_name == nullptr)
    return false;
  const char* name = obj.dlfo_link_map->l_name;
  const char* base = std::strrchr(name, '/');
  base = base != nullptr ? base + 1 : name;
  if (std::strncmp(base, "libc.so", 7) != 0) return false;
  bool same = true;
  for (const size_t n : {size_t{0}, size_t{1}, size_t{24}, size_t{25}, size_t{100}, size_t{1000},
                         size_t{5000}, size_t{100000}}) {
    void* a = g_next.malloc(n);
    void* b = g_next.memalign(4096, n);
    if (a != nullptr) same = same && glibc_usable_size(a) == g_next.malloc_usable_size(a);
    if (b != nullptr) same = same && glibc_usable_size(b) == g_next.malloc_usable_size(b);
    g_next.free(a);
    g_next.free(b);
  }
  return same;
}

size_t usable_size_fn(void* p) {
  return next_usable_size(p);
}

void configure() {
  const char* pattern = env_find("MALLOCINFO_TRACE_EXE");
  if (pattern == nullptr || *pattern == '\0') pattern = "beam*";
  char exe[256];
  exe_basename(exe, sizeof exe);
  if (!glob_match(pattern, exe)) return;

  mi::track::Config config;
  if (const char* m = env_find("MALLOCINFO_TRACE"); m != nullptr && !parse_mode(m, &config.mode))
    warn("MALLOCINFO_TRACE", m);
  struct Knob {
    const mi::limits::Knob& spec;
    uint64_t* out;
  };
  uint64_t table = config.table_capacity, stacks = config.stack_capacity,
           depth = config.stack_depth, sample = config.sample_bytes;
  const Knob knobs[] = {
      {mi::limits::kTableSize, &table},
      {mi::limits::kStackTableSize, &stacks},
      {mi::limits::kStackDepth, &depth},
      {mi::limits::kSampleBytes, &sample},
  };
  for (const Knob& k : knobs) {
    const char* v = env_find(k.spec.env);
    if (v == nullptr) continue;
    const uint64_t n = parse_count(v);
    if (k.spec.valid(n))
      *k.out = n;
    else
      warn(k.spec.env, v);
  }
  config.table_capacity = table;
  config.stack_capacity = stacks;
  config.stack_depth = static_cast<unsigned>(depth);
  config.sample_bytes = sample;
  // One unwinder: libunwind (the former MALLOCINFO_UNWIND=libunwind) takes
  // locks a hook's caller may hold, so it is never called from a hook;
  // "libunwind" is now an unknown value like any other.
  if (const char* u = env_find("MALLOCINFO_UNWIND"); u != nullptr && std::strcmp(u, "cached") != 0)
    warn("MALLOCINFO_UNWIND", u);
  if (!g_tracker.init(config, mi::track::capture_cached, mi::track::coarse_monotonic_ns)) return;
  g_tracker.set_self_range(reinterpret_cast<uintptr_t>(&__ehdr_start),
                           reinterpret_cast<uintptr_t>(&etext));
  g_glibc_chunks = check_glibc_chunks();
  if (g_glibc_chunks || g_next.malloc_usable_size != nullptr)
    g_tracker.set_usable_size(usable_size_fn);
  g_recording = true;
}

}  // namespace

bool ensure_init() {
  int s = g_state.load(std::memory_order_acquire);
  if (s == kReady) return true;
  if (s == kUninit &&
      g_state.compare_exchange_strong(s, kInitializing, std::memory_order_acq_rel)) {
    const bool outer = t_in_hook;
    t_in_hook = true;
    resolve_next();
    map_resolve_next();
    configure();
    if (g_recording) map_init();
    t_in_hook = outer;
    g_state.store(kReady, std::memory_order_release);
    update_gate();
    return true;
  }
  return false;
}

void* pool_alloc(size_t size, size_t align) {
  // A 16-byte header in front of each block holds its size (for realloc).
  // Alignment applies to the absolute address, rounded up to a power of two
  // as glibc's memalign does.
  if (align < 16) align = 16;
  if ((align & (align - 1)) != 0) align = size_t{1} << (64 - __builtin_clzll(align));
  const uintptr_t base = reinterpret_cast<uintptr_t>(g_pool);
  size_t used = g_pool_used.load(std::memory_order_relaxed);
  for (;;) {
    const uintptr_t start = (base + used + 16 + align - 1) & ~(uintptr_t{align} - 1);
    const size_t end = start - base + size;
    if (end > kPoolBytes || end < start - base) {
      errno = ENOMEM;
      return nullptr;
    }
    if (g_pool_used.compare_exchange_weak(used, end, std::memory_order_relaxed)) {
      std::memcpy(reinterpret_cast<char*>(start) - sizeof(size_t), &size, sizeof(size_t));
      return reinterpret_cast<void*>(start);
    }
  }
}

void update_gate() {
  int gate = kGatePass;
  if (g_recording) {
    switch (g_tracker.mode()) {
      case MI_MODE_FULL:
        gate = kGateFull;
        break;
      case MI_MODE_SAMPLE:
        gate = kGateSample;
        break;
      case MI_MODE_COUNTERS:
        gate = kGateCounters;
        break;
      default:
        break;
    }
  }
  g_gate.store(gate, std::memory_order_release);
}

namespace {
// Serialises mode changes (never taken in a hook): the mode, the table and
// the gate change together.
pthread_mutex_t g_mode_lock = PTHREAD_MUTEX_INITIALIZER;
}  // namespace

bool change_mode(uint32_t mode) {
  ::pthread_mutex_lock(&g_mode_lock);
  const uint32_t before = g_tracker.mode();
  // While the mode changes every call takes the slow path, which reads the
  // tracker's own mode: no call is handled by the fast path of the mode
  // being left (sample mode's would skip a free recorded by full mode).
  if (g_recording && mode <= MI_MODE_FULL) g_gate.store(kGateFull, std::memory_order_seq_cst);
  const bool ok = g_tracker.set_mode(mode);
  // Leaving off: an allocation that raced the switch to off may have been
  // recorded after the table was cleared, and its free was not seen.
  if (ok && before == MI_MODE_OFF && mode != MI_MODE_OFF) g_tracker.reset();
  // Regions too: munmaps are not seen while off (map_hooks.cpp).
  if (ok && (mode == MI_MODE_OFF || before == MI_MODE_OFF)) map_forget_all();
  update_gate();
  ::pthread_mutex_unlock(&g_mode_lock);
  return ok;
}

bool start_attached(const Next& next, const mi::track::Config& config) {
  // Nothing calls the hooks yet (no slot is patched), but an ABI query may
  // be running the ordinary start-up: let it finish, then override what it
  // resolved (dlsym(RTLD_NEXT) from a dlopen()ed library is not what the
  // process binds to).
  int s = kUninit;
  if (!g_state.compare_exchange_strong(s, kInitializing, std::memory_order_acq_rel))
    while (g_state.load(std::memory_order_acquire) != kReady) ::sched_yield();
  g_next = next;
  // The patched slots do not include malloc_usable_size (not interposed):
  // take the one the process binds to, so attached byte counters count
  // usable bytes as preloaded ones do (and cost the same).
  if (g_next.malloc_usable_size == nullptr)
    g_next.malloc_usable_size =
        reinterpret_cast<size_t (*)(void*)>(::dlsym(RTLD_DEFAULT, "malloc_usable_size"));
  bool ok = true;
  if (!g_recording) {
    ok = g_tracker.init(config, mi::track::capture_cached, mi::track::coarse_monotonic_ns);
    if (ok) {
      g_tracker.set_self_range(reinterpret_cast<uintptr_t>(&__ehdr_start),
                               reinterpret_cast<uintptr_t>(&etext));
      g_glibc_chunks = check_glibc_chunks();
      if (g_glibc_chunks || g_next.malloc_usable_size != nullptr)
        g_tracker.set_usable_size(usable_size_fn);
      g_recording = true;
      map_init();
    }
  } else {
    map_forget_all();
    ::pthread_mutex_lock(&g_mode_lock);
    g_tracker.reset();
    g_tracker.set_mode(config.mode);
    ::pthread_mutex_unlock(&g_mode_lock);
  }
  g_state.store(kReady, std::memory_order_release);
  update_gate();
  return ok;
}

size_t pool_size_of(const void* p) {
  size_t n;
  std::memcpy(&n, static_cast<const char*>(p) - sizeof(size_t), sizeof(size_t));
  return n;
}

}  // namespace mi::preload
