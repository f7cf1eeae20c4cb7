// attach() on a real process: this executable is linked with
// libattach_lazy.so (lazy binding, no RELRO) and libattach_now.so (-z now,
// full RELRO), dlopen()s the real libmallocinfo_preload.so (RTLD_LOCAL, as
// the NIF does), attaches, and checks every slot kind is redirected and
// restored. libattach_late.so is dlopen()ed after attach.
//
// The process's attach state is global, so the steps run in order inside
// one test case. [jemalloc] runs under LD_PRELOAD=libjemalloc.so.2 (the
// Makefile's test-attach target): blocks must go back to jemalloc.
#define MALLOCINFO_CATCH_MAIN
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../../common/mi_abi.h"
#include "../../preload/elf_relocs.h"
#include "../catch.h"

extern "C" {
void* lazy_alloc(size_t n);
void lazy_free(void* p);
void* now_alloc(size_t n);
void* now_calloc(size_t n, size_t size);
void* now_realloc(void* p, size_t n);
void now_free(void* p);
void* now_malloc_ref();
}

namespace {

std::string exe_dir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  std::string s(buf);
  return s.substr(0, s.rfind('/'));
}

struct Preload {
  void* handle = nullptr;
  const mi_preload_abi* abi = nullptr;
};

const Preload& preload() {
  static Preload p = [] {
    Preload r;
    const char* env = std::getenv("MI_PRELOAD_SO");
    const std::string path =
        env != nullptr ? env : exe_dir() + "/../../priv/libmallocinfo_preload.so";
    r.handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (r.handle == nullptr) return r;
    auto fn = reinterpret_cast<mi_preload_abi_fn>(::dlsym(r.handle, MI_ABI_SYMBOL));
    if (fn != nullptr) r.abi = fn();
    return r;
  }();
  return p;
}

struct Slot {
  uintptr_t address;
  mi::preload::SlotKind kind;
  uintptr_t value;
};

// Every relocation slot for `name` in the loaded object whose path
// contains `lib`, with its current value.
std::vector<Slot> slots_of(const char* lib, const char* name) {
  struct Ctx {
    const char* lib;
    const char* name;
    std::vector<Slot> out;
  } ctx{lib, name, {}};
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* p) {
        Ctx& c = *static_cast<Ctx*>(p);
        if (info->dlpi_name == nullptr || std::strstr(info->dlpi_name, c.lib) == nullptr) return 0;
        const char* names[] = {c.name};
        mi::preload::find_reloc_slots(
            mi::preload::loaded_object(*info), names, 1,
            [](void* q, const mi::preload::RelocSlot& s) {
              static_cast<std::vector<Slot>*>(q)->push_back(
                  Slot{s.address, s.kind, *reinterpret_cast<uintptr_t*>(s.address)});
            },
            &c.out);
        return 0;
      },
      &ctx);
  return ctx.out;
}

std::vector<mi_abi_entry> live(const mi_preload_abi* abi) {
  std::vector<mi_abi_entry> v;
  abi->snapshot(
      [](void* p, const mi_abi_entry* e, size_t n) {
        static_cast<std::vector<mi_abi_entry>*>(p)->insert(
            static_cast<std::vector<mi_abi_entry>*>(p)->end(), e, e + n);
      },
      &v);
  return v;
}

const mi_abi_entry* find_entry(const std::vector<mi_abi_entry>& v, const void* p) {
  for (const auto& e : v)
    if (e.address == reinterpret_cast<uintptr_t>(p)) return &e;
  return nullptr;
}

// True when one of the recorded stack's frames is inside function `fn`.
bool stack_names(const mi_preload_abi* abi, uint32_t id, const char* fn) {
  uint64_t frames[64];
  const uint32_t n = abi->stack(id, frames, 64);
  for (uint32_t i = 0; i < n && i < 64; ++i) {
    Dl_info info{};
    // Return addresses point after the call: look one byte back.
    if (::dladdr(reinterpret_cast<void*>(frames[i] - 1), &info) != 0 && info.dli_sname != nullptr &&
        std::strcmp(info.dli_sname, fn) == 0)
      return true;
  }
  return false;
}

// The interposer's ABI reaches the attach block (an older build does not).
bool has_attach(const mi_preload_abi* abi) {
  return abi->struct_size >= offsetof(mi_preload_abi, attach_status) + sizeof(void*);
}

mi_attach_result attach(const mi_preload_abi* abi) {
  mi_attach_config cfg{MI_MODE_FULL, 32, 1u << 16, 1u << 12, 512 * 1024};
  mi_attach_result r{};
  abi->attach(&cfg, sizeof cfg, &r, sizeof r);
  return r;
}

mi_attach_status attach_status(const mi_preload_abi* abi) {
  mi_attach_status s{};
  abi->attach_status(&s, sizeof s);
  return s;
}

