#include "proc_maps.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace mi::symbolize::detail {
namespace {

// Reads a whole file with read(2): procfs files report size 0 to stat.
std::string read_whole(const char* path) {
  std::string out;
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buffer[16384];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// Hex digits with an optional 0x prefix (the VM writes perf map addresses
// with %p, other JITs without a prefix).
bool parse_hex(std::string_view& s, uint64_t* out) {
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s.remove_prefix(2);
  uint64_t value = 0;
  size_t i = 0;
  for (; i < s.size() && i < 17; ++i) {
    const char c = s[i];
    unsigned digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      break;
    }
    value = value << 4 | digit;
  }
  if (i == 0 || i > 16) return false;
  s.remove_prefix(i);
  *out = value;
  return true;
}

void skip_spaces(std::string_view& s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
}

// Skips one whitespace-delimited field and the blanks after it.
bool skip_field(std::string_view& s) {
  const size_t end = s.find_first_of(" \t");
  if (end == 0 || end == std::string_view::npos) return false;
  s.remove_prefix(end);
  skip_spaces(s);
  return true;
}

template <class F>
void for_each_line(std::string_view text, F&& f) {
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    f(line);
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
}

}  // namespace

std::vector<Mapping> parse_maps(std::string_view text) {
  std::vector<Mapping> maps;
  for_each_line(text, [&maps](std::string_view line) {
    // start-end perms offset dev inode [name]
    Mapping m;
    if (!parse_hex(line, &m.start) || line.empty() || line.front() != '-') return;
    line.remove_prefix(1);
    if (!parse_hex(line, &m.end) || m.end <= m.start) return;
    skip_spaces(line);
    if (!skip_field(line)) return;  // perms
    if (!parse_hex(line, &m.offset)) return;
    skip_spaces(line);
    if (!skip_field(line)) return;  // dev
    // inode, then the name (which may contain spaces) or nothing.
    const size_t end = line.find_first_of(" \t");
    if (end != std::string_view::npos) {
      line.remove_prefix(end);
      skip_spaces(line);
      m.name.assign(line);
    }
    maps.push_back(std::move(m));
  });
  std::sort(maps.begin(), maps.end(),
            [](const Mapping& a, const Mapping& b) { return a.start < b.start; });
  return maps;
}

std::vector<Mapping> read_self_maps() {
  return parse_maps(read_whole("/proc/self/maps"));
}

const Mapping* find_mapping(const std::vector<Mapping>& maps, uint64_t address) {
  auto it = std::upper_bound(maps.begin(), maps.end(), address,
                             [](uint64_t a, const Mapping& m) { return a < m.start; });
  if (it == maps.begin()) return nullptr;
  --it;
  return address < it->end ? &*it : nullptr;
}

void PerfMap::clear() {
  entries_.clear();
  partial_.clear();
  consumed_ = 0;
  open_ = false;
}

bool PerfMap::refresh(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool had = !entries_.empty();
    clear();
    return had;
  }
  bool changed = false;
  if (!open_ || st.st_dev != dev_ || st.st_ino != ino_ ||
      static_cast<uint64_t>(st.st_size) < consumed_) {
    changed = !entries_.empty();
    clear();
    open_ = true;
    dev_ = st.st_dev;
    ino_ = st.st_ino;
  }
  if (static_cast<uint64_t>(st.st_size) == consumed_) return changed;

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return changed;
  std::string text = std::move(partial_);
  partial_.clear();
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::pread(fd, buffer, sizeof(buffer), static_cast<off_t>(consumed_));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
    consumed_ += static_cast<uint64_t>(n);
  }
  ::close(fd);

  // The writer may be mid-line: keep the tail for next time.
  const size_t last_nl = text.rfind('\n');
  if (last_nl == std::string::npos) {
    partial_ = std::move(text);
    return changed;
  }
  partial_.assign(text, last_nl + 1);
  text.resize(last_nl + 1);
  parse_lines(text);
  return true;
}

void PerfMap::parse_lines(std::string_view text) {
  // Appended entries go after the old ones; a stable sort then keeps, for a
  // repeated start, the last one written.
  for_each_line(text, [this](std::string_view line) {
    Entry e;
    if (!parse_hex(line, &e.start) || line.empty() || line.front() != ' ') return;
    skip_spaces(line);
    if (!parse_hex(line, &e.size) || e.size == 0 || line.empty() || line.front() != ' ') return;
    line.remove_prefix(1);
    e.name.assign(line);
    entries_.push_back(std::move(e));
  });
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const Entry& a, const Entry& b) { return a.start < b.start; });
  std::vector<Entry> unique;
  unique.reserve(entries_.size());
  for (Entry& e : entries_) {
    if (!unique.empty() && unique.back().start == e.start) {
      unique.back() = std::move(e);
    } else {
      unique.push_back(std::move(e));
    }
  }
  entries_ = std::move(unique);
}

const PerfMap::Entry* PerfMap::find(uint64_t address) const {
  auto it = std::upper_bound(entries_.begin(), entries_.end(), address,
                             [](uint64_t a, const Entry& e) { return a < e.start; });
  if (it == entries_.begin()) return nullptr;
  --it;
  return address - it->start < it->size ? &*it : nullptr;
}

}  // namespace mi::symbolize::detail
