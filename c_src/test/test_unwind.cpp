// The tracker's unwinder returns exactly libunwind's stacks wherever it can
// step every frame: over many frame shapes (unwind_fixture.cpp), warm and
// cold, with and without a cache, truncated or not, from libc code, code
// without unwind info (JIT-like, with good, null, wild and fake frame
// pointers), frames whose CFI the registers no longer fit (a stale rule's
// situation), two threads at once, and a cache handed from one thread to
// another. Where a frame is outside the supported shape (a signal frame, a
// CFA expression, a CFI instruction at the return address), its stack is a
// prefix of libunwind's ending at that frame. And it never waits for the
// loader lock: it calls no loader function at all, and completes while
// another thread holds that lock.
//
// Both back ends are always called through one call site (capture_site via
// a function pointer; libunwind through a frameless stub with the same
// signature), so whole stacks, first frame included, are compared.
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include "catch.h"

#include "../track/unwind.h"
#include "loader_probe.h"
#include "unwind_fixture.h"
#include "unwind_reference.h"

// The fixture's frames are x86_64 assembly and CFI; elsewhere capture_cached
// is libunwind's loop and there is nothing of its own to test.
#if defined(__x86_64__)

namespace {

using mi::track::UnwindCache;
using mi::track::UnwindCacheStats;
using unwind_fixture::Shape;
using Stack = std::vector<uintptr_t>;
using CaptureFn = size_t (*)(UnwindCache*, uintptr_t*, size_t);

const CaptureFn kLibunwind = unwind_fixture_libunwind_stub;
const CaptureFn kCached = mi::track::capture_cached;
const CaptureFn kUnwBacktrace = unwind_fixture_backtrace_stub;

const CaptureFn kCachedNoCache = unwind_fixture_nocache_stub;

// Cache memory as the tracker gets it: mmap'd, hence zero-filled.
class CacheMem {
 public:
  CacheMem() {
    mem_ = mmap(nullptr, mi::track::unwind_cache_bytes(), PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem_ == MAP_FAILED) std::abort();
    cache = mi::track::unwind_cache_init(mem_);
  }
  ~CacheMem() { munmap(mem_, mi::track::unwind_cache_bytes()); }
  CacheMem(const CacheMem&) = delete;
  CacheMem& operator=(const CacheMem&) = delete;
  UnwindCacheStats stats() const { return mi::track::unwind_cache_stats(cache); }
  // Pages of the cache's memory that are resident (mincore).
  size_t resident_pages() const {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> vec((mi::track::unwind_cache_bytes() + page - 1) / page);
    if (mincore(mem_, mi::track::unwind_cache_bytes(), vec.data()) != 0) std::abort();
    return static_cast<size_t>(
        std::count_if(vec.begin(), vec.end(), [](unsigned char v) { return (v & 1) != 0; }));
  }

  UnwindCache* cache;

