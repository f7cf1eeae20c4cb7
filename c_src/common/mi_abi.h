/* The one interface between the interposer (libmallocinfo_preload.so) and
 * its readers (the NIF, the stress test).
 *
 * Plain C, POD only. The interposer exports exactly one function,
 * mallocinfo_preload_abi(), returning a pointer to a static, immutable
 * mi_preload_abi. Its first two fields never move: a reader checks
 * abi_version == MI_ABI_VERSION and struct_size >= the size it needs before
 * touching any function pointer. The struct only grows at the end.
 * Nothing is freed across the boundary: readers pass their own buffers or a
 * sink callback.
 *
 * Every function here is thread-safe and may be called from any thread of
 * the process, concurrently with allocations; none may be called from
 * inside a malloc hook. They never allocate through malloc.
 */
#ifndef MALLOCINFO_COMMON_MI_ABI_H
#define MALLOCINFO_COMMON_MI_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 2: mi_abi_entry gained `pid' (its stride changed), the Erlang context. */
#define MI_ABI_VERSION 2u
#define MI_ABI_SYMBOL "mallocinfo_preload_abi"

/* Recording modes (MALLOCINFO_TRACE). */
enum mi_mode {
  MI_MODE_OFF = 0,      /* forward only */
  MI_MODE_COUNTERS = 1, /* count calls and bytes */
  MI_MODE_SAMPLE = 2,   /* + a byte-Poisson sample of live blocks */
  MI_MODE_FULL = 3      /* + every live block */
};

/* Stack capture back ends (mi_abi_status.unwinder). Interposers since
 * issue 15 have only MI_UNWINDER_CACHED (lock-free CFI rules cached per
 * thread); MI_UNWINDER_LIBUNWIND is what older ones report when started with
 * MALLOCINFO_UNWIND=libunwind. */
enum mi_unwinder { MI_UNWINDER_LIBUNWIND = 0, MI_UNWINDER_CACHED = 1 };

/* Interposed functions, the index of their call counters. */
enum mi_fn {
  MI_FN_MALLOC = 0,
  MI_FN_CALLOC,
  MI_FN_REALLOC,
  MI_FN_REALLOCARRAY,
  MI_FN_FREE,
  MI_FN_POSIX_MEMALIGN,
  MI_FN_ALIGNED_ALLOC,
  MI_FN_MEMALIGN,
  MI_FN_VALLOC,
  MI_FN_PVALLOC,
  MI_FN_STRDUP,
  MI_FN_STRNDUP,
  MI_FN_COUNT
};

/* One live block, as read by a snapshot. All fields come from the same
 * allocation (the table's per-slot sequence lock guarantees it). */
typedef struct mi_abi_entry {
  uint64_t address;
  uint64_t size;         /* bytes requested */
  uint64_t timestamp_ns; /* CLOCK_MONOTONIC_COARSE at allocation */
  uint32_t stack_id;     /* 0: no stack (stack table full or capture failed) */
  uint32_t flags;        /* MI_ENTRY_SAMPLED: recorded by the sampler */
  /* The Erlang process running on the allocating scheduler thread, as the
   * VM's pid term (an immediate: never a pointer), or 0 (no Erlang
   * context: another thread, no process, or context not enabled). */
  uint64_t pid;
} mi_abi_entry;

/* The entry was recorded in sample mode: it stands for 1/p(size) blocks,
 * p(n) = 1 - exp(-n / sample_bytes). */
#define MI_ENTRY_SAMPLED 1u

