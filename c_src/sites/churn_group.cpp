#include "churn_group.h"

#include <map>
#include <unordered_set>
#include <utility>

#include <algorithm>
#include <exception>
#include <unordered_map>

#include "abi_read.h"
#include "stack_merge.h"

namespace mi::sites {

namespace {

void add_row(ChurnSite& to, const mi_abi_churn& r) {
  to.allocated_count += r.allocated_count;
  to.allocated_bytes += r.allocated_bytes;
  to.freed_count += r.freed_count;
  to.freed_bytes += r.freed_bytes;
  to.temporary_count += r.temporary_count;
  for (unsigned b = 0; b < MI_LIFETIME_BUCKETS; ++b) to.lifetimes[b] += r.lifetimes[b];
  to.estimated = to.estimated || (r.flags & MI_CHURN_SAMPLED) != 0;
}

// id -> its canonical id, over the ids given (distinct).
std::unordered_map<uint32_t, uint32_t> canonical_ids(const std::vector<uint32_t>& ids,
                                                     FetchStack fetch, HashStack hash, void* ctx) {
  std::vector<StackKey> keys(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) keys[i].id = ids[i];
  canonicalize(keys.data(), keys.size(), fetch, hash, ctx);
  std::unordered_map<uint32_t, uint32_t> out;
  out.reserve(keys.size());
  for (const StackKey& k : keys) out.emplace(k.id, k.canonical);
  return out;
}

}  // namespace

std::vector<ChurnSite> group_churn(const std::vector<mi_abi_churn>& rows, FetchStack fetch,
                                   HashStack hash, void* ctx) {
  // Rows have distinct ids (one per churn slot), but for stack 0 and a
  // stack whose old row a compaction keeps for a pinned hook (two rows,
  // one id: both get its canonical id, and are summed as one site).
  std::vector<uint32_t> ids;
  ids.reserve(rows.size());
  for (const mi_abi_churn& r : rows)
    if (r.stack_id != 0) ids.push_back(r.stack_id);
  const std::unordered_map<uint32_t, uint32_t> canon = canonical_ids(ids, fetch, hash, ctx);
  std::unordered_map<uint32_t, size_t> at;  // canonical id -> index in out
  std::vector<ChurnSite> out;
  for (const mi_abi_churn& r : rows) {
    const uint32_t c = r.stack_id == 0 ? 0 : canon.at(r.stack_id);
    auto [it, fresh] = at.try_emplace(c, out.size());
    if (fresh) {
      out.emplace_back();
      out.back().stack = c;
    }
    add_row(out[it->second], r);
  }
  return out;
}

std::vector<ChurnSite> group_churn(const mi_preload_abi* abi) {
  std::vector<mi_abi_churn> rows;
  std::exception_ptr error;
  struct Ctx {
    std::vector<mi_abi_churn>* rows;
    std::exception_ptr* error;
  } ctx{&rows, &error};
  // The sink runs inside the interposer (no exceptions through it).
  abi->churn(
      [](void* p, const mi_abi_churn* r, size_t n) {
        Ctx& c = *static_cast<Ctx*>(p);
        if (*c.error) return;
        try {
          c.rows->insert(c.rows->end(), r, r + n);
        } catch (...) {
          *c.error = std::current_exception();
        }
      },
      &ctx);
  if (error) std::rethrow_exception(error);
  return group_churn(rows, abi_fetch_stack, abi_stack_hasher(abi),
                     const_cast<mi_preload_abi*>(abi));
}

std::vector<ProfileSite> join_sites(const std::vector<Site>& live,
                                    const std::vector<ChurnSite>& churn, FetchStack fetch,
                                    HashStack hash, void* ctx) {
  std::vector<uint32_t> ids;
  for (const Site& s : live)
    if (s.stack != 0) ids.push_back(s.stack);
  for (const ChurnSite& s : churn)
    if (s.stack != 0) ids.push_back(s.stack);
  // An id may be in both lists: canonicalize wants distinct ids.
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const std::unordered_map<uint32_t, uint32_t> canon = canonical_ids(ids, fetch, hash, ctx);
  std::map<std::pair<uint32_t, uint64_t>, size_t> at;  // (stack, pid) -> row
  std::vector<ProfileSite> out;
  std::unordered_set<uint32_t> churned;  // stacks with churn rows
  auto row = [&](uint32_t id, uint64_t pid) -> size_t {
    const uint32_t c = id == 0 ? 0 : canon.at(id);
    auto [it, fresh] = at.try_emplace({c, pid}, out.size());
    if (fresh) {
      out.emplace_back();
      out.back().stack = c;
      out.back().pid = pid;
    }
    return it->second;
  };
  for (const ChurnSite& s : churn) {
    const size_t i = row(s.stack, 0);
    out[i].alloc_count += static_cast<double>(s.allocated_count);
    out[i].alloc_bytes += static_cast<double>(s.allocated_bytes);
    churned.insert(out[i].stack);
  }
  for (const Site& s : live) {
    const size_t i = row(s.stack, s.pid);
    out[i].inuse_count += s.count;
    out[i].inuse_bytes += s.bytes;
  }
  // A row's alloc figures are at least its live ones. A stack churn never
  // saw: each row's are its live ones. A stack churn saw, split by process:
  // each process's row has its live blocks as its allocations (the rest of
  // the stack's, freed blocks of unknown processes, stay in its row of pid
  // 0), so the stack's total is churn's.
  std::unordered_map<uint32_t, size_t> unsplit;  // churned stack -> its row of pid 0
  for (const auto& [key, i] : at)
    if (key.second == 0 && churned.count(key.first) != 0) unsplit.emplace(key.first, i);
  for (ProfileSite& p : out) {
    const bool has_churn = churned.count(p.stack) != 0;
    if (has_churn && p.pid == 0) continue;
    p.alloc_count = p.inuse_count;
    p.alloc_bytes = p.inuse_bytes;
    if (!has_churn) continue;
    ProfileSite& rest = out[unsplit.at(p.stack)];
    rest.alloc_count = std::max(0.0, rest.alloc_count - p.inuse_count);
    rest.alloc_bytes = std::max(0.0, rest.alloc_bytes - p.inuse_bytes);
  }
  // Rows left with nothing (a stack whose every allocation is a process's
  // live block) are dropped.
  out.erase(std::remove_if(out.begin(), out.end(),
                           [](const ProfileSite& p) {
                             return p.inuse_count == 0 && p.inuse_bytes == 0 &&
                                    p.alloc_count == 0 && p.alloc_bytes == 0;
                           }),
            out.end());
  return out;
}

}  // namespace mi::sites
