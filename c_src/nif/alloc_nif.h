// Which allocator serves this process's malloc (mallocinfo:allocator/0),
// and the detection the jemalloc and tcmalloc NIFs (jemalloc_nif.h,
// tcmalloc_nif.h) share.
//
// The NIF links neither allocator. The shared object that serves the
// process's malloc is found once, on first use (looking through
// mallocinfo's own interposer, which forwards to the next one), and kept:
// the malloc a process calls is fixed when it starts (a late dlopen adds
// symbols to the global scope but never changes it; tested), and objects
// loaded at start-up are never unloaded. Each allocator function is taken
// from that object's own symbols with dlsym, so a jemalloc or tcmalloc that
// was dlopen()ed late, or that a library carries privately, is never
// mistaken for the active allocator.
//
// Contracts: thread-safe; detect() may allocate and may wait on the dynamic
// loader's lock (its first call, and Object's dlopen/dlsym every time): the
// NIFs that use it run on dirty schedulers (nif.cpp, beside the table).
#ifndef MALLOCINFO_NIF_ALLOC_NIF_H
#define MALLOCINFO_NIF_ALLOC_NIF_H

#include <erl_nif.h>
#include <link.h>

#include <utility>

namespace mi::nif {

enum class Kind { glibc, jemalloc, tcmalloc, mimalloc, unknown };

// The loaded object whose mapping contains `addr`, or nullptr.
link_map* object_of(const void* addr);

// A counted reference to one already loaded object (RTLD_NOLOAD never loads
// anything), through which that object's own symbols are looked up.
class Object {
 public:
  explicit Object(link_map* map);
  Object(Object&& o) noexcept : map_(o.map_), handle_(std::exchange(o.handle_, nullptr)) {}
  Object(const Object&) = delete;
  Object& operator=(const Object&) = delete;
  Object& operator=(Object&&) = delete;
  ~Object();

  link_map* map() const { return map_; }

  // This object's own definition of `name`, or nullptr. dlsym on a handle
  // also searches the object's dependencies: a libjemalloc user that is not
  // itself an allocator must not be taken for one.
  void* own(const char* name) const;

  template <class Fn>
  Fn fn(const char* name) const {
    return reinterpret_cast<Fn>(own(name));
  }

 private:
  link_map* map_;
  void* handle_ = nullptr;
};

struct Active {
  Kind kind;
  Object object;
};

// Which allocator serves malloc, with a reference to its object; computed
// on the first call (a concurrent first call waits for it), then free.
const Active& detect();

// {error, {wrong_allocator, Kind}}.
ERL_NIF_TERM wrong_allocator(ErlNifEnv* env, Kind k);

// glibc | jemalloc | tcmalloc | mimalloc | unknown.
ERL_NIF_TERM allocator(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace mi::nif

#endif
