#include "trace_context_nif.h"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <vector>

#include "../common/mi_context.h"
#include "../common/mi_sampling.h"
#include "../sites/abi_read.h"
#include "../sites/site_group.h"
#include "atoms.h"
#include "mixed_stack.h"
#include "stack_terms.h"
#include "term.h"
#include "tracker_abi.h"

namespace mi::nif {

namespace {

// What a group of live blocks adds up to.
struct Sum {
  double count = 0, bytes = 0;
  bool estimated = false;
};

void add_entry(Sum& s, const mi_abi_entry& e, uint64_t mean) {
  const mi::sampling::Weight w = mi::sites::entry_weight(e, mean);
  s.count += w.count;
  s.bytes += w.bytes;
  s.estimated = s.estimated || (e.flags & MI_ENTRY_SAMPLED) != 0;
}

void add_sum(Sum& to, const Sum& from) {
  to.count += from.count;
  to.bytes += from.bytes;
  to.estimated = to.estimated || from.estimated;
}

// The VM's tag of a local pid on a 64-bit build (0b0011 in the low four
// bits); checked before the word is handed to the VM as a term.
bool is_pid_word(uint64_t w) {
  return (w & 0xF) == 0x3;
}

template <class Key>
std::vector<std::pair<Key, Sum>> largest(std::vector<std::pair<Key, Sum>> rows, uint64_t n) {
  const size_t k = static_cast<size_t>(std::min<uint64_t>(n, rows.size()));
  std::partial_sort(rows.begin(), rows.begin() + static_cast<ptrdiff_t>(k), rows.end(),
                    [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
  rows.resize(k);
  return rows;
}

ERL_NIF_TERM answer(ErlNifEnv* env, std::vector<ERL_NIF_TERM>& rows, const Sum& without) {
  return enif_make_tuple3(
      env, atoms.ok,
      enif_make_list_from_array(env, rows.data(), static_cast<unsigned>(rows.size())),
      enif_make_tuple2(env, make_u64(env, mi::sites::rounded(without.count)),
                       make_u64(env, mi::sites::rounded(without.bytes))));
}

ERL_NIF_TERM row(ErlNifEnv* env, ERL_NIF_TERM key, const Sum& s) {
  return enif_make_tuple4(env, key, make_u64(env, mi::sites::rounded(s.count)),
                          make_u64(env, mi::sites::rounded(s.bytes)), make_bool(s.estimated));
}

ERL_NIF_TERM by_process(ErlNifEnv* env, const mi_preload_abi* abi, const mi_abi_status& st,
                        uint64_t n) {
  std::unordered_map<uint64_t, Sum> pids;
  Sum without;
  mi::sites::stream_snapshot(abi, [&](const mi_abi_entry* e, size_t count) {
    for (size_t i = 0; i < count; ++i)
      add_entry(e[i].pid != 0 && is_pid_word(e[i].pid) ? pids[e[i].pid] : without, e[i],
                st.sample_bytes);
  });
  std::vector<ERL_NIF_TERM> rows;
  for (const auto& [pid, sum] :
       largest(std::vector<std::pair<uint64_t, Sum>>(pids.begin(), pids.end()), n)) {
    const ERL_NIF_TERM term = static_cast<ERL_NIF_TERM>(pid);
    if (!enif_is_pid(env, term)) {
      add_sum(without, sum);
      continue;
    }
    rows.push_back(row(env, term, sum));
  }
  return answer(env, rows, without);
}

ERL_NIF_TERM by_function(ErlNifEnv* env, const mi_preload_abi* abi, const mi_abi_status& st,
                         uint64_t n) {
  // By stack first (a few thousand stacks for millions of blocks), then
  // each stack's function, read once.
  std::unordered_map<uint32_t, Sum> stacks;
  mi::sites::stream_snapshot(abi, [&](const mi_abi_entry* e, size_t count) {
    for (size_t i = 0; i < count; ++i) add_entry(stacks[e[i].stack_id], e[i], st.sample_bytes);
  });
  struct Found {
    Sum sum;
    std::vector<uint64_t> cps;  // the stack's return addresses, innermost first
    std::optional<mi::symbolize::BeamMfa> running;
  };
  std::vector<Found> found;
  std::vector<uint64_t> cps;
  Sum without;
  for (const auto& [id, sum] : stacks) {
    uint64_t words[mi::sites::kMaxFrames];
    const uint32_t depth = mi::sites::stack_frames(abi, id, words);
    mi_context ctx;
    mi_context_split(words, depth, &ctx);
    if (ctx.kind != MI_CONTEXT_PROCESS || (ctx.mfa == 0 && ctx.cps == 0)) {
      add_sum(without, sum);
      continue;
    }
    Found f{sum, {ctx.words + ctx.mfa, ctx.words + ctx.mfa + ctx.cps}, std::nullopt};
    if (ctx.mfa == 3) f.running = mi::symbolize::BeamMfa{ctx.words[0], ctx.words[1], ctx.words[2]};
    cps.insert(cps.end(), f.cps.begin(), f.cps.end());
    found.push_back(std::move(f));
  }
  std::sort(cps.begin(), cps.end());
  cps.erase(std::unique(cps.begin(), cps.end()), cps.end());
  const std::vector<std::optional<mi::symbolize::BeamMfa>> names =
      mi::symbolize::name_beam_addresses(cps, atom_bound());
  auto name_of = [&](uint64_t cp) -> const std::optional<mi::symbolize::BeamMfa>& {
    return names[static_cast<size_t>(std::lower_bound(cps.begin(), cps.end(), cp) - cps.begin())];
  };

  std::vector<std::pair<ErlangFunction, Sum>> groups;
  for (const Found& f : found) {
    ErlangFunction fn{};
    bool have = false;
    for (uint64_t cp : f.cps) {
      const std::optional<mi::symbolize::BeamMfa>& m = name_of(cp);
      if (m && checked_function(*m, &fn)) {
        have = true;
        break;
      }
    }
    if (!have && f.running) have = checked_function(*f.running, &fn);
    if (!have) {
      add_sum(without, f.sum);
      continue;
    }
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == fn; });
    if (it == groups.end())
      groups.emplace_back(fn, f.sum);
    else
      add_sum(it->second, f.sum);
  }
  std::vector<ERL_NIF_TERM> rows;
  for (const auto& [fn, sum] : largest(std::move(groups), n))
    rows.push_back(row(
        env, enif_make_tuple3(env, fn.module, fn.function, enif_make_uint(env, fn.arity)), sum));
  return answer(env, rows, without);
}

ERL_NIF_TERM by_site_process(ErlNifEnv* env, const mi_preload_abi* abi, const mi_abi_status& st,
                             uint64_t n) {
  std::vector<mi::sites::Site> parts = mi::sites::group_by_site_and_process(abi, st);
  Sum without;
  std::vector<mi::sites::Site> kept;
  for (const mi::sites::Site& s : parts) {
    if (s.pid != 0 && is_pid_word(s.pid) && s.stack != 0 &&
        enif_is_pid(env, static_cast<ERL_NIF_TERM>(s.pid)))
      kept.push_back(s);
    else
      add_sum(without, Sum{s.count, s.bytes, s.estimated});
  }
  const size_t k = static_cast<size_t>(std::min<uint64_t>(n, kept.size()));
  std::partial_sort(kept.begin(), kept.begin() + static_cast<ptrdiff_t>(k), kept.end(),
                    mi::sites::larger_site);
  for (size_t i = k; i < kept.size(); ++i)
    add_sum(without, Sum{kept[i].count, kept[i].bytes, kept[i].estimated});
  kept.resize(k);
  std::vector<ERL_NIF_TERM> rows;
  rows.reserve(k);
  std::unordered_map<uint32_t, ERL_NIF_TERM> packed;  // one binary per stack
  for (const mi::sites::Site& s : kept) {
    auto [it, fresh] = packed.try_emplace(s.stack, 0);
    if (fresh) {
      uint64_t words[mi::sites::kMaxFrames];
      const uint32_t depth = mi::sites::stack_frames(abi, s.stack, words);
      unsigned char* bytes = enif_make_new_binary(env, depth * sizeof(uint64_t), &it->second);
      if (depth != 0) __builtin_memcpy(bytes, words, depth * sizeof(uint64_t));
    }
    rows.push_back(enif_make_tuple5(env, it->second, static_cast<ERL_NIF_TERM>(s.pid),
                                    make_u64(env, mi::sites::rounded(s.count)),
                                    make_u64(env, mi::sites::rounded(s.bytes)),
                                    make_bool(s.estimated)));
  }
  return answer(env, rows, without);
}

}  // namespace

ERL_NIF_TERM trace_by_context(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const uint64_t n = get_u64(env, argv[0]);
  const bool processes = enif_is_identical(argv[1], atoms.process);
  const bool site_processes = enif_is_identical(argv[1], atoms.site_process);
  if (!processes && !site_processes && !enif_is_identical(argv[1], atoms.erlang_function))
    throw BadArg{};
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status& status) {
    return with_stable_ids(env, abi, status, [&](const mi_abi_status& st) {
      if (site_processes) return by_site_process(env, abi, st, n);
      return processes ? by_process(env, abi, st, n) : by_function(env, abi, st, n);
    });
  });
}

