// Tests for symbolize/: against this very process (its own static functions,
// libc, the vDSO), a tiny shared object built at run time with g++, and fake
// perf maps. No fakes for the loader: it is the thing under test.
#include <dlfcn.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include "catch.h"

#include "../symbolize/elf_symbols.h"
#include "../symbolize/proc_maps.h"
#include "../symbolize/symbolize.h"
#include "loader_probe.h"
#include "unknown_addresses.h"

namespace sym = mi::symbolize;
namespace fs = std::filesystem;

// Targets. Distinct bodies so identical-code folding cannot merge them;
// taking their addresses keeps them out of line under their own names.
volatile int mi_sym_sink = 0;

static __attribute__((noinline)) int mi_sym_static_target(int x) {
  mi_sym_sink = mi_sym_sink + x;
  return x * 7 + 3;
}

extern "C" __attribute__((noinline)) int mi_sym_extern_c_target(int x) {
  mi_sym_sink = mi_sym_sink ^ x;
  return x * 11 + 5;
}

namespace mi_test {
__attribute__((noinline)) int frob(int x) {
  mi_sym_sink = mi_sym_sink - x;
  return x * 13 + 9;
}
}  // namespace mi_test

namespace {

template <class F>
uint64_t addr_of(F* f) {
  return reinterpret_cast<uint64_t>(f);
}

uint64_t main_program_bias() {
  uint64_t bias = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        *static_cast<uint64_t*>(data) = info->dlpi_addr;
        return 1;
      },
      &bias);
  return bias;
}

std::string exe_path() {
  return fs::read_symlink("/proc/self/exe").string();
}

// libc's own qsort: &qsort could be a sanitizer's interceptor.
uint64_t libc_qsort() {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(libc != nullptr);
  void* q = dlsym(libc, "qsort");
  dlclose(libc);
  REQUIRE(q != nullptr);
  return reinterpret_cast<uint64_t>(q);
}

fs::path make_sym_tmpdir() {
  std::string tmpl = (fs::temp_directory_path() / "mi_sym_XXXXXX").string();
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

std::string hex(uint64_t v) {
  std::ostringstream out;
  out << std::hex << v;
  return out.str();
}

// Two copies of one tiny library, built once per test run: `plain` keeps its
// .symtab; `stripped` has none, its symbols are in dir/dbg/.build-id/...
struct TestLib {
  fs::path dir;
  fs::path plain;
  fs::path stripped;
  fs::path debug_dir;
  bool ok = false;

  TestLib() {
    std::string tmpl = (fs::temp_directory_path() / "mi_sym_lib_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) return;
    dir = tmpl;
    plain = dir / "libmi_sym_plain.so";
    stripped = dir / "libmi_sym_stripped.so";
    debug_dir = dir / "dbg";
    std::ofstream(dir / "lib.cpp") << R"(
namespace {
__attribute__((noinline)) int hidden_helper(int x) { return x * 5 + 11; }
}
extern "C" void* mi_dl_static_addr() { return reinterpret_cast<void*>(&hidden_helper); }
extern "C" int mi_dl_exported(int x) { return hidden_helper(x) + 2; }
)";
    const std::string cmd =
        "cd '" + dir.string() +
        "' && g++ -shared -fPIC -O1 -Wl,--build-id -o libmi_sym_plain.so lib.cpp"
        " && cp libmi_sym_plain.so libmi_sym_stripped.so"
        " && id=$(readelf -n libmi_sym_stripped.so | sed -n 's/.*Build ID: *//p')"
        " && sub=dbg/.build-id/$(echo $id | cut -c1-2) && mkdir -p $sub"
        " && objcopy --only-keep-debug libmi_sym_stripped.so $sub/$(echo $id | cut -c3-).debug"
        " && strip libmi_sym_stripped.so";
    ok = std::system(cmd.c_str()) == 0;
  }
  ~TestLib() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
  TestLib(const TestLib&) = delete;
  TestLib& operator=(const TestLib&) = delete;
};

const TestLib* test_lib() {
  static TestLib lib;
  return lib.ok ? &lib : nullptr;
}

struct DlLib {
  void* handle = nullptr;
  uint64_t exported = 0;
  uint64_t hidden = 0;
  explicit DlLib(const fs::path& path) {
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    REQUIRE(handle != nullptr);
    exported = reinterpret_cast<uint64_t>(dlsym(handle, "mi_dl_exported"));
    auto getter = reinterpret_cast<void* (*)()>(dlsym(handle, "mi_dl_static_addr"));
    REQUIRE(exported != 0);
    REQUIRE(getter != nullptr);
    hidden = reinterpret_cast<uint64_t>(getter());
  }
  void close() {
    if (handle != nullptr) dlclose(handle);
    handle = nullptr;
  }
  ~DlLib() { close(); }
};

}  // namespace

