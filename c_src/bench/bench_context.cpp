// What the Erlang context adds to a recorded allocation, in the tracker
// alone: malloc(64) + on_alloc + on_free + free in `full' mode, through a
// fake unwinder of 12 native frames, with the context off and on over a
// fake scheduler's memory laid out as the probe finds it on OTP 27 (a
// process stack of 40 words holding 8 return addresses among y registers
// and frame pointers). Run under callgrind for instruction counts (what
// bench/context.sh's ratio is about, without the machine's noise):
//
//   valgrind --tool=callgrind --callgrind-out-file=/dev/null
//     c_src/build/bench_context off|on|miss|other ITERATIONS
//
// `on` is a NIF allocating in a loop (every capture but the first is
// answered by the thread's context cache); `miss` changes a y register of
// the process's stack before every allocation, so the cache's check finds
// a changed word (the first allocation of each NIF call, called again from
// the same loop): the context's words are the same. `other` alternates
// between two processes running the same code (each with its own heap, so
// its own frame pointers): every capture checks the other's stack in place
// (the CPs at the same words, equal, none elsewhere) and finds the same
// words.
//
// BENCH_SSE2=1 in the environment: the cache's check without AVX2 (what a
// CPU without it runs). Prints the wall ns per pair too (noisy on a shared
// machine).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../common/mi_abi.h"
#include "../test/fake_erlang_layout.h"
#include "../track/erlang_context.h"
#include "../track/tracker.h"

namespace {

using mi::track::Config;
using mi::track::Tracker;

constexpr uint64_t kPid = (42ull << 4) | 0x3;
constexpr uint64_t atom(uint64_t index) {
  return (index << 6) | 0x0B;
}

uint64_t g_sd[64], g_proc[64], g_proc2[64], g_env[8], g_mfa[3] = {atom(100), atom(200), 2};
std::vector<uint64_t> g_heap(4096, 0), g_heap2(4096, 0);

uint64_t addr(const void* p) {
  return reinterpret_cast<uint64_t>(p);
}

// A process running the bench's code: its pid, function, and a stack of 40
// words at the end of its heap.
void fake_process(uint64_t* proc, std::vector<uint64_t>& heap, uint64_t pid) {
  proc[0] = pid;
  proc[58] = addr(g_mfa);
  uint64_t* h = heap.data();
  const size_t stack_words = 40, stop = heap.size() - stack_words;
  proc[24] = addr(h);
  proc[10] = addr(h + 100);
  proc[11] = addr(h + stop);
  proc[25] = addr(h + heap.size());
  // Frames of 5 words: two y registers, a frame pointer, a CP.
  for (size_t i = 0; i < stack_words; ++i) {
    uint64_t w;
    switch (i % 5) {
      case 0:
        w = (i << 4) | 0xF;
        break;  // a small integer
      case 1:
        w = atom(i);
        break;  // an atom
      case 2:
        w = addr(h + stop + i + 3);
        break;  // a frame pointer
      default:
        w = 0x7f0000100000ull + (i << 12);
        break;  // a CP
    }
    h[stop + i] = w;
  }
}

mi_erlang_layout fake_vm() {
  mi_erlang_layout l = mi::test::fake_erlang_layout();
  l.max_cps = 8;
  l.scan_words = 256;
  g_sd[21] = addr(g_proc);
  g_sd[26] = addr(g_env);
  g_env[1] = addr(g_proc);
  fake_process(g_proc, g_heap, kPid);
  fake_process(g_proc2, g_heap2, kPid + (1 << 4));
  return l;
}

const void* fake_sd(uint32_t key) {
  return key == 4 ? g_sd : nullptr;
}

bool fake_name(char out[16]) {
  std::memcpy(out, "bench", 6);
  return true;
}

size_t fake_unwind(mi::track::UnwindCache*, uintptr_t* out, size_t max) {
  size_t n = 0;
  for (; n < 12 && n < max; ++n) out[n] = 0x401000 + n * 0x40;
  return n;
}

uint64_t clock_ns() {
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: bench_context off|on|miss|other ITERATIONS\n");
    return 2;
  }
  const bool miss = std::strcmp(argv[1], "miss") == 0;
  const bool other = std::strcmp(argv[1], "other") == 0;
  const bool on = miss || other || std::strcmp(argv[1], "on") == 0;
  const long n = std::atol(argv[2]);
  Tracker t;
  Config c;
  c.mode = MI_MODE_FULL;
  c.table_capacity = 1 << 16;
  c.stack_capacity = 1 << 10;
  if (!t.init(c, fake_unwind, clock_ns)) return 1;
  if (on && !t.set_erlang_layout(fake_vm(), fake_sd, fake_name)) return 1;
  if (std::getenv("BENCH_SSE2") != nullptr) mi::track::erlang_context_allow_avx2(false);
  const auto start = std::chrono::steady_clock::now();
  uint64_t& y0 = g_heap[g_heap.size() - 40];  // the stack's first word: a small integer
  for (long i = 0; i < n; ++i) {
    if (miss) y0 ^= 0x10;
    if (other) {
      uint64_t* next = (i & 1) != 0 ? g_proc2 : g_proc;
      g_sd[21] = addr(next);
      g_env[1] = addr(next);
    }
    void* p = std::malloc(64);
    t.on_alloc(MI_FN_MALLOC, p, 64);
    t.on_free(MI_FN_FREE, p, false);
    std::free(p);
  }
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  mi_abi_status s{};
  t.status(&s);
  std::printf("context %s: %.1f ns per pair, erlang_context %u, stacks %llu\n", argv[1], ns / n,
              static_cast<unsigned>(s.erlang_context), static_cast<unsigned long long>(s.stacks));
  return 0;
}
