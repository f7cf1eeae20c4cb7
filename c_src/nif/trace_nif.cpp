#include "trace_nif.h"

#include <dlfcn.h>
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "../common/mi_abi.h"
#include "../common/mi_limits.h"
#include "../common/mi_sampling.h"
#include "../glibc/resident.h"
#include "../sites/abi_read.h"
#include "../sites/oldest.h"
#include "../sites/site_group.h"
#include "../sites/stack_merge.h"
#include "../symbolize/symbolize.h"
#include "quiet.h"
#include "term.h"

namespace mi::nif {

using mi::sites::age_ms;
using mi::sites::group_by_site;
using mi::sites::kMaxFrames;
using mi::sites::larger_site;
using mi::sites::Oldest;
using mi::sites::rounded;
using mi::sites::Site;
using mi::sites::stack_frames;
using mi::sites::stream_snapshot;

namespace {

// The interposer's ABI when it reached this process one of two ways:
// preloaded (its symbols are global: dlsym(RTLD_DEFAULT)), or dlopen()ed
// by attach() (RTLD_LOCAL: only its handle finds it). nullptr otherwise,
// or when its version is not one we understand. Looked up on every call
// until found: a failed lookup must not stick (attach() may come later,
// and tests load and unload the NIF freely).
const mi_preload_abi* checked(mi_preload_abi_fn fn) {
  const mi_preload_abi* abi = fn != nullptr ? fn() : nullptr;
  if (abi == nullptr || abi->abi_version != MI_ABI_VERSION ||
      abi->struct_size < sizeof(mi_preload_abi))
    return nullptr;
  return abi;
}

std::atomic<const mi_preload_abi*> g_preloaded{nullptr};
std::atomic<const mi_preload_abi*> g_attached{nullptr};

// priv/libmallocinfo_preload.so, next to this NIF.
std::string preload_path() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&checked), &info) == 0 || info.dli_fname == nullptr)
    return "libmallocinfo_preload.so";
  std::string path(info.dli_fname);
  const size_t slash = path.rfind('/');
  return (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) +
         "libmallocinfo_preload.so";
}

// The dlopen()ed interposer's ABI if it is loaded (RTLD_NOLOAD: never
// loads it), whether or not it ever attached.
const mi_preload_abi* loaded_local_abi(bool load) {
  const std::string path = preload_path();
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | (load ? 0 : RTLD_NOLOAD));
  if (h == nullptr) return nullptr;
  // The library is linked -z nodelete; the handle is never closed anyway:
  // its code may be running in a hook on another thread.
  const mi_preload_abi* abi =
      checked(reinterpret_cast<mi_preload_abi_fn>(::dlsym(h, MI_ABI_SYMBOL)));
  if (abi != nullptr && abi->struct_size < offsetof(mi_preload_abi, attach_status) + sizeof(void*))
    return nullptr;
  return abi;
}

bool ever_attached(const mi_preload_abi* abi) {
  mi_attach_status st{};
  abi->attach_status(&st, sizeof st);
  return st.ever != 0;
}

const mi_preload_abi* find_abi() {
  if (const mi_preload_abi* abi = g_preloaded.load(std::memory_order_acquire)) return abi;
  if (const mi_preload_abi* abi = g_attached.load(std::memory_order_acquire)) return abi;
  if (const mi_preload_abi* abi =
          checked(reinterpret_cast<mi_preload_abi_fn>(::dlsym(RTLD_DEFAULT, MI_ABI_SYMBOL)))) {
    learn_quiet(abi);
    g_preloaded.store(abi, std::memory_order_release);
    return abi;
  }
  // This NIF may have been reloaded since attach(): the library is still there.
  const mi_preload_abi* abi = loaded_local_abi(false);
  if (abi != nullptr && ever_attached(abi)) {
    learn_quiet(abi);
    g_attached.store(abi, std::memory_order_release);
    return abi;
  }
  return nullptr;
}

ERL_NIF_TERM not_preloaded(ErlNifEnv* env) {
  return error_tuple(env, atoms.not_preloaded);
}

