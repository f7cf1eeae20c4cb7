#include "resident.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "atomic_file.h"

namespace mi::mem {

namespace {

bool hex(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 16) return false;
  uint64_t v = 0;
  for (const char c : s) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

// "Rss:   1234 kB" -> 1234 * 1024.
bool rss_line(std::string_view line, uint64_t* out) {
  constexpr std::string_view kKey = "Rss:";
  if (line.substr(0, kKey.size()) != kKey) return false;
  size_t i = kKey.size();
  while (i < line.size() && line[i] == ' ') ++i;
  uint64_t kb = 0;
  size_t digits = 0;
  for (; i < line.size() && line[i] >= '0' && line[i] <= '9' && digits < 19; ++i, ++digits)
    kb = kb * 10 + static_cast<uint64_t>(line[i] - '0');
  if (digits == 0) return false;
  *out = kb * 1024;
  return true;
}

// "start-end perms ..." with start < end.
bool header_line(std::string_view line, Vma* out) {
  const size_t dash = line.find('-');
  const size_t space = line.find(' ');
  if (dash == std::string_view::npos || space == std::string_view::npos || dash > space)
    return false;
  Vma v;
  if (!hex(line.substr(0, dash), &v.start) || !hex(line.substr(dash + 1, space - dash - 1), &v.end))
    return false;
  if (v.start >= v.end) return false;
  *out = v;
  return true;
}

}  // namespace

std::vector<Vma> parse_smaps(std::string_view text) {
  std::vector<Vma> out;
  bool open = false;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    Vma v;
    if (header_line(line, &v)) {
      out.push_back(v);
      open = true;
    } else if (uint64_t rss = 0; open && rss_line(line, &rss)) {
      out.back().rss = rss;
    }
  }
  return out;
}

bool read_self_smaps(std::vector<Vma>& out) {
  std::string text;
  out.clear();
  if (mi::file::read_file("/proc/self/smaps", text) != 0) return false;
  out = parse_smaps(text);
  return true;
}

uint64_t probe_mincore(uint64_t start, uint64_t length, void*) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  constexpr uint64_t kChunkPages = 64 * 1024;
  std::vector<unsigned char> vec;
  uint64_t resident = 0;
  for (uint64_t off = 0; off < length; off += kChunkPages * page) {
    const uint64_t len = std::min<uint64_t>(length - off, kChunkPages * page);
    const uint64_t pages = (len + page - 1) / page;
    vec.resize(pages);
    if (::mincore(reinterpret_cast<void*>(start + off), len, vec.data()) != 0) continue;
    for (uint64_t i = 0; i < pages; ++i) resident += (vec[i] & 1) != 0 ? page : 0;
  }
  return resident;
}

std::vector<uint64_t> resident_of(const std::vector<Range>& ranges, const std::vector<Vma>& vmas,
                                  uint64_t page, Probe probe, void* ctx, uint64_t budget_pages) {
  std::vector<uint64_t> out(ranges.size(), 0);
  // What cannot be read off the kernel's figures: probed, or estimated.
  struct Partial {
    size_t range;
    uint64_t start, length;
    const Vma* vma;
  };
  std::vector<Partial> partial;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const uint64_t lo = ranges[i].start;
    const uint64_t hi = lo + ranges[i].length;
    if (hi <= lo) continue;
    // The first mapping that ends after lo.
    auto it = std::upper_bound(vmas.begin(), vmas.end(), lo,
                               [](uint64_t a, const Vma& v) { return a < v.end; });
    for (; it != vmas.end() && it->start < hi; ++it) {
      const Vma& v = *it;
      if (v.rss == 0) continue;
      const uint64_t a = std::max(lo, v.start);
      const uint64_t b = std::min(hi, v.end);
      if (a == v.start && b == v.end)
        out[i] += v.rss;
      else if (v.rss >= v.end - v.start)
        out[i] += b - a;
      else
        partial.push_back(Partial{i, a, b - a, &v});
    }
  }
  std::sort(partial.begin(), partial.end(),
            [](const Partial& x, const Partial& y) { return x.length < y.length; });
  uint64_t left = budget_pages;
  for (const Partial& p : partial) {
    const uint64_t pages = (p.length + page - 1) / page;
    if (pages <= left) {
      left -= pages;
      out[p.range] += std::min(probe(p.start, p.length, ctx), p.length);
    } else {
      left = 0;  // smallest first: nothing after this one fits either
      const uint64_t size = p.vma->end - p.vma->start;
      // rss * length / size without overflow: rss < size <= 2^64.
      const unsigned __int128 share = static_cast<unsigned __int128>(p.vma->rss) * p.length / size;
      out[p.range] += static_cast<uint64_t>(share) / page * page;
    }
  }
  return out;
}

}  // namespace mi::mem
