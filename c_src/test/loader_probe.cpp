// See loader_probe.h. The definitions below replace glibc's in this
// executable (and, through symbol interposition, for every library it
// loads); each forwards to glibc's own implementation.
#include "loader_probe.h"

#include <dlfcn.h>
#include <link.h>

#include <cstddef>

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}

namespace {

thread_local loader_probe::Counts t_counts;
thread_local int t_in_callback;

inline void count_allocation() {
  if (t_in_callback != 0) ++t_counts.allocations_in_callbacks;
}

using Callback = int (*)(dl_phdr_info*, size_t, void*);
using Iterate = int (*)(Callback, void*);

struct Wrapped {
  Callback callback;
  void* data;
};

int wrapped_callback(dl_phdr_info* info, size_t size, void* data) {
  auto* w = static_cast<Wrapped*>(data);
  ++t_counts.callbacks;
  ++t_in_callback;
  const int r = w->callback(info, size, w->data);
  --t_in_callback;
  return r;
}

}  // namespace

extern "C" {

void* malloc(size_t n) {
  count_allocation();
  return __libc_malloc(n);
}

void* calloc(size_t n, size_t size) {
  count_allocation();
  return __libc_calloc(n, size);
}

void* realloc(void* p, size_t n) {
  count_allocation();
  return __libc_realloc(p, n);
}

void* aligned_alloc(size_t align, size_t n) {
  count_allocation();
  return __libc_memalign(align, n);
}

void* memalign(size_t align, size_t n) {
  count_allocation();
  return __libc_memalign(align, n);
}

int posix_memalign(void** out, size_t align, size_t n) {
  count_allocation();
  if (align < sizeof(void*) || (align & (align - 1)) != 0) return 22;  // EINVAL
  void* p = __libc_memalign(align, n);
  if (p == nullptr) return 12;  // ENOMEM
  *out = p;
  return 0;
}

int dl_iterate_phdr(Callback callback, void* data) {
  static const Iterate real = reinterpret_cast<Iterate>(dlsym(RTLD_NEXT, "dl_iterate_phdr"));
  ++t_counts.walks;
  Wrapped w{callback, data};
  return real(wrapped_callback, &w);
}

}  // extern "C"

namespace loader_probe {

bool available() {
  return true;
}

Counts thread_counts() {
  return t_counts;
}

}  // namespace loader_probe

#else

namespace loader_probe {

bool available() {
  return false;
}

Counts thread_counts() {
  return Counts{0, 0, 0};
}

}  // namespace loader_probe

#endif
