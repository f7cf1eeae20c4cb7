#include "alloc_nif.h"

#include <dlfcn.h>

#include <utility>

#include "../common/mi_abi.h"
#include "term.h"

namespace mi::nif {

namespace {

ERL_NIF_TERM kind_atom(Kind k) {
  switch (k) {
    case Kind::glibc:
      return atoms.glibc;
    case Kind::jemalloc:
      return atoms.jemalloc;
    case Kind::tcmalloc:
      return atoms.tcmalloc;
    case Kind::mimalloc:
      return atoms.mimalloc;
    default:
      return atoms.unknown;
  }
}

// The object whose malloc the process calls. When that is mallocinfo's
// interposer, the object it forwards to: its dlsym(RTLD_NEXT, "malloc")
// found the first object after it in the global search order that defines
// malloc, and for the objects loaded at start-up that order is the link-map
// order. Walking l_next without the loader's lock is safe on that stretch:
// objects loaded at start-up are never unloaded and dlopen only appends
// after them, and the walk ends at libc (loaded at start-up, after every
// LD_PRELOAD object) at the latest.
link_map* malloc_object() {
  link_map* first = object_of(::dlsym(RTLD_DEFAULT, "malloc"));
  if (first == nullptr || first != object_of(::dlsym(RTLD_DEFAULT, MI_ABI_SYMBOL))) return first;
  for (link_map* next = first->l_next; next != nullptr; next = next->l_next)
    if (Object(next).own("malloc") != nullptr) return next;
  return nullptr;
}

// What the object serving malloc is, by what it exports itself.
Kind kind_of(const Object& o) {
  if (o.map() == nullptr) return Kind::unknown;
  if (o.map() == object_of(::dlsym(RTLD_DEFAULT, "gnu_get_libc_version"))) return Kind::glibc;
  if (o.own("mallctl") != nullptr) return Kind::jemalloc;
  if (o.own("MallocExtension_GetStats") != nullptr || o.own("tc_version") != nullptr)
    return Kind::tcmalloc;
  if (o.own("mi_version") != nullptr) return Kind::mimalloc;
  return Kind::unknown;
}

}  // namespace

link_map* object_of(const void* addr) {
  if (addr == nullptr) return nullptr;
  Dl_info info;
  void* map = nullptr;
  if (::dladdr1(addr, &info, &map, RTLD_DL_LINKMAP) == 0) return nullptr;
  return static_cast<link_map*>(map);
}

Object::Object(link_map* map) : map_(map) {
  if (map == nullptr) return;
  // The main program's link map has an empty name; dlopen(nullptr) is its
  // handle.
  handle_ = map->l_name[0] == '\0' ? ::dlopen(nullptr, RTLD_LAZY)
                                   : ::dlopen(map->l_name, RTLD_LAZY | RTLD_NOLOAD);
}

Object::~Object() {
  if (handle_ != nullptr) ::dlclose(handle_);
}

void* Object::own(const char* name) const {
  if (handle_ == nullptr) return nullptr;
  void* sym = ::dlsym(handle_, name);
  return object_of(sym) == map_ ? sym : nullptr;
}

// Taken once (alloc_nif.h says why that is enough): a thread-safe static.
const Active& detect() {
  static const Active active = [] {
    Object o(malloc_object());
    const Kind k = kind_of(o);
    return Active{k, std::move(o)};
  }();
  return active;
}

ERL_NIF_TERM wrong_allocator(ErlNifEnv* env, Kind k) {
  return error_tuple(env, enif_make_tuple2(env, atoms.wrong_allocator, kind_atom(k)));
}

ERL_NIF_TERM allocator(ErlNifEnv*, int, const ERL_NIF_TERM[]) {
  return kind_atom(detect().kind);
}

}  // namespace mi::nif
