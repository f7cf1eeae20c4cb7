// The tracker's ABI (common/mi_abi.h) as the NIF finds and checks it, for
// every NIF area that reads the interposer (the tracker's NIFs, the heap
// map): where the interposer is (preloaded, or dlopen()ed by attach(), also
// before this NIF was last loaded), whether it records, which optional
// blocks of the struct it has, reading stack ids that keep their meaning,
// and the recording modes as atoms.
//
// The interposer is looked for at call time: without it every query
// returns {error, not_preloaded}. Finding it also makes every later NIF
// call quiet (quiet.h): on_load looks first. A failed lookup does not
// stick (attach() may come later, and tests load and unload the NIF).
// Everything here is thread-safe; nothing allocates but where it says so
// (and the bodies given to the templates, which may).
#ifndef MALLOCINFO_NIF_TRACKER_ABI_H
#define MALLOCINFO_NIF_TRACKER_ABI_H

#include <erl_nif.h>

#include <cstddef>
#include <cstdint>

#include "../common/mi_abi.h"
#include "atoms.h"
#include "term.h"

namespace mi::nif {

// The interposer's ABI when it is in this process (preloaded, or attached,
// also before this NIF was last loaded), checked (version, size), else
// nullptr. Cheap once found; until then each call runs dlsym and
// dlopen(RTLD_NOLOAD) (the loader's lock: callers run dirty), allocating
// the library's path.
const mi_preload_abi* tracker_abi();

// The interposer's ABI when it is in this process and keeps a live table
// (mode sample or full), else nullptr. tracker_abi() plus one status read.
const mi_preload_abi* recording_tracker();

// True when `abi` (from tracker_abi()) is the preloaded interposer
// (LD_PRELOAD), false when it was attached.
bool is_preloaded(const mi_preload_abi* abi);

// For attach(). The preloaded interposer's checked ABI, looked up now
// (dlsym), or nullptr.
const mi_preload_abi* preloaded_abi();

// For attach(). The interposer beside this NIF (priv/), dlopen()ed
// RTLD_LOCAL (loaded when it is not yet), checked, with the attach block;
// nullptr when it cannot be loaded (dlerror() says why) or does not fit.
// Never closed: its hooks may run on any thread. Allocates the path.
const mi_preload_abi* load_interposer();

// For attach(), once the interposer's attach() succeeded: tracker_abi()
// returns `abi` from then on. Never allocates.
void remember_attached(const mi_preload_abi* abi);

// {error, not_preloaded}
ERL_NIF_TERM not_preloaded(ErlNifEnv* env);

// The ABI of an interposer that records in this process, with its status
// in *st; or nullptr with *error set to {error, not_preloaded |
// not_recording}: an empty answer from a process that records nothing
// would read as "no leak".
const mi_preload_abi* recording_abi(ErlNifEnv* env, ERL_NIF_TERM* error, mi_abi_status* st);

// Runs body(abi, status) when an interposer records in this process
// (recording_abi), and returns what it returns; its {error,
// not_preloaded | not_recording} otherwise.
template <class F>
ERL_NIF_TERM when_recording(ErlNifEnv* env, F&& body) {
  ERL_NIF_TERM error;
  mi_abi_status status;
  const mi_preload_abi* abi = recording_abi(env, &error, &status);
  return abi == nullptr ? error : body(abi, status);
}

// Runs body(st) (which reads stack ids from a snapshot and looks them up
// later) until no stack id it used can have been reused for another stack
// meanwhile: fewer than stack_generations sweeps completed since st was
// read (see mi_abi.h). Thousands of sweeps during one read are needed to
// fail once; after three failures, {error, eagain}. body may run up to
// three times: it must build its answer afresh each time.
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

// Whether the interposer has reclamation (mi_preload_abi.reclaim and the
// status fields after calls[]): not one preloaded from an older build.
bool has_reclaim(const mi_preload_abi* abi);

// Whether the interposer has the region block (regions, region_status).
bool has_regions(const mi_preload_abi* abi);

// Whether the interposer keeps churn (mi_preload_abi.churn, issue 26).
bool has_churn(const mi_preload_abi* abi);

// Whether the interposer says what its tables keep resident
// (mi_preload_abi.resident).
bool has_resident(const mi_preload_abi* abi);

// The atom of a recording mode: full, sample, counters, or off (also for
// a value this NIF does not know).
ERL_NIF_TERM mode_atom(uint32_t mode);

// The MI_MODE_* of full, sample, counters or off; throws BadArg for any
// other term (guarded<>: badarg).
uint32_t decode_mode(ERL_NIF_TERM t);

}  // namespace mi::nif

#endif
