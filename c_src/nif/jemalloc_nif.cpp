#include "jemalloc_nif.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "../glibc/atomic_file.h"
#include "alloc_nif.h"
#include "term.h"

namespace mi::nif {

namespace {

class Mallctl {
 public:
  using Fn = int (*)(const char*, void*, size_t*, void*, size_t);
  // `o` is a jemalloc (detect() found its mallctl).
  explicit Mallctl(const Object& o) : fn_(o.fn<Fn>("mallctl")) {}

  // 0 or the errno value mallctl returned (ENOENT: no such name in this
  // build; EINVAL: wrong size).
  template <class T>
  int read(const char* name, T* out) const {
    size_t len = sizeof(T);
    return fn_(name, out, &len, nullptr, 0);
  }
  template <class T>
  int write(const char* name, T value) const {
    return fn_(name, nullptr, nullptr, &value, sizeof value);
  }

 private:
  Fn fn_;
};

// True when the process started with profiling (MALLOC_CONF prof:true);
// otherwise false with *error set to the {error, Reason} to return.
// prof.active and prof.dump answer ENOENT when it did not, which would read
// as a missing file, so ask opt.prof first.
bool profiling_on(ErlNifEnv* env, const Mallctl& ctl, ERL_NIF_TERM* error) {
  bool prof = false;
  const int err = ctl.read("opt.prof", &prof);
  if (err == ENOENT)
    *error = error_tuple(env, atoms.prof_unsupported);
  else if (err != 0)
    *error = errno_error(env, err);
  else if (!prof)
    *error = error_tuple(env, atoms.prof_disabled);
  return err == 0 && prof;
}

// A growable buffer in anonymous mappings. jemalloc calls the stats writer
// from inside the allocator, and its manual warns that such a callback must
// not allocate (deadlock or crash); mmap/mremap are system calls, not malloc.
class MapBuffer {
 public:
  MapBuffer() = default;
  MapBuffer(const MapBuffer&) = delete;
  MapBuffer& operator=(const MapBuffer&) = delete;
  ~MapBuffer() {
    if (data_ != nullptr) ::munmap(data_, cap_);
  }

  // Never throws (it runs inside jemalloc's C frames); a failed growth is
  // remembered and reported by failed().
  void append(const char* s) noexcept {
    const size_t n = std::strlen(s);
    if (failed_ || n == 0) return;
    if (size_ + n > cap_ && !grow(size_ + n)) {
      failed_ = true;
      return;
    }
    std::memcpy(data_ + size_, s, n);
    size_ += n;
  }
  bool failed() const { return failed_; }
  std::string_view view() const { return {data_, size_}; }

 private:
  bool grow(size_t need) noexcept {
    size_t cap = cap_ == 0 ? size_t{1} << 16 : cap_;
    while (cap < need) cap *= 2;
    void* p = data_ == nullptr
                  ? ::mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                  : ::mremap(data_, cap_, cap, MREMAP_MAYMOVE);
    if (p == MAP_FAILED) return false;
    data_ = static_cast<char*>(p);
    cap_ = cap;
    return true;
  }

