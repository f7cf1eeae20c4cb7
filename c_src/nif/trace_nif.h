// NIF bodies for the allocation tracker API (module mallocinfo_trace).
// They read the interposer through its versioned ABI (common/mi_abi.h),
// found with dlsym at call time; without the interposer every call but
// status returns {error, not_preloaded}. Symbolization happens here, never
// in the interposer.
#ifndef MALLOCINFO_NIF_TRACE_NIF_H
#define MALLOCINFO_NIF_TRACE_NIF_H

#include <erl_nif.h>

namespace mi::nif {

ERL_NIF_TERM trace_status(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM trace_set_mode(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM trace_reset(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM trace_olds(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM trace_sites(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// {ok, [{Count, Bytes, [ReturnAddress]}]}: every live site, raw addresses.
ERL_NIF_TERM trace_profile(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM trace_symbolize(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace mi::nif

#endif
