// Catch2 tests for the interposer's executable glob (preload/glob.cpp), the
// one preload/ file linked into the Catch2 binary.
#include "catch.h"

#include "../preload/glob.h"

TEST_CASE("glob_match", "[preload][glob]") {
  using mi::preload::glob_match;
  CHECK(glob_match("beam*", "beam.smp"));
  CHECK(glob_match("beam*", "beam"));
  CHECK_FALSE(glob_match("beam*", "erlexec"));
  CHECK(glob_match("*", "anything"));
  CHECK(glob_match("*", ""));
  CHECK(glob_match("b?am.smp", "beam.smp"));
  CHECK(glob_match("[bc]eam*", "ceam"));
  CHECK_FALSE(glob_match("[!b]eam*", "beam"));
  CHECK(glob_match("[a-c]*", "bash"));
  CHECK(glob_match("*.smp", "beam.smp"));
  CHECK_FALSE(glob_match("*.smp", "beam.smpx"));
  CHECK(glob_match("*a*b*c", "xxaxxbxxc"));
  CHECK(glob_match("\\*", "*"));
  CHECK_FALSE(glob_match("\\*", "x"));
  CHECK(glob_match("[", "["));
  CHECK_FALSE(glob_match("", "x"));
}
