// Catch2 tests for the Erlang context a hook reads (track/erlang_context.h)
// and its encoding at the end of a stack (common/mi_context.h), on fake VM
// structures laid out as a mi_erlang_layout says: the reader must take what
// checks out and stop, without reading further, at what does not.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>
#include "catch.h"

#include "../common/mi_context.h"
#include "../track/erlang_context.h"
#include "../track/tracker.h"
#include "fake_erlang_layout.h"

using mi::track::capture_erlang_context;
using mi::track::erlang_layout_valid;
using mi::track::normalize_thread_name;

namespace {

constexpr uint64_t kPid = (12345ull << 4) | 0x3;
// Atom terms: index << 6 | 0x0B.
constexpr uint64_t atom(uint64_t index) {
  return (index << 6) | 0x0B;
}

// One scheduler's worth of fake VM memory.
struct FakeVm {
  uint64_t sd[64] = {};
  uint64_t proc[64] = {};
  uint64_t shadow[8] = {};
  uint64_t env[8] = {};
  uint64_t mfa[3] = {atom(100), atom(200), 2};
  std::vector<uint64_t> heap = std::vector<uint64_t>(1024, 0);
  mi_erlang_layout layout{};

  FakeVm() {
    layout = mi::test::fake_erlang_layout();
    layout.max_cps = 4;
    layout.scan_words = 64;
    proc[0] = kPid;
    shadow[0] = kPid;
    sd[21] = addr(proc);
    sd[27] = addr(shadow);
    sd[26] = addr(env);
    env[1] = addr(proc);
    proc[58] = addr(mfa);
    // Heap [0, 100) used, stack from word 1000 to the end.
    uint64_t* h = heap.data();
    proc[24] = addr(h);
    proc[10] = addr(h + 100);
    proc[11] = addr(h + 1000);
    proc[25] = addr(h + 1024);
    // The stack: a y register (a small integer), a frame pointer into the
    // stack, a CP, a boxed term, a CP, an atom, two more CPs, a fifth.
    const uint64_t stack[] = {(7ull << 4) | 0xF, addr(h + 1010),    0x7f0000001000ull,
                              addr(h + 8) | 2,   0x7f0000002000ull, atom(5),
                              0x7f0000003000ull, 0x7f0000004000ull, 0x7f0000005000ull};
    std::memcpy(h + 1000, stack, sizeof stack);
  }
  static uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }
};

FakeVm* g_vm = nullptr;
bool g_not_a_scheduler = false;  // this thread has no scheduler data
const void* fake_sd(uint32_t key) {
  return !g_not_a_scheduler && key == g_vm->layout.key ? g_vm->sd : nullptr;
}

struct Captured {
  std::vector<uint64_t> words;
  uint64_t pid = 0;
  mi_context ctx{};
};

Captured capture(const uint64_t* name = nullptr) {
  Captured c;
  uint64_t out[MI_CONTEXT_MAX_WORDS];
  const unsigned n = capture_erlang_context(g_vm->layout, fake_sd, name, out, &c.pid);
  REQUIRE(n <= MI_CONTEXT_MAX_WORDS);
  // As it will be stored: after two native frames.
  c.words = {0x401000, 0x402000};
  c.words.insert(c.words.end(), out, out + n);
  const uint32_t native =
      mi_context_split(c.words.data(), static_cast<uint32_t>(c.words.size()), &c.ctx);
  CHECK(native == (n == 0 ? c.words.size() : 2u));
  return c;
}

}  // namespace

TEST_CASE("erlang context: a process in a NIF call gives pid, function and return addresses",
          "[erlang_context]") {
  FakeVm vm;
  g_vm = &vm;
  const Captured c = capture();
  CHECK(c.pid == kPid);
  REQUIRE(c.ctx.kind == MI_CONTEXT_PROCESS);
  REQUIRE(c.ctx.mfa == 3);
  CHECK(c.ctx.words[0] == atom(100));
  CHECK(c.ctx.words[1] == atom(200));
  CHECK(c.ctx.words[2] == 2);
  // The frame pointer, the boxed term and the immediates are not CPs; at
  // most max_cps are kept, innermost first.
  REQUIRE(c.ctx.cps == 4);
  CHECK(c.ctx.words[3] == 0x7f0000001000ull);
  CHECK(c.ctx.words[4] == 0x7f0000002000ull);
  CHECK(c.ctx.words[5] == 0x7f0000003000ull);
  CHECK(c.ctx.words[6] == 0x7f0000004000ull);
  g_vm = nullptr;
}