  char* data_ = nullptr;
  size_t size_ = 0, cap_ = 0;
  bool failed_ = false;
};

// A directory only this process's user can enter (mkdtemp: mode 0700, a
// name nobody can predict), removed with its contents when it goes out of
// scope. A dump written there cannot be redirected by a planted symlink or
// collide with a concurrent caller's.
class PrivateDir {
 public:
  PrivateDir() = default;
  PrivateDir(const PrivateDir&) = delete;
  PrivateDir& operator=(const PrivateDir&) = delete;
  ~PrivateDir() {
    if (path_.empty()) return;
    if (DIR* d = ::opendir(path_.c_str())) {
      while (const dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
          ::unlinkat(::dirfd(d), e->d_name, 0);
      ::closedir(d);
    }
    ::rmdir(path_.c_str());
  }

  // 0 or errno. `base` must exist.
  int make(const std::string& base) {
    std::string templ = base + "/mallocinfo-jeprof-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) return errno;
    path_ = std::move(templ);
    return 0;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

ERL_NIF_TERM size_term(ErlNifEnv* env, size_t v) {
  return enif_make_uint64(env, v);
}

}  // namespace

ERL_NIF_TERM jemalloc_stats(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  const Active& a = detect();
  if (a.kind != Kind::jemalloc) return wrong_allocator(env, a.kind);
  using PrintFn = void (*)(void (*)(void*, const char*), void*, const char*);
  const auto print = a.object.fn<PrintFn>("malloc_stats_print");
  if (print == nullptr) return errno_error(env, ENOSYS);
  MapBuffer buf;
  print([](void* b, const char* s) { static_cast<MapBuffer*>(b)->append(s); }, &buf, "J");
  if (buf.failed()) throw std::bad_alloc();
  return enif_make_tuple2(env, atoms.ok, make_binary(env, buf.view()));
}

ERL_NIF_TERM jemalloc_summary(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  const Active& a = detect();
  if (a.kind != Kind::jemalloc) return wrong_allocator(env, a.kind);
  const Mallctl ctl(a.object);
  // The stats.* values are a snapshot taken when the epoch last advanced:
  // advance it first, or they are as old as the previous reader left them.
  int err = ctl.write("epoch", uint64_t{1});
  const struct {
    const char* name;
    ERL_NIF_TERM key;
  } fields[] = {{"stats.allocated", atoms.allocated}, {"stats.active", atoms.active},
                {"stats.resident", atoms.resident},   {"stats.mapped", atoms.mapped},
                {"stats.retained", atoms.retained},   {"stats.metadata", atoms.metadata}};
  MapBuilder map;
  for (const auto& f : fields) {
    size_t v = 0;
    if (err == 0) err = ctl.read(f.name, &v);
    map.put(f.key, size_term(env, v));
  }
  if (err == ENOENT) return error_tuple(env, atoms.stats_disabled);
  if (err != 0) return errno_error(env, err);
  return enif_make_tuple2(env, atoms.ok, map.build(env));
}

ERL_NIF_TERM jemalloc_profile_status(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  const Active& a = detect();
  if (a.kind != Kind::jemalloc) return wrong_allocator(env, a.kind);
  const Mallctl ctl(a.object);
  bool prof = false, active = false, init = false;
  size_t lg_sample = 0;
  int err = ctl.read("opt.prof", &prof);
  if (err == ENOENT) return error_tuple(env, atoms.prof_unsupported);
  if (err == 0) err = ctl.read("prof.active", &active);
  if (err == 0) err = ctl.read("prof.thread_active_init", &init);
  // prof.lg_sample is the rate in force (prof.reset can change it), but it
  // is set up only when profiling is on; otherwise show the option.
  if (err == 0) err = ctl.read(prof ? "prof.lg_sample" : "opt.lg_prof_sample", &lg_sample);
  if (err != 0) return errno_error(env, err);
  return MapBuilder()
      .put(atoms.prof, make_bool(prof))
      .put(atoms.active, make_bool(active))
      .put(atoms.thread_active_init, make_bool(init))
      .put(atoms.lg_sample, size_term(env, lg_sample))
      .build(env);
}

ERL_NIF_TERM jemalloc_profile_active(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  bool on;
  if (enif_is_identical(argv[0], atoms.true_))
    on = true;
  else if (enif_is_identical(argv[0], atoms.false_))
    on = false;
  else
    throw BadArg{};
  const Active& a = detect();
  if (a.kind != Kind::jemalloc) return wrong_allocator(env, a.kind);
  const Mallctl ctl(a.object);
  ERL_NIF_TERM error;
  if (!profiling_on(env, ctl, &error)) return error;
  const int err = ctl.write("prof.active", on);
  return err == 0 ? atoms.ok : errno_error(env, err);
}

ERL_NIF_TERM jemalloc_profile_dump(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const std::string base = get_path(env, argv[0]);
  const Active& a = detect();
  if (a.kind != Kind::jemalloc) return wrong_allocator(env, a.kind);
  const Mallctl ctl(a.object);
  ERL_NIF_TERM error;
  if (!profiling_on(env, ctl, &error)) return error;
  PrivateDir dir;
  int err = dir.make(base);
  if (err != 0) return errno_error(env, err);
  const std::string file = dir.path() + "/heap.prof";
  // jemalloc serialises dumps itself; each caller has its own file.
  err = ctl.write("prof.dump", file.c_str());
  std::string profile;
  if (err == 0) err = mi::file::read_file(file, profile);
  if (err != 0) return errno_error(env, err);
  return enif_make_tuple2(env, atoms.ok, make_binary(env, profile));
}

}  // namespace mi::nif
