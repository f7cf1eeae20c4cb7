#include "churn_group.h"

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
  // Rows have distinct ids (one per churn slot), but for stack 0.
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
  std::unordered_map<uint32_t, size_t> at;
  std::vector<ProfileSite> out;
  std::vector<bool> churned;
  auto row = [&](uint32_t id) -> size_t {
    const uint32_t c = id == 0 ? 0 : canon.at(id);
    auto [it, fresh] = at.try_emplace(c, out.size());
    if (fresh) {
      out.emplace_back();
      out.back().stack = c;
      churned.push_back(false);
    }
    return it->second;
  };
  for (const ChurnSite& s : churn) {
    const size_t i = row(s.stack);
    out[i].alloc_count += static_cast<double>(s.allocated_count);
    out[i].alloc_bytes += static_cast<double>(s.allocated_bytes);
    churned[i] = true;
  }
  for (const Site& s : live) {
    const size_t i = row(s.stack);
    out[i].inuse_count += s.count;
    out[i].inuse_bytes += s.bytes;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (churned[i]) continue;
    out[i].alloc_count = out[i].inuse_count;
    out[i].alloc_bytes = out[i].inuse_bytes;
  }
  return out;
}

}  // namespace mi::sites