TEST_CASE("erlang context: the per-thread cache answers as a fresh capture, never stale",
          "[erlang_context]") {
  FakeVm vm;
  g_vm = &vm;
  mi::track::ContextCache cache{};
  auto with_cache = [&] {
    std::vector<uint64_t> out(MI_CONTEXT_MAX_WORDS);
    uint64_t pid = 0;
    const unsigned n =
        capture_erlang_context(vm.layout, fake_sd, nullptr, out.data(), &pid, &cache);
    out.resize(n);
    out.push_back(pid);
    return out;
  };
  auto fresh = [&] {
    std::vector<uint64_t> out(MI_CONTEXT_MAX_WORDS);
    uint64_t pid = 0;
    const unsigned n = capture_erlang_context(vm.layout, fake_sd, nullptr, out.data(), &pid);
    out.resize(n);
    out.push_back(pid);
    return out;
  };
  const std::vector<uint64_t> first = with_cache();
  REQUIRE(cache.scanned != 0);  // kept
  CHECK(with_cache() == first);
  CHECK(with_cache() == fresh());
  // Another caller at the same depth: a return address changed.
  vm.heap[1002] = 0x7f0000009000ull;
  CHECK(with_cache() == fresh());
  CHECK(with_cache() != first);
  // Another process in the same struct: its pid.
  vm.proc[0] = (43ull << 4) | 0x3;
  const std::vector<uint64_t> other = with_cache();
  CHECK(other.back() == vm.proc[0]);
  CHECK(other == fresh());
  // The stack grew (a deeper call): a new scan.
  vm.proc[11] = FakeVm::addr(vm.heap.data() + 999);
  vm.heap[999] = 0x7f000000a000ull;
  CHECK(with_cache() == fresh());
  g_vm = nullptr;
}

TEST_CASE(
    "erlang context: another process running the same code is answered by the cache, its words "
    "judged against its own heap",
    "[erlang_context]") {
  const bool avx2 = GENERATE(true, false);
  mi::track::erlang_context_allow_avx2(avx2);
  FakeVm vm;
  g_vm = &vm;
  mi::track::ContextCache cache{};
  cache.next_token = mi::track::first_token(5);
  uint64_t out[MI_CONTEXT_MAX_WORDS], pid = 0;
  const auto read = [&] {
    const mi::track::ContextWords c =
        mi::track::read_erlang_context(vm.layout, fake_sd, nullptr, out, &pid, &cache);
    return std::vector<uint64_t>(c.words, c.words + c.n);
  };
  const auto fresh = [&] {
    uint64_t plain[MI_CONTEXT_MAX_WORDS], plain_pid = 0;
    const unsigned n =
        capture_erlang_context(vm.layout, fake_sd, nullptr, plain, &plain_pid, nullptr);
    return std::vector<uint64_t>(plain, plain + n);
  };
  const std::vector<uint64_t> first = read();
  REQUIRE(first.size() == 8);  // header, function, 4 CPs
  REQUIRE(cache.scanned != 0);
  // Process B: the same function and stack shape in memory of its own (its
  // frame pointer and boxed term point into it), another y register.
  std::vector<uint64_t> heap_b(1024, 0);
  uint64_t proc_b[64] = {};
  std::memcpy(proc_b, vm.proc, sizeof proc_b);
  const uint64_t lo_a = FakeVm::addr(vm.heap.data()), lo_b = FakeVm::addr(heap_b.data());
  const uint64_t hi_a = lo_a + 1024 * 8;
  proc_b[0] = (77ull << 4) | 0x3;
  proc_b[24] = lo_b;
  proc_b[10] = lo_b + 100 * 8;
  proc_b[11] = lo_b + 1000 * 8;
  proc_b[25] = lo_b + 1024 * 8;
  for (size_t i = 1000; i < 1024; ++i) {
    const uint64_t w = vm.heap[i];
    heap_b[i] = (w & ~uint64_t{7}) >= lo_a && (w & ~uint64_t{7}) < hi_a ? w - lo_a + lo_b : w;
  }
  heap_b[1000] = (9ull << 4) | 0xF;
  vm.sd[21] = FakeVm::addr(proc_b);
  vm.env[1] = vm.sd[21];
  // A mark in the cache's last word: only an answer from the cache keeps it
  // (a scan finds the real CP, unlike the mark, and takes its words).
  const uint64_t real = cache.words[7];
  cache.words[7] = 0x7f00000bad00ull;
  std::vector<uint64_t> got = read();
  CHECK(pid == proc_b[0]);
  CHECK(got.back() == 0x7f00000bad00ull);  // answered by the cache
  got.back() = real;
  CHECK(got == fresh());
  CHECK(cache.stop == proc_b[11]);
  // Back to A: its stack elsewhere again, answered the same way.
  cache.words[7] = 0x7f00000bad00ull;
  vm.sd[21] = FakeVm::addr(vm.proc);
  vm.env[1] = vm.sd[21];
  got = read();
  CHECK(got.back() == 0x7f00000bad00ull);
  cache.words[7] = real;
  // B again, with A's frame pointer where its own was: the same word as
  // the kept one, a frame pointer in A's stack but a CP in B's (it is not
  // in B's memory). The cache must not answer: a scan finds one more CP.
  heap_b[1001] = vm.heap[1001];
  vm.sd[21] = FakeVm::addr(proc_b);
  vm.env[1] = vm.sd[21];
  got = read();
  CHECK(got == fresh());
  CHECK(got.size() == 8);
  CHECK(got[4] == vm.heap[1001]);  // the new first CP
  // A CP moved by one word in B (same values, another frame shape): a scan.
  heap_b[1001] = heap_b[1002];
  heap_b[1002] = (3ull << 4) | 0xF;
  CHECK(read() == fresh());
  CHECK(read() == first);
  mi::track::erlang_context_allow_avx2(true);
  g_vm = nullptr;
}

