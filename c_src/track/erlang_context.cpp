#include "erlang_context.h"

#include <cstring>

#include <atomic>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

// A continuation pointer: a nonzero word with the low two bits clear that
// does not point into the process's own memory [heap, heap + span) (those
// are frame pointers). Tagged terms have nonzero low bits.
inline bool is_cp(uint64_t w, uint64_t heap, uint64_t span) {
  return (w & 3) == 0 && w != 0 && w - heap >= span;
}

// The scan for continuation pointers: up to max_cps CPs of sp[0, limit)
// into out, their count in *cps; returns the words scanned (up to and
// including the last CP kept, when max_cps were found). On the way:
//  - it compares CP j with expect[j] (room for max_cps words): *diff is 0
//    when each equals its expect word, so a capture that finds the words
//    its cache holds learns it without comparing them again;
//  - *at gets bit i for each CP at word i < 64 (where the cache looks for
//    them in another process's stack).
// Apart, so that it keeps its values in registers. Most words are tagged
// terms, which the first test skips.
[[gnu::noinline]] uint64_t scan_cps(const uint64_t* sp, uint64_t limit, uint64_t heap,
                                    uint64_t span, unsigned max_cps, uint64_t* out,
                                    const uint64_t* expect, unsigned* cps, uint64_t* diff,
                                    uint64_t* at) {
  unsigned k = 0;
  uint64_t i = 0, d = 0, a = 0;
  if (max_cps != 0) {
    while (i < limit) {
      const uint64_t w = sp[i++];
      if ((w & 3) != 0 || w == 0 || w - heap < span) continue;
      out[k] = w;
      d |= w ^ expect[k];
      a |= i <= 64 ? uint64_t{1} << (i - 1) : 0;
      if (++k == max_cps) break;
    }
  }
  *cps = k;
  *diff = d;
  *at = a;
  return i;
}

// The cache's check: true when a scan of sp[0, n) with the cache's bounds
// (so its limit) finds what the scan of kept[0, scanned) found, kept[0, n)
// then holding sp[0, n). Each word that differs and that the scan read
// (below `scanned`) must be a non-CP before and after, so that the scan
// finds the same CPs at the same places and stops at the same word (the
// words after it were kept only to compare whole blocks); so a y register
// may change. False, with kept partly updated, when a CP changed, appeared
// or went.
//
// The words are compared in blocks of 8: [0, 8), [8, 16), ... and, when
// fewer than 8 are left, [n - 8, n), which overlaps the one before (so
// n >= 8 but in the plain version). First a leaf that finds the first
// block that differs, as cheap as the memcmp it replaced; then, only if
// one does, the words that differ. Isa::same(k, s) tells whether the
// blocks at k and s are the same, Isa::differ(k, s) which of their words
// differ (bit j * Isa::kBitsPerWord: word j).
template <class Isa>
[[gnu::always_inline]] inline size_t first_changed_in(const uint64_t* kept, const uint64_t* sp,
                                                      size_t n) {
  const size_t whole = n & ~size_t{7};
  for (size_t i = 0; i < whole; i += 8)
    if (!Isa::same(kept + i, sp + i)) return i;
  return whole == n || Isa::same(kept + n - 8, sp + n - 8) ? n : n - 8;
}

template <class Isa>
[[gnu::always_inline]] inline bool patch_in(uint64_t* kept, const uint64_t* sp, size_t scanned,
                                            size_t n, uint64_t heap, uint64_t span, size_t i) {
  for (;;) {
    for (unsigned words = Isa::differ(kept + i, sp + i); words != 0; words &= words - 1) {
      const size_t j = i + static_cast<unsigned>(__builtin_ctz(words)) / Isa::kBitsPerWord;
      const uint64_t o = kept[j], w = sp[j];
      if (j < scanned && (is_cp(o, heap, span) || is_cp(w, heap, span))) return false;
      kept[j] = w;
    }
    do {
      if (i + 8 >= n) return true;
      i = i + 16 <= n ? i + 8 : n - 8;
    } while (Isa::same(kept + i, sp + i));
  }
}

// One word at a time: any target, and stacks of fewer than 8 words.
[[gnu::noinline]] bool same_cps_plain(uint64_t* kept, const uint64_t* sp, size_t scanned, size_t n,
                                      uint64_t heap, uint64_t span) {
  for (size_t j = 0; j < n; ++j) {
    const uint64_t o = kept[j], w = sp[j];
    if (o == w) continue;
    if (j < scanned && (is_cp(o, heap, span) || is_cp(w, heap, span))) return false;
    kept[j] = w;
  }
  return true;
}

