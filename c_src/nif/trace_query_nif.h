// NIF bodies that read the allocation tracker's live table (module
// mallocinfo_trace): the oldest blocks, the sites, the heap profiles and
// growth snapshots, each one pass over the table through the interposer's
// ABI (tracker_abi.h), blocks grouped by call site (sites/site_group.h).
// Without a recording interposer each returns {error, not_preloaded |
// not_recording}; when stack ids were reused during three reads in a row,
// {error, eagain}. Symbolization happens here, never in the interposer.
// Thread-safe; they allocate (std::bad_alloc: {error, enomem} through
// guarded<>); all walk the table: dirty schedulers (nif/nif.cpp).
#ifndef MALLOCINFO_NIF_TRACE_QUERY_NIF_H
#define MALLOCINFO_NIF_TRACE_QUERY_NIF_H

#include <erl_nif.h>

namespace mi::nif {

// olds(N, MinAgeMs, MinSize, Demangle, MaxAgeMs) -> {ok, [#{address, size,
// age_ms, stack, estimated}]}: the N oldest live blocks whose age lies in
// [MinAgeMs, MaxAgeMs], of at least MinSize bytes, oldest first.
ERL_NIF_TERM trace_olds(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// sites(N, Demangle) -> {ok, [#{stack, count, bytes, oldest_age_ms,
// estimated}]}: the N largest sites by bytes; only their stacks are
// symbolized, in one batch.
ERL_NIF_TERM trace_sites(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// {ok, [{Count, Bytes, [ReturnAddress]}]}: every live site with frames,
// raw addresses, largest first.
ERL_NIF_TERM trace_profile(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// pprof(Demangle, SinceNs) -> {ok, #{mode, sample_bytes, now_ns, churn, sites =>
// [{Count, Bytes, AllocCount, AllocBytes, [LocationId]}], locations => [{Address, Object, Symbol |
// undefined, ObjectOffset}]}}: every live site (allocated at or after
// SinceNs, 0 for all), largest first, stacks innermost first as 1-based
// positions in `locations' (each distinct return address once, symbolized).
ERL_NIF_TERM trace_pprof(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// churn() -> {ok, Mode, ElapsedMs, [{AllocatedCount, AllocatedBytes, FreedCount,
// FreedBytes, TemporaryCount, LifetimesTuple, Estimated, FramesBinary}]}:
// every call site's churn since start or reset, ElapsedMs ago
// (sites/churn_group.h),
// unordered, frames packed as snapshot's; {error, enotsup} from an
// interposer without churn.
ERL_NIF_TERM trace_churn(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// {ok, NowNs}: the tracker's clock, which block timestamps use.
ERL_NIF_TERM trace_now(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// snapshot(OldsN, MaxAgeMs) -> {ok, {Mode, NowNs, [{Count, Bytes, Estimated,
// FramesBinary}], [{Address, Size, AgeMs, Estimated, FramesBinary}]}}: every
// live site, raw addresses packed as native 64-bit words, and the OldsN
// oldest blocks no older than MaxAgeMs, oldest first, from the same pass
// over the table (mallocinfo_trace:snapshot/1).
ERL_NIF_TERM trace_snapshot(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace mi::nif

#endif
