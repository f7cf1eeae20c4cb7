// Symbolized stacks as Erlang terms, for every NIF that shows stacks (the
// tracker's queries and regions, the heap map's site labels, symbolize/2):
// the process-wide symbolizer, one frame's map, and a batch of a few stack
// ids symbolized together.
#ifndef MALLOCINFO_NIF_STACK_TERMS_H
#define MALLOCINFO_NIF_STACK_TERMS_H

#include <erl_nif.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "../common/mi_abi.h"
#include "../symbolize/symbolize.h"
#include "mixed_stack.h"

namespace mi::nif {

// The process-wide symbolizer: its caches (objects' symbol tables, the
// address cache, the JIT's perf map) outlive single calls. Thread-safe
// (the symbolizer locks); made on first use.
mi::symbolize::Symbolizer& symbolizer();

// #{address, object, symbol => Name | undefined, offset}: offset from the
// symbol when there is one, else from the object's start. Allocates terms
// in env; throws std::bad_alloc.
ERL_NIF_TERM frame_term(ErlNifEnv* env, const mi::symbolize::Frame& f);

// Symbolized stacks of a few ids, resolved in one batch: the symbolizer
// reads /proc/self/maps and the JIT's perf map once per batch rather than
// once per frame (per frame, a sites(20) through Erlang code re-read a
// perf map of a few MB some 600 times: seconds). Stacks are mixed
// (mixed_stack.h): their Erlang context follows the native frames. One
// call's; not thread-safe. Allocates (std::bad_alloc passes through).
class StackTerms {
 public:
  StackTerms(const mi_preload_abi* abi, bool demangle) : abi_(abi), demangle_(demangle) {}

  // Queues stack `id` (its frames are read now; id 0, or one unknown,
  // has none). Call before resolve(); a repeated id is queued once.
  void want(uint32_t id);

  // Symbolizes every queued stack and makes their terms in env.
  void resolve(ErlNifEnv* env);

  // The list of frame_term()s of a stack queued by want(), innermost
  // first. Precondition: resolve() ran after want(id).
  ERL_NIF_TERM term(uint32_t id) const { return terms_[index_.at(id)]; }
  // Its Erlang functions, [#{module, function, arity}] innermost first.
  ERL_NIF_TERM erlang(uint32_t id) const { return erlang_[index_.at(id)]; }
  // The name of the thread that allocated (not a scheduler), or "".
  const std::string& thread(uint32_t id) const { return stacks_.thread(index_.at(id)); }

 private:
  const mi_preload_abi* abi_;
  bool demangle_;
  MixedStacks stacks_;
  std::unordered_map<uint32_t, size_t> index_;
  std::vector<ERL_NIF_TERM> terms_, erlang_;
};

}  // namespace mi::nif

#endif