 private:
  void* mem_;
};

// The one call site of every capture in these tests.
__attribute__((noipa)) size_t capture_site(CaptureFn fn, UnwindCache* cache, uintptr_t* out,
                                           size_t max) {
  size_t n = fn(cache, out, max);
  __asm__ volatile("" : "+r"(n));
  return n;
}

// Returns its return address in the shape of a capture.
__attribute__((noipa)) size_t return_address_probe(UnwindCache*, uintptr_t* out, size_t max) {
  if (max > 0) out[0] = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  return max > 0 ? 1 : 0;
}

struct Delta {
  uint64_t hits, misses, fallbacks, truncated;
};

// What one leaf call captures: one stack per function in fns, in order, with
// the cache counters' change around each.
struct Session {
  UnwindCache* cache = nullptr;
  size_t max = 256;
  std::vector<CaptureFn> fns;
  std::vector<Stack> stacks;
  std::vector<Delta> deltas;
  std::vector<size_t> counts;
  int calls = 0;
};

UnwindCacheStats stats_of(const UnwindCache* cache) {
  return cache != nullptr ? mi::track::unwind_cache_stats(cache) : UnwindCacheStats{};
}

// Allocates nothing: it also runs in signal handlers.
__attribute__((noipa)) void leaf(void* arg) {
  auto* s = static_cast<Session*>(arg);
  ++s->calls;
  for (size_t k = 0; k < s->fns.size(); ++k) {
    Stack& out = s->stacks[k];
    std::fill(out.begin(), out.end(), 0x5a5a5a5a);  // max + 1, to catch writes past max
    const UnwindCacheStats before = stats_of(s->cache);
    s->counts[k] = capture_site(s->fns[k], s->cache, out.data(), s->max);
    const UnwindCacheStats after = stats_of(s->cache);
    s->deltas[k] = Delta{after.hits - before.hits, after.misses - before.misses,
                         after.fallbacks - before.fallbacks, after.truncated - before.truncated};
  }
}

// Checks every captured stack against the first (libunwind's).
void check_same(const Session& s) {
  REQUIRE(s.stacks.size() == s.fns.size());
  for (size_t k = 0; k < s.stacks.size(); ++k) {
    REQUIRE(s.counts[k] <= s.max);
    CHECK(s.stacks[k][s.max] == 0x5a5a5a5a);
    const Stack got(s.stacks[k].begin(), s.stacks[k].begin() + static_cast<long>(s.counts[k]));
    const Stack want(s.stacks[0].begin(), s.stacks[0].begin() + static_cast<long>(s.counts[0]));
    INFO("capture " << k);
    CHECK(got == want);
  }
}

// Whether capture k is libunwind's stack (capture 0) cut after a frame.
bool is_strict_prefix(const Session& s, size_t k) {
  return s.counts[k] > 0 && s.counts[k] < s.counts[0] &&
         std::equal(s.stacks[k].begin(), s.stacks[k].begin() + static_cast<long>(s.counts[k]),
                    s.stacks[0].begin());
}

void run_chain(Session& s, const std::vector<Shape>& shapes, int depth, size_t bytes = 64,
               uintptr_t bad_bp = 0) {
  unwind_fixture::Ctx ctx{shapes.data(), shapes.size(), depth, bytes, leaf, &s, nullptr, bad_bp};
  unwind_fixture_run(&ctx, 0);
}

// libunwind, then the cached back end `reps` times, then `extra`.
Session session(UnwindCache* cache, size_t max, int reps, CaptureFn extra = nullptr) {
  Session s;
  s.cache = cache;
  s.max = max;
  s.fns.push_back(kLibunwind);
  for (int i = 0; i < reps; ++i) s.fns.push_back(kCached);
  if (extra != nullptr) s.fns.push_back(extra);
  s.stacks.assign(s.fns.size(), Stack(max + 1));
  s.deltas.resize(s.fns.size());
  s.counts.resize(s.fns.size());
  return s;
}

// Addresses no test can find mapped: below vm.mmap_min_addr (64 KiB by
// default), and outside the canonical address range. (An address once mapped
// and then unmapped does not do: the next mmap may reuse it.)
constexpr uintptr_t kNeverMapped = 0x8000;
constexpr uintptr_t kNonCanonical = uintptr_t{0x8000} << 32;

const std::vector<Shape> kAllCacheable = {
    Shape::kFp,   Shape::kNoFp,   Shape::kAlloca, Shape::kVla,  Shape::kAligned, Shape::kBusy,
    Shape::kNoFp, Shape::kAlloca, Shape::kFp,     Shape::kBusy, Shape::kVla};

}  // namespace

TEST_CASE("unwind: cache memory is 64-256 KiB and starts empty", "[unwind]") {
  CHECK(mi::track::unwind_cache_bytes() >= 64 * 1024);
  CHECK(mi::track::unwind_cache_bytes() <= 256 * 1024);
  CacheMem mem;
  const UnwindCacheStats st = mem.stats();
  CHECK(st.hits == 0);
  CHECK(st.misses == 0);
  CHECK(st.fallbacks == 0);
  CHECK(st.entries == 0);
}

// N + 1 distinct functions, each calling the next from its own call site:
// a stack of N + 1 distinct return addresses above the capture.
template <int N>
__attribute__((noipa)) size_t distinct_chain(UnwindCache* cache, uintptr_t* out, size_t max) {
  size_t n;
  if constexpr (N == 0) {
    n = capture_site(kCached, cache, out, max);
  } else {
    n = distinct_chain<N - 1>(cache, out, max);
  }
  __asm__ volatile("" : "+r"(n));  // keeps the call from being a tail call
  return n;
}

// distinct_chain<600>, always from this call site.
__attribute__((noipa)) size_t capture_distinct(UnwindCache* cache, std::vector<uintptr_t>* out) {
  return distinct_chain<600>(cache, out->data(), out->size());
}

