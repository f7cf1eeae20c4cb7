#include "atomic_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <string_view>

namespace mi::file {

int check_target(const char* path, bool* exists) {
  if (exists != nullptr) *exists = false;
  // lstat("") fails with ENOENT too, but an empty name is not a free one.
  if (path[0] == '\0') return ENOENT;
  struct stat st {};
  if (::lstat(path, &st) != 0) return errno == ENOENT ? 0 : errno;
  if (S_ISREG(st.st_mode)) {
    if (exists != nullptr) *exists = true;
    return 0;
  }
  return S_ISDIR(st.st_mode) ? EISDIR : EEXIST;
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

int AtomicFile::open(const std::string& path) {
  if (const int err = check_target(path.c_str())) return err;
  // The temporary lives in the same directory as `path`, so rename(2) is
  // atomic. mkostemp opens with O_CREAT|O_EXCL, which fails on any existing
  // name, dangling links included: it never writes through a link. Its
  // name is the target's with the suffix, the target's part cut so the
  // whole stays within NAME_MAX: any legal name gets a legal temporary.
  constexpr std::string_view kSuffix = ".tmp.XXXXXX";
  const size_t slash = path.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t keep = std::min(path.size() - base, size_t{NAME_MAX} - kSuffix.size());
  std::string tmp = path.substr(0, base + keep);
  tmp += kSuffix;
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) return errno;
  fd_ = fd;
  tmp_ = std::move(tmp);
  path_ = path;
  // mkstemp creates 0600; what mallocinfo writes is meant to be read by
  // whoever reads the node's other logs.
  if (::fchmod(fd_, 0644) != 0) return errno;
  return 0;
}

int AtomicFile::commit() {
  if (fd_ < 0) return EBADF;
  const int err = rename_into_place();
  if (err != 0) {
    ::unlink(tmp_.c_str());
    tmp_.clear();
  }
  return err;
}

int AtomicFile::rename_into_place() {
  // On disk before it replaces anything: a crash never leaves an empty file.
  if (::fsync(fd_) != 0) return errno;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return errno;
  // A name that was free and is taken between the check and the rename is
  // checked again; a few rounds, since each one needs another process to
  // create and remove the name in between.
  for (int round = 0; round < 4; ++round) {
    bool exists = false;
    if (const int err = check_target(path_.c_str(), &exists)) return err;
    if (exists) {
      if (::rename(tmp_.c_str(), path_.c_str()) != 0) return errno;
      committed_ = true;
      return 0;
    }
    if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_NOREPLACE) == 0) {
      committed_ = true;
      return 0;
    }
    if (errno == EEXIST) continue;
    // A filesystem without RENAME_NOREPLACE (some network and FUSE ones):
    // the check above is all there is.
    if (errno != EINVAL && errno != ENOSYS) return errno;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) return errno;
    committed_ = true;
    return 0;
  }
  return EEXIST;
}

int append_read(int fd, std::string& out, bool* eof) {
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n >= 0) {
      *eof = n == 0;
      out.append(buf, static_cast<size_t>(n));
      return 0;
    }
    if (errno != EINTR) return errno;
  }
}

int read_file(const std::string& path, std::string& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return errno;
  struct stat st;
  int err = ::fstat(fd, &st) == 0 ? 0 : errno;
  out.clear();
  if (err == 0) out.reserve(static_cast<size_t>(st.st_size));
  for (bool eof = false; err == 0 && !eof;) err = append_read(fd, out, &eof);
  ::close(fd);
  return err;
}

}  // namespace mi::file
