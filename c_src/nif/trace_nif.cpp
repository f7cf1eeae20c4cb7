#include "trace_nif.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <string>
#include <unordered_map>
#include <vector>

#include "../common/mi_abi.h"
#include "../symbolize/symbolize.h"
#include "term.h"

namespace mi::nif {

namespace {

// The interposer's ABI, or nullptr when it is not in the process (or its
// version is not one we understand). Looked up on every call until found:
// dlsym is cheap, and a failed lookup must not stick (there is no way to
// preload later, but tests load and unload the NIF freely).
const mi_preload_abi* find_abi() {
  static std::atomic<const mi_preload_abi*> cached{nullptr};
  const mi_preload_abi* abi = cached.load(std::memory_order_acquire);
  if (abi != nullptr) return abi;
  auto fn = reinterpret_cast<mi_preload_abi_fn>(::dlsym(RTLD_DEFAULT, MI_ABI_SYMBOL));
  if (fn == nullptr) return nullptr;
  abi = fn();
  if (abi == nullptr || abi->abi_version != MI_ABI_VERSION ||
      abi->struct_size < sizeof(mi_preload_abi))
    return nullptr;
  cached.store(abi, std::memory_order_release);
  return abi;
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

// Symbolized stacks, memoized per call: many entries share a stack. One
// symbolizer batch per call: /proc/self/maps is read at most once however
// many frames lie outside every object (JIT code).
class StackCache {
 public:
  StackCache(const mi_preload_abi* abi, bool demangle) : abi_(abi), demangle_(demangle) {}

  ERL_NIF_TERM term(ErlNifEnv* env, uint32_t id) {
    auto it = terms_.find(id);
    if (it != terms_.end()) return it->second;
    uint64_t frames[256];
    const uint32_t n = std::min<uint32_t>(abi_->stack(id, frames, 256), 256);
    std::vector<ERL_NIF_TERM> list;
    list.reserve(n);
    for (uint32_t i = 0; i < n; ++i)
      list.push_back(frame_term(env, symbolizer().resolve(frames[i], demangle_, true, batch_)));
    const ERL_NIF_TERM t = enif_make_list_from_array(env, list.data(), n);
    terms_.emplace(id, t);
    return t;
  }

 private:
  const mi_preload_abi* abi_;
  bool demangle_;
  mi::symbolize::SymbolizeBatch batch_;
  std::unordered_map<uint32_t, ERL_NIF_TERM> terms_;
};

// Streams a snapshot into `consume(const mi_abi_entry*, size_t)`. The sink is
// called from the interposer's C frames (built without exceptions), so no
// exception may cross them: the first one is kept, later batches are
// skipped, and it is rethrown here once the interposer has returned.
template <class F>
void stream_snapshot(const mi_preload_abi* abi, F&& consume) {
  struct Ctx {
    F* consume;
    std::exception_ptr error;
  } ctx{&consume, nullptr};
  abi->snapshot(
      [](void* p, const mi_abi_entry* e, size_t n) {
        Ctx& c = *static_cast<Ctx*>(p);
        if (c.error) return;
        try {
          (*c.consume)(e, n);
        } catch (...) {
          c.error = std::current_exception();
        }
      },
      &ctx);
  if (ctx.error) std::rethrow_exception(ctx.error);
}

std::vector<mi_abi_entry> snapshot(const mi_preload_abi* abi, const mi_abi_status& st) {
  std::vector<mi_abi_entry> entries;
  entries.reserve(st.live_entries + st.live_entries / 8 + 64);
  stream_snapshot(
      abi, [&](const mi_abi_entry* e, size_t n) { entries.insert(entries.end(), e, e + n); });
  return entries;
}

uint64_t age_ms(uint64_t now, uint64_t ts) {
  return now > ts ? (now - ts) / 1000000 : 0;
}

// The first n of v in `before` order, each made a term by `to_term`, as
// {ok, List}. Partial sort: O(size log n).
template <class T, class Before, class ToTerm>
ERL_NIF_TERM first_n(ErlNifEnv* env, std::vector<T>& v, uint64_t n, Before before, ToTerm to_term) {
  const size_t k = static_cast<size_t>(std::min<uint64_t>(n, v.size()));
  std::partial_sort(v.begin(), v.begin() + static_cast<ptrdiff_t>(k), v.end(), before);
  std::vector<ERL_NIF_TERM> out;
  out.reserve(k);
  for (size_t i = 0; i < k; ++i) out.push_back(to_term(v[i]));
  return enif_make_tuple2(env, atoms.ok, enif_make_list_from_array(env, out.data(), k));
}

// Live blocks grouped by allocation stack. Sampled entries count 1/p(size)
// blocks and size/p(size) bytes, p(n) = 1 - exp(-n / sample_bytes).
struct Site {
  uint32_t stack;
  double count, bytes;
  uint64_t oldest;
  bool estimated;
};

std::vector<Site> group_by_stack(const mi_preload_abi* abi, const mi_abi_status& st) {
  const double mean = st.sample_bytes > 0 ? static_cast<double>(st.sample_bytes) : 1.0;
  std::unordered_map<uint32_t, Site> by_stack;
  by_stack.reserve(st.stacks + 16);
  stream_snapshot(abi, [&](const mi_abi_entry* e, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      Site& s = by_stack.try_emplace(e[i].stack_id, Site{e[i].stack_id, 0, 0, UINT64_MAX, false})
                    .first->second;
      const double size = static_cast<double>(e[i].size);
      if (e[i].flags & MI_ENTRY_SAMPLED) {
        const double prob = -std::expm1(-size / mean);
        const double w = prob > 0 ? 1.0 / prob : 1.0;
        s.count += w;
        s.bytes += size * w;
        s.estimated = true;
      } else {
        s.count += 1;
        s.bytes += size;
      }
      s.oldest = std::min(s.oldest, e[i].timestamp_ns);
    }
  });
  std::vector<Site> sites;
  sites.reserve(by_stack.size());
  for (auto& [id, site] : by_stack) sites.push_back(site);
  return sites;
}

bool larger_site(const Site& a, const Site& b) {
  return a.bytes != b.bytes ? a.bytes > b.bytes : a.stack < b.stack;
}

uint64_t rounded(double v) {
  return static_cast<uint64_t>(std::llround(v));
}

}  // namespace

mi::symbolize::Symbolizer& symbolizer() {
  static mi::symbolize::Symbolizer s;
  return s;
}

const mi_preload_abi* recording_tracker() {
  const mi_preload_abi* abi = find_abi();
  if (abi == nullptr) return nullptr;
  mi_abi_status st{};
  abi->status(&st, sizeof st);
  return st.recording != 0 && st.mode >= MI_MODE_SAMPLE ? abi : nullptr;
}

ERL_NIF_TERM trace_status(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  const mi_preload_abi* abi = find_abi();
  if (abi == nullptr)
    return MapBuilder()
        .put(atoms.preloaded, atoms.false_)
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
  return MapBuilder()
      .put(atoms.preloaded, atoms.true_)
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
      .put(atoms.stack_depth, u64(env, s.stack_depth))
      .put(atoms.sample_bytes, u64(env, s.sample_bytes))
      .put(atoms.unwinder, s.unwinder != 0 ? atoms.cached : atoms.libunwind)
      .put(atoms.frees_untracked, u64(env, s.frees_untracked))
      .put(atoms.bytes_allocated, u64(env, s.bytes_allocated))
      .put(atoms.bytes_freed, u64(env, s.bytes_freed))
      .put(atoms.calls, calls.build(env))
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
  ERL_NIF_TERM error;
  mi_abi_status st;
  const mi_preload_abi* abi = recording_abi(env, &error, &st);
  if (abi == nullptr) return error;
  return enif_make_tuple2(env, atoms.ok, u64(env, abi->reset()));
}

// olds(N, MinAgeMs, MinSize, Demangle): the N oldest live blocks.
ERL_NIF_TERM trace_olds(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const uint64_t n = get_u64(env, argv[0]);
  const uint64_t min_age = get_u64(env, argv[1]);
  const uint64_t min_size = get_u64(env, argv[2]);
  const bool demangle = enif_is_identical(argv[3], atoms.true_);
  ERL_NIF_TERM error;
  mi_abi_status st;
  const mi_preload_abi* abi = recording_abi(env, &error, &st);
  if (abi == nullptr) return error;
  std::vector<mi_abi_entry> entries = snapshot(abi, st);
  const uint64_t now = abi->now_ns();
  std::erase_if(entries, [&](const mi_abi_entry& e) {
    return e.size < min_size || age_ms(now, e.timestamp_ns) < min_age;
  });
  StackCache stacks(abi, demangle);
  return first_n(
      env, entries, n,
      [](const mi_abi_entry& a, const mi_abi_entry& b) {
        return a.timestamp_ns != b.timestamp_ns ? a.timestamp_ns < b.timestamp_ns
                                                : a.address < b.address;
      },
      [&](const mi_abi_entry& e) {
        return MapBuilder()
            .put(atoms.address, u64(env, e.address))
            .put(atoms.size, u64(env, e.size))
            .put(atoms.age_ms, u64(env, age_ms(now, e.timestamp_ns)))
            .put(atoms.stack, stacks.term(env, e.stack_id))
            .put(atoms.estimated, make_bool((e.flags & MI_ENTRY_SAMPLED) != 0))
            .build(env);
      });
}

// sites(N, Demangle): live blocks grouped by stack, the N largest by bytes.
ERL_NIF_TERM trace_sites(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const uint64_t n = get_u64(env, argv[0]);
  const bool demangle = enif_is_identical(argv[1], atoms.true_);
  ERL_NIF_TERM error;
  mi_abi_status st;
  const mi_preload_abi* abi = recording_abi(env, &error, &st);
  if (abi == nullptr) return error;
  const uint64_t now = abi->now_ns();
  std::vector<Site> sites = group_by_stack(abi, st);
  StackCache stacks(abi, demangle);
  return first_n(env, sites, n, larger_site, [&](const Site& s) {
    return MapBuilder()
        .put(atoms.stack, stacks.term(env, s.stack))
        .put(atoms.count, u64(env, rounded(s.count)))
        .put(atoms.bytes, u64(env, rounded(s.bytes)))
        .put(atoms.oldest_age_ms, u64(env, age_ms(now, s.oldest)))
        .put(atoms.estimated, make_bool(s.estimated))
        .build(env);
  });
}

// profile(): every site as {Count, Bytes, [ReturnAddress]}, largest first,
// with raw addresses and no symbols: the heap profile text carries them,
// and pprof/jeprof symbolize them from the mapped objects themselves.
// Blocks recorded without a stack (stack id 0) have no frames to show and
// are left out.
ERL_NIF_TERM trace_profile(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  ERL_NIF_TERM error;
  mi_abi_status st;
  const mi_preload_abi* abi = recording_abi(env, &error, &st);
  if (abi == nullptr) return error;
  std::vector<Site> sites = group_by_stack(abi, st);
  std::sort(sites.begin(), sites.end(), larger_site);
  std::vector<ERL_NIF_TERM> out;
  out.reserve(sites.size());
  std::vector<ERL_NIF_TERM> frames;
  for (const Site& s : sites) {
    uint64_t pcs[256];
    const uint32_t depth = std::min<uint32_t>(abi->stack(s.stack, pcs, 256), 256);
    if (depth == 0) continue;
    frames.clear();
    for (uint32_t i = 0; i < depth; ++i) frames.push_back(u64(env, pcs[i]));
    out.push_back(enif_make_tuple3(env, u64(env, rounded(s.count)), u64(env, rounded(s.bytes)),
                                   enif_make_list_from_array(env, frames.data(), depth)));
  }
  return enif_make_tuple2(env, atoms.ok, enif_make_list_from_array(env, out.data(), out.size()));
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

}  // namespace mi::nif
