// What the tracker core's Catch2 tests share (test_live_table,
// test_stack_table, test_stack_merge, test_tracker, test_tracker_reclaim,
// test_track_cost): a fake unwinder and clock for deterministic Trackers,
// readers of a Tracker's or a StackTable's state, and a way to hold one
// thread at a chosen point. Test code: allocates, may REQUIRE.
#ifndef MALLOCINFO_TEST_TRACK_FIXTURE_H
#define MALLOCINFO_TEST_TRACK_FIXTURE_H

#include "catch.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "../sites/stack_merge.h"
#include "../track/live_table.h"
#include "../track/stack_table.h"
#include "../track/tracker.h"

namespace mi::test {

// The fake unwinder returns this thread's t_fake_stack; the fake clock
// reads g_fake_now (a test advances it by hand).
inline thread_local std::vector<uintptr_t> t_fake_stack;
inline std::atomic<uint64_t> g_fake_now{1'000'000'000};

inline size_t fake_unwind(mi::track::UnwindCache*, uintptr_t* out, size_t max) {
  size_t n = 0;
  for (; n < t_fake_stack.size() && n < max; ++n) out[n] = t_fake_stack[n];
  return n;
}
inline uint64_t fake_clock() {
  return g_fake_now.load();
}

inline mi_abi_status status_of(const mi::track::Tracker& t) {
  mi_abi_status s{};
  t.status(&s);
  return s;
}

// Live entries by address.
inline std::map<uint64_t, mi::track::LiveEntry> live_of(const mi::track::Tracker& t) {
  std::map<uint64_t, mi::track::LiveEntry> m;
  t.for_each_live([&](const mi::track::LiveEntry& e) { m[e.address] = e; });
  return m;
}

inline void* addr(uint64_t a) {
  return reinterpret_cast<void*>(a);
}

// A tracker on the fake unwinder and clock, with `entries` live-table
// slots and 1 Ki stacks.
inline void init_small(mi::track::Tracker& t, size_t entries = 1 << 12) {
  mi::track::Config c;
  c.table_capacity = entries;
  c.stack_capacity = 1024;
  REQUIRE(t.init(c, fake_unwind, fake_clock));
}

// Reads stack ids back from a StackTable, for mi::sites::canonicalize.
inline uint32_t fetch_from(void* table, uint32_t id, uint64_t* out, uint32_t max) {
  return static_cast<mi::track::StackTable*>(table)->get(id, out, max);
}

inline uint64_t hash_from(void* table, uint32_t id) {
  return static_cast<mi::track::StackTable*>(table)->hash_of(id);
}

// The canonical id of each of `ids` (merging stacks stored twice), with
// the table's hashes or with frames hashed by the reader.
inline std::map<uint32_t, uint32_t> canonical_ids(mi::track::StackTable& st,
                                                  const std::vector<uint32_t>& ids,
                                                  bool with_hashes = true) {
  std::set<uint32_t> distinct(ids.begin(), ids.end());
  std::vector<mi::sites::StackKey> keys;
  for (uint32_t id : distinct) keys.push_back(mi::sites::StackKey{id});
  mi::sites::canonicalize(keys.data(), keys.size(), fetch_from, with_hashes ? hash_from : nullptr,
                          &st);
  std::map<uint32_t, uint32_t> m;
  for (const auto& k : keys) m[k.id] = k.canonical;
  return m;
}

inline std::vector<uint64_t> frames_of(const mi::track::StackTable& st, uint32_t id) {
  uint64_t out[256];
  const unsigned n = st.get(id, out, 256);
  return std::vector<uint64_t>(out, out + n);
}

// Holds one writer between claiming its slot and publishing it.
struct Parking {
  std::mutex m;
  std::condition_variable cv;
  bool parked = false, released = false;
  static void hook(void* ctx) {
    auto* p = static_cast<Parking*>(ctx);
    std::unique_lock<std::mutex> lock(p->m);
    p->parked = true;
    p->cv.notify_all();
    p->cv.wait(lock, [p] { return p->released; });
  }
  void wait_parked() {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [this] { return parked; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(m);
    released = true;
    cv.notify_all();
  }
};

}  // namespace mi::test

#endif