ERL_NIF_TERM trace_symbolize_stacks(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const bool demangle = enif_is_identical(argv[1], atoms.true_);
  MixedStacks stacks;
  if (const mi_preload_abi* abi = tracker_abi(); abi != nullptr) {
    mi_abi_status st{};
    abi->status(&st, sizeof st);
    stacks.set_native_limit(st.stack_depth);
  }
  ERL_NIF_TERM list = argv[0], head;
  while (enif_get_list_cell(env, list, &head, &list)) {
    ErlNifBinary bin;
    if (!enif_inspect_binary(env, head, &bin) || bin.size % sizeof(uint64_t) != 0) throw BadArg{};
    std::vector<uint64_t> words(bin.size / sizeof(uint64_t));
    if (!words.empty()) __builtin_memcpy(words.data(), bin.data, bin.size);
    stacks.add(words.data(), static_cast<uint32_t>(words.size()));
  }
  if (!enif_is_empty_list(env, list)) throw BadArg{};
  stacks.resolve(env, demangle);
  std::vector<ERL_NIF_TERM> out;
  out.reserve(stacks.size());
  std::vector<ERL_NIF_TERM> frames;
  for (size_t i = 0; i < stacks.size(); ++i) {
    frames.clear();
    for (const mi::symbolize::Frame& f : stacks.frames(i)) frames.push_back(frame_term(env, f));
    out.push_back(enif_make_tuple3(
        env, enif_make_list_from_array(env, frames.data(), static_cast<unsigned>(frames.size())),
        stacks.erlang_term(env, i),
        stacks.thread(i).empty() ? atoms.undefined : make_binary(env, stacks.thread(i))));
  }
  return enif_make_list_from_array(env, out.data(), static_cast<unsigned>(out.size()));
}

}  // namespace mi::nif
