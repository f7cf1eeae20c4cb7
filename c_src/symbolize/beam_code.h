// Erlang return addresses named without the VM's symbols (issue 25).
//
// Every BEAM function's code, the JIT's as the interpreter's, is preceded
// by its ErtsCodeInfo (OTP's code_ix.h): an op word, a breakpoint word,
// then the function's module atom, function atom and arity, 8-byte
// aligned, the function's first instruction right after. A return address
// into a function therefore lies after that function's header and before
// the next one's: the nearest (atom, atom, arity) triple before it names
// the function. OTP 29's beam.smp exports no lookup (25 and 27 export
// erts_find_function_from_pc, which the tests use as an oracle), and the
// perf map needs +JPperf at start: this works on any running node.
//
// An address in the JIT's shared stubs (before the first function header
// of its mapping) has no name. Code can be purged and its memory reused:
// name addresses soon after they were recorded, and never cache answers
// across requests.
//
// Reads go through a ReadMemory function that fails instead of faulting
// (process_vm_readv on this process in the NIF), so a wrong guess never
// crashes the node. Not thread-safe per instance; allocates (a read
// buffer).
#ifndef MALLOCINFO_SYMBOLIZE_BEAM_CODE_H
#define MALLOCINFO_SYMBOLIZE_BEAM_CODE_H

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace mi::symbolize {

// The VM's terms for a function: two atom immediates and the arity.
struct BeamMfa {
  uint64_t module, function, arity;
};

// Copies len bytes at address into out; false when they cannot be read.
using ReadMemory = bool (*)(void* ctx, uint64_t address, void* out, size_t len);

// The VM's atoms: an atom term's index (term >> 6) must be below this for
// the term to name an atom that exists.
struct AtomBound {
  uint64_t count;
};

bool is_atom_term(uint64_t w, AtomBound atoms);

class BeamCodeNamer {
 public:
  BeamCodeNamer(ReadMemory read, void* ctx) : read_(read), ctx_(ctx) {}

  // The function whose code holds `address` (a return address), looking
  // back no further than `floor` (the start of the mapping that holds it)
  // and at most kMaxScan bytes; nullopt when no header is found (a stub,
  // or not BEAM code).
  std::optional<BeamMfa> name(uint64_t address, uint64_t floor, AtomBound atoms);

  static constexpr uint64_t kMaxScan = 16 << 20;

 private:
  ReadMemory read_;
  void* ctx_;
  std::vector<uint64_t> buf_;
};

// A ReadMemory for this process: process_vm_readv on its own pid.
bool read_own_memory(void* ctx, uint64_t address, void* out, size_t len);

// Names each address of this process (Erlang return addresses), in one
// batch: /proc/self/maps is read once; only addresses in the JIT's code (an
// anonymous mapping or the VM's memfd:vmem ones) are scanned, others and
// JIT stubs answer nullopt. Allocates; reads files.
std::vector<std::optional<BeamMfa>> name_beam_addresses(const std::vector<uint64_t>& addresses,
                                                        AtomBound atoms);

}  // namespace mi::symbolize

#endif
