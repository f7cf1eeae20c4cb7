// What symbolization costs: the NIF side's Symbolizer (symbolize/) on this
// process's libc and on addresses outside every object. Printed, never
// asserted: the machine is shared and noisy. Run by bench/run.sh; by hand:
// c_src/build/bench_symbolize.
//
// Output: two key=value lines,
//   symbolize cold_first_ms=... second_same_object_us=... cached_resolve_ns=...
//     resolve_all_ns=...
//   symbolize_unknown new_us=... known_us=... resolve_all_new_us=...
// cold: a fresh Symbolizer's first libc address (reads libc's symbols), then
// a second one in the same object; cached: resolve() of 1000 known
// addresses over and over, and the same through resolve_all in batches of
// 1000; unknown: 1000 addresses in no object (half in an anonymous mapping,
// half below mmap_min_addr), new one by one, the same again, and 1000 new
// in one resolve_all.
#include <dlfcn.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../symbolize/symbolize.h"
#include "../test/unknown_addresses.h"

namespace {

namespace sym = mi::symbolize;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "bench_symbolize: %s\n", what);
  std::exit(1);
}

// libc's own qsort, as an address inside libc.
uint64_t libc_qsort() {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (libc == nullptr) die("libc.so.6 not loaded");
  void* q = dlsym(libc, "qsort");
  dlclose(libc);
  if (q == nullptr) die("no qsort in libc");
  return reinterpret_cast<uint64_t>(q);
}

}  // namespace

int main() {
  const uint64_t q = libc_qsort();

  sym::Symbolizer cold;
  auto t0 = std::chrono::steady_clock::now();
  const sym::Frame first = cold.resolve(q + 1, false);
  const double cold_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const sym::Frame second = cold.resolve(q + 2, false);
  const double second_s = seconds_since(t0);
  // A benchmark of lookups that fail would not measure what it says.
  if (first.symbol != std::optional<std::string>("qsort") ||
      second.symbol != std::optional<std::string>("qsort"))
    die("qsort not resolved");

  sym::Symbolizer s;
  std::vector<uint64_t> addresses;
  for (uint64_t i = 0; i < 1000; ++i) addresses.push_back(q + i * 64);
  (void)s.resolve_all(addresses, true);  // warm
  constexpr int kCalls = 1000000;
  size_t named = 0;
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) named += s.resolve(addresses[i % 1000], true).symbol ? 1 : 0;
  const double hot_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls / 1000; ++i) named += s.resolve_all(addresses, true).size();
  const double batch_s = seconds_since(t0);
  if (named == 0) die("nothing named");
  std::printf(
      "symbolize cold_first_ms=%.3f second_same_object_us=%.1f cached_resolve_ns=%.0f "
      "resolve_all_ns=%.0f\n",
      cold_s * 1e3, second_s * 1e6, hot_s * 1e9 / kCalls, batch_s * 1e9 / kCalls);

  mi::test::UnknownAddresses first_set(2), second_set(3);
  if (!first_set.ok() || !second_set.ok()) die("mmap");
  size_t anon = 0;
  t0 = std::chrono::steady_clock::now();
  for (const uint64_t a : first_set.addresses) anon += s.resolve(a, false).object == "[anon]";
  const double new_singles_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (const uint64_t a : first_set.addresses) anon += s.resolve(a, false).object == "[anon]";
  const double known_singles_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (const sym::Frame& f : s.resolve_all(second_set.addresses, false))
    anon += f.object == "[anon]";
  const double new_batch_s = seconds_since(t0);
  if (anon != 1500) die("unknown addresses not answered as [anon]");
  std::printf("symbolize_unknown new_us=%.2f known_us=%.2f resolve_all_new_us=%.2f\n",
              new_singles_s * 1e3, known_singles_s * 1e3, new_batch_s * 1e3);
  return 0;
}
