// Tests for glibc/glibc_introspect: against glibc itself, no fakes needed.
#include <fcntl.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>
#include "catch.h"

#include "../glibc/atomic_file.h"
#include "../glibc/glibc_introspect.h"
#include "scratch_targets.h"

namespace g = mi::glibc;
namespace fs = std::filesystem;

namespace {

fs::path make_tmpdir() {
  std::string tmpl = (fs::temp_directory_path() / "mi_test_XXXXXX").string();
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The numbers of "name = value" lines, in order, keyed by line number.
std::vector<std::pair<std::string, unsigned long long>> stat_lines(const std::string& text) {
  std::vector<std::pair<std::string, unsigned long long>> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) {
      out.emplace_back(line, 0);
      continue;
    }
    std::string name = line.substr(0, eq);
    name.erase(name.find_last_not_of(' ') + 1);
    out.emplace_back(name, std::stoull(line.substr(eq + 1)));
  }
  return out;
}

}  // namespace

TEST_CASE("errno_name gives lower-case POSIX names", "[glibc]") {
  CHECK(std::string(g::errno_name(ENOENT)) == "enoent");
  CHECK(std::string(g::errno_name(EACCES)) == "eacces");
  CHECK(std::string(g::errno_name(EISDIR)) == "eisdir");
  CHECK(std::string(g::errno_name(-1)) == "unknown");
  CHECK(std::string(g::errno_name(100000)) == "unknown");
}

TEST_CASE("info_xml returns a whole malloc_info document", "[glibc]") {
  std::string xml;
  REQUIRE(g::info_xml(xml) == 0);
  CHECK(xml.rfind("<malloc version=\"1\">", 0) == 0);
  CHECK(xml.find("</malloc>") != std::string::npos);
  CHECK(xml.find("<heap nr=\"0\">") != std::string::npos);
}

TEST_CASE("write_info_file writes atomically and reports errno", "[glibc]") {
  const fs::path dir = make_tmpdir();
  const fs::path file = dir / "x.xml";

  SECTION("success leaves exactly the target, readable, complete") {
    REQUIRE(g::write_info_file(file.string()) == 0);
    const std::string xml = slurp(file);
    CHECK(xml.find("</malloc>") != std::string::npos);
    CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}) == 1);
    struct stat st {};
    REQUIRE(::stat(file.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0644);
    // Overwrite replaces in place.
    REQUIRE(g::write_info_file(file.string()) == 0);
    CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}) == 1);
  }
  SECTION("missing directory") {
    CHECK(g::write_info_file((dir / "no/x.xml").string()) == ENOENT);
  }
  SECTION("path is a directory, and no temporary is left behind") {
    fs::create_directory(dir / "sub");
    CHECK(g::write_info_file((dir / "sub").string()) == EISDIR);
    CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}) == 1);
  }
  SECTION("a file used as a directory") {
    std::ofstream(dir / "plain") << "x";
    CHECK(g::write_info_file((dir / "plain/x.xml").string()) == ENOTDIR);
  }
  SECTION("empty path and embedded NUL") {
    CHECK(g::write_info_file("") == ENOENT);
    CHECK(g::write_info_file(std::string("a\0b", 3)) == EINVAL);
  }
  fs::remove_all(dir);
}

TEST_CASE("write_info_file replaces only a regular file or a missing name", "[glibc][file]") {
  mi::test::ScratchTargets scratch;
  const auto before = scratch.entries();
  for (const auto& t : scratch.targets()) {
    INFO(t.kind);
    const auto print = mi::test::ScratchTargets::fingerprint(t.path);
    CHECK(g::write_info_file(t.path) == t.expected_errno);
    CHECK(mi::test::ScratchTargets::fingerprint(t.path) == print);
  }
  // No temporary left beside any of them.
  CHECK(scratch.entries() == before);

  SECTION("a missing name is created") {
    const std::string fresh = scratch.dir() + "/fresh.xml";
    REQUIRE(g::write_info_file(fresh) == 0);
    CHECK(slurp(fresh).find("</malloc>") != std::string::npos);
  }
  SECTION("a regular file is replaced whole, by a new inode") {
    const std::string plain = scratch.dir() + "/plain.xml";
    std::ofstream(plain) << "old contents";
    const auto old = mi::test::ScratchTargets::fingerprint(plain);
    REQUIRE(g::write_info_file(plain) == 0);
    const auto now = mi::test::ScratchTargets::fingerprint(plain);
    CHECK(now.ino != old.ino);
    CHECK(S_ISREG(now.mode));
    CHECK(now.content.rfind("<malloc", 0) == 0);
    CHECK(now.content.find("</malloc>") != std::string::npos);
  }
}