TEST_CASE("erlang context: the cache names its words with a token of its own range",
          "[erlang_context]") {
  FakeVm vm;
  g_vm = &vm;
  mi::track::ContextCache cache{};
  cache.next_token = mi::track::first_token(3);
  uint64_t out[MI_CONTEXT_MAX_WORDS], pid = 0;
  auto read = [&] {
    return mi::track::read_erlang_context(vm.layout, fake_sd, nullptr, out, &pid, &cache);
  };
  const mi::track::ContextWords first = read();
  REQUIRE(first.n == 8);
  CHECK(first.token == mi::track::first_token(3));
  CHECK(first.hash == mi::track::StackTable::hash_words(first.words, first.n));
  const std::vector<uint64_t> words(first.words, first.words + first.n);
  // Answered by the cache: the same words, token and hash.
  mi::track::ContextWords again = read();
  CHECK(std::vector<uint64_t>(again.words, again.words + again.n) == words);
  CHECK(again.token == first.token);
  // A y register changed: a new scan, the same words, so the same token.
  vm.heap[1000] = (8ull << 4) | 0xF;
  REQUIRE(cache.scanned != 0);
  again = read();
  CHECK(std::vector<uint64_t>(again.words, again.words + again.n) == words);
  CHECK(again.token == first.token);
  CHECK(again.hash == first.hash);
  // A return address changed: other words, a new token.
  vm.heap[1002] = 0x7f0000009000ull;
  const mi::track::ContextWords other = read();
  CHECK(other.token == first.token + 1);
  CHECK(other.hash == mi::track::StackTable::hash_words(other.words, other.n));
  CHECK(other.hash != first.hash);
  // Back to the first words: a new token (the cache keeps its last words
  // only, and a token is never given twice).
  vm.heap[1002] = 0x7f0000001000ull;
  const mi::track::ContextWords back = read();
  CHECK(std::vector<uint64_t>(back.words, back.words + back.n) == words);
  CHECK(back.token == first.token + 2);
  // Without a range (next_token 0): no token, the same words.
  mi::track::ContextCache plain{};
  const mi::track::ContextWords untokened =
      mi::track::read_erlang_context(vm.layout, fake_sd, nullptr, out, &pid, &plain);
  CHECK(untokened.token == 0);
  CHECK(std::vector<uint64_t>(untokened.words, untokened.words + untokened.n) == words);
  // Outside the cache (another thread's name): hashed, no token.
  g_not_a_scheduler = true;
  const uint64_t name[2] = {0x6c6f6f705f66696eull, 0x2a};
  const mi::track::ContextWords named =
      mi::track::read_erlang_context(vm.layout, fake_sd, name, out, &pid, &cache);
  g_not_a_scheduler = false;
  CHECK(named.n == 3);
  CHECK(named.token == 0);
  CHECK(named.hash == mi::track::StackTable::hash_words(out, 3));
  // A range's last token is its last: then none.
  mi::track::ContextCache last{};
  last.next_token = (mi::track::first_token(4) | ((uint64_t{1} << mi::track::kTokenBits) - 1));
  const mi::track::ContextWords l1 =
      mi::track::read_erlang_context(vm.layout, fake_sd, nullptr, out, &pid, &last);
  CHECK(l1.token ==
        (uint64_t{4} << mi::track::kTokenBits | ((uint64_t{1} << mi::track::kTokenBits) - 1)));
  CHECK(last.next_token == 0);
  g_vm = nullptr;
}

TEST_CASE("erlang context: a dirty scheduler's env points at the shadow process",
          "[erlang_context]") {
  FakeVm vm;
  vm.env[1] = FakeVm::addr(vm.shadow);
  g_vm = &vm;
  const Captured c = capture();
  CHECK(c.pid == kPid);
  CHECK(c.ctx.kind == MI_CONTEXT_PROCESS);
  CHECK(c.ctx.mfa == 3);
  CHECK(c.ctx.cps == 4);
  g_vm = nullptr;
}

TEST_CASE("erlang context: outside a NIF call, or with an env of another process, only the pid",
          "[erlang_context]") {
  FakeVm vm;
  g_vm = &vm;
  vm.sd[26] = 0;  // no NIF running: the stack may be stale
  Captured c = capture();
  CHECK(c.pid == kPid);
  CHECK(c.ctx.kind == MI_CONTEXT_PROCESS);
  CHECK(c.ctx.mfa == 0);
  CHECK(c.ctx.cps == 0);
  vm.sd[26] = FakeVm::addr(vm.env);
  uint64_t other[4] = {kPid + 16};
  vm.env[1] = FakeVm::addr(other);
  c = capture();
  CHECK(c.pid == kPid);
  CHECK(c.ctx.mfa == 0);
  CHECK(c.ctx.cps == 0);
  vm.env[1] = 0;  // a null shadow never matches a null word
  vm.sd[27] = 0;
  c = capture();
  CHECK(c.ctx.mfa == 0);
  g_vm = nullptr;
}