TEST_CASE("a static function of the main program resolves through .symtab", "[symbolize]") {
  sym::Symbolizer s;
  const uint64_t a = addr_of(&mi_sym_static_target);

  // Return-address semantics: a+1 is looked up as a, offsets stay from a+1.
  const sym::Frame f = s.resolve(a + 1, true, true);
  CHECK(f.address == a + 1);
  CHECK(f.object == exe_path());
  CHECK(f.object_offset == a + 1 - main_program_bias());
  REQUIRE(f.symbol);
  CHECK(*f.symbol == "mi_sym_static_target(int)");
  CHECK(f.symbol_offset == 1);

  const sym::Frame g = s.resolve(a + 2, false, false);
  REQUIRE(g.symbol);
  CHECK(*g.symbol == "_ZL20mi_sym_static_targeti");
  CHECK(g.symbol_offset == 2);

  const sym::Frame exact = s.resolve(a, false, false);
  REQUIRE(exact.symbol);
  CHECK(exact.symbol_offset == 0);

  // As a return address, the function's first byte belongs to what precedes it.
  const sym::Frame before = s.resolve(a, true, true);
  CHECK(before.address == a);
  if (before.symbol) {
    CHECK(*before.symbol != "mi_sym_static_target(int)");
    CHECK(before.symbol_offset >= 1);
  }
}

TEST_CASE("extern \"C\" and namespaced C++ functions", "[symbolize]") {
  sym::Symbolizer s;
  const uint64_t c = addr_of(&mi_sym_extern_c_target);
  for (const bool demangle : {false, true}) {
    const sym::Frame f = s.resolve(c + 3, demangle, true);
    REQUIRE(f.symbol);
    CHECK(*f.symbol == "mi_sym_extern_c_target");
    CHECK(f.symbol_offset == 3);
  }

  const uint64_t frob = addr_of(&mi_test::frob);
  const sym::Frame demangled = s.resolve(frob + 1, true);
  REQUIRE(demangled.symbol);
  CHECK(*demangled.symbol == "mi_test::frob(int)");
  const sym::Frame mangled = s.resolve(frob + 1, false);
  REQUIRE(mangled.symbol);
  CHECK(*mangled.symbol == "_ZN7mi_test4frobEi");
  CHECK(mangled.symbol->rfind("_ZN", 0) == 0);
}

TEST_CASE("a libc function resolves to libc and its public name", "[symbolize]") {
  sym::Symbolizer s;
  const uint64_t q = libc_qsort();
  const sym::Frame f = s.resolve(q + 4, true, false);
  CHECK(f.object.find("libc.so") != std::string::npos);
  REQUIRE(f.symbol);
  CHECK(*f.symbol == "qsort");
  CHECK(f.symbol_offset == 4);

  // The file's own view: object_offset is qsort's link-time address + 4.
  const sym::Frame r = s.resolve(q + 1, false, true);
  REQUIRE(r.symbol);
  CHECK(*r.symbol == "qsort");
  CHECK(r.symbol_offset == 1);
  CHECK(r.object_offset == f.object_offset - 3);
}