// The ABI of an interposer that records in this process, with its status
// in *st; or nullptr with *error set to {error, not_preloaded |
// not_recording}: an empty answer from a process that records nothing
// would read as "no leak".
const mi_preload_abi* recording_abi(ErlNifEnv* env, ERL_NIF_TERM* error, mi_abi_status* st) {
  const mi_preload_abi* abi = find_abi();
  if (abi == nullptr) {
    *error = not_preloaded(env);
    return nullptr;
  }
  *st = mi_abi_status{};
  abi->status(st, sizeof *st);
  if (st->recording == 0) {
    *error = error_tuple(env, atoms.not_recording);
    return nullptr;
  }
  return abi;
}

// Runs body(abi, status) when an interposer records in this process
// (recording_abi); its {error, not_preloaded | not_recording} otherwise.
template <class F>
ERL_NIF_TERM when_recording(ErlNifEnv* env, F&& body) {
  ERL_NIF_TERM error;
  mi_abi_status status;
  const mi_preload_abi* abi = recording_abi(env, &error, &status);
  return abi == nullptr ? error : body(abi, status);
}

ERL_NIF_TERM mode_atom(uint32_t mode) {
  switch (mode) {
    case MI_MODE_FULL:
      return atoms.full;
    case MI_MODE_SAMPLE:
      return atoms.sample;
    case MI_MODE_COUNTERS:
      return atoms.counters;
    default:
      return atoms.off;
  }
}

ERL_NIF_TERM u64(ErlNifEnv* env, uint64_t v) {
  return enif_make_uint64(env, v);
}

ERL_NIF_TERM frame_term(ErlNifEnv* env, const mi::symbolize::Frame& f) {
  return MapBuilder()
      .put(atoms.address, u64(env, f.address))
      .put(atoms.object, make_binary(env, f.object))
      .put(atoms.symbol, f.symbol ? make_binary(env, *f.symbol) : atoms.undefined)
      .put(atoms.offset, u64(env, f.symbol ? f.symbol_offset : f.object_offset))
      .build(env);
}

// True when the interposer has reclamation (mi_preload_abi.reclaim and the
// status fields after calls[]).
bool has_reclaim(const mi_preload_abi* abi) {
  return abi->struct_size >= offsetof(mi_preload_abi, reclaim) + sizeof(abi->reclaim);
}

// Runs body(st) (which reads stack ids from a snapshot and looks them up
// later) until no stack id it used can have been reused for another stack
// meanwhile: fewer than stack_generations sweeps completed since st was
// read (see mi_abi.h). Thousands of sweeps during one read are needed to
// fail once; after three failures, {error, eagain}.
template <class Body>
ERL_NIF_TERM with_stable_ids(ErlNifEnv* env, const mi_preload_abi* abi, mi_abi_status st,
                             Body&& body) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    const ERL_NIF_TERM result = body(st);
    mi_abi_status after{};
    abi->status(&after, sizeof after);
    if (st.stack_generations == 0 || after.stack_sweeps - st.stack_sweeps < st.stack_generations)
      return result;
    st = after;
  }
  return error_tuple(env, atoms.eagain);
}

// Symbolized stacks of a few ids, resolved in one batch: the symbolizer
// reads /proc/self/maps and the JIT's perf map once per batch rather than
// once per frame (per frame, a sites(20) through Erlang code re-read a
// perf map of a few MB some 600 times: seconds).
class StackTerms {
 public:
  StackTerms(const mi_preload_abi* abi, bool demangle) : abi_(abi), demangle_(demangle) {}

  // Queues a stack; call before resolve().
  void want(uint32_t id) {
    if (index_.count(id) != 0) return;
    Span span{static_cast<uint32_t>(addresses_.size()), 0};
    uint64_t frames[kMaxFrames];
    span.n = stack_frames(abi_, id, frames);
    addresses_.insert(addresses_.end(), frames, frames + span.n);
    index_.emplace(id, spans_.size());
    spans_.push_back(span);
  }

  // Symbolizes every queued stack and makes their terms.
  void resolve(ErlNifEnv* env) {
    const std::vector<mi::symbolize::Frame> frames =
        symbolizer().resolve_all(addresses_, demangle_);
    std::vector<ERL_NIF_TERM> list;
    terms_.clear();
    for (const Span& sp : spans_) {
      list.clear();
      for (uint32_t i = 0; i < sp.n; ++i) list.push_back(frame_term(env, frames[sp.first + i]));
      terms_.push_back(enif_make_list_from_array(env, list.data(), sp.n));
    }
  }

  ERL_NIF_TERM term(uint32_t id) const { return terms_[index_.at(id)]; }