TEST_CASE("erlang context: what does not check out is left out", "[erlang_context]") {
  FakeVm vm;
  g_vm = &vm;
  SECTION("no process: a scheduler context, no pid") {
    vm.sd[21] = 0;
    const Captured c = capture();
    CHECK(c.pid == 0);
    CHECK(c.ctx.kind == MI_CONTEXT_SCHEDULER);
  }
  SECTION("a misaligned process pointer is not followed") {
    vm.sd[21] = FakeVm::addr(vm.proc) + 4;
    const Captured c = capture();
    CHECK(c.pid == 0);
    CHECK(c.ctx.kind == MI_CONTEXT_SCHEDULER);
  }
  SECTION("a first word that is not a pid") {
    vm.proc[0] = atom(1);
    const Captured c = capture();
    CHECK(c.pid == 0);
    CHECK(c.ctx.kind == MI_CONTEXT_SCHEDULER);
  }
  SECTION("a current function that is not three words of M, F, A") {
    vm.mfa[1] = 42;
    Captured c = capture();
    CHECK(c.ctx.mfa == 0);
    CHECK(c.ctx.cps == 4);
    vm.mfa[1] = atom(200);
    vm.mfa[2] = 300;
    c = capture();
    CHECK(c.ctx.mfa == 0);
  }
  SECTION("stack pointers out of order: no return addresses") {
    vm.proc[11] = vm.proc[25] + 8;  // stop past hend
    const Captured c = capture();
    CHECK(c.ctx.mfa == 3);
    CHECK(c.ctx.cps == 0);
  }
  SECTION("the scan stops at hend and at scan_words") {
    vm.layout.scan_words = 3;
    Captured c = capture();
    CHECK(c.ctx.cps == 1);  // words 0-2: only the first CP
    vm.layout.scan_words = 64;
    vm.proc[11] = vm.proc[25] - 8;  // one word of stack, a zero: nothing past hend is read
    c = capture();
    CHECK(c.ctx.cps == 0);
  }
  g_vm = nullptr;
}

TEST_CASE("erlang context: another thread gives its name, or nothing", "[erlang_context]") {
  FakeVm vm;
  g_vm = &vm;
  g_not_a_scheduler = true;
  uint64_t name[2];
  normalize_thread_name("erts_async_12", name);
  Captured c = capture(name);
  CHECK(c.pid == 0);
  REQUIRE(c.ctx.kind == MI_CONTEXT_THREAD);
  REQUIRE(c.ctx.names == 2);
  char text[17] = {};
  std::memcpy(text, c.ctx.words, 16);
  CHECK(std::string(text) == "erts_async_*");
  c = capture(nullptr);
  CHECK(c.ctx.kind == 0);
  CHECK(c.words.size() == 2);
  g_not_a_scheduler = false;
  g_vm = nullptr;
}

TEST_CASE("thread names: a trailing number becomes *", "[erlang_context]") {
  auto norm = [](const char* in) {
    uint64_t w[2];
    normalize_thread_name(in, w);
    char text[17] = {};
    std::memcpy(text, w, 16);
    return std::string(text);
  };
  CHECK(norm("erts_async_3") == "erts_async_*");
  CHECK(norm("my_pool") == "my_pool");
  CHECK(norm("1234") == "1234");  // all digits: kept
  CHECK(norm("") == "");
  CHECK(norm("a_very_long_thread_name_99") == "a_very_long_thr");  // 15 bytes kept
  CHECK(norm("pool7") == "pool*");
}

TEST_CASE("mixed stacks: the header is found by value and malformed ones are native frames",
          "[erlang_context]") {
  mi_context ctx;
  const uint64_t plain[] = {0x401000, 0x402000, 0x403000};
  CHECK(mi_context_split(plain, 3, &ctx) == 3);
  CHECK(ctx.kind == 0);
  const uint64_t mixed[] = {0x401000, mi_context_header(MI_CONTEXT_PROCESS, 3, 1, 0),
                            atom(1),  atom(2),
                            0,        0x7f0000001000ull};
  CHECK(mi_context_split(mixed, 6, &ctx) == 1);
  CHECK(ctx.kind == MI_CONTEXT_PROCESS);
  CHECK(ctx.words == mixed + 2);
  // Counts that do not match the words that follow: no context.
  CHECK(mi_context_split(mixed, 5, &ctx) == 5);
  CHECK(ctx.kind == 0);
  const uint64_t bad_kind[] = {0x401000, mi_context_header(9, 0, 0, 0)};
  CHECK(mi_context_split(bad_kind, 2, &ctx) == 2);
  const uint64_t only_header[] = {mi_context_header(MI_CONTEXT_SCHEDULER, 0, 0, 0)};
  CHECK(mi_context_split(only_header, 1, &ctx) == 0);
  CHECK(ctx.kind == MI_CONTEXT_SCHEDULER);
}

