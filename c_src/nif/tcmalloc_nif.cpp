#include "tcmalloc_nif.h"

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "alloc_nif.h"
#include "term.h"

namespace mi::nif {

namespace {

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
