#include "term.h"

#include <cstring>
#include <stdexcept>

#include "../glibc/glibc_introspect.h"

namespace mi::nif {

ERL_NIF_TERM errno_error(ErlNifEnv* env, int err) {
  return error_tuple(env, enif_make_atom(env, mi::glibc::errno_name(err)));
}

ERL_NIF_TERM make_binary(ErlNifEnv* env, std::string_view bytes) {
  ERL_NIF_TERM term;
  unsigned char* dst = enif_make_new_binary(env, bytes.size(), &term);
  if (dst == nullptr) throw std::bad_alloc();
  if (!bytes.empty()) std::memcpy(dst, bytes.data(), bytes.size());
  return term;
}

ERL_NIF_TERM MapBuilder::build(ErlNifEnv* env) {
  ERL_NIF_TERM map;
  if (!enif_make_map_from_arrays(env, keys_.data(), values_.data(), keys_.size(), &map))
    throw std::logic_error("duplicate map key");
  return map;
}

std::string get_path(ErlNifEnv* env, ERL_NIF_TERM t) {
  ErlNifBinary bin;
  if (!enif_inspect_binary(env, t, &bin)) throw BadArg{};
  std::string s(reinterpret_cast<const char*>(bin.data), bin.size);
  if (s.find('\0') != std::string::npos) throw BadArg{};
  return s;
}

uint64_t get_u64(ErlNifEnv* env, ERL_NIF_TERM t) {
  ErlNifUInt64 v;
  if (!enif_get_uint64(env, t, &v)) throw BadArg{};
  return v;
}

std::vector<uint64_t> get_u64_list(ErlNifEnv* env, ERL_NIF_TERM t) {
  unsigned len;
  if (!enif_get_list_length(env, t, &len)) throw BadArg{};
  std::vector<uint64_t> out;
  out.reserve(len);
  ERL_NIF_TERM head;
  while (enif_get_list_cell(env, t, &head, &t)) out.push_back(get_u64(env, head));
  return out;
}

int get_int(ErlNifEnv* env, ERL_NIF_TERM t) {
  int v;
  if (!enif_get_int(env, t, &v)) throw BadArg{};
  return v;
}

std::string get_atom(ErlNifEnv* env, ERL_NIF_TERM t) {
  unsigned len;
  if (!enif_get_atom_length(env, t, &len, ERL_NIF_LATIN1)) throw BadArg{};
  std::string s(len + 1, '\0');
  if (enif_get_atom(env, t, s.data(), len + 1, ERL_NIF_LATIN1) <= 0) throw BadArg{};
  s.resize(len);
  return s;
}

}  // namespace mi::nif