typedef struct mi_abi_status {
  uint32_t mode;      /* enum mi_mode */
  uint32_t recording; /* 1 when this executable matched MALLOCINFO_TRACE_EXE */
  uint32_t stack_depth;
  uint32_t unwinder; /* enum mi_unwinder */
  uint64_t table_capacity;
  uint64_t table_bytes; /* memory reserved for the live table */
  uint64_t live_entries;
  uint64_t live_bytes;     /* sum of recorded sizes still live */
  uint64_t dropped;        /* allocations that could not be recorded (table full) */
  uint64_t stacks;         /* distinct stacks stored now */
  uint64_t stack_capacity; /* a power of two; stack id & (capacity - 1) is its slot */
  uint64_t stack_bytes;    /* memory reserved for the stack table */
  uint64_t stacks_dropped; /* captured stacks that could not be stored (blocks without one) */
  uint64_t sample_bytes;   /* mean sampling interval */
  uint64_t frees_untracked;
  /* Byte counters, cumulative (track/tracker.h says exactly what each mode
   * counts). full: requested bytes of the blocks the table recorded, and
   * of those that left it (freed, or forgotten by reset() or a mode
   * switch), so bytes_allocated - bytes_freed == live_bytes. counters:
   * usable bytes of every call. sample: estimates. */
  uint64_t bytes_allocated;
  uint64_t bytes_freed;
  uint64_t calls[MI_FN_COUNT];
  /* Filled by interposers that have mi_preload_abi.reclaim; older ones
   * copy only the fields above, leaving the caller's zeros. */
  uint64_t stacks_reclaimed;  /* stacks freed because no live block used them */
  uint64_t stack_sweeps;      /* completed reclamation sweeps */
  uint64_t stack_generations; /* a freed slot's ids repeat after this many sweeps */
  /* Filled by interposers that have mi_preload_abi.quiet; older ones leave
   * the caller's zeros. What mallocinfo's own work allocated (threads
   * inside quiet(1)...quiet(0)) while a mode counted: left out of every
   * other figure and never recorded. Exact in full and counters mode; in
   * sample mode, the estimate from the sample points that fell on them. */
  uint64_t self_calls;
  uint64_t self_bytes; /* requested bytes */
  /* 1 once the tracker records the Erlang context (an accepted layout). */
  uint64_t erlang_context;
  /* Filled by interposers that have mi_preload_abi.churn: when churn
   * started counting (start, or the last reset()), on now_ns()'s clock. */
  uint64_t churn_since_ns;
  /* Filled by interposers since the stack table's record pool; older ones
   * leave the caller's zero. What every table of the tracker reserved
   * (live, stack and churn tables, thread states, the region table):
   * MAP_NORESERVE mappings, resident only where written. */
  uint64_t tables_bytes;
} mi_abi_status;

/* resident(): what each of the tracker's tables keeps resident now, in
 * bytes: pages of memory of their own (present and mapped by this process
 * alone, /proc/self/pagemap), so not a page only ever read (the kernel's
 * shared zero page), nor one shared with a forked child while it lives;
 * mincore's count where pagemap cannot be read. */
typedef struct mi_abi_resident {
  uint64_t live;    /* the live table */
  uint64_t stacks;  /* the stack table: slots and records */
  uint64_t churn;   /* the churn rows */
  uint64_t threads; /* the thread states and their unwind caches */
} mi_abi_resident;

/* attach(): the tracker's configuration (the environment knobs' meaning;
 * sizes apply at the first attach of the process only: the tables, once
 * mapped, stay). */
typedef struct mi_attach_config {
  uint32_t mode; /* MI_MODE_COUNTERS, _SAMPLE or _FULL */
  uint32_t stack_depth;
  uint64_t table_capacity;
  uint64_t stack_capacity;
  uint64_t sample_bytes;
} mi_attach_config;

enum mi_attach_rc {
  MI_ATTACH_OK = 0,
  MI_ATTACH_PRELOADED = 1,   /* the library is interposed already */
  MI_ATTACH_UNSUPPORTED = 2, /* `what` names why, `object` which object */
  MI_ATTACH_ERRNO = 3,       /* `err` holds the errno (mprotect, mmap) */
  MI_ATTACH_ALREADY = 4      /* attached already */
};

typedef struct mi_attach_result {
  int32_t rc;       /* enum mi_attach_rc */
  int32_t err;      /* errno for MI_ATTACH_ERRNO */
  char what[32];    /* MI_ATTACH_UNSUPPORTED: static_allocator, elf_layout,
                       too_many_slots, libc, arch */
  char object[224]; /* the object concerned, "" when none */
} mi_attach_result;

