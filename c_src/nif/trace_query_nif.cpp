// The tracker's query NIFs (mallocinfo_trace): olds, sites, profile,
// pprof, snapshot and now, each one pass over the live table through the
// ABI, grouped by sites/site_group. Contracts in trace_query_nif.h.
#include "trace_query_nif.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "../common/mi_abi.h"
#include "../common/mi_context.h"
#include "../sites/abi_read.h"
#include "../sites/churn_group.h"
#include "../sites/oldest.h"
#include "../sites/site_group.h"
#include "atoms.h"
#include "mixed_stack.h"
#include "stack_terms.h"
#include "term.h"
#include "tracker_abi.h"

namespace mi::nif {

using mi::sites::age_ms;
using mi::sites::ChurnSite;
using mi::sites::group_by_site;
using mi::sites::group_by_site_and_process;
using mi::sites::group_churn;
using mi::sites::join_sites;
using mi::sites::kMaxFrames;
using mi::sites::larger_site;
using mi::sites::Oldest;
using mi::sites::ProfileSite;
using mi::sites::rounded;
using mi::sites::Site;
using mi::sites::stack_frames;
using mi::sites::stream_snapshot;

namespace {

// Stack `id`'s raw return addresses packed as native 64-bit words.
ERL_NIF_TERM packed_frames(ErlNifEnv* env, const mi_preload_abi* abi, uint32_t id) {
  uint64_t pcs[kMaxFrames];
  const uint32_t depth = stack_frames(abi, id, pcs);
  ERL_NIF_TERM frames;
  unsigned char* bytes = enif_make_new_binary(env, depth * sizeof(uint64_t), &frames);
  if (depth != 0) std::memcpy(bytes, pcs, depth * sizeof(uint64_t));
  return frames;
}

// {ok, [Map]} for the first k of `items`, their stacks (stack_of(Item))
// symbolized in one batch (StackTerms): each map has the item's mixed
// stack (`stack'), its Erlang functions (`erlang'), the allocating
// thread's name (`thread', only for another thread's stack), and what
// encode(Item, MapBuilder&) puts. The shape of every query that answers
// symbolized stacks.
template <class Item, class StackOf, class Encode>
ERL_NIF_TERM symbolized_list(ErlNifEnv* env, const mi_preload_abi* abi, bool demangle,
                             const std::vector<Item>& items, size_t k, StackOf stack_of,
                             Encode encode) {
  StackTerms stacks(abi, demangle);
  for (size_t i = 0; i < k; ++i) stacks.want(stack_of(items[i]));
  stacks.resolve(env);
  std::vector<ERL_NIF_TERM> out;
  out.reserve(k);
  for (size_t i = 0; i < k; ++i) {
    const uint32_t id = stack_of(items[i]);
    MapBuilder row;
    row.put(atoms.stack, stacks.term(id)).put(atoms.erlang, stacks.erlang(id));
    if (!stacks.thread(id).empty()) row.put(atoms.thread, make_binary(env, stacks.thread(id)));
    encode(items[i], row);
    out.push_back(row.build(env));
  }
  return enif_make_tuple2(env, atoms.ok,
                          enif_make_list_from_array(env, out.data(), static_cast<unsigned>(k)));
}

}  // namespace

// olds(N, MinAgeMs, MinSize, Demangle, MaxAgeMs): the N oldest live blocks
// no older than MaxAgeMs (the report leaves out the node's start-up).
ERL_NIF_TERM trace_olds(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const uint64_t n = get_u64(env, argv[0]);
  const uint64_t min_age = get_u64(env, argv[1]);
  const uint64_t min_size = get_u64(env, argv[2]);
  const bool demangle = enif_is_identical(argv[3], atoms.true_);
  const uint64_t max_age = get_u64(env, argv[4]);
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status& status) {
    return with_stable_ids(env, abi, status, [&](const mi_abi_status&) {
      const uint64_t now = abi->now_ns();
      Oldest olds = Oldest::by_age(n, now, min_age, max_age, min_size);
      stream_snapshot(abi, [&](const mi_abi_entry* e, size_t count) {
        for (size_t i = 0; i < count; ++i) olds.offer(e[i]);
      });
      const std::vector<mi_abi_entry> entries = olds.take();
      return symbolized_list(
          env, abi, demangle, entries, entries.size(),
          [](const mi_abi_entry& e) { return e.stack_id; },
          [&](const mi_abi_entry& e, MapBuilder& row) {
            row.put(atoms.address, make_u64(env, e.address))
                .put(atoms.size, make_u64(env, e.size))
                .put(atoms.age_ms, make_u64(env, age_ms(now, e.timestamp_ns)))
                .put(atoms.estimated, make_bool((e.flags & MI_ENTRY_SAMPLED) != 0));
          });
    });
  });
}

