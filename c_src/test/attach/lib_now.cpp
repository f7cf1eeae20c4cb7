// A shared object linked with -z now and full RELRO: its slots are
// resolved at load and read-only after (attach_tests.cpp).
#include <cstdlib>
#include <cstring>

#define EXPORT extern "C" __attribute__((visibility("default"), noinline))

EXPORT void* now_alloc(size_t n) {
  return std::malloc(n);
}

EXPORT void* now_calloc(size_t n, size_t size) {
  return std::calloc(n, size);
}

EXPORT void* now_realloc(void* p, size_t n) {
  return std::realloc(p, n);
}

EXPORT void now_free(void* p) {
  std::free(p);
}

EXPORT void* now_malloc_ref() {
  return reinterpret_cast<void*>(&std::malloc);
}
