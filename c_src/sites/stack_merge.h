// Reader side: which stack ids name the same call site.
//
// The tracker's stack table may store one stack under two ids (two threads
// storing a new stack at the same moment; see track/stack_table.h), and a
// stack freed since a snapshot was taken reads as unknown. Every reader
// that groups live blocks by call site (sites, the heap profile, the heap
// map's sites) maps ids through canonicalize() first, so one call site is
// one row. Merging here, by content, instead of preventing duplicates in
// the interposer keeps the hot path free of waits: a thread that finds
// another one mid-write of the same stack moves on after a bounded spin.
//
// Linked into the NIF and the Catch2 tests, and called in the heap map's
// forked child, which must not allocate: nothing here allocates.
#ifndef MALLOCINFO_SITES_STACK_MERGE_H
#define MALLOCINFO_SITES_STACK_MERGE_H

#include <cstddef>
#include <cstdint>

#include "../common/mi_context.h"
#include "../common/mi_limits.h"

namespace mi::sites {

// Copies up to `max` frames of stack `id` into out and returns its depth,
// 0 when the stack is unknown (mi_preload_abi.stack has this shape).
using FetchStack = uint32_t (*)(void* ctx, uint32_t id, uint64_t* out, uint32_t max);
// A hash of stack `id`'s frames, equal for equal frames, never 0; 0 when
// the stack is unknown (mi_preload_abi.stack_hash has this shape).
using HashStack = uint64_t (*)(void* ctx, uint32_t id);

struct StackKey {
  uint32_t id = 0;         // set by the caller
  uint32_t canonical = 0;  // set by canonicalize()
  uint64_t hash = 0;       // of the frames; 0 for an unknown stack
};

// Words read per stack: the deepest stack the tracker keeps, and the
// Erlang context that may follow its frames (common/mi_context.h).
inline constexpr uint32_t kMaxFrames = mi::limits::kMaxStackDepth + MI_CONTEXT_MAX_WORDS;

// For keys[0..n) with distinct ids, sets each canonical to the smallest id
// among those whose stack has the same frames, or 0 when its stack is
// unknown (id 0, or freed). Reorders keys (by hash, then id). With `hash`
// (may be nullptr) hashes come from it and frames are fetched only for ids
// sharing a hash with another (a 64K-stack table: ~10 ms instead of ~60 ms
// fetching every stack); without, each stack is fetched and hashed here.
// Never allocates; thread-safe (no state of its own).
void canonicalize(StackKey* keys, size_t n, FetchStack fetch, HashStack hash, void* ctx);

}  // namespace mi::sites

#endif