// sites(N, Demangle): live blocks grouped by call site, the N largest by
// bytes. Only those N stacks are symbolized, in one batch.
ERL_NIF_TERM trace_sites(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const uint64_t n = get_u64(env, argv[0]);
  const bool demangle = enif_is_identical(argv[1], atoms.true_);
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status& status) {
    return with_stable_ids(env, abi, status, [&](const mi_abi_status& st) {
      const uint64_t now = abi->now_ns();
      std::vector<Site> sites = group_by_site(abi, st);
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, sites.size()));
      std::partial_sort(sites.begin(), sites.begin() + static_cast<ptrdiff_t>(k), sites.end(),
                        larger_site);
      return symbolized_list(
          env, abi, demangle, sites, k, [](const Site& s) { return s.stack; },
          [&](const Site& s, MapBuilder& row) {
            row.put(atoms.count, make_u64(env, rounded(s.count)))
                .put(atoms.bytes, make_u64(env, rounded(s.bytes)))
                .put(atoms.oldest_age_ms, make_u64(env, age_ms(now, s.oldest)))
                .put(atoms.estimated, make_bool(s.estimated));
          });
    });
  });
}

// profile(): every site as {Count, Bytes, [ReturnAddress]}, largest first,
// with raw addresses and no symbols: the heap profile text carries them,
// and pprof/jeprof symbolize them from the mapped objects themselves.
// Blocks recorded without a stack (or with one freed since) have no frames
// to show and are left out.
ERL_NIF_TERM trace_profile(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status& status) {
    return with_stable_ids(env, abi, status, [&](const mi_abi_status& st) {
      std::vector<Site> sites = group_by_site(abi, st);
      std::sort(sites.begin(), sites.end(), larger_site);
      std::vector<ERL_NIF_TERM> out;
      out.reserve(sites.size());
      std::vector<ERL_NIF_TERM> frames;
      for (const Site& s : sites) {
        uint64_t pcs[kMaxFrames];
        mi_context ctx;
        // The heap profile's text holds return addresses only.
        const uint32_t depth = mi_context_split(pcs, stack_frames(abi, s.stack, pcs), &ctx);
        if (depth == 0) continue;
        frames.clear();
        for (uint32_t i = 0; i < depth; ++i) frames.push_back(make_u64(env, pcs[i]));
        out.push_back(enif_make_tuple3(env, make_u64(env, rounded(s.count)),
                                       make_u64(env, rounded(s.bytes)),
                                       enif_make_list_from_array(env, frames.data(), depth)));
      }
      return enif_make_tuple2(env, atoms.ok,
                              enif_make_list_from_array(env, out.data(), out.size()));
    });
  });
}

