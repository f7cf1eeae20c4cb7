#include "site_group.h"

#include <algorithm>
#include <unordered_map>

#include "../common/mi_sampling.h"
#include "abi_read.h"
#include "stack_merge.h"

namespace mi::sites {

namespace {

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
      Site& s = sites[at];
      if (e[i].flags & MI_ENTRY_SAMPLED) {
        const mi::sampling::Weight w = mi::sampling::weight(e[i].size, st.sample_bytes);
        s.count += w.count;
        s.bytes += w.bytes;
        s.estimated = true;
      } else {
        s.count += 1;
        s.bytes += static_cast<double>(e[i].size);
      }
      s.oldest = std::min(s.oldest, e[i].timestamp_ns);
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

}  // namespace mi::sites