TEST_CASE("an object dlopen'ed after first use is found, and forgotten after dlclose",
          "[symbolize]") {
  const TestLib* lib = test_lib();
  if (lib == nullptr) {
    WARN("could not build the test library with g++; skipped");
    return;
  }
  sym::Symbolizer s;
  REQUIRE(s.resolve(addr_of(&mi_sym_extern_c_target) + 1, false).symbol);
  const uint64_t rescans_before = s.stats().rescans;

  DlLib dl(lib->plain);
  const sym::Frame f = s.resolve(dl.exported + 3, false, false);
  CHECK(f.object == lib->plain.string());
  REQUIRE(f.symbol);
  CHECK(*f.symbol == "mi_dl_exported");
  CHECK(f.symbol_offset == 3);
  CHECK(s.stats().rescans > rescans_before);

  // Its static function: only in the library's .symtab.
  const sym::Frame h = s.resolve(dl.hidden + 1, true);
  REQUIRE(h.symbol);
  CHECK(*h.symbol == "(anonymous namespace)::hidden_helper(int)");

  const uint64_t gone = dl.exported + 3;
  dl.close();
  const sym::Frame after = s.resolve(gone, false, false);
  CHECK(after.object != lib->plain.string());
  CHECK((!after.symbol || *after.symbol != "mi_dl_exported"));
}

TEST_CASE("separate debug info is found by build-id", "[symbolize]") {
  const TestLib* lib = test_lib();
  if (lib == nullptr) {
    WARN("could not build the test library with g++; skipped");
    return;
  }
  DlLib dl(lib->stripped);

  sym::SymbolizerOptions with_debug;
  with_debug.debug_dir = lib->debug_dir.string();
  sym::Symbolizer s(with_debug);
  const sym::Frame h = s.resolve(dl.hidden + 1, true);
  CHECK(h.object == lib->stripped.string());
  REQUIRE(h.symbol);
  CHECK(*h.symbol == "(anonymous namespace)::hidden_helper(int)");

  sym::SymbolizerOptions without;
  without.debug_dir = "";
  sym::Symbolizer bare(without);
  const sym::Frame b = bare.resolve(dl.hidden + 1, true);
  CHECK(b.object == lib->stripped.string());
  CHECK((!b.symbol || b.symbol->find("hidden_helper") == std::string::npos));
  // .dynsym still names the exported function.
  const sym::Frame e = bare.resolve(dl.exported + 1, false);
  REQUIRE(e.symbol);
  CHECK(*e.symbol == "mi_dl_exported");
}

TEST_CASE("addresses outside ELF objects", "[symbolize]") {
  sym::Symbolizer s;

  SECTION("unmapped") {
    for (const uint64_t a : {uint64_t{0x10}, uint64_t{0}}) {
      const sym::Frame f = s.resolve(a, true);
      CHECK(f.address == a);
      CHECK(f.object.empty());
      CHECK(f.object_offset == 0);
      CHECK_FALSE(f.symbol);
      CHECK(f.symbol_offset == 0);
    }
  }
  SECTION("heap, small and large") {
    auto small = std::make_unique<char[]>(64);
    auto large = std::make_unique<char[]>(8 << 20);
    for (const char* p : {small.get(), large.get()}) {
      const sym::Frame f = s.resolve(reinterpret_cast<uint64_t>(p), true, false);
      INFO(f.object);
      REQUIRE(f.object.size() >= 2);
      CHECK(f.object.front() == '[');
      CHECK(f.object.back() == ']');
      CHECK(f.object != mi::symbolize::kErlangJit);
      CHECK_FALSE(f.symbol);
    }
  }
  SECTION("stack") {
    volatile int local = 0;
    const sym::Frame f = s.resolve(reinterpret_cast<uint64_t>(&local), true, false);
    INFO(f.object);
    REQUIRE_FALSE(f.object.empty());
    CHECK(f.object.front() == '[');
    CHECK_FALSE(f.symbol);
  }
  SECTION("vDSO") {
    const uint64_t base = ::getauxval(AT_SYSINFO_EHDR);
    if (base == 0) return;
    CHECK(s.resolve(base, false, false).object == "[vdso]");
    std::vector<uint64_t> addresses;
    for (uint64_t off = 0; off < 0x4000; off += 4) addresses.push_back(base + off);
    bool found = false;
    for (const sym::Frame& f : s.resolve_all(addresses, false, false)) {
      if (f.object == "[vdso]" && f.symbol && f.symbol->find("gettime") != std::string::npos) {
        found = true;
        break;
      }
    }
    CHECK(found);
  }
}

