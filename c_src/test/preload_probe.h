// What the programs that run under the real interposer (test/stress/,
// test/drift/) share: finding the interposer's ABI as the NIF does
// (dlsym, never linking tracker code), counting checks, and keeping the
// compiler from seeing through the allocations they test.
//
// Header only; for test programs, not for the interposer or the NIF.
#pragma once

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

#include "../common/mi_abi.h"

namespace probe {

// The interposer's ABI table, looked up with dlsym(RTLD_DEFAULT) as the NIF
// does; nullptr when the process runs without it (no LD_PRELOAD) or when
// its table is older than this program's mi_abi.h (struct_size smaller).
// Thread-safe; allocates only what dlsym allocates, once per call.
inline const mi_preload_abi* find_abi() {
  const auto fn = reinterpret_cast<mi_preload_abi_fn>(dlsym(RTLD_DEFAULT, MI_ABI_SYMBOL));
  const mi_preload_abi* abi = fn != nullptr ? fn() : nullptr;
  return abi != nullptr && abi->struct_size >= sizeof(mi_preload_abi) ? abi : nullptr;
}

// abi->status() into a value. Pre: abi is find_abi()'s, non-null.
// Thread-safe (the ABI's status is); no allocation.
inline mi_abi_status status(const mi_preload_abi* abi) {
  mi_abi_status s{};
  abi->status(&s, sizeof s);
  return s;
}

// The program's check counts, for PROBE_CHECK and finish().
inline int g_passed = 0, g_failed = 0;

// The program's result line, "<name>: N passed, N failed", on stdout, and
// its exit status: 0 when no check failed, else 1. Not thread-safe (call
// once all checking threads are joined); no allocation beyond stdio's.
inline int finish(const char* name) {
  printf("%s: %d passed, %d failed\n", name, g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}

// v, which the compiler can no longer reason about: it will not pair a
// malloc with its free and drop both, nor reject at compile time a size it
// knows to be absurd. No allocation.
template <class T>
T opaque(T v) {
  asm volatile("" : "+r"(v));
  return v;
}

// A cheap, seeded pseudo-random sequence (xorshift64): the same seed gives
// the same operations on every run, and drawing one allocates nothing (the
// hooks see only the allocations under test). One per thread.
class Xorshift {
 public:
  // Pre: seed != 0 (0 would give an all-zero stream); it is scrambled, so
  // small ones (a thread's number) do.
  explicit Xorshift(uint64_t seed) : x_(0x9E3779B97F4A7C15ull * seed) {}
  // The next value. Not thread-safe (one generator per thread).
  uint64_t operator()() {
    x_ ^= x_ << 13;
    x_ ^= x_ >> 7;
    x_ ^= x_ << 17;
    return x_;
  }

 private:
  uint64_t x_;
};

}  // namespace probe

// Counts cond in probe::g_passed or probe::g_failed, printing the failed
// condition with its place to stderr; carries on either way (a run reports
// every failure). Not thread-safe: check from the main thread.
#define PROBE_CHECK(cond)                                               \
  do {                                                                  \
    if (cond) {                                                         \
      ++probe::g_passed;                                                \
    } else {                                                            \
      ++probe::g_failed;                                                \
      fprintf(stderr, "FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                   \
  } while (0)