// pprof(Demangle, SinceNs): every site (blocks allocated at or after
// SinceNs only, 0 for all) with its stack as indices into one table of
// distinct return addresses, each symbolized once, in one batch. 30K sites
// share a few tens of thousands of addresses: the Erlang side turns this
// into a profile.proto without formatting a single address itself. With
// SinceNs 0 and an interposer that keeps churn, every site that allocated
// since start or reset, with its churn's alloc figures beside its live
// ones; otherwise the alloc figures are the live ones: {InuseCount,
// InuseBytes, AllocCount, AllocBytes, Stack}. With the Erlang context on,
// a site's live blocks are split by the process that allocated them, and
// each row ends with that Pid (a pprof label) or undefined (the row of no
// process, which also carries the stack's churn: join_sites).
ERL_NIF_TERM trace_pprof(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const bool demangle = enif_is_identical(argv[0], atoms.true_);
  const uint64_t since = get_u64(env, argv[1]);
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status& status) {
    return with_stable_ids(env, abi, status, [&](const mi_abi_status& st) {
      const uint64_t now = abi->now_ns();
      const bool by_process = st.erlang_context != 0;
      const bool churn = since == 0 && has_churn(abi);
      std::vector<ProfileSite> sites;
      {
        const std::vector<Site> live =
            by_process ? group_by_site_and_process(abi, st, since) : group_by_site(abi, st, since);
        const std::vector<ChurnSite> churned = churn ? group_churn(abi) : std::vector<ChurnSite>{};
        sites = join_sites(live, churned, mi::sites::abi_fetch_stack,
                           mi::sites::abi_stack_hasher(abi), const_cast<mi_preload_abi*>(abi));
      }
      std::sort(sites.begin(), sites.end(), [](const ProfileSite& a, const ProfileSite& b) {
        if (a.inuse_bytes != b.inuse_bytes) return a.inuse_bytes > b.inuse_bytes;
        if (a.alloc_bytes != b.alloc_bytes) return a.alloc_bytes > b.alloc_bytes;
        return a.stack != b.stack ? a.stack < b.stack : a.pid < b.pid;
      });
      // Each distinct stack once (a stack's sites are its processes').
      MixedStacks stacks;
      stacks.set_native_limit(st.stack_depth);
      std::unordered_map<uint32_t, uint32_t> stack_at;  // stack id -> index in stacks
      std::vector<uint32_t> site_stack(sites.size());
      for (size_t i = 0; i < sites.size(); ++i) {
        auto [it, fresh] =
            stack_at.try_emplace(sites[i].stack, static_cast<uint32_t>(stack_at.size()));
        if (fresh) {
          uint64_t words[kMaxFrames];
          stacks.add(words, stack_frames(abi, sites[i].stack, words));
        }
        site_stack[i] = it->second;
      }
      stacks.resolve(env, demangle);
      // One location per distinct frame: by address, or by name for the
      // frames that have none (the running Erlang function, a thread).
      std::unordered_map<uint64_t, uint32_t> by_address;  // -> 1-based location id
      std::unordered_map<std::string, uint32_t> by_name;
      std::unordered_map<std::string, ERL_NIF_TERM> objects;  // one binary per object
      std::vector<ERL_NIF_TERM> locs;
      std::vector<uint32_t> ids;  // every stack's location ids, one after the other
      std::vector<uint32_t> depths(stacks.size()), starts(stacks.size());
      for (size_t i = 0; i < stacks.size(); ++i) {
        depths[i] = static_cast<uint32_t>(stacks.frames(i).size());
        starts[i] = static_cast<uint32_t>(ids.size());
        for (const mi::symbolize::Frame& f : stacks.frames(i)) {
          const uint32_t next_id = static_cast<uint32_t>(locs.size() + 1);
          const bool fresh =
              f.address != 0
                  ? by_address.try_emplace(f.address, next_id).second
                  : by_name.try_emplace(f.object + '\0' + f.symbol.value_or(""), next_id).second;
          if (fresh) {
            auto [obj, new_obj] = objects.try_emplace(f.object, 0);
            if (new_obj) obj->second = make_binary(env, f.object);
            locs.push_back(
                enif_make_tuple4(env, make_u64(env, f.address), obj->second,
                                 f.symbol ? make_binary(env, *f.symbol) : atoms.undefined,
                                 make_u64(env, f.object_offset)));
          }
          ids.push_back(f.address != 0 ? by_address.at(f.address)
                                       : by_name.at(f.object + '\0' + f.symbol.value_or("")));
        }
      }
      std::vector<ERL_NIF_TERM> out;
      out.reserve(sites.size());
      std::vector<ERL_NIF_TERM> stack_terms(stacks.size());
      std::vector<ERL_NIF_TERM> stack;
      for (size_t i = 0; i < stacks.size(); ++i) {
        stack.clear();
        for (uint32_t f = 0; f < depths[i]; ++f)
          stack.push_back(enif_make_uint(env, ids[starts[i] + f]));
        stack_terms[i] = enif_make_list_from_array(env, stack.data(), depths[i]);
      }
      for (size_t i = 0; i < sites.size(); ++i) {
        const ERL_NIF_TERM frames = stack_terms[site_stack[i]];
        // A pid word is handed to the VM only when it is tagged as one.
        const auto pid = static_cast<ERL_NIF_TERM>(sites[i].pid);
        const bool is_pid = (sites[i].pid & 0xF) == 0x3 && enif_is_pid(env, pid);
        const ERL_NIF_TERM values[] = {make_u64(env, rounded(sites[i].inuse_count)),
                                       make_u64(env, rounded(sites[i].inuse_bytes)),
                                       make_u64(env, rounded(sites[i].alloc_count)),
                                       make_u64(env, rounded(sites[i].alloc_bytes)),
                                       frames,
                                       is_pid ? pid : atoms.undefined};
        out.push_back(enif_make_tuple_from_array(env, values, by_process ? 6 : 5));
      }
      return enif_make_tuple2(
          env, atoms.ok,
          MapBuilder()
              .put(atoms.mode, mode_atom(st.mode))
              .put(atoms.sample_bytes, make_u64(env, st.sample_bytes))
              .put(atoms.now_ns, make_u64(env, now))
              .put(atoms.churn, make_bool(churn))
              .put(atoms.sites, enif_make_list_from_array(env, out.data(), out.size()))
              .put(atoms.locations, enif_make_list_from_array(env, locs.data(), locs.size()))
              .build(env));
    });
  });
}

