#include "erlang_context.h"

#include <cstring>

namespace mi::track {

namespace {

// The VM's immediate tags on a 64-bit build: a local pid is 0b0011 in the
// low 4 bits, an atom 0b001011 in the low 6.
inline bool is_pid(uint64_t w) {
  return (w & 0xF) == 0x3;
}
inline bool is_atom(uint64_t w) {
  return (w & 0x3F) == 0x0B;
}
inline bool aligned_pointer(uint64_t w) {
  return w != 0 && (w & 7) == 0;
}

// The loop that runs once per stack word, apart so that it keeps its
// values in registers: up to max_cps continuation pointers of sp[0, limit)
// (nonzero words with the low two bits clear outside [heap, heap + span))
// into out, their count in *cps; returns the words scanned.
[[gnu::noinline]] uint64_t scan_cps(const uint64_t* sp, uint64_t limit, uint64_t heap,
                                    uint64_t span, unsigned max_cps, uint64_t* out, unsigned* cps) {
  unsigned k = 0;
  uint64_t i = 0;
  for (; i < limit && k < max_cps; ++i) {
    const uint64_t w = sp[i];
    if (w == 0 || (w & 3) != 0 || w - heap < span) continue;
    out[k++] = w;
  }
  *cps = k;
  return i;
}

// Words in `out`, hashed here, with no token.
inline ContextWords fresh(const uint64_t* out, unsigned n) {
  return {out, n, StackTable::hash_words(out, n), 0};
}

}  // namespace

bool erlang_layout_valid(const mi_erlang_layout& l) {
  const uint32_t words[] = {l.sd_process, l.sd_env, l.sd_shadow, l.env_proc, l.p_current,
                            l.p_htop,     l.p_stop, l.p_heap,    l.p_hend};
  for (const uint32_t w : words)
    if (w > kMaxLayoutWord) return false;
  return l.version == MI_ERLANG_LAYOUT_VERSION && l.key < 1024 && l.max_cps <= MI_CONTEXT_MAX_CPS &&
         l.scan_words <= 4096;
}

unsigned capture_erlang_context(const mi_erlang_layout& l, SchedulerDataFn sd_of,
                                const uint64_t* name, uint64_t* out, uint64_t* pid,
                                ContextCache* cache) {
  const ContextWords c = read_erlang_context(l, sd_of, name, out, pid, cache);
  if (c.words != out) std::memcpy(out, c.words, c.n * 8);
  return c.n;
}

ContextWords read_erlang_context(const mi_erlang_layout& l, SchedulerDataFn sd_of,
                                 const uint64_t* name, uint64_t* out, uint64_t* pid,
                                 ContextCache* cache) {
  *pid = 0;
  const auto* sd = static_cast<const uint64_t*>(sd_of(l.key));
  if (sd == nullptr) {
    if (name == nullptr) return {out, 0, 0, 0};
    out[0] = mi_context_header(MI_CONTEXT_THREAD, 0, 0, 2);
    out[1] = name[0];
    out[2] = name[1];
    return fresh(out, 3);
  }
  const uint64_t procw = sd[l.sd_process];
  if (!aligned_pointer(procw)) {
    out[0] = mi_context_header(MI_CONTEXT_SCHEDULER, 0, 0, 0);
    return fresh(out, 1);
  }
  const auto* proc = reinterpret_cast<const uint64_t*>(procw);
  const uint64_t pid_term = proc[0];
  if (!is_pid(pid_term)) {
    out[0] = mi_context_header(MI_CONTEXT_SCHEDULER, 0, 0, 0);
    return fresh(out, 1);
  }
  *pid = pid_term;
  out[0] = mi_context_header(MI_CONTEXT_PROCESS, 0, 0, 0);
  // The function and the stack only inside a NIF call: there the env is
  // set, points back at this process (or, on a dirty scheduler, at its
  // shadow), and the VM has written the process's stack top back.
  const uint64_t envw = sd[l.sd_env];
  if (!aligned_pointer(envw)) return fresh(out, 1);
  const uint64_t env_proc = reinterpret_cast<const uint64_t*>(envw)[l.env_proc];
  if (env_proc != procw && (env_proc == 0 || env_proc != sd[l.sd_shadow])) return fresh(out, 1);
  unsigned n = 1, mfa = 0, cps = 0;
  const uint64_t current = proc[l.p_current];
  const uint64_t heap = proc[l.p_heap], htop = proc[l.p_htop];
  const uint64_t stop = proc[l.p_stop], hend = proc[l.p_hend];
  const auto* sp = reinterpret_cast<const uint64_t*>(stop);
  // The same process (at the same address, with the same pid), env,
  // function, bounds and stack words as the last capture: the same
  // context. (The MFA words behind `current` are code metadata, unchanged
  // while the function runs.) A kept context was scanned from a stack whose
  // bounds checked out (below) and are those compared here: of the checks,
  // only the heap top's can answer otherwise now, and the scan's limit is
  // the same.
  if (cache != nullptr && cache->scanned != 0 && cache->sd == reinterpret_cast<uint64_t>(sd) &&
      cache->proc == procw && cache->pid == pid_term && cache->env == envw &&
      cache->env_proc == env_proc && cache->current == current && cache->heap == heap &&
      cache->stop == stop && cache->hend == hend && (htop & 7) == 0 && heap <= htop &&
      htop <= stop && std::memcmp(cache->stack, sp, cache->scanned * 8) == 0) {
    *pid = cache->pid;
    return {cache->words, cache->n, cache->hash, cache->token};
  }
  const bool stack_ok = aligned_pointer(heap) && (htop & 7) == 0 && (stop & 7) == 0 &&
                        (hend & 7) == 0 && heap <= htop && htop <= stop && stop <= hend &&
                        hend - heap < (uint64_t{1} << 40);
  const uint64_t stack_words = stack_ok ? (hend - stop) / 8 : 0;
  const uint64_t limit = stack_words < l.scan_words ? stack_words : l.scan_words;
  if (aligned_pointer(current)) {
    const auto* m = reinterpret_cast<const uint64_t*>(current);
    if (is_atom(m[0]) && is_atom(m[1]) && m[2] < 256) {
      out[n++] = m[0];
      out[n++] = m[1];
      out[n++] = m[2];
      mfa = 3;
    }
  }
  uint64_t scanned = 0;
  if (stack_ok) {
    // Continuation pointers: words with the low two bits clear that do not
    // point into the process's own memory (those are frame pointers).
    scanned = scan_cps(sp, limit, heap, hend - heap, l.max_cps, out + n, &cps);
    n += cps;
  }
  out[0] = mi_context_header(MI_CONTEXT_PROCESS, mfa, cps, 0);
  if (cache != nullptr) {
    // Kept only when the scan read at least one word (the key) and fits.
    // Words and token stay paired: words the cache holds already keep
    // their token (and hash); others take a new one.
    cache->scanned = 0;
    if (scanned != 0 && scanned <= ContextCache::kMaxScanned) {
      if (cache->token == 0 || cache->n != n || std::memcmp(cache->words, out, n * 8) != 0) {
        std::memcpy(cache->words, out, n * 8);
        cache->n = n;
        cache->hash = StackTable::hash_words(out, n);
        cache->token = cache->next_token;
        // A range runs out after 2^kTokenBits - 1 tokens: then none.
        if (cache->next_token != 0) {
          const uint64_t next = cache->next_token + 1;
          cache->next_token = (next & ((uint64_t{1} << kTokenBits) - 1)) != 0 ? next : 0;
        }
      }
      cache->sd = reinterpret_cast<uint64_t>(sd);
      cache->proc = procw;
      cache->env = envw;
      cache->env_proc = env_proc;
      cache->current = current;
      cache->heap = heap;
      cache->stop = stop;
      cache->hend = hend;
      cache->pid = *pid;
      std::memcpy(cache->stack, sp, scanned * 8);
      cache->scanned = static_cast<unsigned>(scanned);
      return {cache->words, n, cache->hash, cache->token};
    }
  }
  return fresh(out, n);
}

void normalize_thread_name(const char* name, uint64_t out[2]) {
  char buf[16] = {};
  size_t len = 0;
  while (len < 15 && name[len] != '\0') ++len;
  std::memcpy(buf, name, len);
  size_t digits = len;
  while (digits > 0 && buf[digits - 1] >= '0' && buf[digits - 1] <= '9') --digits;
  if (digits < len && digits > 0) {
    buf[digits] = '*';
    for (size_t i = digits + 1; i < 16; ++i) buf[i] = '\0';
  }
  std::memcpy(out, buf, 16);
}

}  // namespace mi::track
