#include "site_group.h"

#include <algorithm>
#include <unordered_map>

#include "../common/mi_sampling.h"
#include "abi_read.h"
#include "stack_merge.h"

namespace mi::sites {

namespace {

void add_entry(Site& s, const mi_abi_entry& e, uint64_t mean) {
  const mi::sampling::Weight w = entry_weight(e, mean);
  s.count += w.count;
  s.bytes += w.bytes;
  s.estimated = s.estimated || (e.flags & MI_ENTRY_SAMPLED) != 0;
  s.oldest = std::min(s.oldest, e.timestamp_ns);
}

void merge_into(Site& to, const Site& from) {
  to.count += from.count;
  to.bytes += from.bytes;
  to.oldest = std::min(to.oldest, from.oldest);
  to.estimated = to.estimated || from.estimated;
}

// Stack id -> index into a vector of sites. Ids are (generation << bits) |
// slot: a vector indexed by slot answers almost every lookup in one load
// (a million entries group in a few ms, against ~100 ms through a hash
// map); a slot seen with two generations (reused during the snapshot) and
// tables too large for a flat index fall back to the hash map.
class SiteIndex {
 public:
  explicit SiteIndex(uint64_t capacity) {
    if (capacity != 0 && (capacity & (capacity - 1)) == 0 && capacity <= kMaxFlat) {
      mask_ = capacity - 1;
      flat_.assign(capacity, Cell{0, kNone});
    }
  }
  // The index stored for id, or kNone.
  uint32_t find(uint32_t id) const {
    if (!flat_.empty()) {
      const Cell& c = flat_[id & mask_];
      if (c.site != kNone && c.id == id) return c.site;
    }
    auto it = other_.find(id);
    return it == other_.end() ? kNone : it->second;
  }
  void add(uint32_t id, uint32_t site) {
    if (!flat_.empty()) {
      Cell& c = flat_[id & mask_];
      if (c.site == kNone) {
        c = Cell{id, site};
        return;
      }
    }
    other_.emplace(id, site);
  }
  static constexpr uint32_t kNone = UINT32_MAX;

 private:
  static constexpr uint64_t kMaxFlat = uint64_t{1} << 20;
  struct Cell {
    uint32_t id, site;
  };
  std::vector<Cell> flat_;
  uint64_t mask_ = 0;
  std::unordered_map<uint32_t, uint32_t> other_;
};

}  // namespace

std::vector<Site> group_by_site(const mi_preload_abi* abi, const mi_abi_status& st,
                                uint64_t since_ns, Oldest* olds) {
  std::vector<Site> sites;
  sites.reserve(std::min<uint64_t>(st.stacks, 1 << 20) + 16);
  SiteIndex index(st.stack_capacity);
  stream_snapshot(abi, [&](const mi_abi_entry* e, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      if (olds != nullptr) olds->offer(e[i]);
      if (e[i].timestamp_ns < since_ns) continue;
      uint32_t at = index.find(e[i].stack_id);
      if (at == SiteIndex::kNone) {
        at = static_cast<uint32_t>(sites.size());
        sites.push_back(Site{e[i].stack_id, 0, 0, UINT64_MAX, false});
        index.add(e[i].stack_id, at);
      }
      add_entry(sites[at], e[i], st.sample_bytes);
    }
  });

  std::vector<StackKey> keys(sites.size());
  for (size_t i = 0; i < sites.size(); ++i) keys[i].id = sites[i].stack;
  canonicalize(keys.data(), keys.size(), abi);
  std::vector<bool> gone(sites.size(), false);
  for (const StackKey& k : keys) {
    if (k.canonical == k.id) continue;
    const uint32_t from = index.find(k.id);
    uint32_t to = index.find(k.canonical);
    if (to == SiteIndex::kNone) {  // an unknown stack, and no block had none
      to = static_cast<uint32_t>(sites.size());
      sites.push_back(Site{0, 0, 0, UINT64_MAX, false});
      gone.push_back(false);
      index.add(0, to);
    }
    merge_into(sites[to], sites[from]);
    gone[from] = true;
  }
  size_t kept = 0;
  for (size_t i = 0; i < sites.size(); ++i)
    if (!gone[i]) sites[kept++] = sites[i];
  sites.resize(kept);
  return sites;
}

namespace {

// A (stack id, pid) pair as one hash key.
struct PartKey {
  uint32_t stack;
  uint64_t pid;
  bool operator==(const PartKey&) const = default;
};
struct PartHash {
  size_t operator()(const PartKey& k) const {
    uint64_t h = (k.pid ^ (uint64_t{k.stack} << 32 | k.stack)) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

}  // namespace

std::vector<Site> group_by_site_and_process(const mi_preload_abi* abi, const mi_abi_status& st,
                                            uint64_t since_ns) {
  // By (stack id, pid) first; then each stack id's canonical id, and the
  // parts of merged ids merged by (canonical id, pid).
  std::unordered_map<PartKey, Site, PartHash> parts;
  stream_snapshot(abi, [&](const mi_abi_entry* e, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      if (e[i].timestamp_ns < since_ns) continue;
      auto [it, fresh] = parts.try_emplace(PartKey{e[i].stack_id, e[i].pid},
                                           Site{e[i].stack_id, 0, 0, UINT64_MAX, false, e[i].pid});
      add_entry(it->second, e[i], st.sample_bytes);
    }
  });
  std::vector<StackKey> keys;
  {
    std::unordered_map<uint32_t, bool> seen;
    for (const auto& [k, site] : parts)
      if (seen.try_emplace(k.stack, true).second) keys.push_back(StackKey{k.stack, 0, 0});
  }
  canonicalize(keys.data(), keys.size(), abi);
  std::unordered_map<uint32_t, uint32_t> canonical;
  for (const StackKey& k : keys) canonical[k.id] = k.canonical;
  std::unordered_map<PartKey, Site, PartHash> merged;
  for (const auto& [k, site] : parts) {
    const uint32_t to = canonical.at(k.stack);
    auto [it, fresh] = merged.try_emplace(PartKey{to, k.pid}, site);
    if (fresh)
      it->second.stack = to;
    else
      merge_into(it->second, site);
  }
  std::vector<Site> out;
  out.reserve(merged.size());
  for (const auto& [k, site] : merged) out.push_back(site);
  return out;
}

}  // namespace mi::sites
