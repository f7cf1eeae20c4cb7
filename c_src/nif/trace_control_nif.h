// NIF bodies that control the allocation tracker (module mallocinfo_trace):
// its status, recording mode, reset, reclamation, and attaching the
// interposer to a running node. They reach the interposer through its
// versioned ABI (tracker_abi.h); without it every call but status and
// attach returns {error, not_preloaded}. Thread-safe (the interposer
// serialises what must be); each may allocate its reply (std::bad_alloc:
// {error, enomem} through guarded<>). Schedulers: nif/nif.cpp.
#ifndef MALLOCINFO_NIF_TRACE_CONTROL_NIF_H
#define MALLOCINFO_NIF_TRACE_CONTROL_NIF_H

#include <erl_nif.h>

namespace mi::nif {

// status() -> #{preloaded, attached, attached_at, recording, mode, ...}:
// the counters of every mode, the tables' sizes, `mappings' and `self'
// (undefined from an interposer without them); without an interposer only
// preloaded, attached, attached_at, recording and mode.
ERL_NIF_TERM trace_status(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// set_mode(full | sample | counters | off) -> ok | {error, not_preloaded |
// not_recording}; any other term: badarg.
ERL_NIF_TERM trace_set_mode(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// reset() -> {ok, BlocksForgotten} | {error, not_preloaded | not_recording}.
ERL_NIF_TERM trace_reset(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// {ok, StacksFreed} | {error, enotsup} (an interposer without reclamation).
ERL_NIF_TERM trace_reclaim(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// attach(Mode, SampleBytes, TableSize, StackTableSize, StackDepth): ok |
// {error, preloaded | already_attached | {unsupported, What} |
// {load_failed, Msg} | Posix}; mode off or a knob out of mi_limits.h's
// range: badarg. detach(): ok | {error, not_attached}.
ERL_NIF_TERM trace_attach(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM trace_detach(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace mi::nif

#endif