TEST_CASE("erlang layouts: indices and sizes are bounded", "[erlang_context]") {
  FakeVm vm;
  CHECK(erlang_layout_valid(vm.layout));
  mi_erlang_layout l = vm.layout;
  l.version = 0;
  CHECK_FALSE(erlang_layout_valid(l));
  l = vm.layout;
  l.p_hend = mi::track::kMaxLayoutWord + 1;
  CHECK_FALSE(erlang_layout_valid(l));
  l = vm.layout;
  l.max_cps = MI_CONTEXT_MAX_CPS + 1;
  CHECK_FALSE(erlang_layout_valid(l));
  l = vm.layout;
  l.key = 5000;
  CHECK_FALSE(erlang_layout_valid(l));
}

// --- The tracker records it ---------------------------------------------------

namespace {

size_t three_frames(mi::track::UnwindCache*, uintptr_t* out, size_t max) {
  const uintptr_t frames[] = {0x401000, 0x402000, 0x403000};
  size_t n = 0;
  for (; n < 3 && n < max; ++n) out[n] = frames[n];
  return n;
}
uint64_t zero_clock() {
  return 0;
}
bool test_name(char out[16]) {
  std::strcpy(out, "nif_pool_7");
  return true;
}

std::vector<uint64_t> frames_of(const mi::track::Tracker& t, uint32_t id) {
  uint64_t words[mi::track::kMaxStackDepth + MI_CONTEXT_MAX_WORDS];
  const unsigned n = t.stack(id, words, static_cast<unsigned>(std::size(words)));
  return std::vector<uint64_t>(words, words + n);
}

}  // namespace

TEST_CASE("tracker: with a layout, entries carry the pid and stacks end in the context",
          "[erlang_context][track]") {
  using mi::track::Tracker;
  Tracker t;
  mi::track::Config c;
  c.table_capacity = 4096;
  c.stack_capacity = 256;
  REQUIRE(t.init(c, three_frames, zero_clock));
  // Before a layout: plain stacks, no pid.
  t.on_alloc(MI_FN_MALLOC, reinterpret_cast<void*>(0x10000), 100);
  FakeVm vm;
  g_vm = &vm;
  mi_erlang_layout bad = vm.layout;
  bad.max_cps = 99;
  CHECK_FALSE(t.set_erlang_layout(bad, fake_sd, test_name));
  CHECK_FALSE(t.erlang_context_on());
  REQUIRE(t.set_erlang_layout(vm.layout, fake_sd, test_name));
  CHECK(t.erlang_context_on());
  CHECK(t.set_erlang_layout(vm.layout, fake_sd, test_name));  // the same again: fine
  mi_erlang_layout other = vm.layout;
  other.p_current = 59;
  CHECK_FALSE(t.set_erlang_layout(other, fake_sd, test_name));  // a different one: refused
  t.on_alloc(MI_FN_MALLOC, reinterpret_cast<void*>(0x20000), 200);
  g_not_a_scheduler = true;
  t.on_alloc(MI_FN_MALLOC, reinterpret_cast<void*>(0x30000), 300);
  t.on_alloc(MI_FN_MALLOC, reinterpret_cast<void*>(0x30100), 300);
  g_not_a_scheduler = false;
  g_vm = nullptr;

  std::map<uint64_t, mi::track::LiveEntry> live;
  t.for_each_live([&](const mi::track::LiveEntry& e) { live[e.address] = e; });
  REQUIRE(live.size() == 4);
  CHECK(live[0x10000].pid == 0);
  CHECK(live[0x20000].pid == kPid);
  CHECK(live[0x30000].pid == 0);
  mi_context ctx;
  std::vector<uint64_t> f = frames_of(t, live[0x10000].stack_id);
  CHECK(mi_context_split(f.data(), static_cast<uint32_t>(f.size()), &ctx) == 3);
  CHECK(ctx.kind == 0);
  f = frames_of(t, live[0x20000].stack_id);
  REQUIRE(mi_context_split(f.data(), static_cast<uint32_t>(f.size()), &ctx) == 3);
  CHECK(f[0] == 0x401000);
  CHECK(ctx.kind == MI_CONTEXT_PROCESS);
  CHECK(ctx.mfa == 3);
  CHECK(ctx.cps == 4);
  // Two allocations of one pool's thread: one stack, named by the pool.
  CHECK(live[0x30000].stack_id == live[0x30100].stack_id);
  f = frames_of(t, live[0x30000].stack_id);
  REQUIRE(mi_context_split(f.data(), static_cast<uint32_t>(f.size()), &ctx) == 3);
  CHECK(ctx.kind == MI_CONTEXT_THREAD);
  char name[17] = {};
  std::memcpy(name, ctx.words, 16);
  CHECK(std::string(name) == "nif_pool_*");
  t.destroy();
}

