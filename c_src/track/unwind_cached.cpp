// The unwinder of the allocation tracker: per return address, the rule that
// finds the caller's frame, cached per thread; a warm walk over cached rules
// inside the stack window, a cold walk that derives rules and validates
// loads. It takes no lock and calls nothing that does (no libunwind, no
// dl_iterate_phdr, no dladdr): it runs inside malloc hooks, whose callers
// may hold the dynamic loader's lock (a dl_iterate_phdr callback, dlopen) or
// libunwind's (issue 15: a hook that waited for either deadlocked the node).
// See unwind.h for the contract. The parts, one concept a file:
//   eh_frame.{h,cpp}      .eh_frame records and the CFA program -> a row (pure)
//   cfi.{h,cpp}           a row -> a 16-byte step rule; stepping a frame by it (pure)
//   stack_window.{h,cpp}  checked reads and the window of readable stack
//   unwind_cached.cpp     the per-thread rule cache, the walks, capture_cached
//
// Finding the rule of a return address ra (derive_rule, the cold path):
// _dl_find_object (glibc 2.35+, lock-free, no allocation) gives the object,
// its mapped extent and its .eh_frame_hdr; eh::find_fde searches the hdr's
// table; eh::row_at runs the CIE's and the FDE's CFA programs up to the
// call; rule_from_row keeps the row if it has the shape cfi.h describes. The
// row is the one libunwind 1.6 evaluates (test_unwind.cpp compares whole
// stacks with it). Anything outside that shape (CFA or register
// expressions, DW_CFA_register on RBP/RSP/RA, signal frames, an object
// without .eh_frame_hdr, CFI read differently by different unwinders) gets
// a "stop" rule: the stack ends at that frame, shorter than libunwind's,
// never wrong and never blocked.
//
// Code without any unwind info (JIT output, BEAM's for one) gets the rule
// "guess": libunwind 1.6.2's own frame-pointer step for such frames
// (src/x86_64/Gstep.c, the branch taken when dwarf_step() fails with
// UNW_ENOINFO), redone bit for bit in cfi.h's step_guess.
//
// A warm walk (fast_walk) is, per frame: one rule load (found through the
// previous rule's `next` hint, not the hash), one or two stack loads, a few
// compares. A frame whose rule is not cached, or whose loads fall outside
// the stack window, is stepped by the cold walk (capture_slow), which
// derives and caches the rule and reads the stack through read_two, then
// hands back to the warm walk.
//
// Memory safety: a fault here is a fault inside malloc. The warm walk loads
// stack memory only inside the cache's stack window (stack_window.h); the
// cold walk loads anything else with process_vm_readv, which fails where a
// load would fault. So a stale rule (code unmapped and replaced) can produce
// a wrong frame, never a fault. The CFI itself is read from objects the
// loader has mapped, every read bounded by the object's mapped extent.
//
// Thread safety: a cache belongs to one thread (unwind.h). The only shared
// state is the generation counter bumped by unwind_code_unmapped().
//
// x86_64 only; elsewhere capture_cached() follows frame-pointer records
// through read_checked (bottom).
#include <dlfcn.h>
#include <string.h>

#include "cfi.h"
#include "eh_frame.h"
#include "stack_window.h"
#include "unwind.h"

#if defined(__x86_64__)

