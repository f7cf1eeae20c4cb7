// Term helpers and the single try/catch boundary every NIF goes through,
// which also marks the call as mallocinfo's own work (quiet.h).
//
// A NIF body is written as a plain function that decodes its arguments with
// the helpers below (which throw BadArg), calls the core, and encodes the
// result. `guarded<F>` is the only place exceptions are caught:
//   BadArg            -> badarg
//   std::bad_alloc    -> {error, enomem}
//   anything else     -> raises {mallocinfo_error, Message}
// No C++ exception ever reaches the VM. The core libraries (glibc/,
// symbolize/, heapwalk/, sites/, track/) report conditions as status codes,
// which a NIF body turns into {error, Atom} itself (errno_error); the only
// exception they let through is std::bad_alloc from their containers
// (doc/architecture.md, "Errors"). Anything else reaching guarded<> is a
// bug, and raises.
#ifndef MALLOCINFO_NIF_TERM_H
#define MALLOCINFO_NIF_TERM_H

#include <erl_nif.h>

#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "atoms.h"
#include "quiet.h"

namespace mi::nif {

struct BadArg {};

using NifFn = ERL_NIF_TERM (*)(ErlNifEnv*, int, const ERL_NIF_TERM[]);

// {error, Reason}
inline ERL_NIF_TERM error_tuple(ErlNifEnv* env, ERL_NIF_TERM reason) {
  return enif_make_tuple2(env, atoms.error, reason);
}

// {error, enoent} for ENOENT. Errno names form a small closed set, so making
// the atom here cannot grow the atom table without bound.
ERL_NIF_TERM errno_error(ErlNifEnv* env, int err);

inline ERL_NIF_TERM make_bool(bool b) {
  return b ? atoms.true_ : atoms.false_;
}

ERL_NIF_TERM make_binary(ErlNifEnv* env, std::string_view bytes);

inline ERL_NIF_TERM make_u64(ErlNifEnv* env, uint64_t v) {
  return enif_make_uint64(env, v);
}

// Decoders: throw BadArg when the term is not of the expected type.
std::string get_path(ErlNifEnv* env, ERL_NIF_TERM t);  // binary without NUL bytes
uint64_t get_u64(ErlNifEnv* env, ERL_NIF_TERM t);
std::vector<uint64_t> get_u64_list(ErlNifEnv* env, ERL_NIF_TERM t);  // a proper list
int get_int(ErlNifEnv* env, ERL_NIF_TERM t);
std::string get_atom(ErlNifEnv* env, ERL_NIF_TERM t);

// Builds a map from key/value pairs. Throws std::logic_error on a duplicate
// key (a programming error, reported as an exception term).
class MapBuilder {
 public:
  MapBuilder& put(ERL_NIF_TERM key, ERL_NIF_TERM value) {
    keys_.push_back(key);
    values_.push_back(value);
    return *this;
  }
  ERL_NIF_TERM build(ErlNifEnv* env);

 private:
  std::vector<ERL_NIF_TERM> keys_, values_;
};

template <NifFn F>
ERL_NIF_TERM guarded(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) noexcept {
  // Whatever the call allocates is mallocinfo's, never the node's (quiet.h).
  const QuietScope quiet;
  try {
    return F(env, argc, argv);
  } catch (const BadArg&) {
    return enif_make_badarg(env);
  } catch (const std::bad_alloc&) {
    return error_tuple(env, atoms.enomem);
  } catch (const std::exception& e) {
    return enif_raise_exception(
        env, enif_make_tuple2(env, atoms.mallocinfo_error, make_binary(env, e.what())));
  } catch (...) {
    return enif_raise_exception(env, atoms.mallocinfo_error);
  }
}

}  // namespace mi::nif

#endif
