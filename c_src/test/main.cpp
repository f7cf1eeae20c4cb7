// The one Catch2 main for every C++ unit test in c_src/test/.
#define MALLOCINFO_CATCH_MAIN
#include "catch.h"
