// NIF bodies for the allocation tracker API (module mallocinfo_trace).
// They read the interposer through its versioned ABI (common/mi_abi.h),
// found with dlsym at call time; without the interposer every call but
// status returns {error, not_preloaded}. Symbolization happens here, never
// in the interposer.
#ifndef MALLOCINFO_NIF_TRACE_NIF_H
#define MALLOCINFO_NIF_TRACE_NIF_H

#include <erl_nif.h>

#include "../common/mi_abi.h"
#include "../symbolize/symbolize.h"

namespace mi::nif {

// The process-wide symbolizer (its caches outlive single calls). Thread-safe.
mi::symbolize::Symbolizer& symbolizer();

// The interposer's ABI when it is in this process (preloaded, or attached,
// also before this NIF was last loaded), else nullptr. Finding it also
// makes every later NIF call quiet (quiet.h): on_load calls it first.
// Thread-safe; a failed lookup is tried again next time.
const mi_preload_abi* tracker_abi();

// The interposer's ABI when it is in this process and keeps a live table
// (mode sample or full), else nullptr. Cheap after the first call.
const mi_preload_abi* recording_tracker();

ERL_NIF_TERM trace_status(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM trace_set_mode(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM trace_reset(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// {ok, StacksFreed} | {error, enotsup} (an interposer without reclamation).
ERL_NIF_TERM trace_reclaim(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM trace_olds(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM trace_sites(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// {ok, [{Count, Bytes, [ReturnAddress]}]}: every live site, raw addresses.
ERL_NIF_TERM trace_profile(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// pprof(Demangle, SinceNs) -> {ok, #{mode, sample_bytes, now_ns, sites =>
// [{Count, Bytes, [LocationId]}], locations => [{Address, Object, Symbol |
// undefined, ObjectOffset}]}}: every live site (allocated at or after
// SinceNs, 0 for all), largest first, stacks innermost first as 1-based
// positions in `locations' (each distinct return address once, symbolized).
ERL_NIF_TERM trace_pprof(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// {ok, NowNs}: the tracker's clock, which block timestamps use.
ERL_NIF_TERM trace_now(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM trace_symbolize(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// snapshot(OldsN, MaxAgeMs) -> {ok, {Mode, NowNs, [{Count, Bytes, Estimated,
// FramesBinary}], [{Address, Size, AgeMs, Estimated, FramesBinary}]}}: every
// live site, raw addresses packed as native 64-bit words, and the OldsN
// oldest blocks no older than MaxAgeMs, oldest first, from the same pass
// over the table (mallocinfo_trace:snapshot/1).
ERL_NIF_TERM trace_snapshot(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// attach(Mode, SampleBytes, TableSize, StackTableSize, StackDepth): ok |
// {error, preloaded | already_attached | {unsupported, What} |
// {load_failed, Msg} | Posix}. detach(): ok | {error, not_attached}.
ERL_NIF_TERM trace_attach(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM trace_detach(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// regions(Demangle): {ok, [#{start, length, flags, resident, age_ms, stack}]}
// every live region the interposer recorded from the mmap family (issue
// 14), resident bytes from mincore(2); {error, enotsup} from an
// interposer without the region block.
ERL_NIF_TERM trace_regions(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// #{lookups, cache_hits, objects_loaded, rescans, maps_reads, cached_addresses}
ERL_NIF_TERM trace_symbolizer_stats(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace mi::nif

#endif