typedef struct mi_attach_status {
  uint32_t attached;            /* 1 between a successful attach and detach */
  uint32_t ever;                /* 1 once attach succeeded in this process */
  uint64_t attached_at_unix_ns; /* CLOCK_REALTIME of the last attach */
  uint64_t attached_at_ns;      /* the same instant on now_ns()'s clock */
  /* objects, slots, data_pointers: what holds a hook now, as counted by the
   * last walk of every loaded object (attach, detach, each dlopen while
   * attached); an object unloaded since drops out at the next walk. */
  uint64_t objects;       /* objects with at least one patched slot */
  uint64_t slots;         /* slots holding a hook right now */
  uint64_t slots_foreign; /* slots bound elsewhere: left alone */
  uint64_t data_pointers; /* R_X86_64_64 words holding a hook */
  uint64_t attach_ns;     /* duration of the last attach() */
} mi_attach_status;

/* --- Erlang context (issue 25) ---
 * Where the VM keeps what runs on a scheduler thread, as the NIF learned it
 * from its own calls (word indices, 8-byte words; the NIF checks every one
 * before handing it over). With it, a recorded allocation on a scheduler
 * thread carries the running process's pid (mi_abi_entry.pid) and its
 * stack ends in an Erlang context (mi_context.h): the current function's
 * {Module, Function, Arity} and the first return addresses of its Erlang
 * stack; on other threads, the thread's name. */
#define MI_ERLANG_LAYOUT_VERSION 1u
typedef struct mi_erlang_layout {
  uint32_t version;    /* MI_ERLANG_LAYOUT_VERSION */
  uint32_t key;        /* pthread key whose value is the scheduler data */
  uint32_t sd_process; /* in the scheduler data: the running Process* */
  uint32_t sd_env;     /* in the scheduler data: the running NIF's env, 0 outside one */
  uint32_t sd_shadow;  /* in the scheduler data: a dirty scheduler's shadow
                          process (its pid word is the process's) */
  uint32_t env_proc;   /* in the env: the process (or the dirty shadow) */
  uint32_t p_current;  /* in the Process: ErtsCodeMFA* of the running function */
  uint32_t p_htop;     /* in the Process: heap top */
  uint32_t p_stop;     /* in the Process: stack top (it grows down to here) */
  uint32_t p_heap;     /* in the Process: heap start */
  uint32_t p_hend;     /* in the Process: heap and stack end */
  uint32_t max_cps;    /* Erlang return addresses kept, at most MI_CONTEXT_MAX_CPS */
  uint32_t scan_words; /* stack words read at most to find them */
  uint32_t reserved;
} mi_erlang_layout;

/* --- churn (issue 26): per call site, since start or reset(). ---
 * Lifetime buckets: bucket 0 holds blocks freed within 1 ms of their
 * allocation (in practice: within the tracker's clock resolution, the
 * coarse monotonic clock's tick), bucket k (1 <= k < MI_LIFETIME_BUCKETS
 * - 1) those that lived [2^(k-1), 2^k) ms, the last bucket longer ones. */
#define MI_LIFETIME_BUCKETS 24
/* mi_abi_churn.flags: some of the figures are a sample's estimates. */
#define MI_CHURN_SAMPLED 1u
/* One stack's churn. Blocks count when they enter the live table (so in
 * full mode a block the full table dropped counts nothing) and when they
 * leave it by free or realloc (not when reset() or a mode switch forgets
 * them). Sample mode: every figure is the sum of sampled blocks' weights
 * (common/mi_sampling.h), an unbiased estimate. stack_id 0: the blocks
 * without a stored stack, and the sites whose stacks were reclaimed since
 * (no live block used them and the stack table needed the room). */
typedef struct mi_abi_churn {
  uint32_t stack_id;
  uint32_t flags; /* MI_CHURN_SAMPLED */
  uint64_t allocated_count;
  uint64_t allocated_bytes; /* requested bytes */
  uint64_t freed_count;     /* the sum of lifetimes[] */
  uint64_t freed_bytes;
  /* Freed by the thread that allocated them before it allocated anything
   * else (memray's rule, N = 1: a container's grow-and-copy). */
  uint64_t temporary_count;
  uint64_t lifetimes[MI_LIFETIME_BUCKETS];
} mi_abi_churn;

