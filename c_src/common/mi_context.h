/* The Erlang context at the end of a recorded stack (a "mixed stack").
 *
 * A stack in the tracker's stack table is the native return addresses,
 * innermost first; when the tracker knows the VM's layout (mi_abi.h,
 * mi_erlang_layout) a header word follows them, then the context words it
 * announces:
 *
 *   native frames ... | header | M F A | cp cp cp ...          scheduler thread
 *   native frames ... | header | name name                     other thread
 *
 *   header  MI_CONTEXT_MARKER | kind << 16 | mfa << 8 | cps << 4 | names
 *   M F A   the running function: module and function atoms (the VM's
 *           immediate terms) and the arity; only inside a NIF call
 *   cp      Erlang return addresses from the process's stack, innermost
 *           first (code addresses: named at read time, never followed)
 *   name    the thread's name (pthread_getname_np), 16 bytes, a trailing
 *           number replaced by '*' so a pool's threads share one stack
 *
 * No user-space code address has these top 16 bits (x86-64 and aarch64
 * user addresses are below 2^48), so a reader finds the header by value.
 * Every reader of stacks splits them with mi_context_split before it
 * symbolizes: the words after the header are not addresses.
 *
 * Plain C, header-only, no allocation: included by the interposer, the NIF
 * and the tests. */
#ifndef MALLOCINFO_COMMON_MI_CONTEXT_H
#define MALLOCINFO_COMMON_MI_CONTEXT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MI_CONTEXT_MARKER 0xE7C0000000000000ull
#define MI_CONTEXT_MAX_CPS 8u
/* Header, MFA and the return addresses: the most words a context takes. */
#define MI_CONTEXT_MAX_WORDS (1u + 3u + MI_CONTEXT_MAX_CPS)

enum mi_context_kind {
  MI_CONTEXT_PROCESS = 1,   /* a scheduler thread running a process */
  MI_CONTEXT_SCHEDULER = 2, /* a scheduler thread, no process (ports, GC, idle) */
  MI_CONTEXT_THREAD = 3     /* any other thread: its name */
};

typedef struct mi_context {
  uint32_t kind;         /* enum mi_context_kind, 0 when the stack has no context */
  uint32_t mfa;          /* 0 or 3 words */
  uint32_t cps;          /* return addresses, at most MI_CONTEXT_MAX_CPS */
  uint32_t names;        /* 0 or 2 words */
  const uint64_t* words; /* the words after the header */
} mi_context;

static inline int mi_context_is_header(uint64_t w) {
  return (w >> 48) == (MI_CONTEXT_MARKER >> 48);
}

static inline uint64_t mi_context_header(uint32_t kind, uint32_t mfa, uint32_t cps,
                                         uint32_t names) {
  return MI_CONTEXT_MARKER | ((uint64_t)(kind & 0xFFu) << 16) | ((uint64_t)(mfa & 0xFu) << 8) |
         ((uint64_t)(cps & 0xFu) << 4) | (uint64_t)(names & 0xFu);
}

/* The native frames of a stack of n words (returned), and its context in
 * *ctx (kind 0 when it has none, or when the header's counts do not fit the
 * words that follow it: such a stack is all native frames). */
static inline uint32_t mi_context_split(const uint64_t* frames, uint32_t n, mi_context* ctx) {
  ctx->kind = 0;
  ctx->mfa = ctx->cps = ctx->names = 0;
  ctx->words = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (!mi_context_is_header(frames[i])) continue;
    const uint64_t h = frames[i];
    const uint32_t kind = (uint32_t)(h >> 16) & 0xFFu;
    const uint32_t mfa = (uint32_t)(h >> 8) & 0xFu;
    const uint32_t cps = (uint32_t)(h >> 4) & 0xFu;
    const uint32_t names = (uint32_t)h & 0xFu;
    if (kind < MI_CONTEXT_PROCESS || kind > MI_CONTEXT_THREAD || (mfa != 0 && mfa != 3) ||
        cps > MI_CONTEXT_MAX_CPS || (names != 0 && names != 2) || i + 1 + mfa + cps + names != n)
      return n;
    ctx->kind = kind;
    ctx->mfa = mfa;
    ctx->cps = cps;
    ctx->names = names;
    ctx->words = frames + i + 1;
    return i;
  }
  return n;
}

#ifdef __cplusplus
}
#endif

#endif
