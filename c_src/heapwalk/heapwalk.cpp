#include "heapwalk.h"

#include <fcntl.h>
#include <gnu/libc-version.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "../glibc/atomic_file.h"
#include "arena_probe.h"
#include "child.h"
#include "dump_format.h"
#include "ptmalloc.h"
#include "reply.h"

namespace mi::heapwalk {

namespace hd = mi::heapdump;
using namespace detail;

namespace {

void put32(std::string& s, uint32_t v) {
  s.append(reinterpret_cast<const char*>(&v), 4);
}
void put64(std::string& s, uint64_t v) {
  s.append(reinterpret_cast<const char*>(&v), 8);
}

DumpStatus os_error(int err, const char* where) {
  return DumpStatus{Failure::os_error, err, where};
}

// SITE records and END, appended by the parent after the child's part.
int append_tail(int fd, const DumpResult& r, const SiteLabeler& label, uint64_t& written) {
  std::string tail;
  for (const Site& s : r.sites) {
    std::string text = label ? label(s.frames) : std::string();
    if (text.size() > 4096) text.resize(4096);
    put32(tail, hd::kSiteRec);
    put32(tail, static_cast<uint32_t>(4 + 4 + 8 + 8 + text.size()));
    put32(tail, s.id);
    put32(tail, 0);
    put64(tail, s.live_bytes);
    put64(tail, s.live_blocks);
    tail += text;
  }
  put32(tail, hd::kEndRec);
  put32(tail, 8 + 8 + 4 + 4);
  put64(tail, r.chunks);
  put64(tail, r.segments);
  put32(tail, static_cast<uint32_t>(r.arenas.size()));
  put32(tail, 0);
  if (!write_all(fd, tail.data(), tail.size())) return errno;
  written += tail.size();
  return 0;
}

}  // namespace

namespace {

// The child: killed and reaped on every way out unless reaped already.
struct ChildProcess {
  pid_t pid = -1;
  void reap(bool kill_first) {
    if (pid <= 0) return;
    if (kill_first) ::kill(pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    pid = -1;
  }
  ~ChildProcess() { reap(true); }
};

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

struct XmlStream {
  FILE* f = nullptr;
  ~XmlStream() {
    if (f != nullptr) ::fclose(f);
  }
};

}  // namespace

DumpStatus dump(const std::string& path, const DumpOptions& options, const SiteLabeler& label,
                DumpResult& out) {
  out = DumpResult{};
  const char* version = ::gnu_get_libc_version();
  const pt::Layout* layout = pt::layout_for(version);
  if (layout == nullptr) return DumpStatus{Failure::unsupported_glibc, 0, version};
  const uint64_t main_arena = find_main_arena(*layout);
  if (main_arena == 0) return DumpStatus{Failure::unsupported_glibc, 0, "main_arena"};
  if (path.find('\0') != std::string::npos) return os_error(EINVAL, "path");

  // No path: no file at all (the child's writer skips fd -1), only the
  // summary. A path is checked before the fork, so a target that will not be
  // replaced (atomic_file.h) costs no walk; the file is closed and removed
  // on every way out of dump() (including exceptions) until it is renamed
  // into place.
  mi::file::AtomicFile file;
  if (!path.empty()) {
    if (const int err = file.open(path)) return os_error(err, "open");
  }

  // malloc_info's XML goes to an unbuffered stream on a memfd made here,
  // so that printing it in the child allocates nothing (see child_main).
  XmlStream xml;
  if (options.want_info_xml) {
    const int mfd = ::memfd_create("mallocinfo-xml", MFD_CLOEXEC);
    if (mfd < 0) return os_error(errno, "memfd");
    xml.f = ::fdopen(mfd, "w");
    if (xml.f == nullptr) {
      const int err = errno;
      ::close(mfd);
      return os_error(err, "memfd");
    }
    ::setvbuf(xml.f, nullptr, _IONBF, 0);
  }

  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return os_error(errno, "pipe");
  Fd reader{pipefd[0]};
  Fd writer{pipefd[1]};
  const pid_t parent = ::getpid();
  ChildProcess child;
  const uint64_t fork_start = mono_ns();
  child.pid = ::fork();
  const uint64_t fork_ns = mono_ns() - fork_start;
  if (child.pid < 0) return os_error(errno, "fork");
  if (child.pid == 0) child_main(options, *layout, file.fd(), pipefd[1], xml.f, main_arena, parent);
  ::close(writer.fd);
  writer.fd = -1;
  std::string reply;
  const int rerr = read_reply(reader.fd, options.timeout_ms, reply);
  child.reap(rerr != 0);
  if (rerr == ETIMEDOUT) return DumpStatus{Failure::timeout, 0, "child"};
  if (rerr != 0) return os_error(rerr, "pipe");

  ReplyHeader h;
  if (reply.size() < sizeof h) return DumpStatus{Failure::walk_failed, 0, "child_died"};
  std::memcpy(&h, reply.data(), sizeof h);
  h.detail[sizeof h.detail - 1] = '\0';
  if (h.magic != kReplyMagic) return DumpStatus{Failure::walk_failed, 0, "child_reply"};
  switch (h.status) {
    case kOk:
      break;
    case kUnsupported:
      return DumpStatus{Failure::unsupported_glibc, 0, h.detail};
    case kOsError:
      return os_error(h.err != 0 ? h.err : EIO, h.detail);
    default:
      return DumpStatus{Failure::walk_failed, 0, h.detail};
  }
  if (!parse_reply(reply, h, out)) return DumpStatus{Failure::walk_failed, 0, "child_reply"};
  out.fork_ns = fork_ns;
  if (xml.f != nullptr) {
    if (h.xml_len == ~0ull) return os_error(EIO, "malloc_info");
    const int xfd = ::fileno(xml.f);
    char buf[65536];
    ssize_t n;
    for (off_t off = 0; (n = ::pread(xfd, buf, sizeof buf, off)) > 0; off += n)
      out.info_xml.append(buf, static_cast<size_t>(n));
  }
  if (path.empty()) {
    out.file_bytes = 0;
    return DumpStatus{};
  }
  // The child wrote through the shared file description: the offset is at
  // the end of its part.
  uint64_t written = out.file_bytes;
  const int err = append_tail(file.fd(), out, label, written);
  if (err != 0) return os_error(err, "write");
  out.file_bytes = written;
  // fsync, the second look at the target, rename.
  if (const int cerr = file.commit()) return os_error(cerr, "commit");
  return DumpStatus{};
}

}  // namespace mi::heapwalk