mi_abi_status status(const mi_preload_abi* abi) {
  mi_abi_status s{};
  abi->status(&s, sizeof s);
  return s;
}

}  // namespace

TEST_CASE("attach: slots of lazy and -z now objects, dlopen after attach, detach restores",
          "[attach]") {
  const Preload& pl = preload();
  REQUIRE(pl.abi != nullptr);
  const mi_preload_abi* abi = pl.abi;
  REQUIRE(has_attach(abi));

  const uintptr_t real_malloc = reinterpret_cast<uintptr_t>(::dlsym(RTLD_DEFAULT, "malloc"));
  const uintptr_t hook_malloc = reinterpret_cast<uintptr_t>(::dlsym(pl.handle, "malloc"));
  REQUIRE(hook_malloc != 0);
  REQUIRE(hook_malloc != real_malloc);  // RTLD_LOCAL: the process still binds to libc

  // Before: the lazy object's PLT slot is unresolved (points into its own
  // PLT); the -z now object's GOT slot holds malloc, in a read-only page.
  const auto lazy_before = slots_of("libattach_lazy", "malloc");
  const auto now_before = slots_of("libattach_now", "malloc");
  REQUIRE(!lazy_before.empty());
  REQUIRE(!now_before.empty());
  bool lazy_unresolved = false;
  for (const Slot& s : lazy_before)
    if (s.kind == mi::preload::SlotKind::kJumpSlot && s.value != real_malloc)
      lazy_unresolved = true;
  CHECK(lazy_unresolved);
  for (const Slot& s : now_before) CHECK(s.value == real_malloc);
  CHECK(reinterpret_cast<uintptr_t>(now_malloc_ref()) == real_malloc);

  void* before_attach = now_alloc(1111);
  REQUIRE(before_attach != nullptr);

  REQUIRE(attach(abi).rc == MI_ATTACH_OK);
  CHECK(attach(abi).rc == MI_ATTACH_ALREADY);
  const mi_attach_status st = attach_status(abi);
  CHECK(st.attached == 1);
  CHECK(st.slots > 0);
  CHECK(st.attached_at_unix_ns > 0);

  // Every slot of both objects now holds the hook; &malloc through the
  // GOT (GLOB_DAT) too.
  for (const Slot& s : slots_of("libattach_lazy", "malloc")) CHECK(s.value == hook_malloc);
  for (const Slot& s : slots_of("libattach_now", "malloc")) CHECK(s.value == hook_malloc);
  CHECK(reinterpret_cast<uintptr_t>(now_malloc_ref()) == hook_malloc);

  const uint64_t allocated_before = status(abi).bytes_allocated;
  void* a = lazy_alloc(12345);
  // Full mode counts the requested bytes of recorded blocks, as with
  // LD_PRELOAD (track/tracker.h).
  CHECK(status(abi).bytes_allocated - allocated_before == 12345);
  void* b = now_alloc(23456);
  void* c = now_calloc(3, 11111);
  {
    const auto v = live(abi);
    const mi_abi_entry* ea = find_entry(v, a);
    const mi_abi_entry* eb = find_entry(v, b);
    const mi_abi_entry* ec = find_entry(v, c);
    REQUIRE(ea != nullptr);
    REQUIRE(eb != nullptr);
    REQUIRE(ec != nullptr);
    CHECK(ea->size == 12345);
    CHECK(eb->size == 23456);
    CHECK(ec->size == 33333);
    CHECK(stack_names(abi, ea->stack_id, "lazy_alloc"));
    CHECK(stack_names(abi, eb->stack_id, "now_alloc"));
    CHECK(find_entry(v, before_attach) == nullptr);  // before attach: not seen
  }

  // A block from before attach: freed through the hook, forwarded, counted.
  const uint64_t untracked = status(abi).frees_untracked;
  now_free(before_attach);
  CHECK(status(abi).frees_untracked == untracked + 1);

  // realloc of a recorded block moves the record.
  void* b2 = now_realloc(b, 45678);
  REQUIRE(b2 != nullptr);
  {
    const auto v = live(abi);
    const mi_abi_entry* e = find_entry(v, b2);
    REQUIRE(e != nullptr);
    CHECK(e->size == 45678);
  }

  // An object loaded after attach (through this executable's patched
  // dlopen slot) is patched as it loads.
  void* late = ::dlopen((exe_dir() + "/libattach_late.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(late != nullptr);
  for (const Slot& s : slots_of("libattach_late", "malloc")) CHECK(s.value == hook_malloc);
  auto late_alloc = reinterpret_cast<void* (*)(size_t)>(::dlsym(late, "late_alloc"));
  auto late_free = reinterpret_cast<void (*)(void*)>(::dlsym(late, "late_free"));
  REQUIRE(late_alloc != nullptr);
  void* d = late_alloc(34567);
  {
    const auto v = live(abi);
    const mi_abi_entry* e = find_entry(v, d);
    REQUIRE(e != nullptr);
    CHECK(e->size == 34567);
    CHECK(stack_names(abi, e->stack_id, "late_alloc"));
  }
  lazy_free(a);
  now_free(b2);
  now_free(c);
  {
    const auto v = live(abi);
    CHECK(find_entry(v, a) == nullptr);
    CHECK(find_entry(v, b2) == nullptr);
    CHECK(find_entry(v, c) == nullptr);
    CHECK(find_entry(v, d) != nullptr);
  }

  // Detach: every slot back to what it held, the lazy one to its stub.
  REQUIRE(abi->detach() == 0);
  CHECK(abi->detach() == -1);
  const auto lazy_after = slots_of("libattach_lazy", "malloc");
  REQUIRE(lazy_after.size() == lazy_before.size());
  for (size_t i = 0; i < lazy_after.size(); ++i) CHECK(lazy_after[i].value == lazy_before[i].value);
  const auto now_after = slots_of("libattach_now", "malloc");
  REQUIRE(now_after.size() == now_before.size());
  for (size_t i = 0; i < now_after.size(); ++i) CHECK(now_after[i].value == now_before[i].value);
  for (const Slot& s : slots_of("libattach_late", "malloc")) CHECK(s.value == real_malloc);
  CHECK(attach_status(abi).attached == 0);
  CHECK(attach_status(abi).slots == 0);

  // After detach nothing is seen: its frees no longer reach the table, so
  // what it held is forgotten rather than left to go stale, and the
  // process says it records nothing.
  const mi_abi_status after = status(abi);
  CHECK(after.recording == 0);
  CHECK(after.mode == MI_MODE_OFF);
  CHECK(abi->set_mode(MI_MODE_FULL) == -1);
  void* e = now_alloc(56789);
  {
    const auto v = live(abi);
    CHECK(find_entry(v, e) == nullptr);
    CHECK(find_entry(v, d) == nullptr);
  }
  now_free(e);
  late_free(d);  // recorded, freed after detach: forwarded by libc directly

  // Attach again: works, starts from an empty table.
  REQUIRE(attach(abi).rc == MI_ATTACH_OK);
  CHECK(live(abi).empty());
  void* f = lazy_alloc(67890);
  CHECK(find_entry(live(abi), f) != nullptr);
  lazy_free(f);
  REQUIRE(abi->detach() == 0);
  CHECK(reinterpret_cast<uintptr_t>(now_malloc_ref()) == real_malloc);
}

// Issue 14: the mmap family's slots are patched too. This executable's
// own call to mmap goes through its (patched) PLT slot.
bool has_region(const mi_preload_abi* abi, const void* p, uint64_t length) {
  mi_abi_region_status st{};
  abi->region_status(&st, sizeof st);
  std::vector<mi_abi_region> v(st.capacity);
  const uint64_t n = abi->regions(v.data(), v.size());
  for (uint64_t i = 0; i < n && i < v.size(); ++i)
    if (v[i].start == reinterpret_cast<uintptr_t>(p) && v[i].length == length &&
        v[i].flags == MI_REGION_ANONYMOUS)
      return true;
  return false;
}

TEST_CASE("attach: mappings made after attach are regions, unmapped ones are not", "[attach]") {
  const Preload& pl = preload();
  REQUIRE(pl.abi != nullptr);
  REQUIRE(pl.abi->struct_size >= sizeof(mi_preload_abi));
  void* before = ::mmap(nullptr, 1 << 20, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(before != MAP_FAILED);
  REQUIRE(attach(pl.abi).rc == MI_ATTACH_OK);
  void* p = ::mmap(nullptr, 3 << 20, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  CHECK(has_region(pl.abi, p, 3 << 20));
  CHECK_FALSE(has_region(pl.abi, before, 1 << 20));
  REQUIRE(::munmap(static_cast<char*>(p) + (1 << 20), 2 << 20) == 0);
  CHECK(has_region(pl.abi, p, 1 << 20));
  REQUIRE(::munmap(p, 1 << 20) == 0);
  CHECK_FALSE(has_region(pl.abi, p, 1 << 20));
  REQUIRE(pl.abi->detach() == 0);
  ::munmap(before, 1 << 20);
}

// Issue 28: status() counts what holds a hook now. An object loaded and
// unloaded again is counted while it is loaded, and not after the next
// walk (a dlopen while attached), however many came and went.
TEST_CASE("attach: status counts the slots patched now, not every object ever patched",
          "[attach]") {
  const Preload& pl = preload();
  REQUIRE(pl.abi != nullptr);
  REQUIRE(has_attach(pl.abi));
  REQUIRE(attach(pl.abi).rc == MI_ATTACH_OK);
  const mi_attach_status st0 = attach_status(pl.abi);
  REQUIRE(st0.objects > 0);
  REQUIRE(st0.slots > 0);
  const std::string target = exe_dir() + "/stress_dlopen_target.so";
  uint64_t target_slots = 0;
  for (int i = 0; i < 200; ++i) {
    void* h = ::dlopen(target.c_str(), RTLD_NOW | RTLD_LOCAL);
    REQUIRE(h != nullptr);
    const mi_attach_status st = attach_status(pl.abi);
    if (i == 0) target_slots = st.slots - st0.slots;
    CHECK(st.objects == st0.objects + 1);
    CHECK(st.slots == st0.slots + target_slots);
    REQUIRE(::dlclose(h) == 0);
  }
  CHECK(target_slots > 0);
  // A dlopen of an object loaded already walks again: the target is gone.
  REQUIRE(::dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD) != nullptr);
  const mi_attach_status after = attach_status(pl.abi);
  CHECK(after.objects == st0.objects);
  CHECK(after.slots == st0.slots);
  CHECK(after.data_pointers == st0.data_pointers);
  REQUIRE(pl.abi->detach() == 0);
  CHECK(attach_status(pl.abi).objects == 0);
  CHECK(attach_status(pl.abi).slots == 0);
}

TEST_CASE("attach: a failed attach leaves every slot as it was", "[attach]") {
  const Preload& pl = preload();
  REQUIRE(pl.abi != nullptr);
  REQUIRE(has_attach(pl.abi));
  const char* const names[] = {"malloc", "free", "calloc", "realloc", "dlopen"};
  const char* const libs[] = {"libattach_lazy", "libattach_now", "attach_tests"};
  auto all_slots = [&] {
    std::vector<uintptr_t> v;
    for (const char* lib : libs)
      for (const char* name : names)
        for (const Slot& s : slots_of(lib, name)) v.push_back(s.value);
    return v;
  };
  const std::vector<uintptr_t> before = all_slots();
  REQUIRE(before.size() >= 6);
  // The third store fails: two slots were already written when it does.
  ::setenv("MALLOCINFO_ATTACH_FAIL_AFTER", "2", 1);
  const mi_attach_result r = attach(pl.abi);
  ::unsetenv("MALLOCINFO_ATTACH_FAIL_AFTER");
  CHECK(r.rc == MI_ATTACH_ERRNO);
  CHECK(r.err == EACCES);
  CHECK(all_slots() == before);
  CHECK(attach_status(pl.abi).attached == 0);
  CHECK(attach_status(pl.abi).slots == 0);
  CHECK(pl.abi->detach() == -1);
  // And the process can still attach.
  REQUIRE(attach(pl.abi).rc == MI_ATTACH_OK);
  CHECK(all_slots() != before);
  REQUIRE(pl.abi->detach() == 0);
  CHECK(all_slots() == before);
}

TEST_CASE("attach: blocks go back to a preloaded jemalloc", "[jemalloc]") {
  // Run by `make test-attach` under LD_PRELOAD=libjemalloc.so.2.
  using Mallctl = int (*)(const char*, void*, size_t*, void*, size_t);
  auto mallctl = reinterpret_cast<Mallctl>(::dlsym(RTLD_DEFAULT, "mallctl"));
  REQUIRE(mallctl != nullptr);  // not under jemalloc: this test cannot run
  auto thread_counter = [&](const char* name) {
    uint64_t v = 0;
    size_t sz = sizeof v;
    REQUIRE(mallctl(name, &v, &sz, nullptr, 0) == 0);
    return v;
  };
  const Preload& pl = preload();
  REQUIRE(pl.abi != nullptr);
  REQUIRE(has_attach(pl.abi));
  REQUIRE(attach(pl.abi).rc == MI_ATTACH_OK);
  CHECK(reinterpret_cast<uintptr_t>(now_malloc_ref()) ==
        reinterpret_cast<uintptr_t>(::dlsym(pl.handle, "malloc")));

  const uint64_t alloc0 = thread_counter("thread.allocated");
  const uint64_t free0 = thread_counter("thread.deallocated");
  std::vector<void*> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(i % 2 ? lazy_alloc(4096) : now_alloc(4096));
  const uint64_t alloc1 = thread_counter("thread.allocated");
  CHECK(alloc1 - alloc0 >= 64 * 4096);
  CHECK(find_entry(live(pl.abi), blocks[0]) != nullptr);
  for (void* p : blocks) now_free(p);
  CHECK(thread_counter("thread.deallocated") - free0 >= 64 * 4096);
  REQUIRE(pl.abi->detach() == 0);
}