TEST_CASE("tracker: one context, one stack, whether the cache, a new scan or a new token gave it",
          "[erlang_context][track]") {
  using mi::track::Tracker;
  Tracker t;
  mi::track::Config c;
  c.table_capacity = 4096;
  c.stack_capacity = 256;
  REQUIRE(t.init(c, three_frames, zero_clock));
  FakeVm vm;
  g_vm = &vm;
  REQUIRE(t.set_erlang_layout(vm.layout, fake_sd, test_name));
  auto alloc = [&](uintptr_t a) { t.on_alloc(MI_FN_MALLOC, reinterpret_cast<void*>(a), 64); };
  alloc(0x10000);  // a scan
  alloc(0x10100);  // the cache
  vm.heap[1000] = (8ull << 4) | 0xF;
  alloc(0x10200);  // a new scan, the same words
  vm.heap[1002] = 0x7f0000009000ull;
  alloc(0x10300);  // another return address: another stack
  vm.heap[1002] = 0x7f0000001000ull;
  alloc(0x10400);  // the first words again, under a new token
  g_vm = nullptr;
  std::map<uint64_t, uint32_t> id;
  t.for_each_live([&](const mi::track::LiveEntry& e) { id[e.address] = e.stack_id; });
  REQUIRE(id.size() == 5);
  CHECK(id[0x10000] != 0);
  CHECK(id[0x10100] == id[0x10000]);
  CHECK(id[0x10200] == id[0x10000]);
  CHECK(id[0x10300] != id[0x10000]);
  CHECK(id[0x10400] == id[0x10000]);
  mi_abi_status s{};
  t.status(&s);
  CHECK(s.stacks == 2);
  const std::vector<uint64_t> f = frames_of(t, id[0x10300]);
  mi_context ctx;
  REQUIRE(mi_context_split(f.data(), static_cast<uint32_t>(f.size()), &ctx) == 3);
  CHECK(ctx.words[3] == 0x7f0000009000ull);
  t.destroy();
}

namespace {

// Two processes running the same code, for the randomized checks below:
// each with a heap of its own whose last `depth` words are its stack.
struct RandomVm {
  static constexpr size_t kHeapWords = 128;
  struct Process {
    uint64_t words[64] = {};
    std::vector<uint64_t> heap = std::vector<uint64_t>(kHeapWords, 0);
    size_t depth = 0;
    uint64_t* stack() { return heap.data() + kHeapWords - depth; }
    uint64_t lo() const { return FakeVm::addr(heap.data()); }
    uint64_t hi() const { return FakeVm::addr(heap.data() + kHeapWords); }
  };
  uint64_t sd[64] = {};
  uint64_t env[8] = {};
  uint64_t mfa[2][3] = {{atom(100), atom(200), 2}, {atom(101), atom(201), 3}};
  Process procs[2];
  unsigned running = 0;
  mi_erlang_layout layout{};

