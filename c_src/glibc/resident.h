// Resident bytes of address ranges (mallocinfo_trace:mappings/1's
// `resident`), with work that does not grow with reserved address space.
//
// The kernel keeps each mapping's resident bytes (Rss in /proc/self/smaps)
// and computes it walking only the page tables that exist, so a 32 TiB
// PROT_NONE reservation costs it nothing. mincore(2), in contrast, writes
// one byte per page of whatever it is asked about. So the kernel's figure
// is read first, and mincore runs only where it must: on the part of a
// mapping that a range covers when the mapping is shared with other ranges
// or with memory no range covers (the kernel merges adjacent mappings of
// the same kind into one), and only when that mapping has resident pages
// at all and not all of them. Those pages are bounded per call
// (kProbeBudgetPages); past the budget a mapping's Rss is shared out among
// the ranges on it in proportion to how much of it each covers, an
// estimate.
//
// No erl_nif here: linked into the NIF and the Catch2 binary. Thread-safe
// (no shared state). Allocates (std::vector, std::string); may throw only
// std::bad_alloc. Not for malloc hooks.
#ifndef MALLOCINFO_GLIBC_RESIDENT_H
#define MALLOCINFO_GLIBC_RESIDENT_H

#include <cstdint>
#include <string_view>
#include <vector>

namespace mi::mem {

// One mapping of /proc/self/smaps: [start, end) and its Rss in bytes.
struct Vma {
  uint64_t start = 0;
  uint64_t end = 0;
  uint64_t rss = 0;
};

// The mappings of smaps-formatted text, in the text's order (the kernel's:
// by address). Lines that do not parse are skipped; a mapping without an
// Rss line has rss 0.
std::vector<Vma> parse_smaps(std::string_view text);

// This process's mappings. False (and `out` empty) when /proc/self/smaps
// cannot be read.
bool read_self_smaps(std::vector<Vma>& out);

// An address range [start, start + length).
struct Range {
  uint64_t start = 0;
  uint64_t length = 0;
};

// Counts the resident bytes of [start, start + length) (page-aligned).
using Probe = uint64_t (*)(uint64_t start, uint64_t length, void* ctx);

// mincore(2) over the range in bounded chunks; a chunk the kernel refuses
// (unmapped meanwhile) counts as not resident. `ctx` unused.
uint64_t probe_mincore(uint64_t start, uint64_t length, void* ctx);

// At most this many pages are probed per resident_of() call (16 GiB of
// 4 KiB pages, a few milliseconds of mincore).
constexpr uint64_t kProbeBudgetPages = uint64_t{1} << 22;

// The resident bytes of each range, in the order given, from `vmas`
// (sorted by start, not overlapping: parse_smaps' order) as the header
// says: a mapping with no resident page adds nothing, a mapping inside one
// range adds its Rss, a fully resident one adds the overlap, any other
// overlap is probed (smallest first) while `budget_pages` lasts, then
// estimated. Ranges may come in any order and should not overlap (each is
// counted on its own). `page` is the page size.
std::vector<uint64_t> resident_of(const std::vector<Range>& ranges, const std::vector<Vma>& vmas,
                                  uint64_t page, Probe probe, void* ctx,
                                  uint64_t budget_pages = kProbeBudgetPages);

}  // namespace mi::mem

#endif