TEST_CASE("unwind: the rule table grows with its rules and keeps them at half load", "[unwind]") {
  CacheMem mem;
  CHECK(mem.stats().slots == 256);
  // A shallow stack: a few rules, the first table.
  std::vector<uintptr_t> out(1024);
  REQUIRE(capture_site(kCached, mem.cache, out.data(), out.size()) > 2);
  CHECK(mem.stats().slots == 256);
  CHECK(mem.stats().entries < 128);
  // Over 600 return addresses: the table doubles three times (at 128, 256
  // and 512 rules), forgetting its rules each time; the next captures
  // derive the forgotten ones again, until one derives none. Every capture
  // is the same stack (one call site).
  std::vector<Stack> stacks;
  std::vector<UnwindCacheStats> after;
  // The last capture follows a flush (code unmapped): the rules are
  // forgotten, the table keeps its size.
  for (int i = 0; i < 7; ++i) {
    if (i == 6) mi::track::unwind_code_unmapped();
    const size_t n = capture_distinct(mem.cache, &out);
    stacks.emplace_back(out.begin(), out.begin() + static_cast<ptrdiff_t>(n));
    after.push_back(mem.stats());
  }
  REQUIRE(stacks[0].size() > 600);
  for (const Stack& st : stacks) CHECK(st == stacks[0]);
  // The growth happens in the first two captures (the second derives
  // again the rules the first forgot, and grows once more at 512), the
  // third derives what the second forgot; later ones are warm.
  const UnwindCacheStats& warm = after[5];
  INFO("entries " << warm.entries << ", slots " << warm.slots);
  CHECK(after[3].misses == warm.misses);
  CHECK(after[3].fallbacks == warm.fallbacks);
  CHECK(warm.entries > 600);
  // The smallest table that holds them at most half full.
  CHECK(warm.slots == 2048);
  CHECK(warm.entries <= warm.slots / 2);
  // Resident: the counters' page and the 2048 rules' 8 pages, not the
  // whole 128 KiB mapping (32 pages of rules, all touched when 600 rules
  // were hashed over the largest table).
  CHECK(mem.resident_pages() <= 1 + 2048 * 16 / 4096);
  CHECK(after[6].slots == 2048);
  CHECK(after[6].misses > warm.misses + 600);
}

TEST_CASE("unwind: the first frame is the return address into the caller", "[unwind]") {
  CacheMem mem;
  // probe, libunwind, cached (cold), cached (warm), all from one call site.
  const CaptureFn fns[] = {return_address_probe, kLibunwind, kCached, kCached, kCached};
  uintptr_t out[5][64] = {};
  size_t n[5] = {};
  for (size_t k = 0; k < 5; ++k) n[k] = capture_site(fns[k], mem.cache, out[k], 64);
  REQUIRE(n[0] == 1);
  REQUIRE(n[1] > 2);
  for (size_t k = 1; k < 5; ++k) {
    INFO("capture " << k);
    CHECK(out[k][0] == out[0][0]);
    REQUIRE(n[k] == n[1]);
    CHECK(std::memcmp(out[k], out[1], n[1] * sizeof out[1][0]) == 0);
  }
  // Called directly, the first frame is in this function, and the next one
  // is the same for both.
  uintptr_t direct[4] = {};
  uintptr_t direct_lib[4] = {};
  REQUIRE(mi::track::capture_cached(mem.cache, direct, 4) == 4);
  REQUIRE(unwind_reference::capture_libunwind(direct_lib, 4) == 4);
  CHECK(direct[0] != direct_lib[0]);
  CHECK(direct[1] == direct_lib[1]);
  CHECK(direct[2] == direct_lib[2]);
}

TEST_CASE("unwind: max of 0 writes nothing", "[unwind]") {
  CacheMem mem;
  uintptr_t out[1] = {7};
  CHECK(mi::track::capture_cached(mem.cache, out, 0) == 0);
  CHECK(unwind_reference::capture_libunwind(out, 0) == 0);
  CHECK(out[0] == 7);
}

TEST_CASE("unwind: each frame shape, cold then warm", "[unwind]") {
  const std::vector<std::pair<const char*, Shape>> shapes = {
      {"frame pointer", Shape::kFp},     {"no frame pointer", Shape::kNoFp},
      {"alloca", Shape::kAlloca},        {"VLA", Shape::kVla},
      {"over-aligned", Shape::kAligned}, {"callee-saved pushes", Shape::kBusy}};
  for (const auto& [name, shape] : shapes) {
    INFO(name);
    CacheMem mem;
    Session s = session(mem.cache, 256, 3);
    run_chain(s, {shape}, 12);
    check_same(s);
    CHECK(s.counts[0] >= 24);
    CHECK(s.deltas[1].fallbacks == 1);  // cold: learnt through libunwind
    for (size_t k = 2; k < s.fns.size(); ++k) {
      CHECK(s.deltas[k].fallbacks == 0);
      CHECK(s.deltas[k].misses == 0);
      CHECK(s.deltas[k].hits == s.counts[k]);  // every frame, the last one's end rule too
    }
  }
}

TEST_CASE("unwind: alloca and VLA sizes change under a warm cache", "[unwind]") {
  // The classic trap: an RSP-relative rule learnt at one alloca size is wrong
  // at the next. The CFI says RBP-relative, so the rule holds for every size.
  CacheMem mem;
  const std::vector<Shape> shapes = {Shape::kAlloca, Shape::kVla, Shape::kNoFp};
  for (size_t bytes : {size_t{16}, size_t{5000}, size_t{0}, size_t{123}, size_t{70000}}) {
    INFO("bytes " << bytes);
    Session s = session(mem.cache, 256, 2);
    run_chain(s, shapes, 9, bytes);
    check_same(s);
    if (bytes != 16) {
      CHECK(s.deltas[1].fallbacks == 0);
      CHECK(s.deltas[1].hits == s.counts[1]);
    }
  }
}

