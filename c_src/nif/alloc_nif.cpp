#include "alloc_nif.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include "../common/mi_abi.h"
#include "term.h"

namespace mi::nif {

namespace {

enum class Kind { glibc, jemalloc, tcmalloc, mimalloc, unknown };

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

ERL_NIF_TERM wrong_allocator(ErlNifEnv* env, Kind k) {
  return error_tuple(env, enif_make_tuple2(env, atoms.wrong_allocator, kind_atom(k)));
}

// The loaded object whose mapping contains `addr`, or nullptr.
link_map* object_of(const void* addr) {
  if (addr == nullptr) return nullptr;
  Dl_info info;
  void* map = nullptr;
  if (::dladdr1(addr, &info, &map, RTLD_DL_LINKMAP) == 0) return nullptr;
  return static_cast<link_map*>(map);
}

// A counted reference to one already loaded object (RTLD_NOLOAD never loads
// anything), through which that object's own symbols are looked up.
class Object {
 public:
  explicit Object(link_map* map) : map_(map) {
    if (map == nullptr) return;
    // The main program's link map has an empty name; dlopen(nullptr) is its
    // handle.
    handle_ = map->l_name[0] == '\0' ? ::dlopen(nullptr, RTLD_LAZY)
                                     : ::dlopen(map->l_name, RTLD_LAZY | RTLD_NOLOAD);
  }
  Object(Object&& o) noexcept : map_(o.map_), handle_(std::exchange(o.handle_, nullptr)) {}
  Object(const Object&) = delete;
  Object& operator=(const Object&) = delete;
  Object& operator=(Object&&) = delete;
  ~Object() {
    if (handle_ != nullptr) ::dlclose(handle_);
  }

  link_map* map() const { return map_; }

  // This object's own definition of `name`, or nullptr. dlsym on a handle
  // also searches the object's dependencies: a libjemalloc user that is not
  // itself an allocator must not be taken for one.
  void* own(const char* name) const {
    if (handle_ == nullptr) return nullptr;
    void* sym = ::dlsym(handle_, name);
    return object_of(sym) == map_ ? sym : nullptr;
  }

  template <class Fn>
  Fn fn(const char* name) const {
    return reinterpret_cast<Fn>(own(name));
  }

 private:
  link_map* map_;
  void* handle_ = nullptr;
};

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

struct Active {
  Kind kind;
  Object object;
};

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

// Which allocator serves malloc, with a reference to its object. The
// answer is fixed when the process starts: a late dlopen can add allocator
// symbols to the global scope but never changes the malloc the process
// calls (tested), and objects loaded at start are never unloaded. So it is
// taken once, on first use (a thread-safe static: a concurrent first call
// waits for it), and every later call costs nothing.
const Active& detect() {
  static const Active active = [] {
    Object o(malloc_object());
    const Kind k = kind_of(o);
    return Active{k, std::move(o)};
  }();
  return active;
}

// ---------------------------------------------------------------------------
// jemalloc

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

// The whole file into `out`. 0 or errno.
int read_file(const std::string& path, std::string& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return errno;
  struct stat st;
  int err = ::fstat(fd, &st) == 0 ? 0 : errno;
  if (err == 0) {
    out.clear();
    out.reserve(static_cast<size_t>(st.st_size));
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        out.append(buf, static_cast<size_t>(n));
      } else if (n == 0) {
        break;
      } else if (errno != EINTR) {
        err = errno;
        break;
      }
    }
  }
  ::close(fd);
  return err;
}

ERL_NIF_TERM size_term(ErlNifEnv* env, size_t v) {
  return enif_make_uint64(env, v);
}

// ---------------------------------------------------------------------------
// gperftools

// The heap profiler's entry points in the active tcmalloc; all null when
// the object has none (libtcmalloc_minimal).
struct HeapProfiler {
  using StartFn = void (*)(const char*);
  using StopFn = void (*)();
  using RunningFn = int (*)();
  using GetFn = char* (*)();
  using FreeFn = void (*)(void*);

  explicit HeapProfiler(const Object& o)
      : start(o.fn<StartFn>("HeapProfilerStart")),
        stop(o.fn<StopFn>("HeapProfilerStop")),
        running(o.fn<RunningFn>("IsHeapProfilerRunning")),
        get(o.fn<GetFn>("GetHeapProfile")),
        // GetHeapProfile's string comes from tcmalloc's malloc; free it
        // with tcmalloc's own free, not through an interposer in front.
        free(o.fn<FreeFn>("tc_free") != nullptr ? o.fn<FreeFn>("tc_free") : o.fn<FreeFn>("free")) {}
  bool loaded() const {
    return start != nullptr && stop != nullptr && running != nullptr && get != nullptr &&
           free != nullptr;
  }

