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

#define MI_ABI_VERSION 1u
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
  uint64_t live_bytes; /* sum of recorded sizes still live */
  uint64_t dropped;    /* allocations that could not be recorded (table full) */
  uint64_t stacks;
  uint64_t stack_capacity;
  uint64_t stack_bytes; /* memory reserved for the stack table */
  uint64_t stacks_dropped;
  uint64_t sample_bytes; /* mean sampling interval */
  uint64_t frees_untracked;
  uint64_t bytes_allocated; /* requested bytes, every recording mode */
  uint64_t bytes_freed;     /* recorded bytes of blocks freed while recorded */
  uint64_t calls[MI_FN_COUNT];
} mi_abi_status;

/* Receives snapshot entries in batches; ctx is the caller's. */
typedef void (*mi_abi_sink)(void* ctx, const mi_abi_entry* entries, size_t n);

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
   * returns the stack's depth (which may exceed max), 0 for an unknown id. */
  uint32_t (*stack)(uint32_t id, uint64_t* frames, uint32_t max);
  /* Forgets every recorded live block; returns how many were forgotten. */
  uint64_t (*reset)(void);
  /* The clock the timestamps use, in ns. */
  uint64_t (*now_ns)(void);
} mi_preload_abi;

typedef const mi_preload_abi* (*mi_preload_abi_fn)(void);

#ifdef __cplusplus
}
#endif

#endif