TEST_CASE("unwind: mixed shapes, repeated calls", "[unwind]") {
  CacheMem mem;
  for (int round = 0; round < 20; ++round) {
    Session s = session(mem.cache, 256, 1);
    run_chain(s, kAllCacheable, 10 + round, 32 + static_cast<size_t>(round) * 40);
    check_same(s);
    if (round > 0) CHECK(s.deltas[1].fallbacks == 0);
  }
  CHECK(mem.stats().hits > 0);
  CHECK(mem.stats().entries > 20);
}

TEST_CASE("unwind: deep recursion, truncated and whole", "[unwind]") {
  CacheMem mem;
  for (size_t max : {size_t{32}, size_t{1000}, size_t{32}}) {
    INFO("max " << max);
    Session s = session(mem.cache, max, 2);
    run_chain(s, {Shape::kFp, Shape::kNoFp}, 200);
    check_same(s);
    if (max == 32) {
      CHECK(s.counts[0] == 32);
    } else {
      CHECK(s.counts[0] > 400);
      CHECK(s.counts[0] < max);
    }
    CHECK(s.deltas[2].fallbacks == 0);
  }
}

TEST_CASE("unwind: max smaller than, equal to and larger than the depth", "[unwind]") {
  CacheMem mem;
  Session full = session(mem.cache, 512, 1);
  run_chain(full, kAllCacheable, 15);
  check_same(full);
  const size_t depth = full.counts[0];
  for (size_t max :
       {size_t{1}, size_t{2}, size_t{3}, size_t{7}, depth - 1, depth, depth + 1, depth + 100}) {
    INFO("max " << max);
    Session s = session(mem.cache, max, 2);
    run_chain(s, kAllCacheable, 15);
    check_same(s);
    CHECK(s.counts[0] == std::min(max, depth));
  }
}

TEST_CASE("unwind: frames inside libc (qsort comparator)", "[unwind]") {
  CacheMem mem;
  static Session* current = nullptr;
  std::vector<int> data(300);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<int>((i * 7919) % 1009);
  for (int round = 0; round < 3; ++round) {
    Session s = session(mem.cache, 256, 2);
    current = &s;
    std::vector<int> copy = data;
    qsort(copy.data(), copy.size(), sizeof(int), [](const void* a, const void* b) -> int {
      if (current->calls < 3) leaf(current);
      return *static_cast<const int*>(a) - *static_cast<const int*>(b);
    });
    current = nullptr;
    REQUIRE(s.calls == 3);
    check_same(s);
    if (round > 0) CHECK(s.deltas[2].fallbacks == 0);
  }
}

namespace {
Session* g_signal_session = nullptr;

void signal_leaf(void*) {
  raise(SIGUSR1);
}
}  // namespace

TEST_CASE("unwind: through a signal frame (and on an alternate stack)", "[unwind]") {
  CacheMem mem;
  for (bool altstack : {false, true}) {
    INFO("altstack " << altstack);
    stack_t ss{};
    std::vector<char> alt(1 << 16);
    if (altstack) {
      ss.ss_sp = alt.data();
      ss.ss_size = alt.size();
      REQUIRE(sigaltstack(&ss, nullptr) == 0);
    }
    struct sigaction sa {};
    sa.sa_handler = [](int) { leaf(g_signal_session); };
    sa.sa_flags = altstack ? SA_ONSTACK : 0;
    sigemptyset(&sa.sa_mask);
    struct sigaction old {};
    REQUIRE(sigaction(SIGUSR1, &sa, &old) == 0);
    for (int round = 0; round < 3; ++round) {
      Session s = session(mem.cache, 256, 2);
      g_signal_session = &s;
      unwind_fixture::Ctx ctx{
          kAllCacheable.data(), kAllCacheable.size(), 6, 64, signal_leaf, nullptr, nullptr, 0};
      unwind_fixture_run(&ctx, 0);
      g_signal_session = nullptr;
      REQUIRE(s.calls == 1);
      // libunwind: the handler's frames, the signal frame, then the
      // interrupted chain (6 levels of 2 frames).
      CHECK(s.counts[0] > 12);
      // The signal trampoline's CFI is an expression: the stack ends there,
      // a prefix of libunwind's, from a cached rule once warm (except on
      // the alternate stack, where no window is learnt).
      for (size_t k = 1; k < s.fns.size(); ++k) {
        INFO("capture " << k);
        CHECK(is_strict_prefix(s, k));
        CHECK(s.deltas[k].truncated == 1);
      }
#ifndef __SANITIZE_THREAD__
      // (TSan defers signals and runs handlers from its interceptors, with
      // frames of its own around them.)
      for (size_t k = 1; k < s.fns.size(); ++k) CHECK(s.counts[k] + 12 <= s.counts[0]);
      Dl_info info{};
      REQUIRE(dladdr(reinterpret_cast<void*>(s.stacks[2][s.counts[2] - 1]), &info) != 0);
      CHECK(std::strstr(info.dli_fname, "libc.so") != nullptr);
      CHECK(s.deltas[2].fallbacks == (altstack ? 1u : 0u));
#endif
    }
    sigaction(SIGUSR1, &old, nullptr);
    if (altstack) {
      ss.ss_flags = SS_DISABLE;
      sigaltstack(&ss, nullptr);
    }
  }
}

