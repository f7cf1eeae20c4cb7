// ERL_NIF_INIT for mallocinfo_nif: the function table and the lifecycle.
//
// Scheduler choice, per STYLE.md §7: a NIF that locks malloc arenas, waits on
// a child process or touches a file runs on a dirty scheduler; only the O(1)
// constant-returning ones stay on a normal scheduler.
#include <erl_nif.h>

#include "alloc_nif.h"
#include "atoms.h"
#include "erlang_context_nif.h"
#include "glibc_nif.h"
#include "heap_nif.h"
#include "jemalloc_nif.h"
#include "symbolize_nif.h"
#include "tcmalloc_nif.h"
#include "term.h"
#include "trace_context_nif.h"
#include "trace_control_nif.h"
#include "trace_query_nif.h"
#include "trace_regions_nif.h"
#include "tracker_abi.h"

namespace {

using mi::nif::guarded;
namespace n = mi::nif;

constexpr unsigned kCpu = ERL_NIF_DIRTY_JOB_CPU_BOUND;
constexpr unsigned kIo = ERL_NIF_DIRTY_JOB_IO_BOUND;

ErlNifFunc nif_funcs[] = {
    // malloc_info writes a file: filesystem latency is unbounded.
    {"info_file", 1, guarded<n::info_file>, kIo},
    // malloc_info locks every arena in turn and walks all bins.
    {"info_xml", 0, guarded<n::info_xml>, kCpu},
    // Locks every arena and writes to stderr, which may block.
    {"malloc_stats", 0, guarded<n::malloc_stats>, kIo},
    // Forks and waits for the child.
    {"stats_text", 0, guarded<n::stats_text>, kIo},
    // mallinfo2 locks every arena in turn; a busy arena can make it wait.
    {"mallinfo", 0, guarded<n::mallinfo>, kCpu},
    // malloc_trim walks and madvises every arena; reads /proc/self/statm.
    {"trim", 1, guarded<n::trim>, kCpu},
    // mallopt takes the main arena lock.
    {"mallopt", 2, guarded<n::mallopt>, kCpu},
    // Reads /proc/self/statm.
    {"rss", 0, guarded<n::rss>, kIo},
    // Tracker: status sums at most 1024 per-thread counter blocks (~10 us)
    // with no lock and reads /proc/self/pagemap over every table (what
    // each keeps resident: about 0.2 ms at the default sizes, more for
    // larger tables), and until an interposer is found each call looks
    // for one (dlsym, dlopen(RTLD_NOLOAD): the loader's lock, which a slow
    // dlopen holds): dirty I/O.
    {"trace_status", 0, guarded<n::trace_status>, kIo},
    // set_mode(off) and reset walk the whole live table (and reset then
    // runs a reclamation sweep).
    {"trace_set_mode", 1, guarded<n::trace_set_mode>, kCpu},
    {"trace_reset", 0, guarded<n::trace_reset>, kCpu},
    // A whole reclamation sweep: walks the live table and the stack table,
    // and may wait (yielding) for a sweep in progress or pinned readers.
    {"trace_reclaim", 0, guarded<n::trace_reclaim>, kCpu},
    // Snapshot of up to millions of entries, sorting, symbolization (reads
    // ELF files on a cold cache).
    {"trace_olds", 5, guarded<n::trace_olds>, kCpu},
    {"trace_sites", 2, guarded<n::trace_sites>, kCpu},
    // The same snapshot and grouping, every site with raw addresses.
    {"trace_profile", 0, guarded<n::trace_profile>, kCpu},
    {"trace_symbolize", 2, guarded<n::trace_symbolize>, kIo},
    // pprof: the same snapshot and grouping, then every distinct return
    // address symbolized (reads ELF files on a cold cache).
    {"trace_pprof", 2, guarded<n::trace_pprof>, kCpu},
    // Churn: a pass over the churn table (a slot per stack-table slot),
    // grouping by call site (fetches and hashes stacks).
    {"trace_churn", 0, guarded<n::trace_churn>, kCpu},
    // now: one clock read, but finding the interposer may dlopen(RTLD_NOLOAD)
    // (the loader lock) when it is not preloaded.
    {"trace_now", 0, guarded<n::trace_now>, kIo},
    // Growth snapshots: the same walk and grouping as trace_profile (the
    // whole live table), no symbolization.
    {"trace_snapshot", 2, guarded<n::trace_snapshot>, kCpu},
    // Copies the region table, reads /proc/self/smaps (the kernel walks
    // the page tables that exist), runs mincore(2) on mappings regions
    // share (a bounded number of pages) and symbolizes their stacks (ELF
    // reads on a cold cache).
    {"trace_regions", 1, guarded<n::trace_regions>, kIo},
    // attach/detach dlopen the interposer (loader lock, file reads), walk
    // every loaded object's relocations and mprotect RELRO pages: dirty,
    // and I/O because the loader lock can be held by a slow dlopen.
    {"trace_attach", 5, guarded<n::trace_attach>, kIo},
    {"trace_detach", 0, guarded<n::trace_detach>, kIo},
    // The symbolizer's counters: takes its mutex, which a resolve holds
    // while it parses an object's symbol table from disk.
    {"trace_symbolizer_stats", 0, guarded<n::trace_symbolizer_stats>, kIo},
    // The Erlang context's probe must run on each kind of scheduler to
    // learn it: on a normal one it reads a few hundred words through
    // process_vm_readv (well under a millisecond), never a lock.
    {"ectx_probe", 1, guarded<n::ectx_probe>, 0},
    {"ectx_probe_dirty", 1, guarded<n::ectx_probe>, kCpu},
    // Takes the tracker's layout mutex (never held by a hook).
    {"ectx_enable", 1, guarded<n::ectx_enable>, kCpu},
    // Reads /proc/self/maps and code memory.
    {"code_names", 2, guarded<n::code_names>, kIo},
    // A list as long as the caller's: dirty.
    {"atom_terms", 2, guarded<n::atom_terms>, kCpu},
    // One atomic store.
    {"ectx_atoms", 1, guarded<n::ectx_atoms>, 0},
    // Walks the live table, reads /proc/self/maps and code memory.
    {"trace_by_context", 2, guarded<n::trace_by_context>, kCpu},
    // Symbolizes (object files from disk, the symbolizer's mutex) and reads
    // /proc/self/maps.
    {"trace_symbolize_stacks", 2, guarded<n::trace_symbolize_stacks>, kIo},
    // Forks, then waits for the child's walk of every arena and its file
    // writes (seconds on a big heap).
    {"heap_dump", 4, guarded<n::heap_dump>, kIo},
    // Allocator detection: the first call (of this or any call below) runs
    // dlsym/dladdr/dlopen(RTLD_NOLOAD), which take the dynamic loader's lock
    // that another thread's dlopen holds while it reads files and runs
    // constructors: it can wait, so dirty I/O. Later calls read the answer.
    {"allocator", 0, guarded<n::allocator>, kIo},
    // malloc_stats_print locks and merges every arena and formats hundreds
    // of KB of JSON.
    {"jemalloc_stats", 0, guarded<n::jemalloc_stats>, kCpu},
    // Advancing "epoch" merges every arena's statistics under their locks.
    {"jemalloc_summary", 0, guarded<n::jemalloc_summary>, kCpu},
    // mallctl takes ctl_mtx, which a concurrent stats print or epoch
    // refresh holds for as long as it runs.
    {"jemalloc_profile_status", 0, guarded<n::jemalloc_profile_status>, kCpu},
    {"jemalloc_profile_active", 1, guarded<n::jemalloc_profile_active>, kCpu},
    // prof.dump walks every sampled stack and writes a file; then we read
    // it back and remove it.
    {"jemalloc_profile_dump", 1, guarded<n::jemalloc_profile_dump>, kIo},
    // GetStats walks the page heap and every size class under its lock.
    {"tcmalloc_stats", 0, guarded<n::tcmalloc_stats>, kCpu},
    // The heap profiler's lock is held while tcmalloc writes an automatic
    // dump file (HEAP_PROFILE_*_INTERVAL): start, stop and running can wait
    // on file I/O.
    {"tcmalloc_profile_start", 1, guarded<n::tcmalloc_profile_start>, kIo},
    {"tcmalloc_profile_stop", 0, guarded<n::tcmalloc_profile_stop>, kIo},
    {"tcmalloc_profile_running", 0, guarded<n::tcmalloc_profile_running>, kIo},
    // GetHeapProfile formats every allocation bucket under that same lock,
    // which an automatic dump may hold while it writes a file.
    {"tcmalloc_profile_dump", 0, guarded<n::tcmalloc_profile_dump>, kIo},
    // Constant strings: regular scheduler.
    {"version", 0, guarded<n::version>, 0},
    {"libc_version", 0, guarded<n::libc_version>, 0},
};

// The NIF keeps no per-instance state: atoms are global and identical for
// every instance, so load and upgrade just (re)make them, and unload has
// nothing to free. This is what makes load/purge/reload cycles leak-free.
// The interposer, if it is here, is looked for first: from then on every
// call's own allocations are mallocinfo's, never the node's (quiet.h).
int on_load(ErlNifEnv* env, void** priv, ERL_NIF_TERM) {
  n::tracker_abi();
  const n::QuietScope quiet;
  n::make_atoms(env);
  *priv = nullptr;
  return 0;
}

int on_upgrade(ErlNifEnv* env, void** priv, void**, ERL_NIF_TERM) {
  n::tracker_abi();
  const n::QuietScope quiet;
  n::make_atoms(env);
  *priv = nullptr;
  return 0;
}

void on_unload(ErlNifEnv*, void*) {}

}  // namespace

ERL_NIF_INIT(mallocinfo_nif, nif_funcs, on_load, nullptr, on_upgrade, on_unload)
