// A tracker ABI (common/mi_abi.h) with canned contents, for the reader
// side's tests without the interposer: the heap map's sites, the site
// grouping. The ABI is a plain C struct of function pointers without a
// context, so they read the one FakeTracker installed by abi(): one fake
// at a time per test binary (Catch2 runs cases one after the other).
// Header-only; allocates (test code).
#ifndef MALLOCINFO_TEST_FAKE_TRACKER_H
#define MALLOCINFO_TEST_FAKE_TRACKER_H

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "../common/mi_abi.h"

namespace mi::test {

struct FakeTracker {
  // What snapshot() streams, in this order, `batch` entries a sink call
  // (0: all in one call).
  std::vector<mi_abi_entry> entries;
  size_t batch = 0;
  // Stack id -> frames, innermost first; an id not here is unknown.
  std::map<uint32_t, std::vector<uint64_t>> stacks;
  // status() (live_entries is the number of entries).
  mi_abi_status status{};
  // Whether abi() offers stack_hash (an interposer from before it has none).
  bool hashes = true;

  FakeTracker() {
    status.mode = MI_MODE_FULL;
    status.recording = 1;
  }
  // A fake is a test case's local: once it is gone nothing reads it (one
  // fake at a time, as above), and GCC 14's -Wdangling-pointer sees the
  // installed pointer cleared.
  ~FakeTracker() { current() = nullptr; }
  FakeTracker(const FakeTracker&) = delete;
  FakeTracker& operator=(const FakeTracker&) = delete;

  // The ABI reading this fake until another one's abi() is called.
  mi_preload_abi abi() {
    current() = this;
    mi_preload_abi a{};
    a.abi_version = MI_ABI_VERSION;
    a.struct_size = sizeof a;
    a.status = &FakeTracker::status_of;
    a.snapshot = &FakeTracker::snapshot_of;
    a.stack = &FakeTracker::stack_of;
    a.stack_hash = hashes ? &FakeTracker::hash_of : nullptr;
    return a;
  }

 private:
  static FakeTracker*& current() {
    static FakeTracker* fake = nullptr;
    return fake;
  }
  static void status_of(mi_abi_status* out, size_t size) {
    mi_abi_status s = current()->status;
    s.live_entries = current()->entries.size();
    std::memcpy(out, &s, std::min(size, sizeof s));
  }
  static uint64_t snapshot_of(mi_abi_sink sink, void* ctx) {
    const std::vector<mi_abi_entry>& e = current()->entries;
    const size_t step = current()->batch == 0 ? e.size() : current()->batch;
    for (size_t at = 0; at < e.size(); at += step)
      sink(ctx, e.data() + at, std::min(step, e.size() - at));
    return e.size();
  }
  static uint32_t stack_of(uint32_t id, uint64_t* frames, uint32_t max) {
    auto it = current()->stacks.find(id);
    if (it == current()->stacks.end()) return 0;
    const std::vector<uint64_t>& f = it->second;
    std::copy_n(f.begin(), std::min<size_t>(max, f.size()), frames);
    return static_cast<uint32_t>(f.size());
  }
  // Equal frames, equal hash; never 0 for a known stack. Deliberately
  // weak (the sum of the frames), so tests can make two different stacks
  // collide.
  static uint64_t hash_of(uint32_t id) {
    auto it = current()->stacks.find(id);
    if (it == current()->stacks.end() || it->second.empty()) return 0;
    uint64_t h = 1;
    for (uint64_t f : it->second) h += f;
    return h != 0 ? h : 1;
  }
};

}  // namespace mi::test

#endif