TEST_CASE("unwind: code without unwind info is stepped like libunwind's frame-pointer guess",
          "[unwind]") {
  if (!unwind_fixture_jit_available()) {
    WARN("cannot map executable memory here: no JIT-like frame to test");
    return;
  }
  const std::vector<std::pair<const char*, std::vector<Shape>>> chains = {
      {"JIT, valid RBP chain",
       {Shape::kFp, Shape::kNoFp, Shape::kJit, Shape::kAlloca, Shape::kBusy}},
      {"JIT only", {Shape::kJit}},
      {"JIT, fake frame record", {Shape::kNoFp, Shape::kJitFake, Shape::kFp}},
      // libunwind checks both pages of the 8 bytes it reads at the return
      // address; the cache used to end the stack there.
      {"JIT, return address in a page's last 8 bytes", {Shape::kNoFp, Shape::kJitEdge, Shape::kFp}},
      {"no CFI inside .text", {Shape::kNoFp, Shape::kNoCfi, Shape::kVla}},
  };
  for (const auto& [name, shapes] : chains) {
    INFO(name);
    CacheMem mem;
    for (int round = 0; round < 3; ++round) {
      Session s = session(mem.cache, 256, 2);
      run_chain(s, shapes, 10);
      check_same(s);
      CHECK(s.counts[0] > 6);
      if (round > 0) {
        // Warm: no libunwind at all, every frame and the end from rules.
        CHECK(s.deltas[1].fallbacks == 0);
        CHECK(s.deltas[2].fallbacks == 0);
        CHECK(s.deltas[2].hits == s.counts[2]);
      }
    }
  }
}

TEST_CASE("unwind: a JIT frame's RBP decides where libunwind stops", "[unwind]") {
  if (!unwind_fixture_jit_available()) {
    WARN("cannot map executable memory here: no JIT-like frame to test");
    return;
  }
  void* none = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(none != MAP_FAILED);
  static uintptr_t heap_word[4] = {1, 2, 3, 4};
  const std::vector<std::pair<const char*, uintptr_t>> rbps = {
      {"RBP = 0", 0},
      {"RBP -> never mapped (below mmap_min_addr)", kNeverMapped},
      {"RBP -> non-canonical", kNonCanonical},
      {"RBP -> PROT_NONE page", reinterpret_cast<uintptr_t>(none) + 64},
      {"RBP -> readable memory far from the stack", reinterpret_cast<uintptr_t>(heap_word)},
      {"RBP = 1", 1},
      {"RBP = ~0", ~uintptr_t{0}},
  };
  const std::vector<Shape> shapes = {Shape::kNoFp, Shape::kFp, Shape::kJitBp, Shape::kAlloca};
  for (const auto& [name, rbp] : rbps) {
    INFO(name);
    CacheMem mem;
    for (int round = 0; round < 3; ++round) {
      Session s = session(mem.cache, 256, 2);
      run_chain(s, shapes, 12, 64, rbp);
      check_same(s);
      // libunwind stops at the first such frame: the leaf's frames, then
      // level 0 to 2 (two frames each), then the JIT frame.
      CHECK(s.counts[0] < 12);
      if (round > 0) {
        CHECK(s.deltas[2].fallbacks == 0);
        CHECK(s.deltas[2].hits == s.counts[2]);
      }
    }
  }
  munmap(none, 4096);
}

