// A shared object the test dlopen()s only after attach (attach_tests.cpp).
#include <cstdlib>

#define EXPORT extern "C" __attribute__((visibility("default"), noinline))

EXPORT void* late_alloc(size_t n) {
  return std::malloc(n);
}

EXPORT void late_free(void* p) {
  std::free(p);
}
