#include "reply.h"

#include <poll.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../common/mi_limits.h"

namespace mi::heapwalk::detail {

uint64_t mono_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads the child's reply until EOF or the deadline.
int read_reply(int fd, int timeout_ms, std::string& out) {
  const uint64_t deadline = mono_ns() + static_cast<uint64_t>(timeout_ms) * 1000000ull;
  char buf[65536];
  for (;;) {
    const uint64_t now = mono_ns();
    if (now >= deadline) return ETIMEDOUT;
    pollfd p{fd, POLLIN, 0};
    const int left = static_cast<int>(std::min<uint64_t>((deadline - now) / 1000000 + 1, 1 << 30));
    const int pr = ::poll(&p, 1, left);
    if (pr < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (pr == 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      return 0;
    } else if (errno != EINTR) {
      return errno;
    }
  }
}

// Parses the reply into `out`; false when it is short or malformed.
bool parse_reply(const std::string& r, const ReplyHeader& h, DumpResult& out) {
  size_t at = sizeof(ReplyHeader);
  if (h.n_arenas > kMaxArenas || r.size() < at + sizeof(ArenaSummary) * h.n_arenas) return false;
  out.arenas.resize(h.n_arenas);
  std::memcpy(out.arenas.data(), r.data() + at, sizeof(ArenaSummary) * h.n_arenas);
  at += sizeof(ArenaSummary) * h.n_arenas;
  for (uint32_t i = 0; i < h.n_sites; ++i) {
    ReplySite rs;
    if (r.size() < at + sizeof rs) return false;
    std::memcpy(&rs, r.data() + at, sizeof rs);
    at += sizeof rs;
    if (rs.depth > mi::limits::kMaxStackDepth || r.size() < at + rs.depth * 8) return false;
    Site s;
    s.id = rs.id;
    s.live_bytes = rs.live_bytes;
    s.live_blocks = rs.live_blocks;
    s.frames.resize(rs.depth);
    std::memcpy(s.frames.data(), r.data() + at, rs.depth * 8);
    at += rs.depth * 8;
    out.sites.push_back(std::move(s));
  }
  if (r.size() != at) return false;
  out.chunks = h.chunks;
  out.segments = h.segments;
  out.mmap_chunks = h.mmap_chunks;
  out.mmap_bytes = h.mmap_bytes;
  out.file_bytes = h.file_bytes;
  out.tracker = h.tracker != 0;
  out.mallinfo = h.mallinfo;
  out.walk_ns = h.walk_ns;
  return true;
}

}  // namespace mi::heapwalk::detail
