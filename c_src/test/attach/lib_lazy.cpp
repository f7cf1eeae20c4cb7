// A shared object linked with lazy binding and no RELRO: its PLT slots stay
// unresolved until first called (attach_tests.cpp). It never takes
// malloc's address: that would make the linker call through a GOT slot.
#include <cstdlib>

#define EXPORT extern "C" __attribute__((visibility("default"), noinline))

EXPORT void* lazy_alloc(size_t n) {
  return std::malloc(n);
}

EXPORT void lazy_free(void* p) {
  std::free(p);
}