TEST_CASE("unwind: a rule the registers no longer fit never reads outside the stack window",
          "[unwind]") {
  // kBadFp's CFI says CFA = RBP + 16. Its rule is learnt with an honest RBP,
  // then applied with RBP pointing elsewhere: a stale rule's situation (code
  // unmapped, other code mapped at its addresses). The fast path must hand
  // such frames to the cold walk, which validates what it reads, without
  // loading anything outside the stack window itself. On a second thread, so
  // the main thread's stack is readable memory outside the window. The
  // result is libunwind's, or libunwind's without its last frame where the
  // lying CFA lies below the frame's SP (libunwind takes that step, the
  // cold walk refuses a frame that moves down the stack).
  void* none = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(none != MAP_FAILED);
  // Frame records {saved RBP = 0, return address = somewhere without unwind
  // info}: libunwind follows them one frame, then stops.
  alignas(16) static uintptr_t static_record[4];
  static_record[0] = 0;
  static_record[1] = reinterpret_cast<uintptr_t>(&static_record[2]);
  alignas(16) uintptr_t stack_record[4] = {0, 0, 0, 0};
  stack_record[1] = reinterpret_cast<uintptr_t>(&stack_record[2]);
  struct Case {
    const char* name;
    uintptr_t rbp;
    int mismatches = 0;  // neither libunwind's stack nor a strict prefix of it
    size_t shorter = 0;  // most frames fewer than libunwind's
    uint64_t fallbacks = 0;
    size_t count = 0;
  };
  std::vector<Case> cases = {
      {"honest RBP", 0},
      {"RBP -> never mapped (below mmap_min_addr)", kNeverMapped},
      {"RBP -> non-canonical", kNonCanonical},
      {"RBP -> PROT_NONE page", reinterpret_cast<uintptr_t>(none) + 64},
      {"RBP -> frame record in static memory", reinterpret_cast<uintptr_t>(static_record)},
      {"RBP -> frame record on another thread's stack", reinterpret_cast<uintptr_t>(stack_record)},
      {"RBP = 8", 8},
      {"honest RBP again", 0},
  };
  std::thread worker([&cases] {
    CacheMem mem;
    const std::vector<Shape> shapes = {Shape::kNoFp, Shape::kFp, Shape::kBadFp, Shape::kBusy};
    for (int warmup = 0; warmup < 2; ++warmup) {
      Session s = session(mem.cache, 256, 2);
      run_chain(s, shapes, 10);
    }
    for (Case& c : cases) {
      Session s = session(mem.cache, 256, 2);
      run_chain(s, shapes, 10, 64, c.rbp);
      for (size_t k = 1; k < s.fns.size(); ++k) {
        const bool same =
            s.counts[k] == s.counts[0] &&
            std::equal(s.stacks[0].begin(), s.stacks[0].begin() + static_cast<long>(s.counts[0]),
                       s.stacks[k].begin());
        if (!same && !is_strict_prefix(s, k)) ++c.mismatches;
        c.shorter = std::max(c.shorter, s.counts[0] - std::min(s.counts[0], s.counts[k]));
      }
      c.fallbacks = s.deltas[2].fallbacks;
      c.count = s.counts[0];
    }
  });
  worker.join();
  munmap(none, 4096);
  for (const Case& c : cases) {
    INFO(c.name << ": libunwind " << c.count << " frames, cached up to " << c.shorter << " fewer");
    CHECK(c.mismatches == 0);
    if (c.rbp == 0) {
      CHECK(c.shorter == 0);
      CHECK(c.fallbacks == 0);
      CHECK(c.count > 20);
    } else {
      // libunwind stops at (or one frame past) the lying frame.
      CHECK(c.count < 20);
      CHECK(c.shorter <= 1);
    }
  }
}

TEST_CASE("unwind: a cache handed to another thread relearns its stack window", "[unwind]") {
  CacheMem mem;
  int mismatches = 0;
  std::vector<uint64_t> fallbacks;
  auto rounds = [&] {
    for (int round = 0; round < 3; ++round) {
      Session s = session(mem.cache, 256, 2);
      run_chain(s, kAllCacheable, 12);
      for (size_t k = 1; k < 3; ++k)
        if (s.counts[k] != s.counts[0] ||
            !std::equal(s.stacks[0].begin(), s.stacks[0].begin() + static_cast<long>(s.counts[0]),
                        s.stacks[k].begin()))
          ++mismatches;
      fallbacks.push_back(s.deltas[1].fallbacks);
      fallbacks.push_back(s.deltas[2].fallbacks);
    }
  };
  // The second thread starts while the first lives, so it cannot be given
  // the first one's stack (glibc reuses the stacks of finished threads).
  std::thread([&] {
    rounds();
    std::thread(rounds).join();
  }).join();
  CHECK(mismatches == 0);
  // First thread: cold, then warm. Second: the rules hold, the window does
  // not (another stack): one libunwind walk, then warm again.
  const std::vector<uint64_t> want = {1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0};
  CHECK(fallbacks == want);
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
TEST_CASE("unwind: why capture_libunwind is no unw_backtrace: it faults on a lying frame",
          "[unwind]") {
  // unw_backtrace's fast path (tdep_trace) replays cached frame shapes with
  // unvalidated loads; unw_step validates (libunwind's CONSERVATIVE_CHECKS).
  // Warm unw_backtrace on an honest kBadFp frame, then let its RBP point to
  // a PROT_NONE page: unw_step stops there, unw_backtrace faults. In a child.
  void* none = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(none != MAP_FAILED);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);  // not Catch's handler: the parent reports
    CacheMem mem;
    const std::vector<Shape> shapes = {Shape::kNoFp, Shape::kBadFp};
    Session honest = session(mem.cache, 64, 0, kUnwBacktrace);
    run_chain(honest, shapes, 6);
    Session lying = session(mem.cache, 64, 0);
    run_chain(lying, shapes, 6, 64, reinterpret_cast<uintptr_t>(none) + 64);
    if (lying.counts[0] == 0 || lying.counts[0] >= honest.counts[0]) _exit(3);
    Session lying_bt = session(mem.cache, 64, 0, kUnwBacktrace);
    lying_bt.fns.erase(lying_bt.fns.begin());
    run_chain(lying_bt, shapes, 6, 64, reinterpret_cast<uintptr_t>(none) + 64);
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  munmap(none, 4096);
  INFO("child status " << status);
  CHECK(WIFSIGNALED(status));
  if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGSEGV);
}
#endif

