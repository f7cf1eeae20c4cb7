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
  uint64_t words[mi::sites::kMaxFrames];
  index_.emplace(id, stacks_.add(words, mi::sites::stack_frames(abi_, id, words)));
}

void StackTerms::resolve(ErlNifEnv* env) {
  mi_abi_status st{};
  abi_->status(&st, sizeof st);
  stacks_.set_native_limit(st.stack_depth);
  stacks_.resolve(env, demangle_);
  std::vector<ERL_NIF_TERM> list;
  terms_.clear();
  erlang_.clear();
  for (size_t i = 0; i < stacks_.size(); ++i) {
    list.clear();
    for (const mi::symbolize::Frame& f : stacks_.frames(i)) list.push_back(frame_term(env, f));
    terms_.push_back(
        enif_make_list_from_array(env, list.data(), static_cast<unsigned>(list.size())));
    erlang_.push_back(stacks_.erlang_term(env, i));
  }
}

}  // namespace mi::nif
