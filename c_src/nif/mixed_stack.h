// Mixed stacks: a recorded stack (native return addresses, then the Erlang
// context of common/mi_context.h) as frames a person reads, for every NIF
// that shows stacks (the tracker's queries, pprof, symbolize_stacks, the
// by-process and by-function views).
//
//   malloc < mi_ctx_leak_here < leak            native, symbolized
//   < mi_ctx_nif:leak/2                         the JIT's frame, or the
//                                               running function (M F A)
//   < mi_ctx_alpha:normal_alpha/2 < ...         the process's return addresses
//                                               (the JIT's own stubs, module
//                                               erts_beamasm, left out)
//   < [thread] async_*                          another thread: its name
//
// An Erlang function is a Frame whose symbol is "module:function/arity"
// and whose object is the module's name ("the module as the file", as
// pprof shows it). Return addresses into the JIT's code are named by their
// function header (symbolize/beam_code.h); the module and function words
// of the running function are atoms of the VM only when their index is
// below the atom count the Erlang side last gave (raise_atom_bound): no
// word is handed to the VM as a term before that check.
//
// Code can be purged and its memory reused: names are made at read time,
// never cached across calls (a purged function reads as another one, or
// as the unnamed "[erlang jit]" frame, never as a crash).
#ifndef MALLOCINFO_NIF_MIXED_STACK_H
#define MALLOCINFO_NIF_MIXED_STACK_H

#include <erl_nif.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../symbolize/beam_code.h"
#include "../symbolize/symbolize.h"

namespace mi::nif {

// The VM's atom count as the Erlang side last read it
// (erlang:system_info(atom_count)). Atoms are never freed, so the bound
// only rises; 0 (never given) names no Erlang function. Thread-safe.
void raise_atom_bound(uint64_t count);
mi::symbolize::AtomBound atom_bound();

// An Erlang function of a mixed stack: two atom terms (immediates, valid in
// any env) and the arity.
struct ErlangFunction {
  ERL_NIF_TERM module, function;
  uint32_t arity;
  bool operator==(const ErlangFunction& o) const {
    return module == o.module && function == o.function && arity == o.arity;
  }
};

// The Erlang function a raw {module, function, arity} of words names, when
// both words are atoms below atom_bound() and the arity is one (< 256).
bool checked_function(const mi::symbolize::BeamMfa& words, ErlangFunction* out);

// "module:function/arity" (atoms as the VM prints them unquoted; a name
// outside Latin-1 reads '?').
std::string function_text(ErlNifEnv* env, const ErlangFunction& f);

// Stacks of one call, resolved in one batch: one symbolizer batch for
// every native address and Erlang return address, one read of
// /proc/self/maps to name the JIT's. One call's; not thread-safe.
// Allocates (std::bad_alloc passes through).
class MixedStacks {
 public:
  // The tracker's stack depth (mi_abi_status.stack_depth): a stack with
  // that many native frames was cut, and its frames say so before the
  // Erlang ones ("[native frames cut at N]"). 0: never said.
  void set_native_limit(uint32_t depth) { native_limit_ = depth; }

  // Queues a stack, its words as the tracker stores them (n of them);
  // returns its index.
  size_t add(const uint64_t* words, uint32_t n);

  // Resolves everything queued.
  void resolve(ErlNifEnv* env, bool demangle);

  // After resolve(): the frames of stack i, innermost first (native, then
  // Erlang, then the thread's name).
  const std::vector<mi::symbolize::Frame>& frames(size_t i) const { return stacks_[i].frames; }
  // The Erlang functions of stack i, innermost first, one per run of
  // equal neighbours (the NIF's own function first when it is known).
  const std::vector<ErlangFunction>& erlang(size_t i) const { return stacks_[i].erlang; }
  // The name of the thread that allocated (not a scheduler's), or "".
  const std::string& thread(size_t i) const { return stacks_[i].thread; }

  // [#{module, function, arity}] of erlang(i).
  ERL_NIF_TERM erlang_term(ErlNifEnv* env, size_t i) const;

  size_t size() const { return stacks_.size(); }

 private:
  struct Stack {
    uint32_t first = 0, native = 0, cps = 0;  // in addresses_: native ones, then cps
    bool has_mfa = false;
    mi::symbolize::BeamMfa mfa{};
    std::string thread;
    std::vector<mi::symbolize::Frame> frames;
    std::vector<ErlangFunction> erlang;
  };
  std::vector<uint64_t> addresses_;
  std::vector<Stack> stacks_;
  uint32_t native_limit_ = 0;
};

// The frame of an Erlang function (address 0 when only its name is known).
mi::symbolize::Frame erlang_frame(ErlNifEnv* env, const ErlangFunction& f, uint64_t address);

}  // namespace mi::nif

#endif
