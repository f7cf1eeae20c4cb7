// Catch2 for every C++ test: version 2 (Debian 12: one header) or 3
// (Debian 13 on: a header per part and a static library, -lCatch2, which
// the Makefile links when it finds version 3's headers). The one file that
// defines MALLOCINFO_CATCH_MAIN before including it gets main().
#ifndef MALLOCINFO_TEST_CATCH_H
#define MALLOCINFO_TEST_CATCH_H

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_message.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
using Catch::Approx;
#ifdef MALLOCINFO_CATCH_MAIN
#include <catch2/catch_session.hpp>
int main(int argc, char* argv[]) {
  return Catch::Session().run(argc, argv);
}
#endif
#else
#ifdef MALLOCINFO_CATCH_MAIN
#define CATCH_CONFIG_MAIN
#endif
#include <catch2/catch.hpp>
#endif

#endif