 private:
  struct Span {
    uint32_t first, n;
  };
  const mi_preload_abi* abi_;
  bool demangle_;
  std::vector<uint64_t> addresses_;
  std::vector<Span> spans_;
  std::unordered_map<uint32_t, size_t> index_;
  std::vector<ERL_NIF_TERM> terms_;
};

}  // namespace

mi::symbolize::Symbolizer& symbolizer() {
  static mi::symbolize::Symbolizer s;
  return s;
}

const mi_preload_abi* tracker_abi() {
  return find_abi();
}

const mi_preload_abi* recording_tracker() {
  const mi_preload_abi* abi = find_abi();
  if (abi == nullptr) return nullptr;
  mi_abi_status st{};
  abi->status(&st, sizeof st);
  return st.recording != 0 && st.mode >= MI_MODE_SAMPLE ? abi : nullptr;
}

namespace {
// status()'s `mappings': the region table and the mmap family's counters
// (issue 14); undefined from an interposer without them.
ERL_NIF_TERM mappings_status(ErlNifEnv* env, const mi_preload_abi* abi) {
  if (abi->struct_size < offsetof(mi_preload_abi, region_status) + sizeof(abi->region_status) ||
      abi->region_status == nullptr)
    return atoms.undefined;
  mi_abi_region_status r{};
  abi->region_status(&r, sizeof r);
  return MapBuilder()
      .put(atoms.regions, u64(env, r.regions))
      .put(atoms.bytes, u64(env, r.bytes))
      .put(atoms.table_capacity, u64(env, r.capacity))
      .put(atoms.table_bytes, u64(env, r.table_bytes))
      .put(atoms.dropped, u64(env, r.dropped))
      .put(atoms.calls, MapBuilder()
                            .put(atoms.calls_mmap, u64(env, r.calls_mmap))
                            .put(atoms.calls_munmap, u64(env, r.calls_munmap))
                            .put(atoms.calls_mremap, u64(env, r.calls_mremap))
                            .build(env))
      .put(atoms.bytes_mapped, u64(env, r.bytes_mapped))
      .put(atoms.bytes_unmapped, u64(env, r.bytes_unmapped))
      .build(env);
}
}  // namespace

namespace {
// status()'s `self': what mallocinfo's own work allocated and mapped, left
// out of every other figure (quiet.h); undefined from an interposer that
// cannot tell.
ERL_NIF_TERM self_status(ErlNifEnv* env, const mi_preload_abi* abi, const mi_abi_status& s) {
  if (abi->struct_size < offsetof(mi_preload_abi, quiet) + sizeof(abi->quiet))
    return atoms.undefined;
  mi_abi_region_status r{};
  abi->region_status(&r, sizeof r);
  return MapBuilder()
      .put(atoms.calls, u64(env, s.self_calls))
      .put(atoms.bytes, u64(env, s.self_bytes))
      .put(atoms.mmaps, u64(env, r.self_mmaps))
      .put(atoms.bytes_mapped, u64(env, r.self_bytes_mapped))
      .build(env);
}
}  // namespace

