// Catch2 tests for the readers' merging of stack ids by content
// (sites/stack_merge) over a real stack table; the grouping built on it is
// test_site_group.cpp's.
#include "catch.h"

#include <cstdint>

#include "../track/stack_table.h"
#include "track_fixture.h"

using namespace mi::track;
using namespace mi::test;

TEST_CASE("stack merge: same frames one canonical id, unknown stacks 0", "[track][stacks]") {
  StackTable st;
  REQUIRE(st.init(1024, 8));
  const uintptr_t a[] = {1, 2, 3}, b[] = {1, 2, 4};
  const uint32_t ia = st.intern(a, 3), ib = st.intern(b, 3);
  // A stale id (never stored) and the no-stack id 0.
  const uint32_t bogus = (uint32_t{5} << st.slot_bits()) | 3;
  for (const bool table_hashes : {true, false}) {
    const auto canon = canonical_ids(st, {ia, ib, bogus, 0}, table_hashes);
    CHECK(canon.at(ia) == ia);
    CHECK(canon.at(ib) == ib);
    CHECK(canon.at(bogus) == 0);
    CHECK(canon.at(0) == 0);
  }
  CHECK(st.hash_of(ia) != 0);
  CHECK(st.hash_of(ia) != st.hash_of(ib));
  CHECK(st.hash_of(bogus) == 0);
  CHECK(st.hash_of(0) == 0);
  st.destroy();
}