TEST_CASE("AtomicFile checks the target again right before the rename", "[glibc][file]") {
  mi::test::ScratchTargets scratch;
  const std::string path = scratch.dir() + "/late";
  auto temporaries = [&] {
    size_t n = 0;
    for (const auto& e : scratch.entries()) n += e.rfind("late.tmp.", 0) == 0;
    return n;
  };
  mi::file::AtomicFile f;
  REQUIRE(f.open(path) == 0);
  REQUIRE(::write(f.fd(), "new", 3) == 3);
  CHECK(temporaries() == 1);

  SECTION("a FIFO that took the free name meanwhile stays") {
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    const auto print = mi::test::ScratchTargets::fingerprint(path);
    CHECK(f.commit() == EEXIST);
    CHECK(mi::test::ScratchTargets::fingerprint(path) == print);
  }
  SECTION("a symlink that took the free name meanwhile stays, and so does its target") {
    REQUIRE(::symlink("link-target", path.c_str()) == 0);
    const auto print = mi::test::ScratchTargets::fingerprint(path);
    CHECK(f.commit() == EEXIST);
    CHECK(mi::test::ScratchTargets::fingerprint(path) == print);
  }
  SECTION("a regular file that appeared meanwhile is replaced") {
    std::ofstream(path) << "someone else's";
    CHECK(f.commit() == 0);
    CHECK(slurp(path) == "new");
  }
  SECTION("the name still free") {
    CHECK(f.commit() == 0);
    CHECK(slurp(path) == "new");
  }
  CHECK(temporaries() == 0);
}

// Issue 28, item 11: any legal name can be written, up to NAME_MAX bytes:
// the temporary's name (the target's plus 11 bytes) is cut to fit.
TEST_CASE("AtomicFile writes names up to NAME_MAX bytes", "[glibc][file]") {
  mi::test::ScratchTargets scratch;
  const auto before = scratch.entries();
  for (size_t n : {size_t{1}, size_t{200}, size_t{244}, size_t{245}, size_t{250}, size_t{255}}) {
    INFO(n << " bytes");
    const std::string path = scratch.dir() + "/" + std::string(n, 'n');
    mi::file::AtomicFile f;
    REQUIRE(f.open(path) == 0);
    REQUIRE(::write(f.fd(), "x", 1) == 1);
    REQUIRE(f.commit() == 0);
    CHECK(slurp(path) == "x");
    REQUIRE(::unlink(path.c_str()) == 0);
  }
  CHECK(g::write_info_file(scratch.dir() + "/" + std::string(255, 'i')) == 0);
  CHECK(::unlink((scratch.dir() + "/" + std::string(255, 'i')).c_str()) == 0);
  // One byte more is the system's refusal, from the check of the target.
  mi::file::AtomicFile f;
  CHECK(f.open(scratch.dir() + "/" + std::string(256, 'n')) == ENAMETOOLONG);
  CHECK(scratch.entries() == before);
}

TEST_CASE("check_target names what it finds", "[glibc][file]") {
  mi::test::ScratchTargets scratch;
  for (const auto& t : scratch.targets()) {
    INFO(t.kind);
    CHECK(mi::file::check_target(t.path.c_str()) == t.expected_errno);
  }
  bool exists = true;
  CHECK(mi::file::check_target((scratch.dir() + "/none").c_str(), &exists) == 0);
  CHECK_FALSE(exists);
  CHECK(mi::file::check_target((scratch.dir() + "/link-target").c_str(), &exists) == 0);
  CHECK(exists);
  CHECK(mi::file::check_target((scratch.dir() + "/link-target/x").c_str()) == ENOTDIR);
  CHECK(mi::file::check_target((scratch.dir() + "/no/x").c_str()) == 0);  // the open fails later
  CHECK(mi::file::check_target("") == ENOENT);
}

TEST_CASE("read_file reads a whole file, in several reads, and never through a link",
          "[glibc][file]") {
  mi::test::ScratchTargets scratch;
  // Larger than one append_read() step (64 KiB), not a multiple of it.
  std::string text;
  for (int i = 0; text.size() < 200000; ++i) text += std::to_string(i) + ",";
  const std::string path = scratch.dir() + "/read-me";
  std::FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f != nullptr);
  REQUIRE(std::fwrite(text.data(), 1, text.size(), f) == text.size());
  REQUIRE(std::fclose(f) == 0);
  std::string out = "stale";
  CHECK(mi::file::read_file(path, out) == 0);
  CHECK(out == text);
  CHECK(mi::file::read_file(scratch.dir() + "/none", out) == ENOENT);
  for (const auto& t : scratch.targets()) {
    if (t.kind.find("symlink") == std::string::npos) continue;
    INFO(t.kind);
    CHECK(mi::file::read_file(t.path, out) == ELOOP);
  }
}

