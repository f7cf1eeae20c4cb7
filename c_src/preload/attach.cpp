// Attach without LD_PRELOAD: this library, dlopen()ed (RTLD_LOCAL) into a
// running process, redirects the malloc family of every loaded object to
// its hooks by rewriting the words the dynamic linker filled in (PLT and
// GOT slots, absolute data pointers), and redirects dlopen the same way so
// that objects loaded later are patched too. Detach writes the original
// values back. The library is never unloaded (-z nodelete): a thread may
// still be inside a hook it reached through a slot read before detach.
//
// Not a hook: runs on the caller's thread (a dirty scheduler in the VM),
// takes g_attach_lock and, inside it, the loader's list lock through
// dl_iterate_phdr. Lock order, and why it cannot deadlock:
//  - everything that takes the loader's main lock (dlsym, dladdr, dlopen)
//    is done before g_attach_lock is taken, never under it;
//  - the dlopen hook calls the real dlopen with no lock of ours held, and
//    takes g_attach_lock only after it returned. If it runs nested in a
//    constructor (main loader lock held by this thread), the attach lock's
//    holder never waits for that lock.
#include <dlfcn.h>
#include <errno.h>
#include <gnu/libc-version.h>
#include <link.h>
#include <pthread.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "../common/mi_abi.h"
#include "attach.h"
#include "elf_relocs.h"
#include "map_runtime.h"
#include "runtime.h"

extern "C" char __ehdr_start;

