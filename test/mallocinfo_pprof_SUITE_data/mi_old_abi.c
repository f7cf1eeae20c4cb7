/* An interposer from before churn (issue 26), as the NIF sees it. Preloaded
 * ahead of libmallocinfo_preload.so, this library's mallocinfo_preload_abi
 * answers the real interposer's ABI cut off where churn begins (its
 * struct_size, as the interposer of the previous release set it). Readers
 * of churn must then answer {error, enotsup}, and every other reader work
 * as before. It interposes nothing else: no allocation passes through it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>

#include "mi_abi.h"

static mi_preload_abi g_old;
static const mi_preload_abi* g_answer;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* The next definition of the symbol in load order: the real interposer's. */
static void cut(void) {
  mi_preload_abi_fn real = (mi_preload_abi_fn)dlsym(RTLD_NEXT, MI_ABI_SYMBOL);
  const mi_preload_abi* abi = real != NULL ? real() : NULL;
  if (abi == NULL || abi->struct_size <= offsetof(mi_preload_abi, churn)) return;
  /* What lies past struct_size is not the reader's to read: garbage here,
   * so a reader that reads it anyway fails loudly. */
  memset(&g_old, 0xA5, sizeof g_old);
  memcpy(&g_old, abi, offsetof(mi_preload_abi, churn));
  g_old.struct_size = offsetof(mi_preload_abi, churn);
  g_answer = &g_old;
}

__attribute__((visibility("default"))) const mi_preload_abi* mallocinfo_preload_abi(void) {
  pthread_once(&g_once, cut);
  return g_answer;
}
