// Limits shared by the interposer, the NIF and the heap walker, and the
// tracker's size knobs: one table read by the environment parser
// (preload/init.cpp), the attach NIF's checks (nif/trace_control_nif.cpp) and the
// tracker's defaults. Plain constants, no code: any link unit may include
// it. The Erlang side's copy (mallocinfo_trace:knobs/0) is checked against
// this file by test/mallocinfo_limits_tests.erl, which parses the Knob
// lines below: keep each on one line with literal numbers.
#ifndef MALLOCINFO_COMMON_MI_LIMITS_H
#define MALLOCINFO_COMMON_MI_LIMITS_H

#include <cstdint>

namespace mi::limits {

// Frames kept per recorded stack at most. Readers (sites, the heap map's
// SITE labels) size their buffers with it, so no reader cuts a stack short.
constexpr unsigned kMaxStackDepth = 128;

// A numeric knob: environment variable, attach/1 option, range, default.
struct Knob {
  const char* env;
  const char* option;
  uint64_t min, max, default_value;
  constexpr bool valid(uint64_t v) const { return v >= min && v <= max; }
};

// clang-format off
constexpr Knob kTableSize{"MALLOCINFO_TABLE_SIZE", "table_size", 64, 4294967296, 2097152};
constexpr Knob kStackTableSize{"MALLOCINFO_STACK_TABLE_SIZE", "stack_table_size", 64, 268435456, 65536};
constexpr Knob kStackDepth{"MALLOCINFO_STACK_DEPTH", "stack_depth", 1, 128, 32};
constexpr Knob kSampleBytes{"MALLOCINFO_SAMPLE_BYTES", "sample_bytes", 1, 1099511627776, 524288};
// clang-format on

static_assert(kStackDepth.max == kMaxStackDepth);
static_assert(kTableSize.max == uint64_t{1} << 32 && kStackTableSize.max == uint64_t{1} << 28 &&
              kSampleBytes.max == uint64_t{1} << 40);

}  // namespace mi::limits

#endif
