#include "heap_nif.h"

#include <string>
#include <vector>

#include "../heapwalk/dump_format.h"
#include "../heapwalk/heapwalk.h"
#include "glibc_nif.h"
#include "stack_terms.h"
#include "term.h"
#include "tracker_abi.h"

namespace mi::nif {

namespace {

namespace hw = mi::heapwalk;
namespace hd = mi::heapdump;

ERL_NIF_TERM arena_term(ErlNifEnv* env, const hw::ArenaSummary& a, bool tracker) {
  const uint64_t* k = a.by_kind;
  const uint64_t free_bytes = k[hd::kFree] + k[hd::kFast] + k[hd::kTop];
  MapBuilder m;
  m.put(atoms.arena, make_u64(env, a.index))
      .put(atoms.address, make_u64(env, a.address))
      .put(atoms.system_bytes, make_u64(env, a.system_bytes))
      .put(atoms.in_use_bytes, make_u64(env, a.system_bytes - free_bytes))
      .put(atoms.free_bytes, make_u64(env, free_bytes))
      .put(atoms.by_kind, MapBuilder()
                              .put(atoms.in_use, make_u64(env, k[hd::kInUse]))
                              .put(atoms.free, make_u64(env, k[hd::kFree]))
                              .put(atoms.fast, make_u64(env, k[hd::kFast]))
                              .put(atoms.tcache, make_u64(env, k[hd::kTcache]))
                              .put(atoms.top, make_u64(env, k[hd::kTop]))
                              .put(atoms.meta, make_u64(env, k[hd::kMeta]))
                              .build(env))
      .put(atoms.chunks, make_u64(env, a.chunks))
      .put(atoms.free_chunks, make_u64(env, a.free_chunks))
      .put(atoms.largest_free, make_u64(env, a.largest_free))
      .put(atoms.resident_bytes, make_u64(env, a.resident_bytes))
      .put(atoms.trimmable_bytes, make_u64(env, a.trimmable_bytes))
      .put(atoms.pinned_bytes, make_u64(env, a.pinned_bytes))
      .put(atoms.segments, make_u64(env, a.segments));
  if (tracker) {
    m.put(atoms.live_bytes, make_u64(env, a.live_bytes))
        .put(atoms.live_chunks, make_u64(env, a.live_chunks))
        .put(atoms.unrecorded_bytes, make_u64(env, a.unrecorded_bytes));
  }
  return m.build(env);
}

// A site's label: its innermost frames that have a symbol, outside the
// interposer, joined by " < " (callee < caller). Runs after the child.
std::string site_label(const std::vector<uint64_t>& frames) {
  std::string out;
  int named = 0;
  std::string first_unnamed;
  for (const auto& f : symbolizer().resolve_all(frames, true)) {
    if (f.object.find("libmallocinfo_preload") != std::string::npos) continue;
    if (!f.symbol) {
      if (first_unnamed.empty()) {
        const size_t slash = f.object.rfind('/');
        first_unnamed = (slash == std::string::npos ? f.object : f.object.substr(slash + 1)) + "+" +
                        std::to_string(f.object_offset);
      }
      continue;
    }
    if (!out.empty()) out += " < ";
    out += *f.symbol;
    if (++named == 3) break;
  }
  return out.empty() ? first_unnamed : out;
}

ERL_NIF_TERM failure_term(ErlNifEnv* env, const hw::DumpStatus& st) {
  switch (st.failure) {
    case hw::Failure::os_error:
      return errno_error(env, st.err);
    case hw::Failure::timeout:
      return error_tuple(env, atoms.timeout);
    case hw::Failure::unsupported_glibc:
      return error_tuple(env, enif_make_tuple2(env, atoms.unsupported_glibc,
                                               make_binary(env, mi::glibc::libc_version())));
    case hw::Failure::walk_failed:
    case hw::Failure::none:
      break;
  }
  // Details come from a closed set of string literals in heapwalk.cpp, so
  // the atom table cannot grow without bound.
  return error_tuple(
      env, enif_make_tuple2(env, atoms.walk_failed, enif_make_atom(env, st.detail.c_str())));
}

}  // namespace

ERL_NIF_TERM heap_dump(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  ErlNifBinary bin;
  if (!enif_inspect_binary(env, argv[0], &bin)) throw BadArg{};
  const std::string path = bin.size == 0 ? std::string() : get_path(env, argv[0]);
  hw::DumpOptions opt;
  const uint64_t max_sites = get_u64(env, argv[1]);
  if (max_sites > hd::kSiteOther - 1) throw BadArg{};
  opt.max_sites = static_cast<uint32_t>(max_sites);
  opt.timeout_ms = get_int(env, argv[2]);
  if (opt.timeout_ms <= 0) throw BadArg{};
  opt.want_info_xml = get_atom(env, argv[3]) == "true";
  opt.tracker = recording_tracker();

  hw::DumpResult r;
  std::vector<std::string> labels;  // in r.sites order, made once for file and term
  const hw::DumpStatus st = hw::dump(
      path, opt,
      [&](const std::vector<uint64_t>& frames) {
        labels.push_back(site_label(frames));
        return labels.back();
      },
      r);
  if (st.failure != hw::Failure::none) return failure_term(env, st);

  std::vector<ERL_NIF_TERM> arenas;
  for (const auto& a : r.arenas) arenas.push_back(arena_term(env, a, r.tracker));
  std::vector<ERL_NIF_TERM> sites;
  for (size_t i = 0; i < r.sites.size(); ++i) {
    const hw::Site& s = r.sites[i];
    sites.push_back(MapBuilder()
                        .put(atoms.id, make_u64(env, s.id))
                        .put(atoms.live_bytes, make_u64(env, s.live_bytes))
                        .put(atoms.count, make_u64(env, s.live_blocks))
                        .put(atoms.label,
                             make_binary(env, i < labels.size() ? labels[i] : site_label(s.frames)))
                        .build(env));
  }
  MapBuilder m;
  m.put(atoms.arenas, enif_make_list_from_array(env, arenas.data(), arenas.size()))
      .put(atoms.chunks, make_u64(env, r.chunks))
      .put(atoms.segments, make_u64(env, r.segments))
      // glibc knows how many blocks it mmapped, not where: mmap_* are its own
      // counts (mallinfo2 of the same snapshot), tracked_mmap_* the blocks the
      // walker found through the tracker (mmap.png), a subset.
      .put(atoms.mmap_chunks, make_u64(env, r.mallinfo.hblks))
      .put(atoms.mmap_bytes, make_u64(env, r.mallinfo.hblkhd))
      .put(atoms.tracked_mmap_chunks, make_u64(env, r.mmap_chunks))
      .put(atoms.tracked_mmap_bytes, make_u64(env, r.mmap_bytes))
      .put(atoms.file_bytes, make_u64(env, r.file_bytes))
      .put(atoms.tracker, make_bool(r.tracker))
      .put(atoms.mallinfo, mallinfo_term(env, r.mallinfo))
      .put(atoms.walk_ms, make_u64(env, r.walk_ns / 1000000))
      .put(atoms.fork_us, make_u64(env, r.fork_ns / 1000))
      .put(atoms.sites, enif_make_list_from_array(env, sites.data(), sites.size()));
  if (opt.want_info_xml) m.put(atoms.info_xml, make_binary(env, r.info_xml));
  return enif_make_tuple2(env, atoms.ok, m.build(env));
}

}  // namespace mi::nif