namespace mi::track {

namespace {

// At most 8192 rules of 16 bytes: a 128 KiB mapping per thread. A
// workload's distinct return addresses on malloc paths are typically a few
// hundred to a few thousand per thread, and most threads of a node (the
// async, dirty and I/O pools) see far fewer. Rules are spread by hash, so
// every page of a table is touched soon after it is in use: the table
// starts at 256 rules (one 4 KiB page, beside the counters' page) and
// doubles when it is half full, forgetting its rules (they are derived
// again on the next misses), up to 8192, where it evicts instead. A thread
// keeps 32 KiB of table for 1000 rules rather than the whole 128 KiB (issue
// 26: 18 threads of a preloaded RabbitMQ kept 1.32 MiB of caches).
constexpr unsigned kMinSlotBits = 8;
constexpr unsigned kMaxSlotBits = 13;
constexpr size_t kMaxSlots = size_t{1} << kMaxSlotBits;
constexpr size_t kProbe = 8;

uint32_t g_generation = 0;

}  // namespace

// Plain data in zero-filled memory; unwind_cache_init sets `bits`. The
// rules come first: the warm walk adds a rule's `next` hint to the cache's
// own address (a slots array at an offset costs an add a frame), and the
// counters' page after them is the one page beyond the table in use.
struct UnwindCache {
  Rule slots[kMaxSlots];
  uint64_t hits;
  uint64_t misses;
  uint64_t fallbacks;
  uint64_t truncated;
  uint64_t entries;
  uint32_t generation;
  uint32_t evict;
  uint32_t bits;  // the table is slots[0, 2^bits)
  StackWindow window;
};

namespace {

// ---------------------------------------------------------------------------
// The per-thread rule cache: open addressing keyed by return address.

inline size_t slot_of(const UnwindCache* cache, uintptr_t ip) {
  return static_cast<size_t>((ip * 0x9E3779B97F4A7C15ull) >> (64 - cache->bits));
}

inline Rule* find_rule(UnwindCache* cache, uintptr_t ip) {
  if (ip == 0) return nullptr;
  const size_t mask = (size_t{1} << cache->bits) - 1;
  const size_t home = slot_of(cache, ip);
  for (size_t i = 0; i < kProbe; ++i) {
    Rule* r = &cache->slots[(home + i) & mask];
    if (r->ip == ip) return r;
    if (r->ip == 0) return nullptr;
  }
  return nullptr;
}

// Forgets every rule; the table keeps its size. A rule's `next` hint may
// then point at an empty slot or another rule: the warm walk checks the
// rule it lands on.
void clear_rules(UnwindCache* cache) {
  memset(cache->slots, 0, sizeof(Rule) << cache->bits);
  cache->entries = 0;
}

// Slots are never emptied one by one (only all at once), so overwriting a
// full probe window keeps every other key reachable.
void insert_rule(UnwindCache* cache, const Rule& rule) {
  if (rule.ip == 0) return;
  if (cache->entries >= (size_t{1} << cache->bits) / 2 && cache->bits < kMaxSlotBits) {
    ++cache->bits;
    clear_rules(cache);
  }
  const size_t mask = (size_t{1} << cache->bits) - 1;
  const size_t home = slot_of(cache, rule.ip);
  for (size_t i = 0; i < kProbe; ++i) {
    Rule* r = &cache->slots[(home + i) & mask];
    if (r->ip == rule.ip || r->ip == 0) {
      if (r->ip == 0) ++cache->entries;
      *r = rule;
      return;
    }
  }
  cache->slots[(home + (cache->evict++ % kProbe)) & mask] = rule;
}

void flush_if_stale(UnwindCache* cache) {
  const uint32_t gen = __atomic_load_n(&g_generation, __ATOMIC_ACQUIRE);
  if (gen == cache->generation) return;
  clear_rules(cache);
  cache->generation = gen;
}

// ---------------------------------------------------------------------------
// Deriving a rule: the loaded object's CFI, or the frame-pointer guess.

// The FDE covering pc among the loaded objects, found without a lock.
// kNone only where libunwind 1.6.2 (no .debug_frame support on x86_64) finds
// nothing either and its dwarf_step fails with UNW_ENOINFO: pc outside every
// loaded object, or no FDE covering it in its object (eh::find_fde). An
// object without .eh_frame_hdr is kUnknown (libunwind would search its
// .eh_frame). _dl_find_object (glibc 2.35+) takes no lock (the loader
// publishes its object list for it lock-free; libgcc's exception unwinder
// relies on the same) and does not allocate. Without it (older glibc) every
// pc is kUnknown: stacks end at their first frame.
eh::Lookup find_loaded_fde(uintptr_t pc, eh::Fde* out) {
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 35)
  dl_find_object obj;
  if (_dl_find_object(reinterpret_cast<void*>(pc), &obj) != 0) return eh::Lookup::kNone;
  const auto* hdr = static_cast<const uint8_t*>(obj.dlfo_eh_frame);
  if (hdr == nullptr) return eh::Lookup::kUnknown;
  // The object's mapped extent holds its .eh_frame_hdr and .eh_frame: no
  // offset read from them may lead a parse outside it.
  const eh::Span object{static_cast<const uint8_t*>(obj.dlfo_map_start),
                        static_cast<const uint8_t*>(obj.dlfo_map_end)};
  return eh::find_fde(object, hdr, pc, out);
#else
  (void)pc;
  (void)out;
  return eh::Lookup::kUnknown;
#endif
}

// The rule for code at ra that has no FDE: libunwind's frame-pointer guess,
// on the path it takes when the code is mapped and is not a PLT entry. Its
// unw_step reads the 8 bytes at ra to check it is mapped (its RIP fix-up
// path otherwise reads the stack of whoever called unw_getcontext), and 16
// bytes to match a PLT entry (jmp *x(%rip); push $n; jmp ...), whose frame
// it steps differently; this unwinder ends the stack at both. Its check
// covers both pages when the 8 bytes cross a page's end, and so does
// read_checked: a return address in a page's last 8 bytes is stepped.
Rule guess_rule(uintptr_t ra) {
  uint64_t code[2] = {0, 0};
  if (!read_checked(ra, &code[0], 8)) return kind_rule(ra, kStop);
  if (read_checked(ra + 8, &code[1], 8) && (code[0] & 0xffff) == 0x25ff &&
      ((code[0] >> 48) & 0xff) == 0x68 && ((code[1] >> 24) & 0xff) == 0xe9)
    return kind_rule(ra, kStop);
  return kind_rule(ra, kGuess);
}

// The rule for a frame whose return address is ra (so the CFI row is looked
// up at ra - 1, as libunwind does for every frame but a signal frame's
// successor, and signal frames end the stack here). Lock-free, no
// allocation: callable from a malloc hook.
Rule derive_rule(uintptr_t ra) {
  eh::Fde fde;
  if (ra < 2) return kind_rule(ra, kStop);
  switch (find_loaded_fde(ra - 1, &fde)) {
    case eh::Lookup::kFound:
      break;
    case eh::Lookup::kNone:
      return guess_rule(ra);
    case eh::Lookup::kUnknown:
      return kind_rule(ra, kStop);
  }
  if (fde.cie.signal_frame) return kind_rule(ra, kStop);
  eh::Row row;
  if (eh::row_at(fde, ra, &row) != eh::Cfi::kOk) return kind_rule(ra, kStop);
  return rule_from_row(ra, fde.cie, row);
}

// ---------------------------------------------------------------------------
// The walks.

// A step rule applied to f in the window (whose top is hi; f.sp is never
// below its bottom): cfi.h's step() with direct loads, the checks of
// locate() merged with the window's (the CFA at least a return-address slot
// above SP and inside the window, the saved-RBP slot inside the frame being
// popped, so both loads are inside the window). Written out rather than
// through locate(): this is the hottest loop of the tracker, and the merged
// range check saves instructions on every frame. A frame the rule cannot
// apply to goes to the cold walk, which refuses it through step().
inline __attribute__((always_inline)) Step apply_rule(const Rule& r, Frame& f, uintptr_t hi) {
  const uintptr_t base = (r.kind & kCfaFromBp) != 0 ? f.bp : f.sp;
  const intptr_t off8 = r.cfa_off8;
  const uintptr_t cfa = base + 8 * off8;
  if (cfa < f.sp + 8 || cfa > hi) return Step::kOutside;
  uintptr_t bp = f.bp;
  if ((r.kind & kBpSaved) != 0) {
    const uintptr_t slot = base + 8 * (off8 + r.bp_off8);
    if (slot < f.sp) return Step::kOutside;
    bp = load_word(slot);
  }
  const uintptr_t ip = load_word(base + 8 * (off8 - 1));
  if (ip == 0) return Step::kEnd;
  f = Frame{ip, cfa, bp};
  return Step::kStep;
}

// Records frames from index *n on, starting with f, while cached rules and
// the window allow. Returns true when the stack is complete (ended, stopped
// or out full); false leaves *n - 1 as the index of the frame f, which the
// cold walk has to step. The caller has checked the window is this thread's.
inline __attribute__((always_inline)) bool fast_walk(UnwindCache* cache, uintptr_t* out, size_t max,
                                                     size_t* n, Frame& f) {
  char* const slots = reinterpret_cast<char*>(cache->slots);
  const uintptr_t hi = cache->window.hi;
  uintptr_t* const first = out + *n;
  uintptr_t* p = first;
  uintptr_t* const end = out + max;
  bool complete = false;
  // Every pass records one frame, and every pass but the last stepped it by
  // a rule; the last one counts when a rule ended the stack. Counting this
  // way, not with an increment a pass, keeps the loop's counter out of
  // memory (it would be spilled there).
  uint64_t last_resolved = 0;
  // Every load below is at or above f.sp, which only grows: it starts inside.
  Rule* r = cache->window.contains(f.sp) ? find_rule(cache, f.ip) : nullptr;
  for (;;) {
    *p++ = f.ip;
    if (p == end) {
      complete = true;
      break;
    }
    if (r == nullptr) break;
    Rule* next = reinterpret_cast<Rule*>(slots + r->next);
    Step step;
    if (__builtin_expect(r->kind > kStepMax, 0)) {
      if (r->kind == kGuess) {
        step = step_guess(f, [hi](uintptr_t at, uintptr_t* bp, uintptr_t* ip) {
          if (at + 16 > hi) return Step::kOutside;
          *bp = load_word(at);
          *ip = load_word(at + 8);
          return Step::kStep;
        });
      } else {
        step = r->kind == kEnd ? Step::kEnd : Step::kStop;
      }
    } else {
      step = apply_rule(*r, f, hi);
    }
    if (__builtin_expect(step != Step::kStep, 0)) {
      if (step == Step::kOutside) break;
      last_resolved = 1;
      cache->truncated += step == Step::kStop ? 1 : 0;
      complete = true;
      break;
    }
    if (__builtin_expect(next->ip != f.ip, 0)) {
      next = find_rule(cache, f.ip);
      if (next != nullptr) r->next = static_cast<uint32_t>(reinterpret_cast<char*>(next) - slots);
    }
    r = next;
  }
  cache->hits += static_cast<uint64_t>(p - first) - 1 + last_resolved;
  *n = static_cast<size_t>(p - out);
  return complete;
}

// The cold walk: out[0, n) are written; when n > 0, f is the frame of
// out[n - 1], which the warm walk could not step; when n == 0, f is the
// first frame (the return address into capture_cached's caller, with the
// caller's RSP and RBP). Steps frames one by one, deriving and caching the
// rules it lacks, and hands back to the warm walk wherever a cached rule and
// the window allow. cache may be null (every rule derived, every load
// checked). Learns the stack window from the frames it crossed. noinline:
// the warm path's frame stays small.
__attribute__((noinline)) size_t capture_slow(UnwindCache* cache, uintptr_t* out, size_t max,
                                              size_t n, Frame f, uintptr_t caller_sp) {
  bool window = false;
  if (cache != nullptr) {
    ++cache->fallbacks;
    window = cache->window.owner == thread_self() && cache->window.contains(caller_sp);
  }
  // Loads through the window where it holds them, validated elsewhere.
  const StackWindow* const w = window ? &cache->window : nullptr;
  // The window follows frames of plausible size, from the caller's (the
  // warm walk's frames so far were all inside the window): one stack.
  uintptr_t chain_top = f.sp;
  bool chain = true;
  if (n == 0) out[n++] = f.ip;
  while (n < max) {
    Rule derived;
    const Rule* r = cache != nullptr ? find_rule(cache, f.ip) : nullptr;
    if (r == nullptr) {
      derived = derive_rule(f.ip);
      if (cache != nullptr) {
        ++cache->misses;
        insert_rule(cache, derived);
      }
      r = &derived;
    } else {
      ++cache->hits;
    }
    const Frame before = f;
    const Step step =
        mi::track::step(*r, f, [w](uintptr_t a, uintptr_t* va, uintptr_t b, uintptr_t* vb) {
          return read_two(w, a, va, b, vb) ? Step::kStep : Step::kEnd;
        });
    if (step != Step::kStep) {
      if (step == Step::kStop && cache != nullptr) ++cache->truncated;
      break;
    }
    // Guess steps count too: JIT frames sit between native frames of the
    // same stack, and their CFA, while not the real RSP, stays close to it.
    chain = chain && f.sp - before.sp <= kMaxChainFrame;
    if (chain) chain_top = f.sp;
    if (window) {
      // Whatever the warm walk crosses lies inside the window, up to f.
      if (fast_walk(cache, out, max, &n, f)) break;
      if (chain && f.sp > chain_top) chain_top = f.sp;
      continue;
    }
    out[n++] = f.ip;
  }
  if (cache != nullptr) cache->window.learn(window, caller_sp, chain_top);
  return n;
}

}  // namespace

