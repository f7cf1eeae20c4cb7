// Test helper: a scratch directory (mkdtemp) holding one of every kind of
// file a writer must not replace, each with a fingerprint to prove
// afterwards that it was left exactly as it was. Everything is made inside
// the scratch directory; nothing outside it is touched, and the directory
// is removed with its contents by the destructor.
#ifndef MALLOCINFO_TEST_SCRATCH_TARGETS_H
#define MALLOCINFO_TEST_SCRATCH_TARGETS_H

#include <sys/types.h>

#include <string>
#include <vector>

namespace mi::test {

// What identifies a directory entry: its inode, type and permission bits,
// device numbers, and what it holds (a link's text, a file's or a link
// target's bytes, a directory's entry names).
struct Fingerprint {
  ino_t ino = 0;
  mode_t mode = 0;
  dev_t rdev = 0;
  std::string content;
  bool operator==(const Fingerprint&) const = default;
};

struct Target {
  std::string kind;  // "directory", "symlink", "dangling symlink", "char device", ...
  std::string path;
  int expected_errno;  // what a writer must answer
};

class ScratchTargets {
 public:
  // Makes the directory and, inside it: a directory with one file, a
  // symbolic link to a regular scratch file, a dangling symbolic link, a
  // character device with /dev/null's numbers (1, 3), a block device
  // (1, 3: a RAM disk's numbers, never opened), a FIFO, a bound unix socket.
  // Device nodes need CAP_MKNOD (root): the constructor REQUIREs them.
  ScratchTargets();
  ~ScratchTargets();
  ScratchTargets(const ScratchTargets&) = delete;
  ScratchTargets& operator=(const ScratchTargets&) = delete;

  const std::string& dir() const { return dir_; }
  const std::vector<Target>& targets() const { return targets_; }
  // The fingerprint of `path` now (lstat, never following a link).
  static Fingerprint fingerprint(const std::string& path);
  // Names in dir(), sorted (temporaries a writer left behind show here).
  std::vector<std::string> entries() const;

 private:
  std::string dir_;
  std::vector<Target> targets_;
  int socket_fd_ = -1;
};

}  // namespace mi::test

#endif
