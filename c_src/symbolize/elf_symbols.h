// Private to symbolize/: function symbols of one ELF64 object.
//
// Not thread-safe by itself (a SymbolTable is immutable once built, so const
// use from several threads is fine; Symbolizer serialises building). Allocates.
// Malformed input never throws: it yields fewer (or no) symbols. A file that
// is truncated on disk *while* being parsed can still raise SIGBUS, as with
// any mmap reader; replacing a file by rename (how packages upgrade) is safe.
#ifndef MALLOCINFO_SYMBOLIZE_ELF_SYMBOLS_H
#define MALLOCINFO_SYMBOLIZE_ELF_SYMBOLS_H

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mi::symbolize::detail {

class SymbolTable {
 public:
  struct Hit {
    std::string_view name;  // valid while the table lives
    uint64_t start = 0;     // link-time address (add the load bias)
    uint64_t size = 0;
  };

  // Parses an ELF64 image already in memory (the vDSO). [data, data+size)
  // must be readable. Symbols from .symtab and .dynsym.
  static SymbolTable from_image(const void* data, size_t size);

  // mmaps `path` read-only and parses it. When it has no .symtab and
  // `debug_dir` is not empty, also reads <debug_dir>/.build-id/xx/rest.debug
  // if the object has a GNU build-id and that file exists. nullopt when
  // `path` cannot be opened or mapped, or is not a native ELF64 file.
  static std::optional<SymbolTable> load_file(const std::string& path,
                                              const std::string& debug_dir);

  // The function symbol covering link-time address `vaddr`, if any.
  std::optional<Hit> lookup(uint64_t vaddr) const;

  size_t size() const { return symbols_.size(); }
  bool has_symtab() const { return has_symtab_; }
  bool used_debug_file() const { return used_debug_file_; }

 private:
  struct Symbol {
    uint64_t start;
    uint64_t size;
    uint32_t name_offset;  // into names_
    uint32_t name_size;
  };
  std::vector<Symbol> symbols_;  // sorted by start, one per start
  std::string names_;
  bool has_symtab_ = false;
  bool used_debug_file_ = false;

  friend class SymbolCollector;
};

// The GNU build-id of an ELF64 image as lower-case hex, or "" if none.
std::string build_id_hex(const void* data, size_t size);

}  // namespace mi::symbolize::detail

#endif