TEST_CASE("the BEAM JIT's memfd:vmem code is named as Erlang code, without a perf map",
          "[symbolize]") {
  // What OTP 25+ maps: a memfd named "vmem", unlinked, so /proc/self/maps
  // says "/memfd:vmem (deleted)". Without the name the frame read
  // "+0x56e (memfd:vmem (deleted))".
  const int fd = ::memfd_create("vmem", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 8192) == 0);
  void* code = ::mmap(nullptr, 8192, PROT_READ | PROT_EXEC, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(code != MAP_FAILED);
  sym::SymbolizerOptions options;
  options.perf_map_path = "/nonexistent/perf.map";
  sym::Symbolizer s(options);
  const sym::Frame f = s.resolve(reinterpret_cast<uint64_t>(code) + 0x56e, false, false);
  CHECK(f.object == mi::symbolize::kErlangJit);
  CHECK(f.object_offset == 0x56e);
  CHECK_FALSE(f.symbol);
  ::munmap(code, 8192);
}

TEST_CASE("JIT frames from a perf map", "[symbolize]") {
  const fs::path dir = make_sym_tmpdir();
  const fs::path map = dir / "perf-test.map";
  const size_t len = 4096;
  void* region = ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(region != MAP_FAILED);
  const uint64_t base = reinterpret_cast<uint64_t>(region);

  // OTP writes "%p %tx $name"; other JITs omit the 0x.
  std::ofstream(map) << "0x" << hex(base) << " 40 $lists:reverse/2\n"
                     << hex(base + 0x100) << " 20 $erlang:apply/3\n";
  sym::SymbolizerOptions options;
  options.perf_map_path = map.string();
  sym::Symbolizer s(options);

  sym::Frame f = s.resolve(base + 0x10, false, false);
  CHECK(f.object == mi::symbolize::kErlangJit);
  CHECK(f.object_offset == base + 0x10);
  REQUIRE(f.symbol);
  CHECK(*f.symbol == "$lists:reverse/2");
  CHECK(f.symbol_offset == 0x10);

  f = s.resolve(base + 0x106, true, true);
  REQUIRE(f.symbol);
  CHECK(*f.symbol == "$erlang:apply/3");
  CHECK(f.symbol_offset == 6);

  f = s.resolve(base + 0x80, false, false);
  CHECK(f.object == "[anon]");
  CHECK(f.object_offset == 0x80);
  CHECK_FALSE(f.symbol);

  // Appended lines are picked up; a later entry for a start wins; a line
  // still being written is not used until complete.
  std::ofstream(map, std::ios::app) << "0x" << hex(base + 0x200) << " 10 $new:fun/0\n"
                                    << "0x" << hex(base) << " 40 $lists:reverse/2-reloaded\n"
                                    << "0x" << hex(base + 0x300) << " 10 $par";
  f = s.resolve(base + 0x205, false, false);
  REQUIRE(f.symbol);
  CHECK(*f.symbol == "$new:fun/0");
  f = s.resolve(base + 0x10, false, false);
  REQUIRE(f.symbol);
  CHECK(*f.symbol == "$lists:reverse/2-reloaded");
  CHECK_FALSE(s.resolve(base + 0x305, false, false).symbol);
  std::ofstream(map, std::ios::app) << "tial:x/1\n";
  f = s.resolve(base + 0x305, false, false);
  REQUIRE(f.symbol);
  CHECK(*f.symbol == "$partial:x/1");

  fs::remove(map);
  f = s.resolve(base + 0x10, false, false);
  CHECK(f.object == "[anon]");
  CHECK_FALSE(f.symbol);

  // The default path is /tmp/perf-<pid>.map.
  const fs::path default_map = "/tmp/perf-" + std::to_string(::getpid()) + ".map";
  if (!fs::exists(default_map)) {
    std::ofstream(default_map) << hex(base) << " 8 $default:path/0\n";
    sym::Symbolizer d;
    f = d.resolve(base + 1, false, false);
    fs::remove(default_map);
    REQUIRE(f.symbol);
    CHECK(*f.symbol == "$default:path/0");
  }

  ::munmap(region, len);
  fs::remove_all(dir);
}