ERL_NIF_TERM trace_status(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  const mi_preload_abi* abi = find_abi();
  if (abi == nullptr)
    return MapBuilder()
        .put(atoms.preloaded, atoms.false_)
        .put(atoms.attached, atoms.false_)
        .put(atoms.attached_at, atoms.undefined)
        .put(atoms.recording, atoms.false_)
        .put(atoms.mode, atoms.off)
        .build(env);
  mi_abi_status s{};
  abi->status(&s, sizeof s);
  static const ERL_NIF_TERM* const fn_atoms[MI_FN_COUNT] = {
      &atoms.fn_malloc, &atoms.fn_calloc,         &atoms.fn_realloc,       &atoms.fn_reallocarray,
      &atoms.fn_free,   &atoms.fn_posix_memalign, &atoms.fn_aligned_alloc, &atoms.fn_memalign,
      &atoms.fn_valloc, &atoms.fn_pvalloc,        &atoms.fn_strdup,        &atoms.fn_strndup};
  MapBuilder calls;
  for (int i = 0; i < MI_FN_COUNT; ++i) calls.put(*fn_atoms[i], u64(env, s.calls[i]));
  const bool preloaded = abi == g_preloaded.load(std::memory_order_acquire);
  mi_attach_status at{};
  if (!preloaded) abi->attach_status(&at, sizeof at);
  return MapBuilder()
      .put(atoms.preloaded, make_bool(preloaded))
      .put(atoms.attached, make_bool(at.attached != 0))
      .put(atoms.attached_at,
           at.ever != 0 ? u64(env, at.attached_at_unix_ns / 1000000) : atoms.undefined)
      .put(atoms.attach, preloaded ? atoms.undefined
                                   : MapBuilder()
                                         .put(atoms.objects, u64(env, at.objects))
                                         .put(atoms.slots, u64(env, at.slots))
                                         .put(atoms.slots_foreign, u64(env, at.slots_foreign))
                                         .put(atoms.data_pointers, u64(env, at.data_pointers))
                                         .put(atoms.attach_us, u64(env, at.attach_ns / 1000))
                                         .build(env))
      .put(atoms.recording, make_bool(s.recording != 0))
      .put(atoms.mode, mode_atom(s.mode))
      .put(atoms.table_capacity, u64(env, s.table_capacity))
      .put(atoms.table_bytes, u64(env, s.table_bytes))
      .put(atoms.live_entries, u64(env, s.live_entries))
      .put(atoms.live_bytes, u64(env, s.live_bytes))
      .put(atoms.dropped, u64(env, s.dropped))
      .put(atoms.stacks, u64(env, s.stacks))
      .put(atoms.stack_capacity, u64(env, s.stack_capacity))
      .put(atoms.stack_bytes, u64(env, s.stack_bytes))
      .put(atoms.stacks_dropped, u64(env, s.stacks_dropped))
      .put(atoms.stacks_reclaimed, u64(env, s.stacks_reclaimed))
      .put(atoms.stack_sweeps, u64(env, s.stack_sweeps))
      .put(atoms.stack_depth, u64(env, s.stack_depth))
      .put(atoms.sample_bytes, u64(env, s.sample_bytes))
      .put(atoms.unwinder, s.unwinder != 0 ? atoms.cached : atoms.libunwind)
      .put(atoms.frees_untracked, u64(env, s.frees_untracked))
      .put(atoms.bytes_allocated, u64(env, s.bytes_allocated))
      .put(atoms.bytes_freed, u64(env, s.bytes_freed))
      .put(atoms.calls, calls.build(env))
      .put(atoms.mappings, mappings_status(env, abi))
      .put(atoms.self, self_status(env, abi, s))
      .build(env);
}

ERL_NIF_TERM trace_set_mode(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  uint32_t mode;
  if (enif_is_identical(argv[0], atoms.full))
    mode = MI_MODE_FULL;
  else if (enif_is_identical(argv[0], atoms.sample))
    mode = MI_MODE_SAMPLE;
  else if (enif_is_identical(argv[0], atoms.counters))
    mode = MI_MODE_COUNTERS;
  else if (enif_is_identical(argv[0], atoms.off))
    mode = MI_MODE_OFF;
  else
    throw BadArg{};
  const mi_preload_abi* abi = find_abi();
  if (abi == nullptr) return not_preloaded(env);
  // The interposer refuses only when this executable is not recording.
  if (abi->set_mode(mode) != 0) return error_tuple(env, atoms.not_recording);
  return atoms.ok;
}

ERL_NIF_TERM trace_reset(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status&) {
    return enif_make_tuple2(env, atoms.ok, u64(env, abi->reset()));
  });
}

