#include "erlang_context_nif.h"

#include <pthread.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "../common/mi_abi.h"
#include "../common/mi_context.h"
#include "../symbolize/beam_code.h"
#include "mixed_stack.h"
#include "term.h"
#include "tracker_abi.h"

namespace mi::nif {

namespace {

using mi::symbolize::read_own_memory;

constexpr uint32_t kKeys = 1024;      // PTHREAD_KEYS_MAX on glibc
constexpr uint32_t kBlockWords = 64;  // scheduler data and env words searched
constexpr uint32_t kProcWords = 128;  // Process words searched
constexpr uint32_t kStackWords = 256;

// Up to n words at address into out; how many could be read (a block may
// end before n words: read what is there).
uint32_t read_words(uint64_t address, uint64_t* out, uint32_t n) {
  if (address == 0 || (address & 7) != 0) return 0;
  if (read_own_memory(nullptr, address, out, n * 8ull)) return n;
  uint32_t got = 0;
  while (got < n && read_own_memory(nullptr, address + got * 8ull, out + got, 8)) ++got;
  return got;
}

bool aligned(uint64_t w) {
  return w != 0 && (w & 7) == 0;
}

// The first word at `pointer`, if it can be read.
std::optional<uint64_t> first_word(uint64_t pointer) {
  uint64_t w = 0;
  if (!aligned(pointer) || read_words(pointer, &w, 1) != 1) return std::nullopt;
  return w;
}

struct Found {
  uint32_t key = 0, sd_env = 0, sd_process = 0, env_proc = 0, p_current = 0;
  uint32_t p_htop = 0, p_stop = 0, p_heap = 0, p_hend = 0;
  std::optional<uint32_t> sd_shadow;
  std::vector<uint64_t> cps;
};

// The process struct's stack pointers, by consistency with `inside` (a
// pointer into the live heap): heap <= inside < htop <= stop <= hend. The
// lowest htop index wins (+JPperf adds a frame pointer word after stop,
// which makes a second, later candidate).
bool find_stack_words(const uint64_t* p, uint32_t n, uint64_t inside, Found& f) {
  for (uint32_t i = 1; i + 1 < n; ++i) {
    const uint64_t htop = p[i], stop = p[i + 1];
    if (!aligned(htop) || !aligned(stop) || htop <= inside || stop < htop) continue;
    for (uint32_t j = i + 2; j + 1 < n; ++j) {
      const uint64_t heap = p[j], hend = p[j + 1];
      if (!aligned(heap) || !aligned(hend) || heap > inside || hend < stop ||
          hend - heap >= (uint64_t{1} << 40))
        continue;
      f.p_htop = i;
      f.p_stop = i + 1;
      f.p_heap = j;
      f.p_hend = j + 1;
      return true;
    }
  }
  return false;
}

}  // namespace

namespace {

// What one candidate block says, as a map for the Erlang side.
ERL_NIF_TERM candidate_term(ErlNifEnv* env, const Found& f) {
  auto u = [env](uint32_t v) { return enif_make_uint(env, v); };
  std::vector<ERL_NIF_TERM> cps;
  for (const uint64_t cp : f.cps) cps.push_back(enif_make_uint64(env, cp));
  return MapBuilder()
      .put(atoms.key, u(f.key))
      .put(atoms.sd_env, u(f.sd_env))
      .put(atoms.sd_process, u(f.sd_process))
      .put(atoms.sd_shadow, f.sd_shadow ? u(*f.sd_shadow) : atoms.undefined)
      .put(atoms.env_proc, u(f.env_proc))
      .put(atoms.p_current, u(f.p_current))
      .put(atoms.p_htop, u(f.p_htop))
      .put(atoms.p_stop, u(f.p_stop))
      .put(atoms.p_heap, u(f.p_heap))
      .put(atoms.p_hend, u(f.p_hend))
      .put(atoms.cps, enif_make_list_from_array(env, cps.data(), static_cast<unsigned>(cps.size())))
      .build(env);
}

// The rest of a candidate, once its block, process and current function
// are known: the dirty shadow, the env's process word, the return
// addresses on the stack. False when the env does not point back.
bool complete(Found& f, const uint64_t* sd, uint32_t sd_words, const uint64_t* proc, uint64_t env,
              uint64_t pid) {
  for (uint32_t s = 0; s < sd_words; ++s)
    if (s != f.sd_process && sd[s] != sd[f.sd_process] && first_word(sd[s]) == pid) f.sd_shadow = s;
  uint64_t envw[kBlockWords];
  const uint32_t en = read_words(env, envw, kBlockWords);
  bool env_found = false;
  for (uint32_t i = 0; i < en && !env_found; ++i) {
    if (envw[i] == sd[f.sd_process] || (f.sd_shadow && envw[i] == sd[*f.sd_shadow])) {
      f.env_proc = i;
      env_found = true;
    }
  }
  if (!env_found) return false;
  const uint64_t heap = proc[f.p_heap], stop = proc[f.p_stop], hend = proc[f.p_hend];
  uint64_t stack[kStackWords];
  const uint64_t room = (hend - stop) / 8;
  const uint32_t sn =
      read_words(stop, stack, room < kStackWords ? static_cast<uint32_t>(room) : kStackWords);
  for (uint32_t i = 0; i < sn && f.cps.size() < MI_CONTEXT_MAX_CPS; ++i)
    if (stack[i] != 0 && (stack[i] & 3) == 0 && !(stack[i] >= heap && stack[i] < hend))
      f.cps.push_back(stack[i]);
  return true;
}

}  // namespace

ERL_NIF_TERM ectx_probe(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  int arity = 0;
  const ERL_NIF_TERM* elems = nullptr;
  if (!enif_get_tuple(env, argv[0], &arity, &elems)) throw BadArg{};
  ErlNifPid self;
  if (enif_self(env, &self) == nullptr) return error_tuple(env, atoms.no_process);
  const uint64_t pid = static_cast<uint64_t>(self.pid);
  const uint64_t me = reinterpret_cast<uint64_t>(env);
  const uint64_t module = atoms.mallocinfo_nif;
  const uint64_t names[] = {atoms.ectx_probe, atoms.ectx_probe_dirty};
  const uint64_t inside = static_cast<uint64_t>(argv[0]) & ~uint64_t{3};
  // Every block that holds this call's env and a pointer to this process
  // is a candidate (a normal scheduler's thread-progress data is one, 7
  // words into its scheduler data): the Erlang side keeps the one both
  // kinds of scheduler share.
  std::vector<ERL_NIF_TERM> found;
  uint64_t sd[kBlockWords], proc[kProcWords];
  for (uint32_t k = 0; k < kKeys; ++k) {
    const uint64_t block = reinterpret_cast<uint64_t>(::pthread_getspecific(k));
    const uint32_t n = read_words(block, sd, kBlockWords);
    for (uint32_t e = 0; e < n; ++e) {
      if (sd[e] != me) continue;
      for (uint32_t pw = 0; pw < n; ++pw) {
        if (pw == e || first_word(sd[pw]) != pid) continue;
        const uint32_t pn = read_words(sd[pw], proc, kProcWords);
        for (uint32_t c = 1; c < pn; ++c) {
          // The current function: three words equal to this NIF's MFA.
          uint64_t mfa[3];
          if (!aligned(proc[c]) || read_words(proc[c], mfa, 3) != 3 || mfa[0] != module ||
              (mfa[1] != names[0] && mfa[1] != names[1]) || mfa[2] != 1)
            continue;
          Found f;
          if (!find_stack_words(proc, pn, inside, f)) continue;
          f.key = k;
          f.sd_env = e;
          f.sd_process = pw;
          f.p_current = c;
          if (complete(f, sd, n, proc, me, pid)) found.push_back(candidate_term(env, f));
          break;
        }
      }
    }
  }
  if (found.empty()) return error_tuple(env, atoms.not_found);
  return enif_make_tuple2(
      env, atoms.ok,
      MapBuilder()
          .put(atoms.pid, static_cast<ERL_NIF_TERM>(pid))
          .put(atoms.candidates,
               enif_make_list_from_array(env, found.data(), static_cast<unsigned>(found.size())))
          .build(env));
}

ERL_NIF_TERM ectx_enable(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  if (!enif_is_map(env, argv[0])) throw BadArg{};
  auto field = [env, &argv](ERL_NIF_TERM name) {
    ERL_NIF_TERM v;
    if (!enif_get_map_value(env, argv[0], name, &v)) throw BadArg{};
    const uint64_t x = get_u64(env, v);
    if (x > UINT32_MAX) throw BadArg{};
    return static_cast<uint32_t>(x);
  };
  mi_erlang_layout l{};
  l.version = MI_ERLANG_LAYOUT_VERSION;
  l.key = field(atoms.key);
  l.sd_env = field(atoms.sd_env);
  l.sd_process = field(atoms.sd_process);
  l.sd_shadow = field(atoms.sd_shadow);
  l.env_proc = field(atoms.env_proc);
  l.p_current = field(atoms.p_current);
  l.p_htop = field(atoms.p_htop);
  l.p_stop = field(atoms.p_stop);
  l.p_heap = field(atoms.p_heap);
  l.p_hend = field(atoms.p_hend);
  l.max_cps = field(atoms.max_cps);
  l.scan_words = field(atoms.scan_words);
  const mi_preload_abi* abi = tracker_abi();
  if (abi == nullptr) return error_tuple(env, atoms.not_preloaded);
  if (abi->struct_size < offsetof(mi_preload_abi, erlang_context) + sizeof(abi->erlang_context) ||
      abi->erlang_context == nullptr || abi->erlang_context(&l, sizeof l) != 0)
    return error_tuple(env, atoms.refused);
  return atoms.ok;
}

ERL_NIF_TERM code_names(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const std::vector<uint64_t> addresses = get_u64_list(env, argv[0]);
  const uint64_t atom_count = get_u64(env, argv[1]);
  std::vector<ERL_NIF_TERM> out;
  out.reserve(addresses.size());
  // Atom terms that passed is_atom_term against the VM's atom count are
  // atoms of this VM: they are terms as they stand.
  for (const auto& mfa : mi::symbolize::name_beam_addresses(addresses, {atom_count}))
    out.push_back(mfa ? enif_make_tuple3(env, static_cast<ERL_NIF_TERM>(mfa->module),
                                         static_cast<ERL_NIF_TERM>(mfa->function),
                                         enif_make_uint64(env, mfa->arity))
                      : atoms.none);
  return enif_make_list_from_array(env, out.data(), static_cast<unsigned>(out.size()));
}

ERL_NIF_TERM ectx_atoms(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  raise_atom_bound(get_u64(env, argv[0]));
  return atoms.ok;
}

ERL_NIF_TERM atom_terms(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  unsigned len;
  if (!enif_get_list_length(env, argv[0], &len)) throw BadArg{};
  const mi::symbolize::AtomBound atoms_bound{get_u64(env, argv[1])};
  std::vector<ERL_NIF_TERM> out;
  out.reserve(len);
  ERL_NIF_TERM list = argv[0], head;
  while (enif_get_list_cell(env, list, &head, &list)) {
    int n = 0;
    const ERL_NIF_TERM* t = nullptr;
    if (!enif_get_tuple(env, head, &n, &t) || n != 3) throw BadArg{};
    const uint64_t m = get_u64(env, t[0]), f = get_u64(env, t[1]), a = get_u64(env, t[2]);
    const bool ok = mi::symbolize::is_atom_term(m, atoms_bound) &&
                    mi::symbolize::is_atom_term(f, atoms_bound) && a < 256;
    out.push_back(ok ? enif_make_tuple3(env, static_cast<ERL_NIF_TERM>(m),
                                        static_cast<ERL_NIF_TERM>(f), enif_make_uint64(env, a))
                     : atoms.none);
  }
  return enif_make_list_from_array(env, out.data(), static_cast<unsigned>(out.size()));
}

}  // namespace mi::nif