namespace {

using Unknowns = mi::test::UnknownAddresses;

void check_unknown_frames(const std::vector<sym::Frame>& frames, const Unknowns& u) {
  REQUIRE(frames.size() == u.addresses.size());
  size_t anon = 0, unmapped = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    const sym::Frame& f = frames[i];
    CHECK(f.address == u.addresses[i]);
    CHECK_FALSE(f.symbol);
    if (i % 2 == 0) {
      anon += f.object == "[anon]" ? 1 : 0;
      CHECK(f.object_offset == f.address - reinterpret_cast<uint64_t>(u.map));
    } else {
      unmapped += f.object.empty() ? 1 : 0;
      CHECK(f.object_offset == 0);
    }
  }
  CHECK(anon == 500);
  CHECK(unmapped == 500);
}

}  // namespace

TEST_CASE("misses: /proc/self/maps is read at most once per batch, and not for known ones",
          "[symbolize]") {
  sym::Symbolizer s;
  Unknowns a(0), b(1);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  (void)s.resolve(addr_of(&mi_test::frob), false);  // the object list, read once
  const uint64_t reads0 = s.stats().maps_reads;

  // A batch of 1000 unknown addresses: one read.
  check_unknown_frames(s.resolve_all(a.addresses, false, false), a);
  CHECK(s.stats().maps_reads - reads0 == 1);
  CHECK(s.stats().cached_misses == 1000);

  // The same addresses again, in a batch or one by one: no read at all.
  check_unknown_frames(s.resolve_all(a.addresses, false, false), a);
  std::vector<sym::Frame> singles;
  for (const uint64_t addr : a.addresses) singles.push_back(s.resolve(addr, false, false));
  check_unknown_frames(singles, a);
  CHECK(s.stats().maps_reads - reads0 == 1);

  // 1000 new ones one at a time in one SymbolizeBatch: one read.
  sym::SymbolizeBatch batch;
  singles.clear();
  for (const uint64_t addr : b.addresses) singles.push_back(s.resolve(addr, false, false, batch));
  check_unknown_frames(singles, b);
  CHECK(s.stats().maps_reads - reads0 == 2);

  // Mappings change: a batch that reads the file for a new miss refreshes
  // the known misses it meets from that read; one that does not read keeps
  // the cached answer.
  const uint64_t in_a = a.addresses[0];
  a.unmap();
  CHECK(s.resolve(in_a, false, false).object == "[anon]");
  CHECK(s.stats().maps_reads - reads0 == 2);
  const std::vector<sym::Frame> fresh = s.resolve_all({0x2345, in_a}, false, false);
  CHECK(s.stats().maps_reads - reads0 == 3);
  CHECK(fresh[1].object != "[anon]");
  CHECK(fresh[1].object_offset == 0);
}