ERL_NIF_TERM trace_reclaim(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status&) {
    // An interposer from before reclamation (preloaded from an older build).
    if (!has_reclaim(abi)) return error_tuple(env, atoms.enotsup);
    return enif_make_tuple2(env, atoms.ok, u64(env, abi->reclaim()));
  });
}

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
      const size_t k = entries.size();
      StackTerms stacks(abi, demangle);
      for (size_t i = 0; i < k; ++i) stacks.want(entries[i].stack_id);
      stacks.resolve(env);
      std::vector<ERL_NIF_TERM> out;
      out.reserve(k);
      for (size_t i = 0; i < k; ++i) {
        const mi_abi_entry& e = entries[i];
        out.push_back(MapBuilder()
                          .put(atoms.address, u64(env, e.address))
                          .put(atoms.size, u64(env, e.size))
                          .put(atoms.age_ms, u64(env, age_ms(now, e.timestamp_ns)))
                          .put(atoms.stack, stacks.term(e.stack_id))
                          .put(atoms.estimated, make_bool((e.flags & MI_ENTRY_SAMPLED) != 0))
                          .build(env));
      }
      return enif_make_tuple2(env, atoms.ok, enif_make_list_from_array(env, out.data(), k));
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
      StackTerms stacks(abi, demangle);
      for (size_t i = 0; i < k; ++i) stacks.want(sites[i].stack);
      stacks.resolve(env);
      std::vector<ERL_NIF_TERM> out;
      out.reserve(k);
      for (size_t i = 0; i < k; ++i) {
        const Site& s = sites[i];
        out.push_back(MapBuilder()
                          .put(atoms.stack, stacks.term(s.stack))
                          .put(atoms.count, u64(env, rounded(s.count)))
                          .put(atoms.bytes, u64(env, rounded(s.bytes)))
                          .put(atoms.oldest_age_ms, u64(env, age_ms(now, s.oldest)))
                          .put(atoms.estimated, make_bool(s.estimated))
                          .build(env));
      }
      return enif_make_tuple2(env, atoms.ok, enif_make_list_from_array(env, out.data(), k));
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
        const uint32_t depth = stack_frames(abi, s.stack, pcs);
        if (depth == 0) continue;
        frames.clear();
        for (uint32_t i = 0; i < depth; ++i) frames.push_back(u64(env, pcs[i]));
        out.push_back(enif_make_tuple3(env, u64(env, rounded(s.count)), u64(env, rounded(s.bytes)),
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
// into a profile.proto without formatting a single address itself.
ERL_NIF_TERM trace_pprof(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const bool demangle = enif_is_identical(argv[0], atoms.true_);
  const uint64_t since = get_u64(env, argv[1]);
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status& status) {
    return with_stable_ids(env, abi, status, [&](const mi_abi_status& st) {
      const uint64_t now = abi->now_ns();
      std::vector<Site> sites = group_by_site(abi, st, since);
      std::sort(sites.begin(), sites.end(), larger_site);
      std::unordered_map<uint64_t, uint32_t> index;  // address -> 1-based location id
      std::vector<uint64_t> addresses;
      std::vector<uint32_t> ids;  // every site's location ids, one after the other
      std::vector<uint32_t> depths(sites.size());
      for (size_t i = 0; i < sites.size(); ++i) {
        uint64_t pcs[kMaxFrames];
        const uint32_t depth = stack_frames(abi, sites[i].stack, pcs);
        depths[i] = depth;
        for (uint32_t f = 0; f < depth; ++f) {
          auto [it, fresh] = index.try_emplace(pcs[f], static_cast<uint32_t>(addresses.size() + 1));
          if (fresh) addresses.push_back(pcs[f]);
          ids.push_back(it->second);
        }
      }
      const std::vector<mi::symbolize::Frame> frames =
          symbolizer().resolve_all(addresses, demangle);
      // One binary per object, shared by its locations.
      std::unordered_map<std::string, ERL_NIF_TERM> objects;
      std::vector<ERL_NIF_TERM> locs;
      locs.reserve(frames.size());
      for (const mi::symbolize::Frame& f : frames) {
        auto [it, fresh] = objects.try_emplace(f.object, 0);
        if (fresh) it->second = make_binary(env, f.object);
        locs.push_back(enif_make_tuple4(env, u64(env, f.address), it->second,
                                        f.symbol ? make_binary(env, *f.symbol) : atoms.undefined,
                                        u64(env, f.object_offset)));
      }
      std::vector<ERL_NIF_TERM> out;
      out.reserve(sites.size());
      std::vector<ERL_NIF_TERM> stack;
      size_t next = 0;
      for (size_t i = 0; i < sites.size(); ++i) {
        stack.clear();
        for (uint32_t f = 0; f < depths[i]; ++f) stack.push_back(enif_make_uint(env, ids[next++]));
        out.push_back(enif_make_tuple3(env, u64(env, rounded(sites[i].count)),
                                       u64(env, rounded(sites[i].bytes)),
                                       enif_make_list_from_array(env, stack.data(), depths[i])));
      }
      return enif_make_tuple2(
          env, atoms.ok,
          MapBuilder()
              .put(atoms.mode, mode_atom(st.mode))
              .put(atoms.sample_bytes, u64(env, st.sample_bytes))
              .put(atoms.now_ns, u64(env, now))
              .put(atoms.sites, enif_make_list_from_array(env, out.data(), out.size()))
              .put(atoms.locations, enif_make_list_from_array(env, locs.data(), locs.size()))
              .build(env));
    });
  });
}