  RandomVm() {
    layout = mi::test::fake_erlang_layout();
    sd[26] = FakeVm::addr(env);
    for (unsigned i = 0; i < 2; ++i) {
      Process& p = procs[i];
      p.words[0] = ((500ull + i) << 4) | 0x3;
      p.words[58] = FakeVm::addr(mfa[0]);
      p.words[24] = p.lo();
      p.words[25] = p.hi();
      p.words[10] = p.lo() + 80;  // the heap top
    }
    run(0);
  }
  Process& proc() { return procs[running]; }
  void run(unsigned i) {
    running = i;
    sd[21] = FakeVm::addr(procs[i].words);
    env[1] = sd[21];
  }
  // The stack top follows the depth (the words below it stay as they are).
  void set_depth(Process& p, size_t depth) {
    p.depth = depth;
    p.words[11] = FakeVm::addr(p.stack());
  }
};

RandomVm* g_rvm = nullptr;
const void* random_sd(uint32_t key) {
  return key == g_rvm->layout.key ? g_rvm->sd : nullptr;
}

// What a capture must give, written as plainly as the contract says it:
// the header, the function, then up to max_cps continuation pointers (a
// nonzero word with the low two bits clear that is outside the process's
// memory [heap, hend)) among the first min(stack words, scan_words) words
// from the stack top, and no CPs at all when the bounds do not check out.
std::vector<uint64_t> reference_context(RandomVm& vm) {
  RandomVm::Process& p = vm.proc();
  const uint64_t heap = p.words[24], htop = p.words[10], stop = p.words[11], hend = p.words[25];
  std::vector<uint64_t> cps;
  if (heap != 0 && heap % 8 == 0 && htop % 8 == 0 && stop % 8 == 0 && hend % 8 == 0 &&
      heap <= htop && htop <= stop && stop <= hend) {
    const uint64_t* stack = reinterpret_cast<const uint64_t*>(stop);
    const size_t limit = std::min<size_t>((hend - stop) / 8, vm.layout.scan_words);
    for (size_t i = 0; i < limit && cps.size() < vm.layout.max_cps; ++i) {
      const uint64_t w = stack[i];
      const bool inside = w >= heap && w < hend;
      if (w != 0 && w % 4 == 0 && !inside) cps.push_back(w);
    }
  }
  const auto* m = reinterpret_cast<const uint64_t*>(p.words[58]);
  std::vector<uint64_t> out = {
      mi_context_header(MI_CONTEXT_PROCESS, 3, static_cast<uint32_t>(cps.size()), 0), m[0], m[1],
      m[2]};
  out.insert(out.end(), cps.begin(), cps.end());
  return out;
}

// A random stack word for process p: mostly tagged terms, and frame
// pointers, CPs, zeros, the bounds of p's memory and pointers into the
// other process's (which are CPs as far as p is concerned).
uint64_t random_word(std::mt19937_64& rng, RandomVm& vm, unsigned p) {
  const RandomVm::Process& own = vm.procs[p];
  const RandomVm::Process& other = vm.procs[1 - p];
  const uint64_t r = rng();
  const uint64_t slot = (r >> 8) % RandomVm::kHeapWords;
  switch (r % 16) {
    case 0:
    case 1:
    case 2:
      return ((r >> 8) << 4) | 0xF;  // a small integer
    case 3:
      return atom((r >> 8) & 0xFFFF);
    case 4:
      return own.lo() + slot * 8 + 2;  // a boxed term
    case 5:
      return own.lo() + slot * 8 + 1;  // a list
    case 6:
      return 0;
    case 7:
    case 8:
      return own.lo() + slot * 8;  // a frame pointer
    case 9:
    case 10:
    case 11:
      return 0x7f0000000000ull + ((r >> 8) & 0xFFFFF) * 4;  // a CP
    case 12: {
      const uint64_t bounds[] = {own.lo(), own.hi(), own.lo() - 8, own.hi() - 8, own.hi() + 8};
      return bounds[(r >> 8) % 5];
    }
    case 13:
      return other.lo() + slot * 8;  // the other process's memory
    case 14:
      return 4;  // the smallest nonzero word with the low two bits clear
    default:
      return ((r >> 8) << 4) | 0x3;  // a pid
  }
}

bool is_tagged(uint64_t w) {
  return (w & 3) != 0;
}

}  // namespace