TEST_CASE("the object scan allocates nothing inside dl_iterate_phdr callbacks", "[symbolize]") {
  // The loader holds its lock around the callbacks; an allocation there
  // reaches malloc's hooks with it held (issue 15). Counted by interposing
  // malloc and dl_iterate_phdr in this binary (loader_probe).
  if (!loader_probe::available()) {
    WARN("sanitizer build: allocations are not probed here");
    return;
  }
  for (const size_t initial : {size_t{64}, size_t{1}}) {
    INFO("room for " << initial << " objects at first");
    sym::SymbolizerOptions options;
    options.initial_scan_objects = initial;
    sym::Symbolizer s(options);
    const loader_probe::Counts before = loader_probe::thread_counts();
    const sym::Frame f = s.resolve(libc_qsort() + 1, false);
    CHECK(f.symbol == std::optional<std::string>("qsort"));
    s.clear();  // a second full scan
    CHECK(s.resolve(addr_of(&mi_test::frob) + 1, false).symbol ==
          std::optional<std::string>("_ZN7mi_test4frobEi"));
    const loader_probe::Counts after = loader_probe::thread_counts();
    CHECK(s.stats().rescans == 2);
    // Every loaded object was visited (libc, the vDSO, this program, ...).
    CHECK(after.callbacks - before.callbacks > 6);
    CHECK(after.allocations_in_callbacks - before.allocations_in_callbacks == 0);
  }
}

TEST_CASE("resolve_all keeps order and uses the cache", "[symbolize]") {
  sym::Symbolizer s;
  const uint64_t frob = addr_of(&mi_test::frob);
  const uint64_t q = libc_qsort();
  const uint64_t st = addr_of(&mi_sym_static_target);
  const std::vector<uint64_t> addresses{frob + 1, 0x10, q + 1, st + 1, frob + 2};

  const std::vector<sym::Frame> frames = s.resolve_all(addresses, true);
  REQUIRE(frames.size() == addresses.size());
  for (size_t i = 0; i < frames.size(); ++i) CHECK(frames[i].address == addresses[i]);
  CHECK(frames[0].symbol == std::optional<std::string>("mi_test::frob(int)"));
  CHECK(frames[0].symbol_offset == 1);
  CHECK(frames[1].object.empty());
  CHECK_FALSE(frames[1].symbol);
  CHECK(frames[2].symbol == std::optional<std::string>("qsort"));
  CHECK(frames[3].symbol == std::optional<std::string>("mi_sym_static_target(int)"));
  CHECK(frames[4].symbol == std::optional<std::string>("mi_test::frob(int)"));
  CHECK(frames[4].symbol_offset == 2);

  const sym::SymbolizerStats before = s.stats();
  const std::vector<sym::Frame> again = s.resolve_all(addresses, false);
  const sym::SymbolizerStats after = s.stats();
  CHECK(after.cache_hits - before.cache_hits == 5);  // the unmapped one as a known miss
  CHECK(after.maps_reads == before.maps_reads);
  CHECK(after.objects_loaded == before.objects_loaded);
  CHECK(again[0].symbol == std::optional<std::string>("_ZN7mi_test4frobEi"));

  s.clear();
  CHECK(s.stats().cached_addresses == 0);
  CHECK(s.stats().cached_misses == 0);
  CHECK(s.resolve(q + 1, false).symbol == std::optional<std::string>("qsort"));
}

TEST_CASE("demangle", "[symbolize]") {
  CHECK(sym::demangle("_ZN7mi_test4frobEi") == "mi_test::frob(int)");
  CHECK(sym::demangle("_ZNSt6vectorIiSaIiEE9push_backERKi") ==
        "std::vector<int, std::allocator<int> >::push_back(int const&)");
  CHECK(sym::demangle("_Z3fooi.cold") == "foo(int) [clone .cold]");
  // Not mangled, or not valid: unchanged.
  CHECK(sym::demangle("main") == "main");
  CHECK(sym::demangle("i") == "i");  // __cxa_demangle alone would say "int"
  CHECK(sym::demangle("") == "");
  CHECK(sym::demangle("_Z") == "_Z");
  CHECK(sym::demangle("_Zgarbage!!") == "_Zgarbage!!");
  CHECK(sym::demangle("$lists:reverse/2") == "$lists:reverse/2");
}