// now(): {ok, NowNs}, the tracker's clock (block timestamps use it).
ERL_NIF_TERM trace_now(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status&) {
    return enif_make_tuple2(env, atoms.ok, u64(env, abi->now_ns()));
  });
}

// snapshot(): {ok, {Mode, NowNs, [{Count, Bytes, Estimated, Frames}]}},
// every live site (the blocks without a stored stack too, Frames = <<>>),
// unsorted. Frames packs the raw return addresses as native 64-bit words in
// one binary: a snapshot of thousands of sites stays a few flat binaries
// (cheap to keep, compare and send), and the Erlang side symbolizes only the
// stacks it returns. NowNs is the tracker's clock (the blocks' timestamps).
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
}  // namespace

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
        out.push_back(enif_make_tuple4(env, u64(env, rounded(s.count)), u64(env, rounded(s.bytes)),
                                       make_bool(s.estimated), packed_frames(env, abi, s.stack)));
      std::vector<ERL_NIF_TERM> old_terms;
      for (const mi_abi_entry& e : olds.take())
        old_terms.push_back(enif_make_tuple5(
            env, u64(env, e.address), u64(env, e.size), u64(env, age_ms(now, e.timestamp_ns)),
            make_bool((e.flags & MI_ENTRY_SAMPLED) != 0), packed_frames(env, abi, e.stack_id)));
      return enif_make_tuple2(
          env, atoms.ok,
          enif_make_tuple4(env, mode_atom(st.mode), u64(env, now),
                           enif_make_list_from_array(env, out.data(), out.size()),
                           enif_make_list_from_array(env, old_terms.data(), old_terms.size())));
    });
  });
}

namespace {

bool has_regions(const mi_preload_abi* abi) {
  return abi->struct_size >= offsetof(mi_preload_abi, regions) + sizeof(abi->regions) &&
         abi->regions != nullptr;
}

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
                        .put(atoms.start, u64(env, r.start))
                        .put(atoms.length, u64(env, r.length))
                        .put(atoms.flags, region_flags(env, r.flags))
                        .put(atoms.resident, u64(env, resident[index++]))
                        .put(atoms.age_ms, u64(env, age_ms(now, r.timestamp_ns)))
                        .put(atoms.stack, enif_make_list_from_array(env, stack.data(), depth))
                        .build(env));
    }
    return enif_make_tuple2(
        env, atoms.ok,
        enif_make_list_from_array(env, out.data(), static_cast<unsigned>(out.size())));
  });
}

// symbolizer_stats(): the process-wide symbolizer's counters, so tests can
// check how much work a query did (not how long it took).
ERL_NIF_TERM trace_symbolizer_stats(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  const mi::symbolize::SymbolizerStats s = symbolizer().stats();
  return MapBuilder()
      .put(atoms.lookups, u64(env, s.lookups))
      .put(atoms.cache_hits, u64(env, s.cache_hits))
      .put(atoms.objects_loaded, u64(env, s.objects_loaded))
      .put(atoms.rescans, u64(env, s.rescans))
      .put(atoms.maps_reads, u64(env, s.maps_reads))
      .put(atoms.cached_addresses, u64(env, s.cached_addresses))
      .build(env);
}

// symbolize([Address], Demangle) -> [Frame]: for callers holding raw
// addresses (tests, reports).
ERL_NIF_TERM trace_symbolize(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  unsigned len;
  if (!enif_get_list_length(env, argv[0], &len)) throw BadArg{};
  const bool demangle = enif_is_identical(argv[1], atoms.true_);
  std::vector<uint64_t> addresses;
  addresses.reserve(len);
  ERL_NIF_TERM list = argv[0], head;
  while (enif_get_list_cell(env, list, &head, &list)) addresses.push_back(get_u64(env, head));
  // One batch: one read of /proc/self/maps at most, however many misses.
  std::vector<ERL_NIF_TERM> out;
  out.reserve(len);
  for (const auto& f : symbolizer().resolve_all(addresses, demangle, false))
    out.push_back(frame_term(env, f));
  return enif_make_list_from_array(env, out.data(), len);
}