/* Receives churn rows in batches; ctx is the caller's. */
typedef void (*mi_abi_churn_sink)(void* ctx, const mi_abi_churn* rows, size_t n);

/* Receives snapshot entries in batches; ctx is the caller's. */
typedef void (*mi_abi_sink)(void* ctx, const mi_abi_entry* entries, size_t n);

/* --- mapped memory (issue 14): types of the region block below. --- */
/* Frames kept per recorded region (the stack depth, capped at this). */
#define MI_REGION_FRAMES 64
/* mi_abi_region.flags */
#define MI_REGION_ANONYMOUS 1u    /* MAP_ANONYMOUS */
#define MI_REGION_PRIVATE_FILE 2u /* MAP_PRIVATE of a file */
#define MI_REGION_SHARED 4u       /* MAP_SHARED (anonymous or file): counted, flagged */
#define MI_REGION_NO_ACCESS 8u    /* mapped PROT_NONE (an address-space reservation) */
#define MI_REGION_REMAPPED 16u    /* moved or resized by mremap since */

/* One live mapping made through mmap/mmap64 (or moved there by mremap). */
typedef struct mi_abi_region {
  uint64_t start;
  uint64_t length;       /* bytes, a multiple of the page size */
  uint64_t timestamp_ns; /* now_ns() when it was mapped */
  uint32_t flags;        /* MI_REGION_* */
  uint32_t depth;        /* frames used, innermost first: frames[0] called mmap */
  uint64_t frames[MI_REGION_FRAMES];
} mi_abi_region;

typedef struct mi_abi_region_status {
  uint64_t capacity;    /* regions the table holds at most */
  uint64_t table_bytes; /* memory reserved for it */
  uint64_t regions;     /* live regions now */
  uint64_t bytes;       /* their bytes */
  uint64_t dropped;     /* regions (or split pieces) not recorded: table full */
  uint64_t calls_mmap;  /* mmap + mmap64, every recording mode */
  uint64_t calls_munmap;
  uint64_t calls_mremap;
  uint64_t bytes_mapped;   /* by successful mmap calls, every recording mode */
  uint64_t bytes_unmapped; /* by munmap calls that succeeded */
  /* Filled by interposers that have mi_preload_abi.quiet: mappings made by
   * mallocinfo's own work (never recorded as regions). */
  uint64_t self_mmaps;
  uint64_t self_bytes_mapped;
} mi_abi_region_status;