size_t unwind_cache_bytes() {
  return sizeof(UnwindCache);
}

UnwindCache* unwind_cache_init(void* zeroed_memory) {
  auto* cache = static_cast<UnwindCache*>(zeroed_memory);
  cache->bits = kMinSlotBits;
  cache->generation = __atomic_load_n(&g_generation, __ATOMIC_ACQUIRE);
  return cache;
}

UnwindCacheStats unwind_cache_stats(const UnwindCache* cache) {
  return UnwindCacheStats{cache->hits,      cache->misses,  cache->fallbacks,
                          cache->truncated, cache->entries, size_t{1} << cache->bits};
}

void unwind_code_unmapped() {
  __atomic_add_fetch(&g_generation, 1, __ATOMIC_ACQ_REL);
}

}  // namespace mi::track

// The entry point proper, reached from the capture_cached stub below with the
// caller's return address, RSP and RBP as they were at the call: exact by
// construction, and no rule is needed for capture_cached's own frame.
extern "C" __attribute__((visibility("hidden"), used)) size_t mi_track_capture_cached_entry(
    mi::track::UnwindCache* cache, uintptr_t* out, size_t max, uintptr_t ra, uintptr_t sp,
    uintptr_t bp) {
  using namespace mi::track;
  if (max == 0) return 0;
  Frame f{ra, sp, bp};
  size_t n = 0;
  if (cache != nullptr) {
    flush_if_stale(cache);
    if (cache->window.ready(sp) && fast_walk(cache, out, max, &n, f)) return n;
  }
  return capture_slow(cache, out, max, n, f, sp);
}

