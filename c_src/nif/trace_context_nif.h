// NIF bodies of the tracker's Erlang views (issue 25): the live blocks by
// the process that allocated them and by the Erlang function that drove
// the allocation, and packed stacks of the Erlang side's snapshots turned
// into mixed stacks (mixed_stack.h). Every body here walks the live table
// or reads /proc/self/maps and other processes' code: dirty CPU.
#ifndef MALLOCINFO_NIF_TRACE_CONTEXT_NIF_H
#define MALLOCINFO_NIF_TRACE_CONTEXT_NIF_H

#include <erl_nif.h>

namespace mi::nif {

// trace_by_context(N, process | erlang_function | site_process) ->
//   {ok, Rows, {CountWithout, BytesWithout}} | {error, not_preloaded |
//   not_recording | eagain}
// Rows, the N largest by bytes, largest first:
//   process:          [{Pid, Count, Bytes, Estimated}]
//   erlang_function:  [{{Module, Function, Arity}, Count, Bytes, Estimated}]
//   site_process:     [{Packed, Pid, Count, Bytes, Estimated}]: a call site
//                     (its stack's raw words, as snapshot rows pack them)
//                     and a process's blocks from it (which processes hold
//                     a native function's memory)
// A block's function is the innermost Erlang function below the one that
// was running (the caller of a NIF: the first named return address on the
// process's stack), or the running function when the stack has no other.
// Blocks without that context (other threads, no process, recorded before
// the context was on) are summed in the last element. Sampled blocks count
// as the blocks they stand for (common/mi_sampling.h).
ERL_NIF_TERM trace_by_context(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

// trace_symbolize_stacks([Packed], Demangle) -> [{Frames, Erlang, Thread}]:
// each packed stack (a snapshot's raw words, native 64-bit) as its mixed
// frames (maps as in sites/1), its Erlang functions ([#{module, function,
// arity}], innermost first) and the allocating thread's name (a binary) or
// undefined. One batch: the symbolizer and /proc/self/maps once.
ERL_NIF_TERM trace_symbolize_stacks(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace mi::nif

#endif