TEST_CASE("unwind: CFI outside the supported shape ends the stack at that frame", "[unwind]") {
  // A CFA expression, and a CFI instruction exactly at the return address:
  // libunwind steps both; the cache ends the stack at the odd frame, its
  // return address included, from a cached "stop" rule once warm.
  const std::vector<std::pair<Shape, uintptr_t>> odds = {
      {Shape::kExpr, reinterpret_cast<uintptr_t>(&unwind_fixture_expr_frame)},
      {Shape::kQuirk, reinterpret_cast<uintptr_t>(&unwind_fixture_quirk_frame)}};
  for (const auto& [odd, odd_start] : odds) {
    INFO("shape " << static_cast<int>(odd));
    CacheMem mem;
    // One odd frame near the innermost end of a deep chain.
    std::vector<Shape> shapes(40, Shape::kNoFp);
    shapes[37] = odd;
    for (int round = 0; round < 3; ++round) {
      Session s = session(mem.cache, 256, 2);
      run_chain(s, shapes, 40);
      REQUIRE(s.counts[0] > 80);
      for (size_t k = 1; k < s.fns.size(); ++k) {
        INFO("capture " << k);
        REQUIRE(is_strict_prefix(s, k));
        CHECK(s.counts[k] < 16);
        // The last frame is the return address into the odd function.
        const uintptr_t last = s.stacks[k][s.counts[k] - 1];
        CHECK(last > odd_start);
        CHECK(last - odd_start < 64);
        CHECK(s.deltas[k].truncated == 1);
      }
      const Delta& warm = s.deltas[2];
      CHECK(warm.fallbacks == 0);
      CHECK(warm.misses == 0);
      CHECK(warm.hits == s.counts[2]);
    }
  }
}

TEST_CASE("unwind: without a cache, every rule derived and every load checked", "[unwind]") {
  // A thread without a cache (the tracker's shared overflow state) gets the
  // same stacks, from the cold walk alone.
  for (int round = 0; round < 3; ++round) {
    Session s = session(nullptr, 256, 0, kCachedNoCache);
    run_chain(s, kAllCacheable, 10 + round, 100);
    check_same(s);
    CHECK(s.counts[0] > 20);
  }
  if (unwind_fixture_jit_available()) {
    Session s = session(nullptr, 256, 0, kCachedNoCache);
    run_chain(s, {Shape::kFp, Shape::kJit, Shape::kJitFake, Shape::kNoFp}, 10);
    check_same(s);
  }
}

namespace {

// One capture through a chain whose rules no cache has seen: code without
// unwind info (mapped at run time, and inside .text), for which libunwind
// searches every loaded object, and CFI frames of every shape; with this
// thread's loader activity during the capture. With `reference`,
// libunwind's capture of the same chain instead.
struct ColdCapture {
  Stack stack;
  uint64_t walks = 0;
  bool reference = false;
};

__attribute__((noipa)) void cold_leaf(void* arg) {
  auto* c = static_cast<ColdCapture*>(arg);
  CacheMem mem;
  uintptr_t out[256];
  const loader_probe::Counts before = loader_probe::thread_counts();
  const size_t n = capture_site(c->reference ? kLibunwind : kCached, mem.cache, out, 256);
  c->walks = loader_probe::thread_counts().walks - before.walks;
  c->stack.assign(out, out + n);
}

__attribute__((noipa)) ColdCapture cold_capture(bool reference) {
  ColdCapture c;
  c.reference = reference;
  const std::vector<Shape> shapes = {Shape::kFp,     Shape::kJit,   Shape::kNoFp,
                                     Shape::kAlloca, Shape::kJit,   Shape::kVla,
                                     Shape::kBusy,   Shape::kNoCfi, Shape::kAligned};
  unwind_fixture::Ctx ctx{shapes.data(), shapes.size(), 14, 64, cold_leaf, &c, nullptr, 0};
  unwind_fixture_run(&ctx, 0);
  return c;
}

}  // namespace

