#include "glibc_introspect.h"

#include <fcntl.h>
#include <gnu/libc-version.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "atomic_file.h"

namespace mi::glibc {

Mallinfo read_mallinfo() {
  const struct mallinfo2 m = ::mallinfo2();
  return Mallinfo{m.arena,   m.ordblks, m.smblks,   m.hblks,    m.hblkhd,
                  m.usmblks, m.fsmblks, m.uordblks, m.fordblks, m.keepcost};
}

int info_xml(std::string& out) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* fp = ::open_memstream(&buf, &len);
  if (fp == nullptr) return errno;
  const int rc = ::malloc_info(0, fp);
  const int saved = errno;
  // fclose finalises buf/len even when malloc_info failed.
  ::fclose(fp);
  // Owned from here, so std::bad_alloc from assign() cannot leak it.
  const std::unique_ptr<char, void (*)(void*)> owned(buf, ::free);
  if (rc != 0) return saved;
  if (buf == nullptr) return EIO;
  out.assign(buf, len);
  return 0;
}

int write_info_file(const std::string& path) {
  if (path.find('\0') != std::string::npos) return EINVAL;
  mi::file::AtomicFile file;
  if (const int err = file.open(path)) return err;
  // malloc_info writes to a FILE*; a duplicate of the descriptor keeps the
  // temporary's own open for AtomicFile's fsync and rename.
  const int dup_fd = ::fcntl(file.fd(), F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return errno;
  FILE* fp = ::fdopen(dup_fd, "w");
  if (fp == nullptr) {
    const int err = errno;
    ::close(dup_fd);
    return err;
  }
  int err = 0;
  if (::malloc_info(0, fp) != 0) err = errno;
  if (::fflush(fp) != 0 && err == 0) err = errno;
  if (::fclose(fp) != 0 && err == 0) err = errno;
  return err != 0 ? err : file.commit();
}

namespace {

// Child side of capture_stats(): only what is safe after fork() in a
// multi-threaded parent. glibc's fork re-initialises the malloc and stdio
// locks in the child, so malloc_stats() and mallinfo2() are usable here.
[[noreturn]] void stats_child(int wfd) {
  if (::dup2(wfd, STDERR_FILENO) < 0) ::_exit(127);
  // No exec follows, so O_CLOEXEC does not apply: let go of the node's
  // descriptors (sockets, other children's pipes) while this child runs.
  ::close_range(STDERR_FILENO + 1, ~0u, 0);
  ::malloc_stats();
  ::fflush(stderr);
  const struct mallinfo2 m = ::mallinfo2();
  char line[128];
  const int n = std::snprintf(
      line, sizeof line, "mmap regions     = %10zu\nmmap bytes       = %10zu\n", m.hblks, m.hblkhd);
  if (n > 0 && ::write(STDERR_FILENO, line, static_cast<size_t>(n)) != n) ::_exit(126);
  ::_exit(0);
}

int64_t now_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

}  // namespace

int capture_stats(std::string& out, int timeout_ms) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return errno;
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return err;
  }
  if (pid == 0) {
    ::close(fds[0]);
    stats_child(fds[1]);
  }
  ::close(fds[1]);
  out.clear();
  int err = 0;
  const int64_t deadline = now_ms() + timeout_ms;
  for (;;) {
    const int64_t left = deadline - now_ms();
    if (left <= 0) {
      err = ETIMEDOUT;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int pr = ::poll(&p, 1, static_cast<int>(left));
    if (pr < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    if (pr == 0) continue;
    bool eof = false;
    err = mi::file::append_read(fds[0], out, &eof);
    if (err != 0 || eof) break;
  }
  ::close(fds[0]);
  if (err != 0) ::kill(pid, SIGKILL);
  int status = 0;
  pid_t waited;
  while ((waited = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  // ECHILD (SIGCHLD ignored by the host program) leaves the exit status
  // unknown; the pipe reaching EOF is then the only evidence, and enough.
  // A child that exited non-zero or died of a signal produced partial text.
  if (err == 0 && waited == pid &&
      (WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0)))
    err = EIO;
  return err;
}

std::optional<uint64_t> resident_bytes() {
  const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[256];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  buf[n] = '\0';
  unsigned long long size = 0, resident = 0;
  if (std::sscanf(buf, "%llu %llu", &size, &resident) != 2) return std::nullopt;
  return static_cast<uint64_t>(resident) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

bool trim(size_t pad) {
  return ::malloc_trim(pad) != 0;
}

namespace {
struct ParamName {
  std::string_view name;
  Param param;
  int glibc;
};
constexpr std::array<ParamName, 7> kParams{{
    {"arena_max", Param::arena_max, M_ARENA_MAX},
    {"arena_test", Param::arena_test, M_ARENA_TEST},
    {"mmap_threshold", Param::mmap_threshold, M_MMAP_THRESHOLD},
    {"mmap_max", Param::mmap_max, M_MMAP_MAX},
    {"trim_threshold", Param::trim_threshold, M_TRIM_THRESHOLD},
    {"top_pad", Param::top_pad, M_TOP_PAD},
    {"perturb", Param::perturb, M_PERTURB},
}};
}  // namespace

std::optional<Param> param_from_name(std::string_view name) {
  for (const auto& p : kParams)
    if (p.name == name) return p.param;
  return std::nullopt;
}

namespace {
// mallopt(3) silently ignores some values it cannot use (arena_max 0, a
// negative top_pad, ...) and still returns 1. An operator who typed such a
// value should hear about it, so these ranges are checked here first.
bool value_in_range(Param p, int value) {
  // DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: 4 MiB * sizeof(long).
  constexpr long kMmapThresholdMax = 4L * 1024 * 1024 * static_cast<long>(sizeof(long));
  switch (p) {
    case Param::arena_max:
    case Param::arena_test:
      return value > 0;
    case Param::mmap_threshold:
      return value >= 0 && value <= kMmapThresholdMax;
    case Param::mmap_max:
    case Param::top_pad:
      return value >= 0;
    case Param::trim_threshold:
      return value >= -1;  // -1 is mallopt(3)'s "never trim"
    case Param::perturb:
      return true;
  }
  return false;
}
}  // namespace

int set_param(Param p, int value) {
  if (!value_in_range(p, value)) return EINVAL;
  for (const auto& k : kParams)
    if (k.param == p) return ::mallopt(k.glibc, value) == 1 ? 0 : EINVAL;
  return EINVAL;
}

namespace {
constexpr int kMaxErrno = 256;
struct ErrnoNames {
  char names[kMaxErrno][24];
  ErrnoNames() {
    for (int e = 0; e < kMaxErrno; ++e) {
      const char* upper = ::strerrorname_np(e);
      char* dst = names[e];
      if (upper == nullptr) {
        std::strcpy(dst, "unknown");
        continue;
      }
      size_t i = 0;
      for (; upper[i] != '\0' && i + 1 < sizeof names[e]; ++i)
        dst[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(upper[i])));
      dst[i] = '\0';
    }
  }
};
}  // namespace

const char* errno_name(int err) {
  static const ErrnoNames table;  // C++ guarantees thread-safe one-time init.
  if (err < 0 || err >= kMaxErrno) return "unknown";
  return table.names[err];
}

const char* libc_version() {
  return ::gnu_get_libc_version();
}

}  // namespace mi::glibc
