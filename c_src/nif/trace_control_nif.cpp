// The tracker's control NIFs (mallocinfo_trace): status, mode, reset,
// reclaim, attach and detach. Contracts in trace_control_nif.h.
#include "trace_control_nif.h"

#include <dlfcn.h>
#include <errno.h>

#include <cstddef>
#include <cstring>

#include "../common/mi_abi.h"
#include "../common/mi_limits.h"
#include "atoms.h"
#include "quiet.h"
#include "term.h"
#include "tracker_abi.h"

namespace mi::nif {

namespace {

// status()'s `mappings': the region table and the mmap family's counters
// (r: the interposer's region status).
ERL_NIF_TERM mappings_term(ErlNifEnv* env, const mi_abi_region_status& r) {
  return MapBuilder()
      .put(atoms.regions, make_u64(env, r.regions))
      .put(atoms.bytes, make_u64(env, r.bytes))
      .put(atoms.table_capacity, make_u64(env, r.capacity))
      .put(atoms.table_bytes, make_u64(env, r.table_bytes))
      .put(atoms.dropped, make_u64(env, r.dropped))
      .put(atoms.calls, MapBuilder()
                            .put(atoms.calls_mmap, make_u64(env, r.calls_mmap))
                            .put(atoms.calls_munmap, make_u64(env, r.calls_munmap))
                            .put(atoms.calls_mremap, make_u64(env, r.calls_mremap))
                            .build(env))
      .put(atoms.bytes_mapped, make_u64(env, r.bytes_mapped))
      .put(atoms.bytes_unmapped, make_u64(env, r.bytes_unmapped))
      .build(env);
}

// status()'s `self': what mallocinfo's own work allocated (s) and mapped
// (r), left out of every other figure (quiet.h).
ERL_NIF_TERM self_term(ErlNifEnv* env, const mi_abi_status& s, const mi_abi_region_status& r) {
  return MapBuilder()
      .put(atoms.calls, make_u64(env, s.self_calls))
      .put(atoms.bytes, make_u64(env, s.self_bytes))
      .put(atoms.mmaps, make_u64(env, r.self_mmaps))
      .put(atoms.bytes_mapped, make_u64(env, r.self_bytes_mapped))
      .build(env);
}

// attach()'s errno as an atom: the ones attach can meet (mprotect, mmap),
// einval for any other.
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

// status()'s `tables_resident': what each table keeps resident; undefined
// from an interposer that does not say.
ERL_NIF_TERM tables_resident_term(ErlNifEnv* env, const mi_preload_abi* abi) {
  if (!has_resident(abi)) return atoms.undefined;
  mi_abi_resident r{};
  abi->resident(&r, sizeof r);
  return MapBuilder()
      .put(atoms.live, make_u64(env, r.live))
      .put(atoms.stacks, make_u64(env, r.stacks))
      .put(atoms.churn, make_u64(env, r.churn))
      .put(atoms.threads, make_u64(env, r.threads))
      .build(env);
}

}  // namespace

ERL_NIF_TERM trace_status(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  const mi_preload_abi* abi = tracker_abi();
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
  for (int i = 0; i < MI_FN_COUNT; ++i) calls.put(*fn_atoms[i], make_u64(env, s.calls[i]));
  // One read of the region block serves `mappings' and `self' (each
  // undefined from an interposer without its block).
  const bool regions = has_regions(abi);
  mi_abi_region_status r{};
  if (regions) abi->region_status(&r, sizeof r);
  const bool preloaded = is_preloaded(abi);
  mi_attach_status at{};
  if (!preloaded) abi->attach_status(&at, sizeof at);
  return MapBuilder()
      .put(atoms.preloaded, make_bool(preloaded))
      .put(atoms.attached, make_bool(at.attached != 0))
      .put(atoms.attached_at,
           at.ever != 0 ? make_u64(env, at.attached_at_unix_ns / 1000000) : atoms.undefined)
      .put(atoms.attach, preloaded ? atoms.undefined
                                   : MapBuilder()
                                         .put(atoms.objects, make_u64(env, at.objects))
                                         .put(atoms.slots, make_u64(env, at.slots))
                                         .put(atoms.slots_foreign, make_u64(env, at.slots_foreign))
                                         .put(atoms.data_pointers, make_u64(env, at.data_pointers))
                                         .put(atoms.attach_us, make_u64(env, at.attach_ns / 1000))
                                         .build(env))
      .put(atoms.recording, make_bool(s.recording != 0))
      .put(atoms.mode, mode_atom(s.mode))
      .put(atoms.table_capacity, make_u64(env, s.table_capacity))
      .put(atoms.table_bytes, make_u64(env, s.table_bytes))
      .put(atoms.live_entries, make_u64(env, s.live_entries))
      .put(atoms.live_bytes, make_u64(env, s.live_bytes))
      .put(atoms.dropped, make_u64(env, s.dropped))
      .put(atoms.stacks, make_u64(env, s.stacks))
      .put(atoms.stack_capacity, make_u64(env, s.stack_capacity))
      .put(atoms.stack_bytes, make_u64(env, s.stack_bytes))
      .put(atoms.tables_bytes, make_u64(env, s.tables_bytes))
      .put(atoms.tables_resident, tables_resident_term(env, abi))
      .put(atoms.stacks_dropped, make_u64(env, s.stacks_dropped))
      .put(atoms.stacks_reclaimed, make_u64(env, s.stacks_reclaimed))
      .put(atoms.stack_sweeps, make_u64(env, s.stack_sweeps))
      .put(atoms.stack_depth, make_u64(env, s.stack_depth))
      .put(atoms.sample_bytes, make_u64(env, s.sample_bytes))
      .put(atoms.unwinder, s.unwinder != 0 ? atoms.cached : atoms.libunwind)
      .put(atoms.frees_untracked, make_u64(env, s.frees_untracked))
      .put(atoms.bytes_allocated, make_u64(env, s.bytes_allocated))
      .put(atoms.bytes_freed, make_u64(env, s.bytes_freed))
      .put(atoms.calls, calls.build(env))
      .put(atoms.mappings, regions ? mappings_term(env, r) : atoms.undefined)
      .put(atoms.self, regions && has_quiet(abi) ? self_term(env, s, r) : atoms.undefined)
      .put(atoms.erlang_context, s.erlang_context != 0 ? atoms.on : atoms.off)
      .build(env);
}

ERL_NIF_TERM trace_set_mode(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const uint32_t mode = decode_mode(argv[0]);
  const mi_preload_abi* abi = tracker_abi();
  if (abi == nullptr) return not_preloaded(env);
  // The interposer refuses only when this executable is not recording.
  if (abi->set_mode(mode) != 0) return error_tuple(env, atoms.not_recording);
  return atoms.ok;
}

ERL_NIF_TERM trace_reset(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status&) {
    return enif_make_tuple2(env, atoms.ok, make_u64(env, abi->reset()));
  });
}

ERL_NIF_TERM trace_reclaim(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return when_recording(env, [&](const mi_preload_abi* abi, const mi_abi_status&) {
    // An interposer from before reclamation (preloaded from an older build).
    if (!has_reclaim(abi)) return error_tuple(env, atoms.enotsup);
    return enif_make_tuple2(env, atoms.ok, make_u64(env, abi->reclaim()));
  });
}

// attach(Mode, SampleBytes, TableSize, StackTableSize, StackDepth), each
// validated by mallocinfo_trace.
ERL_NIF_TERM trace_attach(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  mi_attach_config cfg{};
  cfg.mode = decode_mode(argv[0]);
  // Attaching in mode off would hook every call to record nothing.
  if (cfg.mode == MI_MODE_OFF) throw BadArg{};
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
  if (preloaded_abi() != nullptr) return error_tuple(env, atoms.preloaded);
  const mi_preload_abi* abi = load_interposer();
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
      remember_attached(abi);
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
  const mi_preload_abi* abi = tracker_abi();
  if (abi == nullptr || is_preloaded(abi) || abi->detach() != 0)
    return error_tuple(env, atoms.not_attached);
  return atoms.ok;
}

}  // namespace mi::nif
