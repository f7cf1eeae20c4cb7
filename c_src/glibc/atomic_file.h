// Writing a file the caller named without destroying what was there.
//
// mallocinfo writes files at paths an operator types into a remote console
// (mallocinfo:info/1, mallocinfo_heap:dump/1,2). The file is written under a
// temporary name in the same directory and renamed over the target once it is
// complete and on disk, so a reader never sees half of it and a crash never
// leaves an empty one. rename(2) replaces whatever the name points at, so
// the target is checked first: a missing name or a regular file is written;
// anything else is left exactly as it is (same inode, same contents):
//   - a directory:                          EISDIR
//   - a symbolic link (never followed),
//     a character or block device, a FIFO,
//     a socket:                             EEXIST
// Symbolic links are refused outright rather than followed: replacing the
// link would break whatever relies on it, and writing through it would let
// whoever planted it choose the file we overwrite. Links in the directory
// part of the path are followed as usual (only the last component is the
// target).
//
// No erl_nif here: linked into the NIF and the Catch2 binary. Every function
// is thread-safe (no shared state); none may be called from a malloc hook
// (they allocate through std::string).
#ifndef MALLOCINFO_GLIBC_ATOMIC_FILE_H
#define MALLOCINFO_GLIBC_ATOMIC_FILE_H

#include <string>

namespace mi::file {

// What `path` names now, by lstat(2): 0 when the name is free (ENOENT) or a
// regular file, EISDIR or EEXIST as above, ENOENT for an empty path, else
// lstat's errno (EACCES, ENOTDIR, ENAMETOOLONG, ...). *exists (when given) is set when 0 is
// returned for an existing regular file. Does not allocate.
int check_target(const char* path, bool* exists = nullptr);

// A file being written for `path`: open() checks the target and creates the
// temporary (`<path>.tmp.XXXXXX`, the last component of `path` cut so the
// temporary's name is at most NAME_MAX bytes; O_CREAT|O_EXCL so it is never
// an existing file or a link, mode 0644); the caller writes through fd(); commit() makes
// it durable and renames it into place. Until commit() succeeds the
// destructor closes and removes the temporary, so every way out of the
// caller (errors, exceptions) leaves nothing behind.
//
// The target is checked twice: in open(), so a refused target costs no work
// and leaves no temporary beside it, and again right before the rename, so
// the window in which something else can take the name is the few
// instructions between lstat(2) and rename(2). When the name was free, the
// rename is renameat2(RENAME_NOREPLACE), which fails rather than replace
// anything that appeared meanwhile (that thing is then checked like any
// target); only a regular file is replaced with a plain rename(2).
// Not thread-safe: one owner.
class AtomicFile {
 public:
  AtomicFile() = default;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  // 0 or an errno value (check_target's, or mkostemp's). Precondition: not
  // open yet; `path` has no NUL byte.
  int open(const std::string& path);
  // The temporary's descriptor (O_CLOEXEC), -1 before open() or after
  // commit().
  int fd() const { return fd_; }
  // fsync, close, check the target again, rename. 0 or an errno value; on
  // failure the temporary is removed and the target left as it was.
  int commit();

 private:
  int rename_into_place();

  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Reading, for the same callers: one read(2) of `fd` appended to `out`,
// retried on EINTR. 0 with *eof false after appending, 0 with *eof true at
// end of file, or errno. Blocks as read(2) does on `fd`.
int append_read(int fd, std::string& out, bool* eof);

// The whole of the file at `path` into `out`: ELOOP when the last component
// of `path` is a symbolic link (links in the directories above it are
// followed). 0 or errno.
int read_file(const std::string& path, std::string& out);

}  // namespace mi::file

#endif