  StartFn start;
  StopFn stop;
  RunningFn running;
  GetFn get;
  FreeFn free;
};

// HeapProfilerStart ignores a second start and HeapProfilerStop a second
// stop; serialising our check-then-act makes already_running / not_running
// exact for callers going through this NIF.
std::mutex& profiler_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

ERL_NIF_TERM allocator(ErlNifEnv*, int, const ERL_NIF_TERM[]) {
  return kind_atom(detect().kind);
}

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
  if (err == 0) err = read_file(file, profile);
  if (err != 0) return errno_error(env, err);
  return enif_make_tuple2(env, atoms.ok, make_binary(env, profile));
}

ERL_NIF_TERM tcmalloc_stats(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  const Active& a = detect();
  if (a.kind != Kind::tcmalloc) return wrong_allocator(env, a.kind);
  using GetStatsFn = void (*)(char*, int);
  const auto get_stats = a.object.fn<GetStatsFn>("MallocExtension_GetStats");
  if (get_stats == nullptr) return errno_error(env, ENOSYS);
  // GetStats truncates silently to the buffer it is given (always
  // NUL-terminated): a text that fills it may have been cut, so grow and
  // ask again.
  constexpr size_t kMax = size_t{64} << 20;
  for (size_t size = size_t{64} << 10;; size *= 2) {
    std::string buf(size, '\0');
    get_stats(buf.data(), static_cast<int>(size));
    const size_t n = ::strnlen(buf.data(), size);
    if (n + 1 < size || size >= kMax) {
      buf.resize(n);
      return enif_make_tuple2(env, atoms.ok, make_binary(env, buf));
    }
  }
}

ERL_NIF_TERM tcmalloc_profile_start(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  const std::string prefix = get_path(env, argv[0]);
  const Active& a = detect();
  if (a.kind != Kind::tcmalloc) return wrong_allocator(env, a.kind);
  const HeapProfiler hp(a.object);
  if (!hp.loaded()) return error_tuple(env, atoms.profiler_not_loaded);
  const std::lock_guard<std::mutex> lock(profiler_mutex());
  if (hp.running() != 0) return error_tuple(env, atoms.already_running);
  hp.start(prefix.c_str());
  return atoms.ok;
}

ERL_NIF_TERM tcmalloc_profile_dump(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  const Active& a = detect();
  if (a.kind != Kind::tcmalloc) return wrong_allocator(env, a.kind);
  const HeapProfiler hp(a.object);
  if (!hp.loaded()) return error_tuple(env, atoms.profiler_not_loaded);
  std::string profile;
  {
    const std::lock_guard<std::mutex> lock(profiler_mutex());
    if (hp.running() == 0) return error_tuple(env, atoms.not_running);
    const std::unique_ptr<char, HeapProfiler::FreeFn> text(hp.get(), hp.free);
    if (text == nullptr) return error_tuple(env, atoms.enomem);
    profile.assign(text.get());
  }
  // A profiler stopped behind our back (not through this NIF) gives "".
  if (profile.empty()) return error_tuple(env, atoms.not_running);
  return enif_make_tuple2(env, atoms.ok, make_binary(env, profile));
}

ERL_NIF_TERM tcmalloc_profile_stop(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  const Active& a = detect();
  if (a.kind != Kind::tcmalloc) return wrong_allocator(env, a.kind);
  const HeapProfiler hp(a.object);
  if (!hp.loaded()) return error_tuple(env, atoms.profiler_not_loaded);
  const std::lock_guard<std::mutex> lock(profiler_mutex());
  if (hp.running() == 0) return error_tuple(env, atoms.not_running);
  hp.stop();
  return atoms.ok;
}

ERL_NIF_TERM tcmalloc_profile_running(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  const Active& a = detect();
  if (a.kind != Kind::tcmalloc) return wrong_allocator(env, a.kind);
  const HeapProfiler hp(a.object);
  if (!hp.loaded()) return error_tuple(env, atoms.profiler_not_loaded);
  return make_bool(hp.running() != 0);
}

}  // namespace mi::nif
