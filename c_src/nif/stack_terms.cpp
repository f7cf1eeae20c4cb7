#include "stack_terms.h"

#include "../sites/abi_read.h"
#include "atoms.h"
#include "term.h"

namespace mi::nif {

mi::symbolize::Symbolizer& symbolizer() {
  static mi::symbolize::Symbolizer s;
  return s;
}

ERL_NIF_TERM frame_term(ErlNifEnv* env, const mi::symbolize::Frame& f) {
  return MapBuilder()
      .put(atoms.address, make_u64(env, f.address))
      .put(atoms.object, make_binary(env, f.object))
      .put(atoms.symbol, f.symbol ? make_binary(env, *f.symbol) : atoms.undefined)
      .put(atoms.offset, make_u64(env, f.symbol ? f.symbol_offset : f.object_offset))
      .build(env);
}

void StackTerms::want(uint32_t id) {
  if (index_.count(id) != 0) return;
  Span span{static_cast<uint32_t>(addresses_.size()), 0};
  uint64_t frames[mi::sites::kMaxFrames];
  span.n = mi::sites::stack_frames(abi_, id, frames);
  addresses_.insert(addresses_.end(), frames, frames + span.n);
  index_.emplace(id, spans_.size());
  spans_.push_back(span);
}

void StackTerms::resolve(ErlNifEnv* env) {
  const std::vector<mi::symbolize::Frame> frames = symbolizer().resolve_all(addresses_, demangle_);
  std::vector<ERL_NIF_TERM> list;
  terms_.clear();
  for (const Span& sp : spans_) {
    list.clear();
    for (uint32_t i = 0; i < sp.n; ++i) list.push_back(frame_term(env, frames[sp.first + i]));
    terms_.push_back(enif_make_list_from_array(env, list.data(), sp.n));
  }
}

}  // namespace mi::nif
