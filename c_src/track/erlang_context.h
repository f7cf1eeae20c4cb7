// The Erlang context of an allocation, read inside a hook (issue 25): on a
// scheduler thread, the running process's pid, the function it runs and
// the first return addresses of its Erlang stack; on any other thread, the
// thread's name. Encoded after the native frames of the recorded stack
// (common/mi_context.h); the pid goes into the live entry.
//
// Where these live in the VM is not known here: the NIF learns it from its
// own calls (nif/erlang_context_nif.cpp) and hands over a mi_erlang_layout,
// which erlang_layout_valid() checks before the tracker uses it.
//
// Hook-safe: plain loads only, no lock, no allocation, no system call. The
// only pointers followed are the scheduler data (the VM's own thread-
// specific value for this thread), the process it runs, the NIF env and the
// current function's three words, and the process's own stack: each
// reached through words of the layout, and each checked first (non-null,
// aligned, the env pointing back at the process, heap <= stop <= hend); a
// value that does not check out ends the context there. Stale code
// addresses are never followed: return addresses are stored, and named at
// read time.
#ifndef MALLOCINFO_TRACK_ERLANG_CONTEXT_H
#define MALLOCINFO_TRACK_ERLANG_CONTEXT_H

#include <cstddef>
#include <cstdint>

#include "../common/mi_abi.h"
#include "../common/mi_context.h"
#include "stack_table.h"

namespace mi::track {

// The largest word index a layout may name (the structs are read that far).
constexpr uint32_t kMaxLayoutWord = 255;

// True when the layout can be used: the right version, every index within
// kMaxLayoutWord, max_cps within MI_CONTEXT_MAX_CPS, a bounded scan.
bool erlang_layout_valid(const mi_erlang_layout& l);

// The calling thread's value of pthread key `key` (the VM's scheduler
// data), or nullptr. The interposer's is pthread_getspecific; tests pass
// their own.
using SchedulerDataFn = const void* (*)(uint32_t key);

// The last context a thread captured inside a NIF call, and everything it
// was made from: the process's function and bounds, and the stack words it
// scanned (rounded up to whole blocks of 8 where the stack has them). A
// capture that reads the same words makes the same context, so it is
// copied instead of scanned again (a NIF that allocates in a loop scans
// its process's stack once); so does one whose stack words differ only
// where neither word is a CP (a y register changed: the next call of the
// NIF from the same loop), and one on a stack elsewhere (another process
// running the same code, or this one's after a GC moved it) with CPs at
// the same words, equal, and none elsewhere, judged against its own heap;
// the cache then keeps the new words. The pid is not part of the context
// words: it is read every time. Per thread, owned by the caller; never
// shared.
//
// The cache also names its context words with a token (StackTable::Tail):
// a refill that makes the same words as the last keeps the token and the
// hash; one that makes other words takes next_token and advances it. So a
// token names one content only, as long as no two caches draw from one
// range (the tracker starts thread state i's at first_token(i), once;
// next_token 0 gives none). One layout per cache: the cache compares what
// it read, not how.
// Cache i's first token: its tokens are i in the top bits, a count below.
constexpr unsigned kTokenBits = 54;
constexpr uint64_t first_token(uint64_t index) {
  return (index << kTokenBits) | 1;
}

struct ContextCache {
  // Longer scans are not kept; a multiple of 8, at most 64 (`at`).
  static constexpr unsigned kMaxScanned = 64;
  uint64_t current, heap, stop, hend;
  unsigned scanned;  // stack words scanned; 0: nothing kept
  unsigned kept;     // stack words kept, at least scanned (when kept: rounded up to 8
                     // within that stack; a stack elsewhere that matched keeps the count)
  unsigned n;        // context words
  unsigned full;     // 1: the scan ended at the last CP it wanted, 0: at its limit
  uint64_t at;       // bit i: stack word i (< scanned) is a CP
  uint64_t stack[kMaxScanned];
  uint64_t words[MI_CONTEXT_MAX_WORDS];
  uint64_t hash;        // StackTable::hash_words(words, n)
  uint64_t token;       // names words[0, n), or 0
  uint64_t next_token;  // the next token to give, or 0 (give none)
};

// What a capture found, as the tail of the stack it will end (StackTable::
// Tail): its words (in the caller's buffer, or the cache's while nothing
// else captures on the thread), how many (0: nothing to say), their hash
// (StackTable::hash_words) and their token (0: none).
using ContextWords = StackTable::Tail;

// Reads the calling thread's context: the words are written to `out` (room
// for MI_CONTEXT_MAX_WORDS) or, when the cache answers, left in the cache,
// header first. *pid is set to the running process's pid term, or 0.
// `name` is the thread's name (2 words, see normalize_thread_name) or
// nullptr when unknown. `cache` (nullptr: none) is the calling thread's
// ContextCache: read and refilled; the words are the same with or without
// it. Hook-safe (above).
ContextWords read_erlang_context(const mi_erlang_layout& l, SchedulerDataFn sd_of,
                                 const uint64_t* name, uint64_t* out, uint64_t* pid,
                                 ContextCache* cache = nullptr);

// The same words, always copied to out; returns how many.
unsigned capture_erlang_context(const mi_erlang_layout& l, SchedulerDataFn sd_of,
                                const uint64_t* name, uint64_t* out, uint64_t* pid,
                                ContextCache* cache = nullptr);

// Whether the cache's check may use AVX2 where the CPU has it (true, the
// default); false: SSE2 on x86-64. The answers are the same: tests run
// both. Relaxed, and read by every capture: set it while none runs.
void erlang_context_allow_avx2(bool allow);

// A thread name (at most 15 bytes, NUL-terminated) as the 2 context words:
// a trailing run of digits becomes one '*' (erts_async_3 -> erts_async_*),
// so the threads of one pool record one stack. No allocation.
void normalize_thread_name(const char* name, uint64_t out[2]);

}  // namespace mi::track

#endif
