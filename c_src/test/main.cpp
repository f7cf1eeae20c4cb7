// The one Catch2 main for every C++ unit test in c_src/test/.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