TEST_CASE("parse_maps reads names with spaces and skips junk", "[symbolize]") {
  const auto maps = sym::detail::parse_maps(
      "5563a000-5563b000 r--p 00000000 fd:01 123  /opt/my app/bin (deleted)\n"
      "not a line\n"
      "7ffd1000-7ffd2000 rw-p 00000000 00:00 0                          [stack]\n"
      "7f0000000000-7f0000100000 rw-p 00000000 00:00 0 \n"
      "7f0000200000-7f0000201000 r-xp 00002000 fd:01 99 /usr/lib/x.so\n");
  REQUIRE(maps.size() == 4);  // sorted by start
  CHECK(maps[0].name == "/opt/my app/bin (deleted)");
  CHECK(maps[1].name == "[stack]");
  CHECK(maps[2].name.empty());
  CHECK(maps[2].end == 0x7f0000100000);
  CHECK(maps[3].offset == 0x2000);
  CHECK(maps[3].name == "/usr/lib/x.so");
  CHECK(sym::detail::find_mapping(maps, 0x7ffd1fff) == &maps[1]);
  CHECK(sym::detail::find_mapping(maps, 0x7ffd2000) == nullptr);
  CHECK(sym::detail::find_mapping(maps, 0x10) == nullptr);
}

TEST_CASE("the ELF reader survives corrupt images", "[symbolize]") {
  std::ifstream in("/proc/self/exe", std::ios::binary);
  std::vector<char> image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(image.size() > 4096);
  const size_t good = sym::detail::SymbolTable::from_image(image.data(), image.size()).size();
  CHECK(good > 0);
  CHECK(sym::detail::build_id_hex(image.data(), image.size()).size() >= 16);

  for (const size_t cut : {size_t{0}, size_t{4}, size_t{63}, size_t{64}, image.size() / 2}) {
    CHECK(sym::detail::SymbolTable::from_image(image.data(), cut).size() <= good);
  }
  // Scribble over the section header table (at the end of the file) and the
  // ELF header's section fields; every read must stay in bounds (ASan).
  std::mt19937_64 rng(42);
  const size_t tail = std::min<size_t>(image.size(), 64 * 64);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::pair<size_t, char>> saved;
    auto scribble = [&](size_t at) {
      saved.emplace_back(at, image[at]);
      image[at] = static_cast<char>(rng());
    };
    for (int k = 0; k < 16; ++k) scribble(image.size() - 1 - rng() % tail);
    if (round % 2 == 0) scribble(0x28 + rng() % 24);  // e_shoff .. e_shstrndx
    (void)sym::detail::SymbolTable::from_image(image.data(), image.size());
    (void)sym::detail::build_id_hex(image.data(), image.size());
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) image[it->first] = it->second;
  }
}

TEST_CASE("concurrent resolution from several threads", "[symbolize]") {
  sym::Symbolizer s;
  const uint64_t st = addr_of(&mi_sym_static_target);
  const uint64_t frob = addr_of(&mi_test::frob);
  const uint64_t q = libc_qsort();
  auto heap = std::make_unique<int>(1);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const uint64_t k = 1 + static_cast<uint64_t>((i + t) % 4);
        if (t == 0 && i % 500 == 499) s.clear();
        const sym::Frame a = s.resolve(st + k, true);
        const sym::Frame b = s.resolve(frob + k, false);
        const std::vector<sym::Frame> c =
            s.resolve_all({q + k, 0x10, reinterpret_cast<uint64_t>(heap.get())}, false);
        const bool ok = a.symbol == std::optional<std::string>("mi_sym_static_target(int)") &&
                        a.symbol_offset == k &&
                        b.symbol == std::optional<std::string>("_ZN7mi_test4frobEi") &&
                        c.size() == 3 && c[0].symbol == std::optional<std::string>("qsort") &&
                        c[1].object.empty() && !c[2].symbol;
        if (!ok) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(failures.load() == 0);
}