typedef struct mi_preload_abi {
  uint32_t abi_version;
  uint32_t struct_size;
  /* Fills *out. out_size is sizeof(*out) as the caller knows it; only that
   * many bytes are written. */
  void (*status)(mi_abi_status* out, size_t out_size);
  /* Switches the recording mode; -1 when mode is not an enum mi_mode or the
   * process is not recording (executable did not match). */
  int (*set_mode)(uint32_t mode);
  /* Streams every live entry to sink; returns the number streamed. */
  uint64_t (*snapshot)(mi_abi_sink sink, void* ctx);
  /* Copies stack `id`'s return addresses (innermost first) into frames;
   * returns the stack's depth (which may exceed max), 0 for an unknown id
   * (never stored, or freed since: ids carry a generation). A reader that
   * keeps ids from a snapshot gets each id's own frames or 0 as long as
   * fewer than status.stack_generations sweeps completed meanwhile (it
   * compares stack_sweeps before and after). One call site can have more
   * than one id (two threads storing a new stack at once): readers that
   * group by call site merge ids by their frames. */
  uint32_t (*stack)(uint32_t id, uint64_t* frames, uint32_t max);
  /* Forgets every recorded live block, then frees every stack (as
   * reclaim); returns how many blocks were forgotten. */
  uint64_t (*reset)(void);
  /* The clock the timestamps use, in ns. */
  uint64_t (*now_ns)(void);

  /* --- attach without LD_PRELOAD (issue 11): one contiguous block. ---
   * Present when struct_size reaches past `attach_status`. The library is
   * then dlopen()ed by the NIF (RTLD_LOCAL) instead of preloaded. */
  /* Loads the tracker into this process by rewriting the malloc family's
   * relocation slots of every loaded object (but libc, ld.so, the vdso
   * and this library) and redirecting dlopen. Serialised against detach
   * and other attaches; takes the loader's list lock; never call it from a
   * hook. On failure every slot is as it was. */
  void (*attach)(const struct mi_attach_config* config, size_t config_size,
                 struct mi_attach_result* out, size_t out_size);
  /* Restores every slot attach changed. 0, or -1 when not attached. */
  int (*detach)(void);
  void (*attach_status)(struct mi_attach_status* out, size_t out_size);

  /* --- stack reclamation: check struct_size before use --- */
  /* Frees every stack no live block references (a whole sweep, run by the
   * caller's thread, which also helps a sweep already running to its end).
   * Returns how many stacks were freed. Stacks are otherwise freed by
   * sweeps the hooks run in small steps as the stack table fills. */
  uint64_t (*reclaim)(void);
  /* A hash of stack `id`'s frames (equal frames, equal hash; never 0), or
   * 0 for an unknown id, read from the stack table without copying the
   * frames: readers merging ids by content fetch frames only for ids whose
   * hashes are equal. */
  uint64_t (*stack_hash)(uint32_t id);

  /* --- mapped memory (issue 14): one contiguous block; check struct_size.
   * The regions mapped through the interposed mmap family while the
   * tracker recorded (mode sample or full; counters mode only counts). */
  void (*region_status)(mi_abi_region_status* out, size_t out_size);
  /* Copies up to max live regions into out (one consistent view); returns
   * how many are live, which may exceed max. */
  uint64_t (*regions)(mi_abi_region* out, uint64_t max);

  /* --- mallocinfo's own work (issue 22): check struct_size. ---
   * quiet(1) marks the calling thread as working for mallocinfo (the NIF
   * wraps every call in it) until the matching quiet(0); calls nest.
   * Meanwhile the thread's allocations and mappings are forwarded and
   * counted in self_* instead of being recorded or counted as the node's,
   * and its frees of blocks the table does not hold count nothing. A free
   * of a block the table holds is seen as always (it is the node's). A
   * store to the calling thread's initial-exec TLS: no lock, no malloc;
   * callable from any thread, never from inside a hook. */
  void (*quiet)(int enter);

  /* --- Erlang context (issue 25): check struct_size. ---
   * Hands the tracker the VM's layout (a copy is kept). 0, or -1 when the
   * layout is refused (a word index past what the reader allows, a bad
   * version). The first accepted layout stays: a later one must be equal.
   * Not for hooks; any thread. */
  int (*erlang_context)(const mi_erlang_layout* layout, size_t layout_size);

  /* --- churn (issue 26): check struct_size. ---
   * Streams every stack's churn row (mi_abi_churn, this header's layout) to
   * sink, in batches; returns the number of rows. Rows name stack ids as a
   * snapshot does (same rules for reading their frames). Counters mode
   * counts nothing new; rows from before a switch to it stay until reset.
   * A row has no size of its own: a changed mi_abi_churn needs a new
   * MI_ABI_VERSION. Not for hooks; any thread. */
  uint64_t (*churn)(mi_abi_churn_sink sink, void* ctx);

  /* --- what the tables keep resident (issue 26): check struct_size. ---
   * Fills *out (at most out_size bytes; zeros when nothing records). Reads
   * /proc/self/pagemap over every table: a few hundred microseconds at the
   * default sizes, in proportion to what the tables reserved, so only
   * status() asks, never the cheap checks. Not for hooks; any thread. */
  void (*resident)(mi_abi_resident* out, size_t out_size);
} mi_preload_abi;

typedef const mi_preload_abi* (*mi_preload_abi_fn)(void);

#ifdef __cplusplus
}
#endif

#endif