#if defined(__x86_64__)
// 8 words in 4 compares: SSE2, which every x86-64 has. A word differs
// when either of its halves does.
struct Sse2 {
  static __m128i pair(const uint64_t* a, const uint64_t* b) {
    return _mm_cmpeq_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)),
                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
  }
  static bool same(const uint64_t* k, const uint64_t* s) {
    const __m128i e = _mm_and_si128(_mm_and_si128(pair(k, s), pair(k + 2, s + 2)),
                                    _mm_and_si128(pair(k + 4, s + 4), pair(k + 6, s + 6)));
    return _mm_movemask_epi8(e) == 0xFFFF;
  }
  // Bit 2j: word j differs (its halves are bits 2j and 2j + 1).
  static constexpr unsigned kBitsPerWord = 2;
  static unsigned differ(const uint64_t* k, const uint64_t* s) {
    const auto halves = [&](unsigned j) {
      return static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(pair(k + j, s + j))));
    };
    const unsigned same = halves(0) | halves(2) << 4 | halves(4) << 8 | halves(6) << 12;
    return ~(same & same >> 1) & 0x5555u;
  }
};

[[gnu::noinline]] size_t first_changed_sse2(const uint64_t* kept, const uint64_t* sp, size_t n) {
  return first_changed_in<Sse2>(kept, sp, n);
}
[[gnu::noinline]] bool patch_sse2(uint64_t* kept, const uint64_t* sp, size_t scanned, size_t n,
                                  uint64_t heap, uint64_t span, size_t i) {
  return patch_in<Sse2>(kept, sp, scanned, n, heap, span, i);
}

// 8 words in 2 compares: AVX2, where the CPU has it.
struct Avx2 {
  [[gnu::target("avx2")]] static __m256i quad(const uint64_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  [[gnu::target("avx2")]] static bool same(const uint64_t* k, const uint64_t* s) {
    const __m256i d = _mm256_or_si256(_mm256_xor_si256(quad(k), quad(s)),
                                      _mm256_xor_si256(quad(k + 4), quad(s + 4)));
    return _mm256_testz_si256(d, d) != 0;
  }
  static constexpr unsigned kBitsPerWord = 1;
  [[gnu::target("avx2")]] static unsigned differ(const uint64_t* k, const uint64_t* s) {
    const unsigned lo = static_cast<unsigned>(
        _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(quad(k), quad(s)))));
    const unsigned hi = static_cast<unsigned>(
        _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(quad(k + 4), quad(s + 4)))));
    return ~(lo | hi << 4) & 0xFFu;
  }
};

[[gnu::noinline, gnu::target("avx2")]] size_t first_changed_avx2(const uint64_t* kept,
                                                                 const uint64_t* sp, size_t n) {
  return first_changed_in<Avx2>(kept, sp, n);
}
[[gnu::noinline, gnu::target("avx2")]] bool patch_avx2(uint64_t* kept, const uint64_t* sp,
                                                       size_t scanned, size_t n, uint64_t heap,
                                                       uint64_t span, size_t i) {
  return patch_in<Avx2>(kept, sp, scanned, n, heap, span, i);
}

std::atomic<bool> g_allow_avx2{true};

// Whether the checks take their AVX2 paths. __builtin_cpu_supports reads
// what libgcc's constructor found (nothing before it ran: then the other
// paths, which answer the same).
inline bool use_avx2() {
  return __builtin_cpu_supports("avx2") && g_allow_avx2.load(std::memory_order_relaxed);
}
#endif

inline bool same_cps(uint64_t* kept, const uint64_t* sp, size_t scanned, size_t n, uint64_t heap,
                     uint64_t span) {
#if defined(__x86_64__)
  if (n >= 8) {
    if (use_avx2()) {
      const size_t i = first_changed_avx2(kept, sp, n);
      return i == n || patch_avx2(kept, sp, scanned, n, heap, span, i);
    }
    const size_t i = first_changed_sse2(kept, sp, n);
    return i == n || patch_sse2(kept, sp, scanned, n, heap, span, i);
  }
#endif
  return same_cps_plain(kept, sp, scanned, n, heap, span);
}

