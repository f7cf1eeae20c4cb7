#include "glibc_nif.h"

#include <malloc.h>

#include <string>

#include "../common/mi_version.h"
#include "../glibc/glibc_introspect.h"
#include "term.h"

namespace mi::nif {

namespace g = mi::glibc;

ERL_NIF_TERM info_file(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const std::string path = get_path(env, argv[0]);
  const int err = g::write_info_file(path);
  return err == 0 ? atoms.ok : errno_error(env, err);
}

ERL_NIF_TERM info_xml(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  std::string xml;
  if (const int err = g::info_xml(xml)) return errno_error(env, err);
  return enif_make_tuple2(env, atoms.ok, make_binary(env, xml));
}

ERL_NIF_TERM malloc_stats(ErlNifEnv*, int, const ERL_NIF_TERM[]) {
  ::malloc_stats();
  return atoms.ok;
}

ERL_NIF_TERM stats_text(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  std::string text;
  const int err = g::capture_stats(text);
  if (err != 0) return errno_error(env, err);
  return enif_make_tuple2(env, atoms.ok, make_binary(env, text));
}

ERL_NIF_TERM mallinfo_term(ErlNifEnv* env, const g::Mallinfo& m) {
  auto u = [env](uint64_t v) { return enif_make_uint64(env, v); };
  return MapBuilder()
      .put(atoms.arena, u(m.arena))
      .put(atoms.ordblks, u(m.ordblks))
      .put(atoms.smblks, u(m.smblks))
      .put(atoms.hblks, u(m.hblks))
      .put(atoms.hblkhd, u(m.hblkhd))
      .put(atoms.usmblks, u(m.usmblks))
      .put(atoms.fsmblks, u(m.fsmblks))
      .put(atoms.uordblks, u(m.uordblks))
      .put(atoms.fordblks, u(m.fordblks))
      .put(atoms.keepcost, u(m.keepcost))
      .build(env);
}

ERL_NIF_TERM mallinfo(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return mallinfo_term(env, g::read_mallinfo());
}

namespace {
ERL_NIF_TERM rss_term(ErlNifEnv* env) {
  const auto r = g::resident_bytes();
  return r ? enif_make_uint64(env, *r) : atoms.undefined;
}
}  // namespace

ERL_NIF_TERM trim(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const uint64_t pad = get_u64(env, argv[0]);
  const ERL_NIF_TERM before = rss_term(env);
  const bool released = g::trim(static_cast<size_t>(pad));
  const ERL_NIF_TERM after = rss_term(env);
  const ERL_NIF_TERM map = MapBuilder()
                               .put(atoms.released, make_bool(released))
                               .put(atoms.rss_before, before)
                               .put(atoms.rss_after, after)
                               .build(env);
  return enif_make_tuple2(env, atoms.ok, map);
}

ERL_NIF_TERM mallopt(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const auto param = g::param_from_name(get_atom(env, argv[0]));
  if (!param) throw BadArg{};
  const int value = get_int(env, argv[1]);
  const int err = g::set_param(*param, value);
  return err == 0 ? atoms.ok : errno_error(env, err);
}

ERL_NIF_TERM rss(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return rss_term(env);
}

ERL_NIF_TERM version(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return make_binary(env, MALLOCINFO_VERSION);
}

ERL_NIF_TERM libc_version(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return make_binary(env, g::libc_version());
}

}  // namespace mi::nif