TEST_CASE("capture_stats equals malloc_stats() for the same heap state", "[glibc]") {
  // Give the heap some shape: a second arena (from a thread), mmapped blocks
  // and freed holes. Blocks stay live until the end of the test.
  std::vector<void*> keep;
  for (int i = 0; i < 64; ++i) keep.push_back(std::malloc(100 + i * 37));
  for (int i = 0; i < 64; i += 2) {
    std::free(keep[i]);
    keep[i] = nullptr;
  }
  keep.push_back(std::malloc(4 << 20));  // above the mmap threshold
  keep.push_back(std::malloc(2 << 20));
  std::thread([&keep] {
    for (int i = 0; i < 32; ++i) keep.push_back(std::malloc(1000));
  }).join();
  keep.reserve(keep.size() + 8);

  // 1. What malloc_stats() prints in this process, captured through fd 2.
  //    Nothing between here and the fork of capture_stats allocates.
  const fs::path dir = make_tmpdir();
  const std::string direct_path = (dir / "direct.txt").string();
  std::string captured;
  captured.reserve(1 << 16);
  const int fd = ::open(direct_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(fd, STDERR_FILENO);
  ::malloc_stats();
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(fd);
  const struct mallinfo2 mi = ::mallinfo2();

  // 2. The same, from capture_stats' child.
  REQUIRE(g::capture_stats(captured) == 0);
  const std::string direct = slurp(direct_path);

  REQUIRE(!direct.empty());
  REQUIRE(captured.size() > direct.size());
  CHECK(captured.substr(0, direct.size()) == direct);

  // 3. Cross-check the figures against mallinfo2 (an independent glibc path).
  const auto lines = stat_lines(captured);
  unsigned long long arena_system = 0, arena_in_use = 0, arenas = 0;
  std::map<std::string, unsigned long long> total;
  bool in_total = false;
  for (const auto& [name, value] : lines) {
    if (name.rfind("Arena ", 0) == 0) {
      ++arenas;
      in_total = false;
    } else if (name.rfind("Total", 0) == 0) {
      in_total = true;
    } else if (in_total || name.rfind("mmap ", 0) == 0 || name.rfind("max mmap", 0) == 0) {
      total[name] = value;
    } else if (name == "system bytes") {
      arena_system += value;
    } else if (name == "in use bytes") {
      arena_in_use += value;
    }
  }
  CHECK(arenas >= 2);
  CHECK(arena_system == mi.arena);
  CHECK(arena_in_use == mi.uordblks);
  CHECK(total["system bytes"] == mi.arena + mi.hblkhd);
  CHECK(total["in use bytes"] == mi.uordblks + mi.hblkhd);
  CHECK(total["mmap regions"] == mi.hblks);
  CHECK(total["mmap bytes"] == mi.hblkhd);
  CHECK(total["mmap regions"] >= 2);
  CHECK(total["max mmap regions"] >= total["mmap regions"]);
  CHECK(total["max mmap bytes"] >= total["mmap bytes"]);

  for (void* p : keep) std::free(p);
  fs::remove_all(dir);
}

TEST_CASE("mallinfo, resident bytes and trim", "[glibc]") {
  void* big = std::malloc(8 << 20);
  asm volatile("" : : "g"(big) : "memory");  // keep the malloc/free pair
  const g::Mallinfo m = g::read_mallinfo();
  CHECK(m.hblks >= 1);
  CHECK(m.hblkhd >= (8u << 20));
  std::free(big);
  const auto rss = g::resident_bytes();
  REQUIRE(rss.has_value());
  CHECK(*rss > 0);
  // Free a lot of small blocks so the top of the heap is trimmable.
  std::vector<void*> v;
  for (int i = 0; i < 20000; ++i) v.push_back(std::malloc(512));
  for (void* p : v) std::free(p);
  CHECK(g::trim(0));
}

TEST_CASE("mallopt parameters", "[glibc]") {
  CHECK(g::param_from_name("arena_max") == g::Param::arena_max);
  CHECK(g::param_from_name("perturb") == g::Param::perturb);
  CHECK_FALSE(g::param_from_name("nope").has_value());
  CHECK(g::set_param(g::Param::perturb, 0) == 0);
  CHECK(g::set_param(g::Param::top_pad, 128 * 1024) == 0);
  CHECK(g::set_param(g::Param::trim_threshold, -1) == 0);
  CHECK(g::set_param(g::Param::trim_threshold, 128 * 1024) == 0);
  // Values glibc would silently ignore are refused.
  CHECK(g::set_param(g::Param::mmap_threshold, INT_MAX) == EINVAL);
  CHECK(g::set_param(g::Param::mmap_threshold, -1) == EINVAL);
  CHECK(g::set_param(g::Param::arena_max, 0) == EINVAL);
  CHECK(g::set_param(g::Param::top_pad, -1) == EINVAL);
  CHECK(g::set_param(g::Param::trim_threshold, -2) == EINVAL);
}

TEST_CASE("mallinfo figures above 4 GiB do not wrap", "[glibc]") {
  // Address space only: an untouched mmapped block costs no resident memory.
  void* huge = std::malloc(size_t{5} << 30);
  REQUIRE(huge != nullptr);
  asm volatile("" : : "g"(huge) : "memory");
  const g::Mallinfo m = g::read_mallinfo();
  CHECK(m.hblkhd >= (uint64_t{5} << 30));
  std::free(huge);
}