// The cache's check for a stack elsewhere (another process running the
// same code, or this one after its stack moved): true when a scan of
// sp[0, scanned) finds CPs exactly at the words `at` names (bit j: word j),
// each equal to kept's, kept[0, n) then holding sp[0, n). Every word below
// `scanned` is judged against the new heap, equal or not (an equal word
// may be a frame pointer into one heap and not the other). False, with
// kept partly updated, otherwise. The caller checked sp[0, n) is within
// the stack, n >= scanned.
[[gnu::noinline]] bool same_cps_moved_plain(uint64_t* kept, const uint64_t* sp, size_t scanned,
                                            size_t n, uint64_t at, uint64_t heap, uint64_t span) {
  // As the scan reads them: most words are tagged terms, which the first
  // test finds not to be CPs. Nothing is written before all words check.
  for (size_t j = 0; j < scanned; ++j) {
    const uint64_t w = sp[j];
    const uint64_t cp = is_cp(w, heap, span) ? 1 : 0;
    if (cp != ((at >> j) & 1) || (cp != 0 && w != kept[j])) return false;
  }
  std::memcpy(kept, sp, n * 8);
  return true;
}

#if defined(__x86_64__)
// 4 words at a time, the last n % 4 one by one (nothing past sp[n) is
// read). Lanes at or past `scanned` are masked off at the end. The
// unsigned compare w - heap >= span is a signed one with both sides' top
// bits flipped.
[[gnu::noinline, gnu::target("avx2")]] bool same_cps_moved_avx2(uint64_t* kept, const uint64_t* sp,
                                                                size_t scanned, size_t n,
                                                                uint64_t at, uint64_t heap,
                                                                uint64_t span) {
  const __m256i three = _mm256_set1_epi64x(3), zero = _mm256_setzero_si256();
  const __m256i top = _mm256_set1_epi64x(static_cast<long long>(uint64_t{1} << 63));
  const __m256i base = _mm256_set1_epi64x(static_cast<long long>(heap));
  const __m256i span_top = _mm256_set1_epi64x(static_cast<long long>(span ^ (uint64_t{1} << 63)));
  uint64_t found = 0, bad = 0;
  size_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp + j));
    const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kept + j));
    const __m256i untagged = _mm256_cmpeq_epi64(_mm256_and_si256(v, three), zero);
    const __m256i own =
        _mm256_cmpgt_epi64(span_top, _mm256_xor_si256(_mm256_sub_epi64(v, base), top));
    const __m256i cp =
        _mm256_andnot_si256(_mm256_or_si256(_mm256_cmpeq_epi64(v, zero), own), untagged);
    const __m256i changed_cp = _mm256_andnot_si256(_mm256_cmpeq_epi64(v, k), cp);
    found |= uint64_t(_mm256_movemask_pd(_mm256_castsi256_pd(cp))) << j;
    bad |= uint64_t(_mm256_movemask_pd(_mm256_castsi256_pd(changed_cp))) << j;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(kept + j), v);
  }
  for (; j < n; ++j) {
    const uint64_t w = sp[j];
    const uint64_t cp = is_cp(w, heap, span) ? 1 : 0;
    found |= cp << j;
    bad |= (cp & (w != kept[j] ? 1 : 0)) << j;
    kept[j] = w;
  }
  // Only the words the scan read count.
  const uint64_t read = scanned >= 64 ? ~uint64_t{0} : (uint64_t{1} << scanned) - 1;
  return (found & read) == at && (bad & read) == 0;
}
#endif

inline bool same_cps_moved(uint64_t* kept, const uint64_t* sp, size_t scanned, size_t n,
                           uint64_t at, uint64_t heap, uint64_t span) {
#if defined(__x86_64__)
  if (use_avx2()) return same_cps_moved_avx2(kept, sp, scanned, n, at, heap, span);
#endif
  return same_cps_moved_plain(kept, sp, scanned, n, at, heap, span);
}

// A process's heap and stack bounds as the VM keeps them: aligned,
// heap <= htop <= stop <= hend, less than 1 TiB. Only then is its stack,
// [stop, hend), read.
inline bool bounds_ok(uint64_t heap, uint64_t htop, uint64_t stop, uint64_t hend) {
  return aligned_pointer(heap) && (htop & 7) == 0 && (stop & 7) == 0 && (hend & 7) == 0 &&
         heap <= htop && htop <= stop && stop <= hend && hend - heap < (uint64_t{1} << 40);
}

// The words a scan of the stack [stop, hend) reads at most (bounds_ok).
inline uint64_t scan_limit(const mi_erlang_layout& l, uint64_t stop, uint64_t hend) {
  const uint64_t words = (hend - stop) / 8;
  return words < l.scan_words ? words : l.scan_words;
}

