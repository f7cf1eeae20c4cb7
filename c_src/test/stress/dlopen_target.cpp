// A library that stress_loader_lock loads and unloads in a loop: dlopen and
// dlclose hold the loader lock while glibc allocates, and each load may map
// this code at new addresses.
#include <stdlib.h>

extern "C" __attribute__((visibility("default"), noinline)) void* stress_target_alloc(size_t n) {
  void* p = malloc(n);
  __asm__ volatile("" ::"r"(p) : "memory");
  return p;
}
