// NIF bodies for the glibc introspection API (module mallocinfo).
// Each is wrapped by guarded<> in nif.cpp; the scheduler for each is chosen
// there, beside the function table.
#ifndef MALLOCINFO_NIF_GLIBC_NIF_H
#define MALLOCINFO_NIF_GLIBC_NIF_H

#include <erl_nif.h>

#include "../glibc/glibc_introspect.h"

namespace mi::nif {

// The map mallinfo/0 returns, for any Mallinfo (also one taken elsewhere).
ERL_NIF_TERM mallinfo_term(ErlNifEnv* env, const mi::glibc::Mallinfo& m);

ERL_NIF_TERM info_file(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM info_xml(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM malloc_stats(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM stats_text(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM mallinfo(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM trim(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM mallopt(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM rss(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM version(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM libc_version(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace mi::nif

#endif