TEST_CASE("unwind: a cold capture calls no loader function", "[unwind]") {
  // libunwind finds FDEs with dl_iterate_phdr (the loader lock) while
  // holding its own global lock: from a malloc hook, that is the deadlock
  // of issue 15. The cold walk uses _dl_find_object, which locks nothing.
  if (!loader_probe::available()) {
    WARN("sanitizer build: dl_iterate_phdr is not probed here");
    return;
  }
  ColdCapture c[2];
  // A bound the compiler cannot see: one call site, not an unrolled pair.
  const volatile int two = 2;
  for (int i = 0; i < two; ++i) c[i] = cold_capture(i == 1);
  CHECK(c[0].walks == 0);
  CHECK(c[1].walks > 0);  // the probe sees libunwind's
  CHECK(c[0].stack.size() > 28);
  CHECK(c[0].stack == c[1].stack);
}

TEST_CASE("unwind: a cold capture completes while another thread holds the loader lock",
          "[unwind]") {
  // Thread A sits in a dl_iterate_phdr callback (holding the loader lock)
  // until thread B has finished a cold capture, or until a watchdog of 20 s
  // lets it go, so that a capture that waits for the lock fails this test
  // instead of hanging it. Deterministic: B starts only once A holds the
  // lock, and A releases it only after B is done (or the watchdog fired).
  struct Shared {
    std::atomic<bool> holding{false};
    std::atomic<bool> done{false};
    bool done_while_held = false;
  } shared;
  std::thread a([&shared] {
    dl_iterate_phdr(
        [](dl_phdr_info*, size_t, void* p) -> int {
          auto* sh = static_cast<Shared*>(p);
          sh->holding.store(true);
          for (int i = 0; i < 20000 && !sh->done.load(); ++i) usleep(1000);
          sh->done_while_held = sh->done.load();
          return 1;
        },
        &shared);
  });
  ColdCapture c[2];
  std::thread b([&shared, &c] {
    while (!shared.holding.load()) usleep(100);
    // The same call site twice: the cold capture, then (once the lock is
    // free) libunwind's of the same chain.
    const volatile int two = 2;
    for (int i = 0; i < two; ++i) {
      c[i] = cold_capture(i == 1);
      shared.done.store(true);
    }
  });
  b.join();
  a.join();
  CHECK(shared.done_while_held);
  CHECK(c[0].stack.size() > 28);
  CHECK(c[0].stack == c[1].stack);
}

TEST_CASE("unwind: two threads, one cache each", "[unwind]") {
  struct Result {
    int mismatches = 0;
    int captures = 0;
    UnwindCacheStats stats{};
  };
  auto work = [](Result* r, int seed) {
    CacheMem mem;
    for (int i = 0; i < 300; ++i) {
      Session s = session(mem.cache, 64 + static_cast<size_t>((i * 7 + seed) % 200), 1);
      std::vector<Shape> shapes = kAllCacheable;
      std::rotate(shapes.begin(), shapes.begin() + (i + seed) % 5, shapes.end());
      run_chain(s, shapes, 5 + (i + seed) % 30, static_cast<size_t>(i % 300));
      ++r->captures;
      if (s.counts[0] != s.counts[1] ||
          !std::equal(s.stacks[0].begin(), s.stacks[0].begin() + static_cast<long>(s.counts[0]),
                      s.stacks[1].begin()))
        ++r->mismatches;
    }
    r->stats = mem.stats();
  };
  Result a, b;
  std::thread ta(work, &a, 1);
  std::thread tb(work, &b, 2);
  ta.join();
  tb.join();
  CHECK(a.captures == 300);
  CHECK(b.captures == 300);
  CHECK(a.mismatches == 0);
  CHECK(b.mismatches == 0);
  // Mostly warm: far more frames from the cache than from libunwind.
  CHECK(a.stats.hits > 10 * a.stats.misses);
  CHECK(b.stats.hits > 10 * b.stats.misses);
}

TEST_CASE("unwind: forgetting rules after code is unmapped", "[unwind]") {
  CacheMem mem;
  Session warm = session(mem.cache, 256, 2);
  run_chain(warm, kAllCacheable, 8);
  check_same(warm);
  REQUIRE(mem.stats().entries > 0);
  mi::track::unwind_code_unmapped();
  Session s = session(mem.cache, 256, 2);
  run_chain(s, kAllCacheable, 8);
  check_same(s);
  CHECK(s.deltas[1].fallbacks == 1);  // relearnt
  CHECK(s.deltas[2].fallbacks == 0);
}

TEST_CASE("unwind: capture_libunwind agrees with unw_backtrace", "[unwind]") {
  // unw_backtrace (libunwind's own cached trace) starts at its caller too.
  CacheMem mem;
  for (size_t max : {size_t{3}, size_t{64}}) {
    Session s = session(mem.cache, max, 1, kUnwBacktrace);
    run_chain(s, kAllCacheable, 12);
    check_same(s);
  }
}

#endif  // __x86_64__
