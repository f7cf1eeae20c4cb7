// Every atom the NIF returns, made once at load (and again, idempotently, at
// upgrade). Read-only after load, so any scheduler may read it without locks.
// Add an atom by adding one line to MI_ATOMS: X(c_name, "erlang_name").
#ifndef MALLOCINFO_NIF_ATOMS_H
#define MALLOCINFO_NIF_ATOMS_H

#include <erl_nif.h>

#define MI_ATOMS(X)                                 \
  X(ok, "ok")                                       \
  X(error, "error")                                 \
  X(true_, "true")                                  \
  X(false_, "false")                                \
  X(undefined, "undefined")                         \
  X(enomem, "enomem")                               \
  X(mallocinfo_error, "mallocinfo_error")           \
  /* mallinfo2 */                                   \
  X(arena, "arena")                                 \
  X(ordblks, "ordblks")                             \
  X(smblks, "smblks")                               \
  X(hblks, "hblks")                                 \
  X(hblkhd, "hblkhd")                               \
  X(usmblks, "usmblks")                             \
  X(fsmblks, "fsmblks")                             \
  X(uordblks, "uordblks")                           \
  X(fordblks, "fordblks")                           \
  X(keepcost, "keepcost")                           \
  /* trim */                                        \
  X(released, "released")                           \
  X(rss_before, "rss_before")                       \
  X(rss_after, "rss_after")                         \
  /* tracker status */                              \
  X(not_preloaded, "not_preloaded")                 \
  X(not_recording, "not_recording")                 \
  X(preloaded, "preloaded")                         \
  X(recording, "recording")                         \
  X(mode, "mode")                                   \
  X(full, "full")                                   \
  X(sample, "sample")                               \
  X(counters, "counters")                           \
  X(off, "off")                                     \
  X(table_capacity, "table_capacity")               \
  X(table_bytes, "table_bytes")                     \
  X(live_entries, "live_entries")                   \
  X(live_bytes, "live_bytes")                       \
  X(dropped, "dropped")                             \
  X(stacks, "stacks")                               \
  X(stack_capacity, "stack_capacity")               \
  X(stack_bytes, "stack_bytes")                     \
  X(tables_bytes, "tables_bytes")                   \
  X(tables_resident, "tables_resident")             \
  X(live, "live")                                   \
  X(threads, "threads")                             \
  X(stacks_dropped, "stacks_dropped")               \
  X(stacks_reclaimed, "stacks_reclaimed")           \
  X(stack_sweeps, "stack_sweeps")                   \
  X(enotsup, "enotsup")                             \
  X(eagain, "eagain")                               \
  /* symbolizer counters */                         \
  X(lookups, "lookups")                             \
  X(cache_hits, "cache_hits")                       \
  X(objects_loaded, "objects_loaded")               \
  X(rescans, "rescans")                             \
  X(maps_reads, "maps_reads")                       \
  X(cached_addresses, "cached_addresses")           \
  X(stack_depth, "stack_depth")                     \
  X(sample_bytes, "sample_bytes")                   \
  X(unwinder, "unwinder")                           \
  X(cached, "cached")                               \
  X(libunwind, "libunwind")                         \
  X(frees_untracked, "frees_untracked")             \
  X(bytes_allocated, "bytes_allocated")             \
  X(bytes_freed, "bytes_freed")                     \
  X(calls, "calls")                                 \
  /* interposed functions, in enum mi_fn order */   \
  X(fn_malloc, "malloc")                            \
  X(fn_calloc, "calloc")                            \
  X(fn_realloc, "realloc")                          \
  X(fn_reallocarray, "reallocarray")                \
  X(fn_free, "free")                                \
  X(fn_posix_memalign, "posix_memalign")            \
  X(fn_aligned_alloc, "aligned_alloc")              \
  X(fn_memalign, "memalign")                        \
  X(fn_valloc, "valloc")                            \
  X(fn_pvalloc, "pvalloc")                          \
  X(fn_strdup, "strdup")                            \
  X(fn_strndup, "strndup")                          \
  /* olds, sites, frames */                         \
  X(address, "address")                             \
  X(size, "size")                                   \
  X(age_ms, "age_ms")                               \
  X(stack, "stack")                                 \
  X(count, "count")                                 \
  X(bytes, "bytes")                                 \
  X(oldest_age_ms, "oldest_age_ms")                 \
  X(estimated, "estimated")                         \
  X(object, "object")                               \
  X(symbol, "symbol")                               \
  X(offset, "offset")                               \
  /* heap map */                                    \
  X(arenas, "arenas")                               \
  X(system_bytes, "system_bytes")                   \
  X(in_use_bytes, "in_use_bytes")                   \
  X(free_bytes, "free_bytes")                       \
  X(by_kind, "by_kind")                             \
  X(in_use, "in_use")                               \
  X(free, "free")                                   \
  X(fast, "fast")                                   \
  X(tcache, "tcache")                               \
  X(top, "top")                                     \
  X(meta, "meta")                                   \
  X(chunks, "chunks")                               \
  X(free_chunks, "free_chunks")                     \
  X(largest_free, "largest_free")                   \
  X(resident_bytes, "resident_bytes")               \
  X(trimmable_bytes, "trimmable_bytes")             \
  X(pinned_bytes, "pinned_bytes")                   \
  X(live_chunks, "live_chunks")                     \
  X(unrecorded_bytes, "unrecorded_bytes")           \
  X(segments, "segments")                           \
  X(mmap_chunks, "mmap_chunks")                     \
  X(mmap_bytes, "mmap_bytes")                       \
  X(tracked_mmap_chunks, "tracked_mmap_chunks")     \
  X(tracked_mmap_bytes, "tracked_mmap_bytes")       \
  X(file_bytes, "file_bytes")                       \
  X(tracker, "tracker")                             \
  X(mallinfo, "mallinfo")                           \
  X(info_xml, "info_xml")                           \
  X(walk_ms, "walk_ms")                             \
  X(fork_us, "fork_us")                             \
  X(sites, "sites")                                 \
  X(churn, "churn")                                 \
  /* attach (issue 11) */                           \
  X(attached, "attached")                           \
  X(attached_at, "attached_at")                     \
  X(attach, "attach")                               \
  X(objects, "objects")                             \
  X(slots, "slots")                                 \
  X(slots_foreign, "slots_foreign")                 \
  X(data_pointers, "data_pointers")                 \
  X(attach_us, "attach_us")                         \
  X(already_attached, "already_attached")           \
  X(not_attached, "not_attached")                   \
  X(unsupported, "unsupported")                     \
  X(static_allocator, "static_allocator")           \
  X(elf_layout, "elf_layout")                       \
  X(too_many_slots, "too_many_slots")               \
  X(libc, "libc")                                   \
  X(arch, "arch")                                   \
  X(load_failed, "load_failed")                     \
  X(eacces, "eacces")                               \
  X(eperm, "eperm")                                 \
  X(einval, "einval")                               \
  X(label, "label")                                 \
  X(id, "id")                                       \
  X(timeout, "timeout")                             \
  X(unsupported_glibc, "unsupported_glibc")         \
  X(walk_failed, "walk_failed")                     \
  /* allocators */                                  \
  X(glibc, "glibc")                                 \
  X(jemalloc, "jemalloc")                           \
  X(tcmalloc, "tcmalloc")                           \
  X(mimalloc, "mimalloc")                           \
  X(unknown, "unknown")                             \
  X(wrong_allocator, "wrong_allocator")             \
  X(allocated, "allocated")                         \
  X(active, "active")                               \
  X(resident, "resident")                           \
  X(mapped, "mapped")                               \
  X(retained, "retained")                           \
  X(metadata, "metadata")                           \
  X(prof, "prof")                                   \
  X(thread_active_init, "thread_active_init")       \
  X(lg_sample, "lg_sample")                         \
  X(stats_disabled, "stats_disabled")               \
  X(prof_disabled, "profiling_disabled")            \
  X(prof_unsupported, "profiling_unsupported")      \
  X(profiler_not_loaded, "profiler_not_loaded")     \
  X(not_running, "not_running")                     \
  X(already_running, "already_running")             \
  /* pprof */                                       \
  X(now_ns, "now_ns")                               \
  X(locations, "locations")                         \
  /* mapped memory (issue 14) */                    \
  X(start, "start")                                 \
  X(length, "length")                               \
  X(flags, "flags")                                 \
  X(anonymous, "anonymous")                         \
  X(private_file, "private_file")                   \
  X(shared, "shared")                               \
  X(no_access, "no_access")                         \
  X(remapped, "remapped")                           \
  X(mappings, "mappings")                           \
  X(regions, "regions")                             \
  X(calls_mmap, "mmap")                             \
  X(calls_munmap, "munmap")                         \
  X(calls_mremap, "mremap")                         \
  X(bytes_mapped, "bytes_mapped")                   \
  /* mallocinfo's own work, left out (quiet.h) */   \
  X(self, "self")                                   \
  X(mmaps, "mmaps")                                 \
  /* the Erlang context (erlang_context_nif.cpp) */ \
  X(key, "key")                                     \
  X(erlang_context, "erlang_context")               \
  X(on, "on")                                       \
  X(sd_env, "sd_env")                               \
  X(sd_process, "sd_process")                       \
  X(sd_shadow, "sd_shadow")                         \
  X(env_proc, "env_proc")                           \
  X(p_current, "p_current")                         \
  X(p_htop, "p_htop")                               \
  X(p_stop, "p_stop")                               \
  X(p_heap, "p_heap")                               \
  X(p_hend, "p_hend")                               \
  X(erts_beamasm, "erts_beamasm")                   \
  X(module, "module")                               \
  X(function, "function")                           \
  X(arity, "arity")                                 \
  X(process, "process")                             \
  X(erlang_function, "erlang_function")             \
  X(site_process, "site_process")                   \
  X(erlang, "erlang")                               \
  X(thread, "thread")                               \
  X(pid, "pid")                                     \
  X(cps, "cps")                                     \
  X(candidates, "candidates")                       \
  X(max_cps, "max_cps")                             \
  X(scan_words, "scan_words")                       \
  X(mallocinfo_nif, "mallocinfo_nif")               \
  X(ectx_probe, "ectx_probe")                       \
  X(ectx_probe_dirty, "ectx_probe_dirty")           \
  X(none, "none")                                   \
  X(refused, "refused")                             \
  X(not_found, "not_found")                         \
  X(no_process, "no_process")                       \
  X(env_process, "env_process")                     \
  X(bytes_unmapped, "bytes_unmapped")

namespace mi::nif {

struct Atoms {
#define MI_ATOM_FIELD(name, text) ERL_NIF_TERM name;
  MI_ATOMS(MI_ATOM_FIELD)
#undef MI_ATOM_FIELD
};

extern Atoms atoms;

// Fills `atoms`. Called from the load and upgrade callbacks only.
void make_atoms(ErlNifEnv* env);

}  // namespace mi::nif

#endif