TEST_CASE(
    "erlang context: the cache and the scan give what the plain reading of the contract "
    "gives, over random stacks and changes",
    "[erlang_context]") {
  const bool avx2 = GENERATE(true, false);
  mi::track::erlang_context_allow_avx2(avx2);
  std::mt19937_64 rng(avx2 ? 25 : 52);
  std::map<uint64_t, std::vector<uint64_t>> named;  // token -> the words it names
  // Steps checked, steps after which the cache held a scan, steps whose
  // words were those of the step before, and other words.
  size_t checked = 0, kept = 0, same = 0, other = 0;
  for (unsigned round = 0; round < 400; ++round) {
    RandomVm vm;
    g_rvm = &vm;
    vm.layout.max_cps = static_cast<uint32_t>(rng() % (MI_CONTEXT_MAX_CPS + 1));
    vm.layout.scan_words = static_cast<uint32_t>(rng() % 4 == 0 ? rng() % 12 : rng() % 90);
    REQUIRE(erlang_layout_valid(vm.layout));
    // Deep stacks (beyond what the cache keeps) and shallow ones (fewer
    // than 8 words).
    const size_t depth = rng() % 3 == 0 ? rng() % 10 : rng() % 100;
    for (unsigned p = 0; p < 2; ++p) {
      vm.set_depth(vm.procs[p], depth);
      for (size_t i = 0; i < depth; ++i) vm.procs[p].stack()[i] = random_word(rng, vm, p);
    }
    mi::track::ContextCache cache{};
    cache.next_token = mi::track::first_token(round + (avx2 ? 0 : 1000));
    std::vector<uint64_t> last;
    uint64_t last_token = 0;
    for (unsigned step = 0; step < 60; ++step) {
      RandomVm::Process& p = vm.proc();
      const size_t at = p.depth == 0 ? 0 : rng() % p.depth;
      switch (rng() % 11) {
        case 0:
          break;  // the same stack: the cache answers
        case 1:
        case 2:
          // A y register changed (a tagged term for another), as between
          // two calls of a NIF from one loop.
          if (p.depth != 0 && is_tagged(p.stack()[at])) p.stack()[at] = ((rng() >> 8) << 4) | 0xF;
          break;
        case 3:
          if (p.depth == 0) break;  // no word to change
          if (rng() % 3 == 0) {
            // A word's upper half alone (a CP for another, a frame pointer
            // for a CP, a term for another).
            p.stack()[at] ^= uint64_t{1} << (32 + rng() % 16);
          } else {
            p.stack()[at] = random_word(rng, vm, vm.running);  // any word, any kind
          }
          break;
        case 4: {
          // The other process, running the same code: its frame pointers
          // point into its own memory; a y register may differ.
          const unsigned o = 1 - vm.running;
          RandomVm::Process& q = vm.procs[o];
          vm.set_depth(q, p.depth);
          for (size_t i = 0; i < p.depth; ++i) {
            const uint64_t w = p.stack()[i];
            q.stack()[i] = w >= p.lo() && w < p.hi() ? w - p.lo() + q.lo() : w;
          }
          if (p.depth != 0 && rng() % 2 == 0 && is_tagged(q.stack()[at]))
            q.stack()[at] = ((rng() >> 8) << 4) | 0xF;
          vm.run(o);
          break;
        }
        case 5: {
          // A deeper or shallower stack (a call, a return).
          const size_t d = rng() % 2 == 0 ? p.depth + 1 + rng() % 3
                                          : p.depth - std::min<size_t>(p.depth, 1 + rng() % 3);
          const size_t old = p.depth;
          vm.set_depth(p, std::min<size_t>(d, RandomVm::kHeapWords - 16));
          for (size_t i = 0; i + old < p.depth; ++i)
            p.stack()[i] = random_word(rng, vm, vm.running);
          break;
        }
        case 6:
          // Another CP where one was (another caller at the same depth).
          for (size_t i = 0; i < p.depth; ++i) {
            const uint64_t w = p.stack()[(at + i) % p.depth];
            if (w != 0 && w % 4 == 0 && !(w >= p.lo() && w < p.hi())) {
              p.stack()[(at + i) % p.depth] = 0x7f0000000000ull + ((rng() >> 8) & 0xFFFFF) * 4;
              break;
            }
          }
          break;
        case 7:
          p.words[58] = FakeVm::addr(vm.mfa[rng() % 2]);  // another function
          break;
        case 8: {
          // The heap top: usually somewhere it may be, now and then not.
          const uint64_t tops[] = {p.lo(), p.lo() + 8 * (rng() % 16), p.words[11], p.words[11] + 8,
                                   p.lo() + 4};
          p.words[10] = tops[rng() % (rng() % 4 == 0 ? 5 : 3)];
          break;
        }
        case 9:
          // The bounds of the process's memory move, its stack top and pid
          // do not: the frame pointers near them change kind. (The end
          // stays within the memory, at or above the stack top.)
          if (rng() % 2 == 0) {
            p.words[24] = p.lo() + 8 * (rng() % 4);
          } else {
            p.words[25] = p.hi() - 8 * (rng() % (std::min<size_t>(p.depth, 3) + 1));
          }
          if (rng() % 3 == 0) {
            p.words[24] = p.lo();
            p.words[25] = p.hi();
          }
          break;
        default:
          // Two words at once: a y register and any word.
          if (p.depth == 0) break;  // no word to change
          if (is_tagged(p.stack()[at])) p.stack()[at] = atom(rng() & 0xFFF);
          p.stack()[rng() % p.depth] = random_word(rng, vm, vm.running);
          break;
      }
      INFO("avx2 " << avx2 << ", round " << round << ", step " << step << ", depth "
                   << vm.proc().depth << ", max_cps " << vm.layout.max_cps << ", scan_words "
                   << vm.layout.scan_words);
      const std::vector<uint64_t> want = reference_context(vm);
      uint64_t out[MI_CONTEXT_MAX_WORDS], pid = 0;
      const mi::track::ContextWords c =
          mi::track::read_erlang_context(vm.layout, random_sd, nullptr, out, &pid, &cache);
      const std::vector<uint64_t> got(c.words, c.words + c.n);
      REQUIRE(got == want);
      REQUIRE(pid == vm.proc().words[0]);
      REQUIRE(c.hash == mi::track::StackTable::hash_words(c.words, c.n));
      // Without the cache: the same words.
      uint64_t plain[MI_CONTEXT_MAX_WORDS], plain_pid = 0;
      const unsigned n =
          capture_erlang_context(vm.layout, random_sd, nullptr, plain, &plain_pid, nullptr);
      REQUIRE(std::vector<uint64_t>(plain, plain + n) == want);
      // A token names one content only.
      if (c.token != 0) {
        const auto it = named.emplace(c.token, got).first;
        REQUIRE(it->second == got);
      }
      if (cache.scanned != 0) ++kept;
      ++(got == last ? same : other);
      // The same words as the last capture, both named: by the same token.
      if (got == last && c.token != 0 && last_token != 0) REQUIRE(c.token == last_token);
      last = got;
      last_token = c.token;
      ++checked;
    }
    g_rvm = nullptr;
  }
  mi::track::erlang_context_allow_avx2(true);
  // Every kind of step, often.
  CHECK(checked == 400u * 60u);
  CHECK(kept > checked / 2);
  CHECK(same > checked / 4);
  CHECK(other > checked / 8);
}