namespace mi::preload {
namespace {

// Indexes 0..MI_FN_COUNT-1 follow enum mi_fn; dlopen comes next, then the
// mmap family (issue 14: an attached node sees mappings too).
constexpr size_t kDlopen = MI_FN_COUNT;
constexpr size_t kMmap = MI_FN_COUNT + 1;
constexpr size_t kMmap64 = MI_FN_COUNT + 2;
constexpr size_t kMunmap = MI_FN_COUNT + 3;
constexpr size_t kMremap = MI_FN_COUNT + 4;
constexpr size_t kNames = MI_FN_COUNT + 5;
const char* const kName[kNames] = {
    "malloc",        "calloc",   "realloc", "reallocarray", "free",   "posix_memalign",
    "aligned_alloc", "memalign", "valloc",  "pvalloc",      "strdup", "strndup",
    "dlopen",        "mmap",     "mmap64",  "munmap",       "mremap",
};

// Original value of every slot this library wrote, by address, so detach
// restores a lazy PLT slot to its resolver stub and not to the resolved
// function. A slot patched again (an object unloaded and another loaded at
// the same address) overwrites its record.
struct SlotRecord {
  uintptr_t address;
  uintptr_t original;
};
constexpr size_t kMaxSlots = 1 << 15;
SlotRecord g_records[kMaxSlots];
size_t g_nrecords = 0;

pthread_mutex_t g_attach_lock = PTHREAD_MUTEX_INITIALIZER;
std::atomic<bool> g_attached{false};

// A fork while another thread holds g_attach_lock (attaching, or patching
// after a dlopen) would leave it locked forever in the child, whose first
// dlopen through a patched slot would then hang. The child gets a fresh
// lock instead (registered once, at the first attach). Its slots are each
// either patched or original, both valid; a walk cut short by the fork
// only leaves some slots unpatched.
//
// The loader's list lock is the same hazard, and not ours to reset: any
// parent thread may have held it at fork() (an attach or detach walk,
// another dlopen hook, the symbolizer's rescan, an unwinder), and glibc
// resets only its main loader lock in the child. A child cannot tell
// whether it is held (no try-lock), and walking the objects another way
// (the link map of the handle dlopen returned, then each new object's
// program headers through dladdr) would still read loader lists the lock
// guards. So a forked child never walks again: its dlopen hook is the
// real dlopen and nothing more. What the child loads later stays
// unpatched; its calls go straight to the allocator, which is safe (the
// hooks add no header to a block), and nothing reads a child's tracker:
// the NIF and the schedulers that would ask did not fork with it.
std::atomic<bool> g_forked_child{false};

void child_after_fork() {
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  std::memcpy(&g_attach_lock, &fresh, sizeof fresh);
  g_forked_child.store(true, std::memory_order_relaxed);
}
std::atomic<bool> g_atfork_registered{false};

// Resolved before g_attach_lock (dlsym/dladdr take the loader lock), then
// read under it. g_hook: this library's functions; g_target: what the
// process binds each name to (glibc, or jemalloc/tcmalloc when preloaded).
uintptr_t g_hook[kNames];
uintptr_t g_target[kNames];
// Objects never patched: libc, ld.so, the vdso, this library. One address
// inside each.
uintptr_t g_skip[4];

// What attach_status() reports. Written under g_attach_lock, read without
// it (status is a cheap query that must not wait for an attach walking
// every object): each field is one atomic word, so a reader racing an
// attach may mix fields of before and after, never tear one.
struct Published {
  std::atomic<uint32_t> attached{0}, ever{0};
  std::atomic<uint64_t> attached_at_unix_ns{0}, attached_at_ns{0}, objects{0}, slots{0},
      slots_foreign{0}, data_pointers{0}, attach_ns{0};
};
Published g_status;

uintptr_t word_at(uintptr_t address) {
  return __atomic_load_n(reinterpret_cast<uintptr_t*>(address), __ATOMIC_ACQUIRE);
}

// --- what to do with one slot -----------------------------------------------

enum class Action { kLeave, kPatch, kForeign };

Action classify(const LoadedObject& obj, const RelocSlot& s, uintptr_t value) {
  // An allocator's references to its own functions (jemalloc's, libc's)
  // are its business.
  if (s.defined_here || value == 0) return Action::kLeave;
  if (value == g_hook[s.name_index]) return Action::kLeave;  // patched already
  if (value == g_target[s.name_index]) return Action::kPatch;
  // A lazy PLT slot not called yet holds its own PLT stub; the hook
  // forwards to the target the resolver would have found.
  if (s.kind == SlotKind::kJumpSlot && object_contains(obj, value)) return Action::kPatch;
  // dlopen may be bound to libdl's compatibility wrapper: any dlopen does.
  if (s.name_index == kDlopen && s.kind != SlotKind::kAbs64) return Action::kPatch;
  // Bound elsewhere (RTLD_DEEPBIND, an object still being relocated by a
  // dlopen on another thread) or a data word the program has rewritten:
  // leave it. Nothing it allocates reaches our free and vice versa.
  return Action::kForeign;
}

// One aligned 8-byte store. A thread calling through the slot loads it
// with one 8-byte load, so it sees either the old target or the new one,
// both valid functions with the same contract: no lock or stop-the-world
// is needed. RELRO pages are made writable around the store; nothing else
// writes them after load, so restoring PROT_READ is exact.
// Tests only: MALLOCINFO_ATTACH_FAIL_AFTER=N makes the N+1-th store of an
// attach fail with EACCES, so that the restore of a failed attach is
// tested on real slots. Read at each attach; -1: off.
long g_fail_after = -1;

int store_slot(const LoadedObject& obj, uintptr_t address, uintptr_t value, size_t page) {
  if (g_fail_after == 0) return EACCES;
  if (g_fail_after > 0) --g_fail_after;
  const SlotAccess access = slot_access(obj, address, page);
  if (access == SlotAccess::kReadOnly) return EACCES;
  void* const pg = reinterpret_cast<void*>(address & ~(page - 1));
  if (access == SlotAccess::kRelro && ::mprotect(pg, page, PROT_READ | PROT_WRITE) != 0)
    return errno;
  __atomic_store_n(reinterpret_cast<uintptr_t*>(address), value, __ATOMIC_RELEASE);
  if (access == SlotAccess::kRelro) ::mprotect(pg, page, PROT_READ);
  return 0;
}

void record(uintptr_t address, uintptr_t original) {
  for (size_t i = 0; i < g_nrecords; ++i)
    if (g_records[i].address == address) {
      g_records[i].original = original;
      return;
    }
  g_records[g_nrecords++] = SlotRecord{address, original};
}

uintptr_t recorded(uintptr_t address, size_t name_index) {
  for (size_t i = 0; i < g_nrecords; ++i)
    if (g_records[i].address == address) return g_records[i].original;
  return g_target[name_index];
}

// --- walking every loaded object --------------------------------------------

enum class Pass { kCheck, kPatch, kRestore };

struct Walk {
  Pass pass;
  size_t page;
  bool first = true;
  // Outcome: the first failure stops the walk's writes.
  int err = 0;
  const char* unsupported = nullptr;
  char object[sizeof(mi_attach_result::object)] = {};
  // Counts of this walk: slots written, left alone, data words written,
  // objects written to, slots a check would patch.
  size_t patched = 0, foreign = 0, data = 0, objects = 0, pending = 0;
  // What holds a hook once the walk is done (written now or before, or
  // not restored): status() reports these, so an object unloaded since
  // is no longer counted.
  size_t hooked = 0, hooked_data = 0, hooked_objects = 0;
  // Current object.
  const LoadedObject* obj = nullptr;
  bool obj_touched = false, obj_hooked = false;
};

void fail(Walk& w, const char* what, const char* object) {
  if (w.unsupported != nullptr || w.err != 0) return;
  w.unsupported = what;
  std::strncpy(w.object, object, sizeof w.object - 1);
}

bool skipped(const LoadedObject& obj) {
  for (uintptr_t a : g_skip)
    if (a != 0 && object_contains(obj, a)) return true;
  return false;
}

void count_hooked(Walk& w, const RelocSlot& s) {
  ++w.hooked;
  if (s.kind == SlotKind::kAbs64) ++w.hooked_data;
  w.obj_hooked = true;
}

void on_slot(void* ctx, const RelocSlot& s) {
  Walk& w = *static_cast<Walk*>(ctx);
  if (w.err != 0 || w.unsupported != nullptr) return;
  const uintptr_t value = word_at(s.address);
  const bool hooked = !s.defined_here && value == g_hook[s.name_index];
  if (w.pass == Pass::kRestore) {
    if (!hooked) return;
    // A failed store leaves the hook in place: harmless, it forwards.
    if (store_slot(*w.obj, s.address, recorded(s.address, s.name_index), w.page) == 0)
      ++w.patched;
    else
      count_hooked(w, s);
    return;
  }
  if (hooked) {
    count_hooked(w, s);
    return;
  }
  const Action a = classify(*w.obj, s, value);
  if (a == Action::kForeign) {
    ++w.foreign;
    return;
  }
  if (a != Action::kPatch) return;
  if (slot_access(*w.obj, s.address, w.page) == SlotAccess::kReadOnly) {
    ++w.foreign;
    return;
  }
  if (w.pass == Pass::kCheck) {
    ++w.pending;
    if (w.pending > kMaxSlots) fail(w, "too_many_slots", w.obj->name);
    return;
  }
  if (g_nrecords == kMaxSlots) {
    fail(w, "too_many_slots", w.obj->name);
    return;
  }
  if (const int e = store_slot(*w.obj, s.address, g_hook[s.name_index], w.page); e != 0) {
    w.err = e;
    std::strncpy(w.object, w.obj->name, sizeof w.object - 1);
    return;
  }
  record(s.address, value);
  ++w.patched;
  if (s.kind == SlotKind::kAbs64) ++w.data;
  w.obj_touched = true;
  count_hooked(w, s);
}

// Runs inside dl_iterate_phdr, with the loader's list lock held: no malloc
// (the walker and the stores use none). The stores happen here, not after
// the walk, because the lock is what keeps the object mapped: once it is
// released another thread may dlclose it.
int on_object(dl_phdr_info* info, size_t, void* ctx) {
  Walk& w = *static_cast<Walk*>(ctx);
  const LoadedObject obj = loaded_object(*info);
  const bool main_exe = w.first;
  w.first = false;
  if (main_exe && w.pass == Pass::kCheck && object_contains(obj, g_target[MI_FN_MALLOC])) {
    // The executable has its own malloc: its calls to it are not
    // relocated, so most of its allocations could not be seen.
    fail(w, "static_allocator", "");
    return 1;
  }
  if (skipped(obj)) return 0;
  w.obj = &obj;
  w.obj_touched = w.obj_hooked = false;
  const ElfWalk r = find_reloc_slots(obj, kName, kNames, on_slot, &w);
  if (r == ElfWalk::kUnknownLayout && w.pass == Pass::kCheck) fail(w, "elf_layout", obj.name);
  if (w.obj_touched) ++w.objects;
  if (w.obj_hooked) ++w.hooked_objects;
  w.obj = nullptr;
  return w.err != 0 || w.unsupported != nullptr ? 1 : 0;
}

Walk walk(Pass pass) {
  Walk w;
  w.pass = pass;
  w.page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  ::dl_iterate_phdr(on_object, &w);
  return w;
}

// What holds a hook now, after a walk that visited every loaded object
// (under g_attach_lock). Counted afresh by each walk rather than added up,
// so an object unloaded since the last walk drops out at the next.
void publish_hooked(const Walk& w) {
  g_status.objects.store(w.hooked_objects, std::memory_order_relaxed);
  g_status.slots.store(w.hooked, std::memory_order_relaxed);
  g_status.data_pointers.store(w.hooked_data, std::memory_order_relaxed);
}

// --- dlopen redirection -----------------------------------------------------

void* hook_dlopen(const char* file, int flags) {
  using Fn = void* (*)(const char*, int);
  // No lock of ours across the real dlopen: the loader takes its own, and
  // constructors it runs may allocate or dlopen in turn.
  void* h = reinterpret_cast<Fn>(g_target[kDlopen])(file, flags);
  // Not in a forked child: see child_after_fork().
  if (h != nullptr && g_attached.load(std::memory_order_acquire) &&
      !g_forked_child.load(std::memory_order_relaxed)) {
    const int saved = errno;
    ::pthread_mutex_lock(&g_attach_lock);
    if (g_attached.load(std::memory_order_relaxed)) {
      const Walk w = walk(Pass::kPatch);
      publish_hooked(w);
      g_status.slots_foreign.store(w.foreign, std::memory_order_relaxed);
    }
    ::pthread_mutex_unlock(&g_attach_lock);
    errno = saved;
  }
  return h;
}

// --- resolution, before any lock --------------------------------------------

// The hooks are this library's exported malloc & co. `&malloc` written here
// would go through our own GOT and give the process's malloc (the library
// is RTLD_LOCAL), so ask the loader for this object's definitions.
bool resolve(mi_attach_result* out) {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&hook_dlopen), &info) == 0 || info.dli_fname == nullptr) {
    std::strcpy(out->what, "elf_layout");
    return false;
  }
  void* self = ::dlopen(info.dli_fname, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (self == nullptr) {
    std::strcpy(out->what, "elf_layout");
    return false;
  }
  for (size_t i = 0; i < kNames; ++i) {
    if (i == kDlopen) continue;
    g_hook[i] = reinterpret_cast<uintptr_t>(::dlsym(self, kName[i]));
    g_target[i] = reinterpret_cast<uintptr_t>(::dlsym(RTLD_DEFAULT, kName[i]));
  }
  g_hook[kDlopen] = reinterpret_cast<uintptr_t>(&hook_dlopen);
  g_target[kDlopen] = reinterpret_cast<uintptr_t>(::dlsym(RTLD_DEFAULT, "dlopen"));
  ::dlclose(self);
  g_skip[0] = reinterpret_cast<uintptr_t>(::dlsym(RTLD_DEFAULT, "gnu_get_libc_version"));
  g_skip[1] = ::getauxval(AT_BASE);
  g_skip[2] = ::getauxval(AT_SYSINFO_EHDR);
  g_skip[3] = reinterpret_cast<uintptr_t>(&__ehdr_start);
  if (g_skip[0] == 0) {
    std::strcpy(out->what, "libc");
    return false;
  }
  for (size_t i = 0; i < kNames; ++i) {
    // reallocarray may be missing from an old libc; everything else must be.
    if (i == MI_FN_REALLOCARRAY && g_target[i] == 0) continue;
    if (g_hook[i] == 0 || g_target[i] == 0) {
      std::strcpy(out->what, "libc");
      return false;
    }
  }
  return true;
}

