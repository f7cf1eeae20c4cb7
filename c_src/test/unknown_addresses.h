// Addresses outside every loaded object, for the symbolizer's tests and its
// benchmark (test/test_symbolize.cpp, bench/bench_symbolize.cpp).
//
// 1000 addresses: 500 in an anonymous mapping of their own (answered
// "[anon]" with their offset from map), 500 below mmap_min_addr (never
// mapped, answered ""). `salt` makes each set's addresses distinct, so each
// set is new to a symbolizer's cache. Not thread-safe; allocates (the
// vector); ok() is false when the mapping could not be made.
#ifndef MALLOCINFO_TEST_UNKNOWN_ADDRESSES_H
#define MALLOCINFO_TEST_UNKNOWN_ADDRESSES_H

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mi::test {

struct UnknownAddresses {
  static constexpr size_t kMapBytes = 1 << 20;
  static constexpr size_t kGuard = 4096;
  char* map = nullptr;
  std::vector<uint64_t> addresses;

  explicit UnknownAddresses(unsigned salt) {
    // Between two PROT_NONE pages, so the kernel cannot merge it with a
    // neighbouring mapping (offsets are from the mapping's start).
    void* m =
        ::mmap(nullptr, kMapBytes + 2 * kGuard, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return;
    map = static_cast<char*>(m) + kGuard;
    if (::mprotect(map, kMapBytes, PROT_READ | PROT_WRITE) != 0) {
      unmap();
      return;
    }
    for (uint64_t i = 0; i < 500; ++i) {
      addresses.push_back(reinterpret_cast<uint64_t>(map) + i * 2048 + 8 * salt + 1);
      addresses.push_back(0x1000 + i * 16 + salt);
    }
  }
  ~UnknownAddresses() { unmap(); }
  bool ok() const { return map != nullptr; }
  // Gone early: its addresses become unmapped ones.
  void unmap() {
    if (map != nullptr) ::munmap(map - kGuard, kMapBytes + 2 * kGuard);
    map = nullptr;
  }
  UnknownAddresses(const UnknownAddresses&) = delete;
  UnknownAddresses& operator=(const UnknownAddresses&) = delete;
};

}  // namespace mi::test

#endif
