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
  *pid = 0;
  const auto* sd = static_cast<const uint64_t*>(sd_of(l.key));
  if (sd == nullptr) {
    if (name == nullptr) return 0;
    out[0] = mi_context_header(MI_CONTEXT_THREAD, 0, 0, 2);
    out[1] = name[0];
    out[2] = name[1];
    return 3;
  }
  const uint64_t procw = sd[l.sd_process];
  if (!aligned_pointer(procw)) {
    out[0] = mi_context_header(MI_CONTEXT_SCHEDULER, 0, 0, 0);
    return 1;
  }
  const auto* proc = reinterpret_cast<const uint64_t*>(procw);
  const uint64_t pid_term = proc[0];
  if (!is_pid(pid_term)) {
    out[0] = mi_context_header(MI_CONTEXT_SCHEDULER, 0, 0, 0);
    return 1;
  }
  *pid = pid_term;
  out[0] = mi_context_header(MI_CONTEXT_PROCESS, 0, 0, 0);
  // The function and the stack only inside a NIF call: there the env is
  // set, points back at this process (or, on a dirty scheduler, at its
  // shadow), and the VM has written the process's stack top back.
  const uint64_t envw = sd[l.sd_env];
  if (!aligned_pointer(envw)) return 1;
  const uint64_t env_proc = reinterpret_cast<const uint64_t*>(envw)[l.env_proc];
  if (env_proc != procw && (env_proc == 0 || env_proc != sd[l.sd_shadow])) return 1;
  unsigned n = 1, mfa = 0, cps = 0;
  const uint64_t current = proc[l.p_current];
  const uint64_t heap = proc[l.p_heap], htop = proc[l.p_htop];
  const uint64_t stop = proc[l.p_stop], hend = proc[l.p_hend];
  const bool stack_ok = aligned_pointer(heap) && (htop & 7) == 0 && (stop & 7) == 0 &&
                        (hend & 7) == 0 && heap <= htop && htop <= stop && stop <= hend &&
                        hend - heap < (uint64_t{1} << 40);
  const uint64_t stack_words = stack_ok ? (hend - stop) / 8 : 0;
  const uint64_t limit = stack_words < l.scan_words ? stack_words : l.scan_words;
  const auto* sp = reinterpret_cast<const uint64_t*>(stop);
  // The same process (at the same address, with the same pid), env,
  // function, bounds and stack words as the last capture: the same
  // context. (The MFA words behind `current` are code metadata, unchanged
  // while the function runs.)
  if (cache != nullptr && cache->scanned != 0 && cache->sd == reinterpret_cast<uint64_t>(sd) &&
      cache->proc == procw && cache->pid == pid_term && cache->env == envw &&
      cache->env_proc == env_proc && cache->current == current && cache->heap == heap &&
      cache->stop == stop && cache->hend == hend && cache->scanned <= limit &&
      std::memcmp(cache->stack, sp, cache->scanned * 8) == 0) {
    std::memcpy(out, cache->words, cache->n * 8);
    *pid = cache->pid;
    return cache->n;
  }
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
    for (; scanned < limit && cps < l.max_cps; ++scanned) {
      const uint64_t w = sp[scanned];
      if (w == 0 || (w & 3) != 0 || (w >= heap && w < hend)) continue;
      out[n++] = w;
      ++cps;
    }
  }
  out[0] = mi_context_header(MI_CONTEXT_PROCESS, mfa, cps, 0);
  if (cache != nullptr) {
    // Kept only when the scan read at least one word (the key) and fits.
    cache->scanned = 0;
    if (scanned != 0 && scanned <= ContextCache::kMaxScanned) {
      cache->sd = reinterpret_cast<uint64_t>(sd);
      cache->proc = procw;
      cache->env = envw;
      cache->env_proc = env_proc;
      cache->current = current;
      cache->heap = heap;
      cache->stop = stop;
      cache->hend = hend;
      cache->pid = *pid;
      cache->n = n;
      std::memcpy(cache->stack, sp, scanned * 8);
      std::memcpy(cache->words, out, n * 8);
      cache->scanned = static_cast<unsigned>(scanned);
    }
  }
  return n;
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