// What the scan compares CPs with when there is no cache.
constexpr uint64_t kNoWords[MI_CONTEXT_MAX_CPS] = {};

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
  // The same function and stack words as the last capture: the same
  // context. (The words are made from these alone: the checks above, on
  // the scheduler data and the env, were made again; the MFA words behind
  // `current` are code metadata, unchanged while the function runs.)
  //  - The same bounds: the stack the context was scanned from, whose
  //    bounds checked out then (below): of the checks, only the heap top's
  //    can answer otherwise now, and the scan's limit is the same. Its
  //    words may differ where no CP was or is (same_cps): a y register
  //    changed, as between two calls of a NIF from one loop.
  //  - Other bounds: another process running the same code, or this one's
  //    stack after a GC moved it. They are checked here; the scan of this
  //    stack must end where the kept one's did (at its last CP wanted, or
  //    at the same limit), and find CPs at the same words, equal
  //    (same_cps_moved), and nowhere else.
  if (cache != nullptr && cache->scanned != 0 && cache->current == current) {
    // One test for the three bounds (heap <= stop held when they were kept).
    if (((cache->heap ^ heap) | (cache->stop ^ stop) | (cache->hend ^ hend) | (htop & 7)) == 0) {
      if (htop - heap <= stop - heap &&
          same_cps(cache->stack, sp, cache->scanned, cache->kept, heap, hend - heap))
        return {cache->words, cache->n, cache->hash, cache->token};
    } else if (bounds_ok(heap, htop, stop, hend) && cache->kept <= (hend - stop) / 8 &&
               (cache->full != 0 || scan_limit(l, stop, hend) == cache->scanned)) {
      if (same_cps_moved(cache->stack, sp, cache->scanned, cache->kept, cache->at, heap,
                         hend - heap)) {
        cache->heap = heap;
        cache->stop = stop;
        cache->hend = hend;
        return {cache->words, cache->n, cache->hash, cache->token};
      }
      // Its kept words are partly this stack's now: emptied below.
    }
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
  const bool stack_ok = bounds_ok(heap, htop, stop, hend);
  const uint64_t stack_words = stack_ok ? (hend - stop) / 8 : 0;
  uint64_t scanned = 0, cps_differ = 1, at = 0;
  if (stack_ok) {
    // Continuation pointers: words with the low two bits clear that do not
    // point into the process's own memory (those are frame pointers),
    // compared with the cache's as they are found (its words may be of
    // another shape: the header and count compare below settle that).
    const uint64_t* expect = cache != nullptr ? cache->words + n : kNoWords;
    scanned = scan_cps(sp, scan_limit(l, stop, hend), heap, hend - heap, l.max_cps, out + n, expect,
                       &cps, &cps_differ, &at);
    n += cps;
  }
  out[0] = mi_context_header(MI_CONTEXT_PROCESS, mfa, cps, 0);
  if (cache != nullptr) {
    // Kept only when the scan read at least one word (the key) and fits.
    // Words and token stay paired: words the cache holds already keep
    // their token (and hash); others take a new one. Emptied first (a
    // failed check above may have left its kept words half replaced); its
    // words, token and hash stay as they were.
    cache->scanned = 0;
    if (scanned != 0 && scanned <= ContextCache::kMaxScanned) {
      // The CPs were compared by the scan; the header and the function here.
      const bool same = cache->token != 0 && cache->n == n && cps_differ == 0 &&
                        cache->words[0] == out[0] &&
                        (mfa == 0 || ((cache->words[1] ^ out[1]) | (cache->words[2] ^ out[2]) |
                                      (cache->words[3] ^ out[3])) == 0);
      if (!same) {
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
      cache->current = current;
      cache->heap = heap;
      cache->stop = stop;
      cache->hend = hend;
      // Whole blocks of 8 where the stack has the words (kMaxScanned is
      // a multiple of 8): the check compares them at once.
      const uint64_t kept =
          (scanned + 7) / 8 * 8 < stack_words ? (scanned + 7) / 8 * 8 : stack_words;
      std::memcpy(cache->stack, sp, kept * 8);
      cache->scanned = static_cast<unsigned>(scanned);
      cache->kept = static_cast<unsigned>(kept);
      cache->full = cps == l.max_cps ? 1 : 0;
      cache->at = at;
      return {cache->words, n, cache->hash, cache->token};
    }
  }
  return fresh(out, n);
}

void erlang_context_allow_avx2(bool allow) {
#if defined(__x86_64__)
  g_allow_avx2.store(allow, std::memory_order_relaxed);
#else
  (void)allow;
#endif
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
