// NIF bodies for the Erlang context of native allocations (issue 25).
//
// The tracker reads, inside its hooks, a few words of the VM's scheduler
// data and of the running process (track/erlang_context.h). Where those
// words are is not exported by the VM (OTP 29's beam.smp exports nothing
// but the NIF and driver API), so this NIF learns it from a context it
// controls: its own call. ectx_probe, called once on a normal and once on a
// dirty scheduler through known Erlang functions, finds the thread-specific
// block that holds this call's env, in it the running process (whose first
// word is enif_self's pid) and, in the process, the current function
// (three words equal to this NIF's own module, name and arity) and the
// heap and stack pointers (consistent with the tuple it is given, which is
// on the caller's heap). Every unknown pointer is read with
// process_vm_readv, so a wrong guess is an error, never a crash. The Erlang
// side (mallocinfo_trace_context) checks that both probes agree and that
// the return addresses found name the caller's stack as the VM itself does
// (process_info current_stacktrace), then ectx_enable hands the layout to
// the tracker.
#ifndef MALLOCINFO_NIF_ERLANG_CONTEXT_NIF_H
#define MALLOCINFO_NIF_ERLANG_CONTEXT_NIF_H

#include <erl_nif.h>

namespace mi::nif {

// ectx_probe(Tuple) -> {ok, #{pid, candidates => [#{key, sd_env,
// sd_process, sd_shadow, env_proc, p_current, p_htop, p_stop, p_heap,
// p_hend, cps}]}} | {error, not_found | no_process}: every thread-specific
// block that holds this call's env and a process pointer that checks out.
// Tuple must be built at run time (a literal is not on the heap).
// sd_shadow is undefined where the block has none (a normal scheduler).
// Registered twice: ectx_probe (normal scheduler) and ectx_probe_dirty
// (dirty CPU).
ERL_NIF_TERM ectx_probe(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// ectx_enable(LayoutMap) -> ok | {error, not_preloaded | refused}: the
// layout (ectx_probe's keys) to the tracker.
ERL_NIF_TERM ectx_enable(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
// code_names([Address], AtomCount) -> [{Module, Function, Arity} | none]:
// Erlang code addresses named by their function header
// (symbolize/beam_code.h); AtomCount is erlang:system_info(atom_count).
ERL_NIF_TERM code_names(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

// ectx_atoms(AtomCount) -> ok: the VM's atom count as the Erlang side
// read it (erlang:system_info(atom_count)), the bound below which recorded
// words are named as atoms (mixed_stack.h raise_atom_bound). The caller
// must pass a count the VM had: a larger one would let a word that is no
// atom through as a term (mallocinfo_trace_context:refresh/0 is the one
// caller).
ERL_NIF_TERM ectx_atoms(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

// atom_terms([{ModuleWord, FunctionWord, Arity}], AtomCount) ->
// [{Module, Function, Arity} | none]: raw words of a recorded context as
// terms, each word checked to be an atom of this VM first (a word that is
// not is never handed to the VM as a term).
ERL_NIF_TERM atom_terms(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace mi::nif

#endif
