// Reader side: every live block of a snapshot grouped by call site, the
// grouping behind the tracker's sites, heap profile, pprof and growth
// snapshots (nif/trace_query_nif.cpp).
//
// A site is first a stack id; ids whose stacks have the same frames are
// then merged into the smallest of them, and ids whose stack is unknown
// (freed since, or never stored) into the "no stack" site, stack 0
// (canonicalize(), stack_merge.h). Sampled entries count as the blocks
// they stand for (common/mi_sampling.h), so a site's figures are
// estimates as soon as one of its entries is sampled.
//
// Linked into the NIF and the Catch2 tests; no erl_nif. group_by_site()
// allocates (std::bad_alloc is the NIF's {error, enomem}) and is
// thread-safe (no state of its own; the ABI is).
#ifndef MALLOCINFO_SITES_SITE_GROUP_H
#define MALLOCINFO_SITES_SITE_GROUP_H

#include <cmath>
#include <cstdint>
#include <vector>

#include "../common/mi_abi.h"
#include "../common/mi_sampling.h"
#include "oldest.h"

namespace mi::sites {

// What one live block stands for: itself, or, recorded by the sampler
// (MI_ENTRY_SAMPLED), the blocks its weight estimates (mean: the tracker's
// sample_bytes). Every grouping of live blocks adds these.
inline mi::sampling::Weight entry_weight(const mi_abi_entry& e, uint64_t mean) {
  if ((e.flags & MI_ENTRY_SAMPLED) != 0) return mi::sampling::weight(e.size, mean);
  return {1, static_cast<double>(e.size)};
}

// One call site's live blocks.
struct Site {
  uint32_t stack;   // its canonical stack id; 0: blocks without a known stack
  double count;     // blocks (estimated when `estimated`)
  double bytes;     // their requested bytes (estimated when `estimated`)
  uint64_t oldest;  // the earliest timestamp among them, on now_ns()'s clock
  bool estimated;   // at least one block was sampled
  // group_by_site_and_process only: the process (its pid word, as the
  // tracker recorded it: mi_abi_entry.pid) whose blocks these are; 0 for
  // blocks recorded without one. Always 0 from group_by_site.
  uint64_t pid = 0;
};

// Every live block of `abi`'s table grouped by call site, in no particular
// order, each site's stack id canonical and distinct. `st` is the status
// read before the snapshot (its sample_bytes weighs sampled entries, its
// stacks and stack_capacity size the index). since_ns > 0 keeps only the
// blocks allocated at or after that instant (on now_ns()'s clock: a delta
// profile). `olds`, when not nullptr, is offered every block on the way,
// since_ns or not: the oldest blocks of the same snapshot.
// Precondition: the caller keeps the ids' meaning for the whole call (the
// NIF runs it inside with_stable_ids, nif/tracker_abi.h).
std::vector<Site> group_by_site(const mi_preload_abi* abi, const mi_abi_status& st,
                                uint64_t since_ns = 0, Oldest* olds = nullptr);

// The same, with each site's blocks split by the process that allocated
// them (mi_abi_entry.pid): one Site per (canonical stack, pid), the same
// stack merging as group_by_site. The figures of a stack's parts add up to
// its group_by_site figures.
std::vector<Site> group_by_site_and_process(const mi_preload_abi* abi, const mi_abi_status& st,
                                            uint64_t since_ns = 0);

// The order of a report: more bytes first, then the smaller stack id (a
// strict order, so equal sites come out the same on every call).
inline bool larger_site(const Site& a, const Site& b) {
  if (a.bytes != b.bytes) return a.bytes > b.bytes;
  return a.stack != b.stack ? a.stack < b.stack : a.pid < b.pid;
}

// A site's estimated figure as the whole number the API reports.
inline uint64_t rounded(double v) {
  return static_cast<uint64_t>(std::llround(v));
}

}  // namespace mi::sites

#endif
