#include "mixed_stack.h"

#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "../common/mi_context.h"
#include "atoms.h"
#include "stack_terms.h"
#include "term.h"

namespace mi::nif {

namespace {

std::atomic<uint64_t> g_atom_bound{0};

// The JIT's frames the symbolizer could not name otherwise (no perf map).
bool unnamed_jit(const mi::symbolize::Frame& f) {
  return !f.symbol && f.object == mi::symbolize::kErlangJit;
}

std::string atom_text(ErlNifEnv* env, ERL_NIF_TERM atom) {
  char buf[256];
  const int n = enif_get_atom(env, atom, buf, sizeof buf, ERL_NIF_LATIN1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n - 1)) : std::string("?");
}

}  // namespace

void raise_atom_bound(uint64_t count) {
  uint64_t seen = g_atom_bound.load(std::memory_order_relaxed);
  while (count > seen &&
         !g_atom_bound.compare_exchange_weak(seen, count, std::memory_order_relaxed)) {
  }
}

mi::symbolize::AtomBound atom_bound() {
  return {g_atom_bound.load(std::memory_order_relaxed)};
}

bool checked_function(const mi::symbolize::BeamMfa& words, ErlangFunction* out) {
  const mi::symbolize::AtomBound bound = atom_bound();
  if (!mi::symbolize::is_atom_term(words.module, bound) ||
      !mi::symbolize::is_atom_term(words.function, bound) || words.arity > 255)
    return false;
  // Checked against the VM's atom count: these words are atoms as they
  // stand (immediates), so they are terms in any env.
  *out =
      ErlangFunction{static_cast<ERL_NIF_TERM>(words.module),
                     static_cast<ERL_NIF_TERM>(words.function), static_cast<uint32_t>(words.arity)};
  return true;
}

std::string function_text(ErlNifEnv* env, const ErlangFunction& f) {
  return atom_text(env, f.module) + ":" + atom_text(env, f.function) + "/" +
         std::to_string(f.arity);
}

mi::symbolize::Frame erlang_frame(ErlNifEnv* env, const ErlangFunction& f, uint64_t address) {
  mi::symbolize::Frame frame;
  frame.address = address;
  frame.object = atom_text(env, f.module);
  frame.symbol = function_text(env, f);
  return frame;
}

size_t MixedStacks::add(const uint64_t* words, uint32_t n) {
  Stack s;
  mi_context ctx;
  s.first = static_cast<uint32_t>(addresses_.size());
  s.native = mi_context_split(words, n, &ctx);
  addresses_.insert(addresses_.end(), words, words + s.native);
  if (ctx.kind == MI_CONTEXT_PROCESS) {
    s.has_mfa = ctx.mfa == 3;
    if (s.has_mfa) s.mfa = {ctx.words[0], ctx.words[1], ctx.words[2]};
    s.cps = ctx.cps;
    addresses_.insert(addresses_.end(), ctx.words + ctx.mfa, ctx.words + ctx.mfa + ctx.cps);
  } else if (ctx.kind == MI_CONTEXT_THREAD && ctx.names == 2) {
    char name[17] = {};
    __builtin_memcpy(name, ctx.words, 16);
    s.thread = name;  // up to its NUL
  }
  stacks_.push_back(std::move(s));
  return stacks_.size() - 1;
}

void MixedStacks::resolve(ErlNifEnv* env, bool demangle) {
  // Each distinct address once (stacks share most of theirs).
  std::vector<uint64_t> distinct(addresses_);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const std::vector<mi::symbolize::Frame> frames = symbolizer().resolve_all(distinct, demangle);
  std::vector<const mi::symbolize::Frame*> resolved(addresses_.size());
  for (size_t i = 0; i < addresses_.size(); ++i)
    resolved[i] = &frames[static_cast<size_t>(
        std::lower_bound(distinct.begin(), distinct.end(), addresses_[i]) - distinct.begin())];
  // The JIT's addresses, named in one batch (one read of /proc/self/maps);
  // the Erlang return addresses are the JIT's too.
  std::vector<uint64_t> jit;
  std::unordered_map<uint64_t, size_t> jit_at;
  for (const Stack& s : stacks_)
    for (uint32_t i = s.first; i < s.first + s.native + s.cps; ++i)
      if (unnamed_jit(*resolved[i]) && jit_at.emplace(addresses_[i], jit.size()).second)
        jit.push_back(addresses_[i]);
  const std::vector<std::optional<mi::symbolize::BeamMfa>> names =
      mi::symbolize::name_beam_addresses(jit, atom_bound());

  auto named = [&](uint32_t i, ErlangFunction* f) {
    if (!unnamed_jit(*resolved[i])) return false;
    const std::optional<mi::symbolize::BeamMfa>& m = names[jit_at.at(addresses_[i])];
    return m && checked_function(*m, f);
  };
  for (Stack& s : stacks_) {
    s.frames.clear();
    s.erlang.clear();
    auto add_erlang = [&](const ErlangFunction& f, uint64_t address) {
      // erts_beamasm: the JIT's stubs (normal_exit/0 ends every process's
      // stack), not code of the node's.
      if (f.module == atoms.erts_beamasm) return;
      if (!s.erlang.empty() && s.erlang.back() == f) return;
      s.erlang.push_back(f);
      s.frames.push_back(erlang_frame(env, f, address));
    };
    ErlangFunction f;
    for (uint32_t i = s.first; i < s.first + s.native; ++i) {
      if (named(i, &f))
        add_erlang(f, addresses_[i]);
      else
        s.frames.push_back(*resolved[i]);
    }
    const bool has_context = s.has_mfa || s.cps != 0 || !s.thread.empty();
    if (native_limit_ != 0 && s.native >= native_limit_ && has_context) {
      mi::symbolize::Frame cut;
      cut.object = "[truncated]";
      cut.symbol = "[native frames cut at " + std::to_string(native_limit_) + "]";
      s.frames.push_back(std::move(cut));
    }
    if (s.has_mfa && checked_function(s.mfa, &f)) add_erlang(f, 0);
    for (uint32_t i = s.first + s.native; i < s.first + s.native + s.cps; ++i) {
      if (named(i, &f))
        add_erlang(f, addresses_[i]);
      else
        s.frames.push_back(*resolved[i]);
    }
    if (!s.thread.empty()) {
      mi::symbolize::Frame t;
      t.object = "[thread]";
      t.symbol = s.thread;
      s.frames.push_back(std::move(t));
    }
  }
}

ERL_NIF_TERM MixedStacks::erlang_term(ErlNifEnv* env, size_t i) const {
  std::vector<ERL_NIF_TERM> list;
  list.reserve(stacks_[i].erlang.size());
  for (const ErlangFunction& f : stacks_[i].erlang)
    list.push_back(MapBuilder()
                       .put(atoms.module, f.module)
                       .put(atoms.function, f.function)
                       .put(atoms.arity, enif_make_uint(env, f.arity))
                       .build(env));
  return enif_make_list_from_array(env, list.data(), static_cast<unsigned>(list.size()));
}

}  // namespace mi::nif
