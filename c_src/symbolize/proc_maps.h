// Private to symbolize/: the two text sources for addresses outside ELF
// objects, /proc/self/maps and the Erlang VM's perf map.
//
// Not thread-safe (Symbolizer serialises use). Allocate. Never throw except
// std::bad_alloc; unreadable files read as empty.
#ifndef MALLOCINFO_SYMBOLIZE_PROC_MAPS_H
#define MALLOCINFO_SYMBOLIZE_PROC_MAPS_H

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mi::symbolize::detail {

struct Mapping {
  uint64_t start = 0;
  uint64_t end = 0;     // exclusive
  uint64_t offset = 0;  // file offset of `start`
  std::string name;     // path or "[heap]"-style pseudo name; "" when anonymous
};

// Parses /proc/self/maps-formatted text; lines that do not parse are skipped.
// The result is sorted by start (the kernel's order).
std::vector<Mapping> parse_maps(std::string_view text);

// The current mappings of this process.
std::vector<Mapping> read_self_maps();

// The mapping containing `address` in a list sorted by start, or nullptr.
const Mapping* find_mapping(const std::vector<Mapping>& maps, uint64_t address);

// Incremental reader of a perf map ("START SIZE name" per line, START and
// SIZE in hex, with or without 0x: OTP writes "%p %tx $name"). The VM only
// appends, so refresh() reads the bytes added since the last call; a replaced
// or shrunk file is re-read whole.
class PerfMap {
 public:
  struct Entry {
    uint64_t start = 0;
    uint64_t size = 0;
    std::string name;
  };

  // Brings the entries up to date with the file at `path` (stat + read of the
  // new tail). Returns true when the entries changed. A missing file empties
  // the map.
  bool refresh(const std::string& path);

  // The entry covering `address`; of entries with the same start, the one
  // appended last (code memory may be reused after a purge).
  const Entry* find(uint64_t address) const;

  void clear();
  size_t size() const { return entries_.size(); }

 private:
  void parse_lines(std::string_view text);

  std::vector<Entry> entries_;  // sorted by start, one per start
  std::string partial_;         // an incomplete last line
  uint64_t consumed_ = 0;       // bytes of the file read so far
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  bool open_ = false;
};

}  // namespace mi::symbolize::detail

#endif