namespace {

ERL_NIF_TERM posix_atom(int err) {
  switch (err) {
    case EACCES:
      return atoms.eacces;
    case EPERM:
      return atoms.eperm;
    case ENOMEM:
      return atoms.enomem;
    default:
      return atoms.einval;
  }
}

// The interposer names why attach is unsupported (mi_attach_result::what);
// an unknown name (a newer interposer) is passed on as a binary.
ERL_NIF_TERM unsupported_atom(ErlNifEnv* env, const char* what) {
  const struct {
    const char* name;
    const ERL_NIF_TERM* atom;
  } known[] = {{"static_allocator", &atoms.static_allocator},
               {"elf_layout", &atoms.elf_layout},
               {"too_many_slots", &atoms.too_many_slots},
               {"libc", &atoms.libc},
               {"arch", &atoms.arch}};
  for (const auto& k : known)
    if (std::strcmp(k.name, what) == 0) return *k.atom;
  return make_binary(env, what);
}

}  // namespace

// attach(Mode, SampleBytes, TableSize, StackTableSize, StackDepth), each
// validated by mallocinfo_trace.
ERL_NIF_TERM trace_attach(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  mi_attach_config cfg{};
  if (enif_is_identical(argv[0], atoms.full))
    cfg.mode = MI_MODE_FULL;
  else if (enif_is_identical(argv[0], atoms.sample))
    cfg.mode = MI_MODE_SAMPLE;
  else if (enif_is_identical(argv[0], atoms.counters))
    cfg.mode = MI_MODE_COUNTERS;
  else
    throw BadArg{};
  // mallocinfo_trace checks these too; checked again here so that a direct
  // call of the stub cannot size a table at 0 (mi_limits.h is the one home
  // of the ranges).
  auto knob = [env](ERL_NIF_TERM t, const mi::limits::Knob& k) {
    const uint64_t v = get_u64(env, t);
    if (!k.valid(v)) throw BadArg{};
    return v;
  };
  cfg.sample_bytes = knob(argv[1], mi::limits::kSampleBytes);
  cfg.table_capacity = knob(argv[2], mi::limits::kTableSize);
  cfg.stack_capacity = knob(argv[3], mi::limits::kStackTableSize);
  cfg.stack_depth = static_cast<uint32_t>(knob(argv[4], mi::limits::kStackDepth));
  if (checked(reinterpret_cast<mi_preload_abi_fn>(::dlsym(RTLD_DEFAULT, MI_ABI_SYMBOL))) != nullptr)
    return error_tuple(env, atoms.preloaded);
  const mi_preload_abi* abi = loaded_local_abi(true);
  if (abi == nullptr) {
    const char* why = ::dlerror();
    return error_tuple(
        env, enif_make_tuple2(env, atoms.load_failed, make_binary(env, why != nullptr ? why : "")));
  }
  mi_attach_result r{};
  // From the moment the hooks are in, this call's own allocations are
  // mallocinfo's too: the rest of it is quiet, and so is every later call.
  learn_quiet(abi);
  const QuietScope quiet(abi);
  abi->attach(&cfg, sizeof cfg, &r, sizeof r);
  switch (r.rc) {
    case MI_ATTACH_OK:
      g_attached.store(abi, std::memory_order_release);
      return atoms.ok;
    case MI_ATTACH_PRELOADED:
      return error_tuple(env, atoms.preloaded);
    case MI_ATTACH_ALREADY:
      return error_tuple(env, atoms.already_attached);
    case MI_ATTACH_UNSUPPORTED: {
      r.what[sizeof r.what - 1] = '\0';
      r.object[sizeof r.object - 1] = '\0';
      const ERL_NIF_TERM what = unsupported_atom(env, r.what);
      return error_tuple(
          env, enif_make_tuple2(env, atoms.unsupported,
                                r.object[0] != '\0'
                                    ? enif_make_tuple2(env, what, make_binary(env, r.object))
                                    : what));
    }
    default:
      return error_tuple(env, posix_atom(r.err));
  }
}

ERL_NIF_TERM trace_detach(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  const mi_preload_abi* abi = find_abi();
  if (abi == nullptr || abi == g_preloaded.load(std::memory_order_acquire) || abi->detach() != 0)
    return error_tuple(env, atoms.not_attached);
  return atoms.ok;
}

}  // namespace mi::nif
