/* The small library mi_stress_nif's dlopen thread loads and unloads in a
 * loop (built by mallocinfo_stress_SUITE): dlopen and dlclose allocate while
 * holding the dynamic loader's lock, each load may map this code at new
 * addresses, and every load changes what the symbolizer must rescan. */
#include <stdlib.h>

__attribute__((noinline)) void* mi_stress_target_alloc(size_t n) {
  void* p = malloc(n);
  __asm__ volatile("" : : "g"(p) : "memory");
  return p;
}