Next next_from_targets() {
  Next n{};
  auto set = []<class F>(F*& field, size_t i) { field = reinterpret_cast<F*>(g_target[i]); };
  set(n.malloc, MI_FN_MALLOC);
  set(n.free, MI_FN_FREE);
  set(n.calloc, MI_FN_CALLOC);
  set(n.realloc, MI_FN_REALLOC);
  set(n.reallocarray, MI_FN_REALLOCARRAY);
  set(n.posix_memalign, MI_FN_POSIX_MEMALIGN);
  set(n.aligned_alloc, MI_FN_ALIGNED_ALLOC);
  set(n.memalign, MI_FN_MEMALIGN);
  set(n.valloc, MI_FN_VALLOC);
  set(n.pvalloc, MI_FN_PVALLOC);
  set(n.strdup, MI_FN_STRDUP);
  set(n.strndup, MI_FN_STRNDUP);
  return n;
}

MapNext map_next_from_targets() {
  MapNext n{};
  auto set = []<class F>(F*& field, size_t i) { field = reinterpret_cast<F*>(g_target[i]); };
  set(n.mmap, kMmap);
  set(n.mmap64, kMmap64);
  set(n.munmap, kMunmap);
  set(n.mremap, kMremap);
  return n;
}

uint64_t clock_ns(clockid_t id) {
  timespec ts{};
  ::clock_gettime(id, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

void do_attach(const mi_attach_config& cfg, mi_attach_result* out) {
#if !defined(__x86_64__)
  out->rc = MI_ATTACH_UNSUPPORTED;
  std::strcpy(out->what, "arch");
  return;
#endif
  const uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
  if (!resolve(out)) {
    out->rc = MI_ATTACH_UNSUPPORTED;
    return;
  }
  // The process binds malloc to us: we are preloaded (dlsym(RTLD_DEFAULT)
  // from here searches the global scope first, where a dlopen()ed
  // RTLD_LOCAL library is not).
  if (g_target[MI_FN_MALLOC] == g_hook[MI_FN_MALLOC]) {
    out->rc = MI_ATTACH_PRELOADED;
    return;
  }
  if (!g_atfork_registered.exchange(true)) ::pthread_atfork(nullptr, nullptr, child_after_fork);
  ::pthread_mutex_lock(&g_attach_lock);
  if (g_attached.load(std::memory_order_relaxed)) {
    ::pthread_mutex_unlock(&g_attach_lock);
    out->rc = MI_ATTACH_ALREADY;
    return;
  }
  // Check every object first: an unsupported layout is found before
  // anything is written.
  if (const Walk check = walk(Pass::kCheck); check.unsupported != nullptr) {
    ::pthread_mutex_unlock(&g_attach_lock);
    out->rc = MI_ATTACH_UNSUPPORTED;
    std::strncpy(out->what, check.unsupported, sizeof out->what - 1);
    std::memcpy(out->object, check.object, sizeof out->object);
    return;
  }
  mi::track::Config config;
  config.mode = cfg.mode;
  config.stack_depth = cfg.stack_depth;
  config.table_capacity = cfg.table_capacity;
  config.stack_capacity = cfg.stack_capacity;
  config.sample_bytes = cfg.sample_bytes;
  map_set_next(map_next_from_targets());
  if (!start_attached(next_from_targets(), config)) {
    ::pthread_mutex_unlock(&g_attach_lock);
    out->rc = MI_ATTACH_ERRNO;
    out->err = ENOMEM;
    return;
  }
  g_nrecords = 0;
  const char* fail_after = ::secure_getenv("MALLOCINFO_ATTACH_FAIL_AFTER");
  g_fail_after = fail_after != nullptr ? std::strtol(fail_after, nullptr, 10) : -1;
  // Set before patching: a dlopen reached through a slot patched a moment
  // ago must patch what it loaded (it waits for this lock).
  g_attached.store(true, std::memory_order_release);
  const Walk w = walk(Pass::kPatch);
  if (w.err != 0 || w.unsupported != nullptr) {
    g_fail_after = -1;
    walk(Pass::kRestore);
    g_attached.store(false, std::memory_order_release);
    ::pthread_mutex_unlock(&g_attach_lock);
    if (w.err != 0) {
      out->rc = MI_ATTACH_ERRNO;
      out->err = w.err;
    } else {
      out->rc = MI_ATTACH_UNSUPPORTED;
      std::strncpy(out->what, w.unsupported, sizeof out->what - 1);
    }
    std::memcpy(out->object, w.object, sizeof out->object);
    return;
  }
  g_fail_after = -1;
  constexpr auto rl = std::memory_order_relaxed;
  g_status.attached_at_unix_ns.store(clock_ns(CLOCK_REALTIME), rl);
  g_status.attached_at_ns.store(mi::track::coarse_monotonic_ns(), rl);
  publish_hooked(w);
  g_status.slots_foreign.store(w.foreign, rl);
  g_status.attach_ns.store(clock_ns(CLOCK_MONOTONIC) - t0, rl);
  g_status.ever.store(1, rl);
  g_status.attached.store(1, std::memory_order_release);
  ::pthread_mutex_unlock(&g_attach_lock);
  out->rc = MI_ATTACH_OK;
}

}  // namespace

void abi_attach(const mi_attach_config* config, size_t config_size, mi_attach_result* out,
                size_t out_size) {
  mi_attach_result r{};
  mi_attach_config cfg{};
  std::memcpy(&cfg, config, config_size < sizeof cfg ? config_size : sizeof cfg);
  do_attach(cfg, &r);
  std::memcpy(out, &r, out_size < sizeof r ? out_size : sizeof r);
}

int abi_detach() {
  ::pthread_mutex_lock(&g_attach_lock);
  if (!g_attached.load(std::memory_order_relaxed)) {
    ::pthread_mutex_unlock(&g_attach_lock);
    return -1;
  }
  g_attached.store(false, std::memory_order_release);
  const Walk w = walk(Pass::kRestore);
  // Slots that could not be restored (mprotect refused) keep the hook,
  // which forwards: they stay counted.
  publish_hooked(w);
  g_status.attached.store(0, std::memory_order_release);
  // Nothing is recorded from now on, and frees no longer reach the table:
  // what it holds would go stale. Switch off (the table's pages go back);
  // the next attach() starts afresh.
  change_mode(MI_MODE_OFF);
  ::pthread_mutex_unlock(&g_attach_lock);
  return 0;
}

bool detached() {
  return g_status.ever.load(std::memory_order_relaxed) != 0 &&
         g_status.attached.load(std::memory_order_acquire) == 0;
}

void abi_attach_status(mi_attach_status* out, size_t out_size) {
  constexpr auto rl = std::memory_order_relaxed;
  mi_attach_status s{};
  s.attached = g_status.attached.load(std::memory_order_acquire);
  s.ever = g_status.ever.load(rl);
  s.attached_at_unix_ns = g_status.attached_at_unix_ns.load(rl);
  s.attached_at_ns = g_status.attached_at_ns.load(rl);
  s.objects = g_status.objects.load(rl);
  s.slots = g_status.slots.load(rl);
  s.slots_foreign = g_status.slots_foreign.load(rl);
  s.data_pointers = g_status.data_pointers.load(rl);
  s.attach_ns = g_status.attach_ns.load(rl);
  std::memcpy(out, &s, out_size < sizeof s ? out_size : sizeof s);
}

}  // namespace mi::preload