// churn(): every call site's churn since start or reset, unordered, stacks
// packed as snapshot/2's: the Erlang side sorts, picks and symbolizes
// (mallocinfo_trace:churn/2).
ERL_NIF_TERM trace_churn(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status& status) {
    if (!has_churn(abi)) return error_tuple(env, atoms.enotsup);
    return with_stable_ids(env, abi, status, [&](const mi_abi_status& st) {
      const std::vector<ChurnSite> sites = group_churn(abi);
      std::vector<ERL_NIF_TERM> out;
      out.reserve(sites.size());
      for (const ChurnSite& s : sites) {
        ERL_NIF_TERM buckets[MI_LIFETIME_BUCKETS];
        for (unsigned b = 0; b < MI_LIFETIME_BUCKETS; ++b)
          buckets[b] = make_u64(env, s.lifetimes[b]);
        const ERL_NIF_TERM fields[] = {
            make_u64(env, s.allocated_count),
            make_u64(env, s.allocated_bytes),
            make_u64(env, s.freed_count),
            make_u64(env, s.freed_bytes),
            make_u64(env, s.temporary_count),
            enif_make_tuple_from_array(env, buckets, MI_LIFETIME_BUCKETS),
            make_bool(s.estimated),
            packed_frames(env, abi, s.stack)};
        out.push_back(enif_make_tuple_from_array(env, fields, 8));
      }
      const uint64_t now = abi->now_ns();
      const uint64_t elapsed_ms = age_ms(now, st.churn_since_ns);
      return enif_make_tuple4(env, atoms.ok, mode_atom(st.mode), make_u64(env, elapsed_ms),
                              enif_make_list_from_array(env, out.data(), out.size()));
    });
  });
}

// now(): {ok, NowNs}, the tracker's clock (block timestamps use it).
ERL_NIF_TERM trace_now(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status&) {
    return enif_make_tuple2(env, atoms.ok, make_u64(env, abi->now_ns()));
  });
}

// snapshot(): {ok, {Mode, NowNs, [{Count, Bytes, Estimated, Frames}]}},
// every live site (the blocks without a stored stack too, Frames = <<>>),
// unsorted. Frames packs the raw return addresses as native 64-bit words in
// one binary: a snapshot of thousands of sites stays a few flat binaries
// (cheap to keep, compare and send), and the Erlang side symbolizes only the
// stacks it returns. NowNs is the tracker's clock (the blocks' timestamps).
ERL_NIF_TERM trace_snapshot(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const uint64_t olds_n = get_u64(env, argv[0]);
  const uint64_t max_age = get_u64(env, argv[1]);
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status& status) {
    return with_stable_ids(env, abi, status, [&](const mi_abi_status& st) {
      const uint64_t now = abi->now_ns();
      Oldest olds = Oldest::by_age(olds_n, now, 0, max_age, 0);
      const std::vector<Site> sites = group_by_site(abi, st, 0, &olds);
      std::vector<ERL_NIF_TERM> out;
      out.reserve(sites.size());
      for (const Site& s : sites)
        out.push_back(enif_make_tuple4(env, make_u64(env, rounded(s.count)),
                                       make_u64(env, rounded(s.bytes)), make_bool(s.estimated),
                                       packed_frames(env, abi, s.stack)));
      std::vector<ERL_NIF_TERM> old_terms;
      for (const mi_abi_entry& e : olds.take())
        old_terms.push_back(enif_make_tuple5(env, make_u64(env, e.address), make_u64(env, e.size),
                                             make_u64(env, age_ms(now, e.timestamp_ns)),
                                             make_bool((e.flags & MI_ENTRY_SAMPLED) != 0),
                                             packed_frames(env, abi, e.stack_id)));
      return enif_make_tuple2(
          env, atoms.ok,
          enif_make_tuple4(env, mode_atom(st.mode), make_u64(env, now),
                           enif_make_list_from_array(env, out.data(), out.size()),
                           enif_make_list_from_array(env, old_terms.data(), old_terms.size())));
    });
  });
}

}  // namespace mi::nif