namespace mi::track {

// A stub that cannot be inlined and has no frame of its own: it hands the
// caller's registers to the entry point and jumps there, so the entry point
// runs as if called directly from our caller.
__attribute__((naked)) size_t capture_cached(UnwindCache*, uintptr_t*, size_t) {
  // (With -fcf-protection, GCC puts the endbr64 in front by itself.)
  __asm__(
      "movq (%rsp), %rcx\n\t"
      "leaq 8(%rsp), %r8\n\t"
      "movq %rbp, %r9\n\t"
      "jmp mi_track_capture_cached_entry\n\t");
}

}  // namespace mi::track

#else  // !__x86_64__: no CFI rules; frame-pointer records, read with checks.

namespace mi::track {

struct UnwindCache {
  uint64_t misses;
  uint64_t fallbacks;
};

size_t unwind_cache_bytes() {
  return sizeof(UnwindCache);
}

UnwindCache* unwind_cache_init(void* zeroed_memory) {
  return static_cast<UnwindCache*>(zeroed_memory);
}

UnwindCacheStats unwind_cache_stats(const UnwindCache* cache) {
  return UnwindCacheStats{0, cache->misses, cache->fallbacks, 0, 0, 0};
}

void unwind_code_unmapped() {}

// Follows frame records {caller's frame pointer, return address} from this
// function's own (AArch64's AAPCS64 layout, and x86_64's), each read with
// read_checked; ends at the first unreadable or non-ascending record. Code
// built without frame pointers is skipped over or ends the stack early.
__attribute__((noinline)) size_t capture_cached(UnwindCache* cache, uintptr_t* out, size_t max) {
  uintptr_t fp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  size_t n = 0;
  if (cache != nullptr) ++cache->fallbacks;
  while (n < max) {
    uintptr_t record[2];
    if (!read_checked(fp, record, sizeof record) || record[1] == 0) break;
    out[n++] = record[1];
    if (cache != nullptr) ++cache->misses;
    if (record[0] <= fp) break;
    fp = record[0];
  }
  __asm__ volatile("" : "+r"(n));
  return n;
}

}  // namespace mi::track

#endif
