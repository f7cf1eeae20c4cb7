// Reader side: the tracker's churn rows (common/mi_abi.h, mi_abi_churn)
// grouped by call site, the way site_group.h groups live blocks: ids whose
// stacks have the same frames merge into the smallest, unknown stacks
// (freed since, or never stored) into stack 0. Behind mallocinfo_trace's
// churn/2 and the allocation figures of its pprof profiles
// (nif/trace_query_nif.cpp).
//
// Linked into the NIF and the Catch2 tests; no erl_nif. Allocates
// (std::bad_alloc is the NIF's {error, enomem}); thread-safe (no state of
// its own; the ABI is).
#ifndef MALLOCINFO_SITES_CHURN_GROUP_H
#define MALLOCINFO_SITES_CHURN_GROUP_H

#include <cstdint>
#include <vector>

#include "../common/mi_abi.h"
#include "site_group.h"

namespace mi::sites {

// One call site's churn since the tracker started or was reset.
struct ChurnSite {
  uint32_t stack = 0;  // canonical stack id; 0: no known stack
  uint64_t allocated_count = 0, allocated_bytes = 0;
  uint64_t freed_count = 0, freed_bytes = 0;
  uint64_t temporary_count = 0;
  uint64_t lifetimes[MI_LIFETIME_BUCKETS] = {};
  bool estimated = false;  // some figures are a sample's estimates
};

// Every churn row of `abi` (which must have churn: has_churn) grouped by
// call site, unordered, each stack id canonical and distinct.
// Precondition: the caller keeps the ids' meaning for the whole call
// (with_stable_ids).
std::vector<ChurnSite> group_churn(const mi_preload_abi* abi);

// Rows already read (the seam for tests): the same grouping.
std::vector<ChurnSite> group_churn(const std::vector<mi_abi_churn>& rows, FetchStack fetch,
                                   HashStack hash, void* ctx);

// One site of a profile with both live and cumulative figures: pprof's
// inuse_* and alloc_*.
struct ProfileSite {
  uint32_t stack = 0;
  uint64_t pid = 0;  // the process holding inuse_* (live sites split by process), or 0
  double inuse_count = 0, inuse_bytes = 0;
  double alloc_count = 0, alloc_bytes = 0;
};

// The live sites and the churn sites (each canonical on its own) joined
// by call site: one row per stack, canonical across both lists. The alloc
// figures of a site that churn never saw (blocks recorded before an
// interposer had churn) are its live ones, so alloc_* >= inuse_* holds
// wherever the tracker saw the allocations. Live sites split by process
// (group_by_site_and_process) stay split: one row per (stack, pid). Churn
// is never split by process: a process's row has its live blocks as its
// allocations, and the rest of the stack's (freed blocks, whose process
// is not kept) is its row of pid 0, so each stack's figures add up to
// churn's and the table's. Rows with nothing left are dropped.
std::vector<ProfileSite> join_sites(const std::vector<Site>& live,
                                    const std::vector<ChurnSite>& churn, FetchStack fetch,
                                    HashStack hash, void* ctx);

}  // namespace mi::sites

#endif
