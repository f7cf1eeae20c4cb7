// Address -> (object path, symbol, offset), for the NIF side only.
//
// Never linked into the interposer and never called from a malloc hook: it
// may allocate (std::string, containers) and read files. Called on dirty
// schedulers. Thread-safe: a Symbolizer may be shared; its cache is guarded
// by an internal mutex (held for the whole of a resolve, including any file
// parsing it triggers: contention is rare, and parsing once is the point).
// It never allocates while holding the dynamic loader's lock: its
// dl_iterate_phdr callbacks copy into storage reserved before the walk, so
// an allocation there cannot reach a malloc hook (the tracker's, or any
// other interposer's) with that lock held.
//
// Errors: ordinary "not found" conditions (unmapped address, unreadable or
// stripped file, no covering symbol) are not errors; they give a Frame with
// an empty object and/or no symbol. Only std::bad_alloc can escape (the
// core libraries' one exception, doc/architecture.md "Errors"); the
// internal std::mutex could throw std::system_error only on misuse
// (relocking from the same thread), which no path does.
#ifndef MALLOCINFO_SYMBOLIZE_SYMBOLIZE_H
#define MALLOCINFO_SYMBOLIZE_SYMBOLIZE_H

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mi::symbolize {

// What an address resolves to. Both offsets are taken from `address` exactly
// as the caller passed it, also when it was looked up as a return address
// (see Symbolizer::resolve): symbol start + symbol_offset == address, and for
// an ELF object load bias + object_offset == address.
//
// `object` is, in order of precedence:
//   - an ELF object mapped by the dynamic loader: its path as the loader
//     knows it (the main program: the target of /proc/self/exe; the vDSO:
//     "[vdso]"); object_offset = address - load bias, i.e. the address as
//     `addr2line -e object` and the symbol table of the file understand it;
//   - "[erlang jit]" (kErlangJit) for Erlang code the BEAM JIT emitted: an
//     address listed in the Erlang VM's perf map (/tmp/perf-<pid>.map,
//     written with `+JPperf true`; the symbol is the map's name,
//     object_offset = address: JIT code has no load bias), or else in one
//     of the JIT's `memfd:vmem` mappings (no symbol; object_offset = offset
//     into the mapping);
//   - otherwise the name of the /proc/self/maps mapping holding it
//     ("[heap]", "[stack]", "[vvar]", "[anon:name]", a file path, or "[anon]"
//     for an unnamed mapping); object_offset = offset into the mapping plus
//     the mapping's file offset (a file offset for file mappings);
//   - "" when nothing is mapped there; object_offset = 0.
// The object name of Erlang code compiled by the BEAM JIT.
inline constexpr const char* kErlangJit = "[erlang jit]";

struct Frame {
  uint64_t address = 0;               // the address asked for
  std::string object;                 // see above ("" when unmapped)
  uint64_t object_offset = 0;         // see above
  std::optional<std::string> symbol;  // nullopt when no symbol covers it
  uint64_t symbol_offset = 0;         // address - symbol start (0 when no symbol)
};

struct SymbolizerOptions {
  // Root of separate debug files, searched as <debug_dir>/.build-id/xx/rest.debug
  // for objects without a .symtab. "" disables the search.
  std::string debug_dir = "/usr/lib/debug";
  // Erlang VM perf map. "" means /tmp/perf-<getpid()>.map (pid taken at
  // lookup time, so a forked child reads its own).
  std::string perf_map_path;
  bool use_perf_map = true;
  // Objects the loaded-object scan has room for at first (it grows, between
  // walks, as needed). Tests set it low to exercise the growth.
  size_t initial_scan_objects = 64;
};

// Counters since construction (clear() does not reset them); for tests and
// for reporting cache efficiency.
struct SymbolizerStats {
  uint64_t lookups = 0;           // addresses resolved
  uint64_t cache_hits = 0;        // ... answered from the per-address cache
  uint64_t objects_loaded = 0;    // symbol tables parsed (or attempted)
  uint64_t rescans = 0;           // dl_iterate_phdr walks of the object list
  uint64_t maps_reads = 0;        // /proc/self/maps reads
  uint64_t cached_addresses = 0;  // current size of the per-address cache
  uint64_t cached_misses = 0;     // ... and of the cache of addresses outside objects
};

// Lookups that share one read of each text source (/proc/self/maps, the
// perf map): a caller resolving many addresses in one request (a NIF call)
// makes one batch, and the request reads /proc/self/maps at most once
// however many of its addresses lie outside every object. For one thread
// and one Symbolizer; short-lived (it keeps a snapshot of the mappings).
// May allocate.
class SymbolizeBatch {
 public:
  SymbolizeBatch();
  ~SymbolizeBatch();
  SymbolizeBatch(const SymbolizeBatch&) = delete;
  SymbolizeBatch& operator=(const SymbolizeBatch&) = delete;

  struct State;

 private:
  friend class Symbolizer;
  std::unique_ptr<State> state_;
};

class Symbolizer {
 public:
  // Cheap: reads nothing until the first resolve. May allocate.
  Symbolizer();
  explicit Symbolizer(SymbolizerOptions options);
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  // Resolves addresses of this process. Uses the dynamic symbol table and,
  // when the object file on disk has one, the full .symtab (static functions
  // too), else a separate debug file found by build-id, else dladdr. Function
  // symbols (STT_FUNC, STT_GNU_IFUNC) with a nonzero size only; of several
  // names for one address, a global one with the fewest leading underscores
  // ("qsort", not "__GI_qsort").
  //
  // Caching: parsed symbol tables per (object, load bias), and results for
  // addresses inside ELF objects. JIT answers are not cached (the perf map
  // changes under us). /proc/self/maps answers (addresses outside every
  // object: "misses") are: a known miss costs a hash lookup, not a read of
  // the file; a batch that reads the file anyway refreshes the misses it
  // meets from that read (mappings change: a cached "[anon]" may be stale
  // until then). A batch (resolve_all, or a SymbolizeBatch) reads each text
  // source at most once. Each call first compares the loader's
  // dlpi_adds/dlpi_subs counters (one cheap dl_iterate_phdr step): after a
  // dlopen the object list is re-read, after a dlclose the address cache is
  // dropped too.
  //
  // `demangle` applies abi::__cxa_demangle to C++ names (never spawns a
  // process).
  //
  // `return_address`: addresses taken from a stack are return addresses and
  // point after the call instruction, possibly past the end of the caller
  // (a call to a noreturn function as the last instruction). When true, the
  // object and symbol are those of address-1 (inside the call instruction);
  // `address` and both offsets still refer to the address as given, so a
  // return address prints as the usual "caller+0x1c" and symbol_offset may
  // equal the symbol's size. Address 0 is looked up as 0.
  Frame resolve(uint64_t address, bool demangle, bool return_address = true);
  // The same, sharing the text sources read for `batch` (see SymbolizeBatch).
  Frame resolve(uint64_t address, bool demangle, bool return_address, SymbolizeBatch& batch);
  // Same as resolve for each address, in one batch; the result has the same
  // length and order as `addresses`.
  std::vector<Frame> resolve_all(const std::vector<uint64_t>& addresses, bool demangle,
                                 bool return_addresses = true);

  // Forget everything cached (objects may have been dlclose'd): symbol
  // tables, the object list, the per-address caches, the perf map.
  void clear();

  SymbolizerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// abi::__cxa_demangle, or the input unchanged when it is not a mangled name.
// Only names starting with "_Z" are tried (a bare "i" would otherwise
// "demangle" to the type "int"). Thread-safe; allocates.
std::string demangle(const std::string& name);

}  // namespace mi::symbolize

#endif
