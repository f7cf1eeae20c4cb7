// The tracker's regions NIF (mallocinfo_trace:mappings/1,2): the live
// mappings the interposer recorded from the mmap family, with resident
// bytes and symbolized stacks. Contract in trace_regions_nif.h.
#include "trace_regions_nif.h"

#include <unistd.h>

#include <algorithm>
#include <vector>

#include "../common/mi_abi.h"
#include "../glibc/resident.h"
#include "../sites/abi_read.h"
#include "atoms.h"
#include "stack_terms.h"
#include "term.h"
#include "tracker_abi.h"

namespace mi::nif {

namespace {

// Resident bytes of every region, in order: the kernel's Rss per mapping
// (/proc/self/smaps), mincore(2) only on the part of a mapping a region
// shares, within a budget (glibc/resident.h), so a huge reservation costs
// no more than a small one. Without smaps (no /proc), mincore on every
// region as a last resort.
std::vector<uint64_t> resident_bytes(const std::vector<mi_abi_region>& regions) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<mi::mem::Range> ranges;
  ranges.reserve(regions.size());
  for (const mi_abi_region& r : regions) ranges.push_back(mi::mem::Range{r.start, r.length});
  std::vector<mi::mem::Vma> vmas;
  if (mi::mem::read_self_smaps(vmas))
    return mi::mem::resident_of(ranges, vmas, page, mi::mem::probe_mincore, nullptr);
  std::vector<uint64_t> out;
  out.reserve(ranges.size());
  for (const mi::mem::Range& r : ranges)
    out.push_back(mi::mem::probe_mincore(r.start, r.length, nullptr));
  return out;
}

ERL_NIF_TERM region_flags(ErlNifEnv* env, uint32_t f) {
  std::vector<ERL_NIF_TERM> out;
  if (f & MI_REGION_ANONYMOUS) out.push_back(atoms.anonymous);
  if (f & MI_REGION_PRIVATE_FILE) out.push_back(atoms.private_file);
  if (f & MI_REGION_SHARED) out.push_back(atoms.shared);
  if (f & MI_REGION_NO_ACCESS) out.push_back(atoms.no_access);
  if (f & MI_REGION_REMAPPED) out.push_back(atoms.remapped);
  return enif_make_list_from_array(env, out.data(), static_cast<unsigned>(out.size()));
}

}  // namespace

ERL_NIF_TERM trace_regions(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const bool demangle = enif_is_identical(argv[0], atoms.true_);
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status&) {
    if (!has_regions(abi)) return error_tuple(env, atoms.enotsup);
    mi_abi_region_status rs{};
    abi->region_status(&rs, sizeof rs);
    std::vector<mi_abi_region> regions(rs.capacity);
    const uint64_t n = abi->regions(regions.data(), regions.size());
    regions.resize(std::min<uint64_t>(n, regions.size()));
    // One symbolizer batch for every frame of every region.
    std::vector<uint64_t> addresses;
    for (const mi_abi_region& r : regions)
      addresses.insert(addresses.end(), r.frames,
                       r.frames + std::min<uint32_t>(r.depth, MI_REGION_FRAMES));
    const std::vector<mi::symbolize::Frame> frames = symbolizer().resolve_all(addresses, demangle);
    const uint64_t now = abi->now_ns();
    const std::vector<uint64_t> resident = resident_bytes(regions);
    std::vector<ERL_NIF_TERM> out, stack;
    out.reserve(regions.size());
    size_t at = 0, index = 0;
    for (const mi_abi_region& r : regions) {
      const uint32_t depth = std::min<uint32_t>(r.depth, MI_REGION_FRAMES);
      stack.clear();
      for (uint32_t i = 0; i < depth; ++i) stack.push_back(frame_term(env, frames[at + i]));
      at += depth;
      out.push_back(MapBuilder()
                        .put(atoms.start, make_u64(env, r.start))
                        .put(atoms.length, make_u64(env, r.length))
                        .put(atoms.flags, region_flags(env, r.flags))
                        .put(atoms.resident, make_u64(env, resident[index++]))
                        .put(atoms.age_ms, make_u64(env, mi::sites::age_ms(now, r.timestamp_ns)))
                        .put(atoms.stack, enif_make_list_from_array(env, stack.data(), depth))
                        .build(env));
    }
    return enif_make_tuple2(
        env, atoms.ok,
        enif_make_list_from_array(env, out.data(), static_cast<unsigned>(out.size())));
  });
}

}  // namespace mi::nif
