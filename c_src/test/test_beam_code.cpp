// Catch2 tests for naming Erlang return addresses by the function header
// before them (symbolize/beam_code.h), on fake code memory laid out as the
// VM lays it out: shared stubs first, then each function's ErtsCodeInfo
// (op, breakpoint, module, function, arity) right before its code.
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>
#include "catch.h"

#include "../symbolize/beam_code.h"

using mi::symbolize::AtomBound;
using mi::symbolize::BeamCodeNamer;
using mi::symbolize::BeamMfa;

namespace {

constexpr uint64_t kBase = 0x7f1200000000ull;
constexpr uint64_t atom(uint64_t index) {
  return (index << 6) | 0x0B;
}

// Code memory at kBase: `words` 8-byte words of machine code, made up
// word by word (a large region costs no memory: allocating and freeing a
// big block here would move glibc's mmap threshold under later tests), and
// the function headers placed in it.
struct FakeCode {
  size_t words;
  std::map<size_t, uint64_t> placed;
  unsigned reads = 0;
  explicit FakeCode(size_t n) : words(n) {}
  // Machine code never looks like two atoms and an arity in a row here:
  // words whose low six bits are never 0x0B.
  uint64_t word(size_t i) const {
    if (auto it = placed.find(i); it != placed.end()) return it->second;
    uint64_t w = (i + 1) * 0x9E3779B97F4A7C15ull;
    w ^= w >> 29;
    return (w & 0x3F) == 0x0B ? w ^ 1 : w;
  }
  // A function header whose arity word is at word index `at + 4`.
  uint64_t header_at(size_t at, uint64_t m, uint64_t f, uint64_t a) {
    placed[at] = 0x9090909090909090ull;  // op: code
    placed[at + 1] = 0;                  // no breakpoint
    placed[at + 2] = atom(m);
    placed[at + 3] = atom(f);
    placed[at + 4] = a;
    return kBase + (at + 5) * 8;  // the function's first instruction
  }
  static bool read(void* ctx, uint64_t address, void* out, size_t len) {
    auto* c = static_cast<FakeCode*>(ctx);
    ++c->reads;
    if (address < kBase || (address & 7) != 0 || (len & 7) != 0 ||
        address + len > kBase + c->words * 8)
      return false;
    auto* w = static_cast<uint64_t*>(out);
    for (size_t i = 0; i < len / 8; ++i) w[i] = c->word((address - kBase) / 8 + i);
    return true;
  }
};

bool same(const std::optional<BeamMfa>& got, uint64_t m, uint64_t f, uint64_t a) {
  return got && got->module == atom(m) && got->function == atom(f) && got->arity == a;
}

}  // namespace

TEST_CASE("beam code: a return address is named by the nearest function header before it",
          "[symbolize][beam_code]") {
  FakeCode code(8192);
  const uint64_t f1 = code.header_at(200, 10, 11, 2);   // stubs below word 200
  const uint64_t f2 = code.header_at(3000, 10, 12, 0);  // a long first function
  const uint64_t f3 = code.header_at(3100, 20, 21, 5);
  BeamCodeNamer namer(FakeCode::read, &code);
  const AtomBound atoms{1000};
  CHECK(same(namer.name(f1 + 3, kBase, atoms), 10, 11, 2));
  CHECK(same(namer.name(f1 + 20000, kBase, atoms), 10, 11, 2));  // thousands of words back
  CHECK(same(namer.name(f2, kBase, atoms), 10, 12, 0));          // the first instruction
  CHECK(same(namer.name(f2 + 7, kBase, atoms), 10, 12, 0));
  CHECK(same(namer.name(f3 + 100, kBase, atoms), 20, 21, 5));
  // In the stubs: no header before it in the mapping.
  CHECK_FALSE(namer.name(kBase + 100 * 8 + 3, kBase, atoms));
  // Atoms the VM does not have are not atoms.
  CHECK_FALSE(namer.name(f1 + 16, kBase, AtomBound{11}));
  // Outside the mapping floor, nothing is read.
  CHECK_FALSE(namer.name(kBase - 64, kBase, atoms));
}

TEST_CASE("beam code: a header across two read chunks is found", "[symbolize][beam_code]") {
  // Reads go backwards in chunks of 512 words from the address: put the
  // header's words on both sides of each boundary near it.
  for (size_t shift = 0; shift < 6; ++shift) {
    FakeCode code(4096);
    const size_t cp_word = 3000;
    const size_t at = cp_word - 512 - shift;  // header words straddle 3000 - 512
    code.header_at(at, 30, 31, 3);
    BeamCodeNamer namer(FakeCode::read, &code);
    INFO("shift " << shift);
    CHECK(same(namer.name(kBase + cp_word * 8 + 4, kBase, AtomBound{100}), 30, 31, 3));
  }
}

TEST_CASE("beam code: unreadable memory ends the search, never faults", "[symbolize][beam_code]") {
  FakeCode code(1024);
  BeamCodeNamer namer(FakeCode::read, &code);
  // The floor claims more memory than there is: the first failed read stops.
  CHECK_FALSE(namer.name(kBase + 512 * 8, kBase - (1 << 20), AtomBound{100}));
  // A real process_vm_readv on an address nothing maps fails cleanly.
  uint64_t out = 0;
  CHECK_FALSE(mi::symbolize::read_own_memory(nullptr, 8, &out, sizeof out));
  const uint64_t here = 0x1122334455667788ull;
  CHECK(
      mi::symbolize::read_own_memory(nullptr, reinterpret_cast<uint64_t>(&here), &out, sizeof out));
  CHECK(out == here);
}

TEST_CASE("beam code: the scan is bounded", "[symbolize][beam_code]") {
  const size_t words = (BeamCodeNamer::kMaxScan / 8) + 4096;
  FakeCode code(words);
  code.header_at(0, 40, 41, 1);  // farther back than kMaxScan from the end
  BeamCodeNamer namer(FakeCode::read, &code);
  CHECK_FALSE(namer.name(kBase + (words - 1) * 8, kBase, AtomBound{100}));
  CHECK(code.reads <= BeamCodeNamer::kMaxScan / (512 * 8) + 2);
}
