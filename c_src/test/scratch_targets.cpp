#include "scratch_targets.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include "catch.h"

namespace mi::test {

namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

ScratchTargets::ScratchTargets() {
  std::string tmpl = (fs::temp_directory_path() / "mi_targets_XXXXXX").string();
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  dir_ = tmpl;
  const auto at = [&](const char* name) { return dir_ + "/" + name; };

  REQUIRE(::mkdir(at("directory").c_str(), 0755) == 0);
  std::ofstream(at("directory/inside")) << "kept";
  targets_.push_back({"directory", at("directory"), EISDIR});

  std::ofstream(at("link-target")) << "the link's target";
  REQUIRE(::symlink("link-target", at("symlink").c_str()) == 0);
  targets_.push_back({"symlink to a regular file", at("symlink"), EEXIST});
  REQUIRE(::symlink("nothing-here", at("dangling").c_str()) == 0);
  targets_.push_back({"dangling symlink", at("dangling"), EEXIST});

  INFO("device nodes need CAP_MKNOD: run the tests as root");
  REQUIRE(::mknod(at("char-device").c_str(), S_IFCHR | 0644, makedev(1, 3)) == 0);
  targets_.push_back({"character device", at("char-device"), EEXIST});
  REQUIRE(::mknod(at("block-device").c_str(), S_IFBLK | 0600, makedev(1, 3)) == 0);
  targets_.push_back({"block device", at("block-device"), EEXIST});

  REQUIRE(::mkfifo(at("fifo").c_str(), 0644) == 0);
  targets_.push_back({"FIFO", at("fifo"), EEXIST});

  socket_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(socket_fd_ >= 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  const std::string sock = at("socket");
  REQUIRE(sock.size() < sizeof sa.sun_path);
  std::memcpy(sa.sun_path, sock.c_str(), sock.size() + 1);
  REQUIRE(::bind(socket_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  targets_.push_back({"unix socket", sock, EEXIST});
}

ScratchTargets::~ScratchTargets() {
  if (socket_fd_ >= 0) ::close(socket_fd_);
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

Fingerprint ScratchTargets::fingerprint(const std::string& path) {
  Fingerprint f;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return f;
  f.ino = st.st_ino;
  f.mode = st.st_mode;
  f.rdev = st.st_rdev;
  if (S_ISLNK(st.st_mode)) {
    char buf[4096];
    const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
    f.content.assign(buf, n > 0 ? static_cast<size_t>(n) : 0);
    // And what it points at, when it points at something.
    struct stat target {};
    if (::stat(path.c_str(), &target) == 0 && S_ISREG(target.st_mode))
      f.content += "\n->" + std::to_string(target.st_ino) + ":" + slurp(path);
  } else if (S_ISREG(st.st_mode)) {
    f.content = slurp(path);
  } else if (S_ISDIR(st.st_mode)) {
    for (const auto& n : names_in(path)) f.content += n + "\n";
  }
  return f;
}

std::vector<std::string> ScratchTargets::entries() const {
  return names_in(dir_);
}

}  // namespace mi::test
