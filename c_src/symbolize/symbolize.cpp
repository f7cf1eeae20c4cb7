#include "symbolize.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "elf_symbols.h"
#include "proc_maps.h"

namespace mi::symbolize {
namespace {

using detail::Mapping;
using detail::SymbolTable;

// Past this many cached addresses the cache starts over: a bound on memory
// for callers that feed it every address they ever saw.
constexpr size_t kMaxCachedAddresses = size_t{1} << 20;

struct Generation {
  unsigned long long adds = 0;
  unsigned long long subs = 0;
  bool operator==(const Generation&) const = default;
};

bool has_counters(size_t size) {
  return size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(dl_phdr_info::dlpi_subs);
}

// The counters are global, so the first object is enough: one step of
// dl_iterate_phdr (about 25 ns), cheap enough to do on every call. Writes
// the caller's POD only: it runs under the loader's lock (see ScanBuffer).
int generation_callback(dl_phdr_info* info, size_t size, void* data) {
  if (has_counters(size)) {
    *static_cast<Generation*>(data) = Generation{info->dlpi_adds, info->dlpi_subs};
  }
  return 1;
}

Generation current_generation() {
  Generation g;
  dl_iterate_phdr(generation_callback, &g);
  return g;
}

struct LoadedObject {
  std::string name;
  uint64_t bias = 0;
  std::vector<std::pair<uint64_t, uint64_t>> segments;  // [start, end) of PT_LOADs
  bool first = false;
};

// What scan_callback copies out of the loader. The loader holds its lock
// around the callback, and an allocation there would reach malloc's hooks
// with that lock held (the tracker's, or any other interposer's: issue 15),
// so the callback only appends to storage reserved before the walk, after
// checking that it fits; sizes never pass capacities, so nothing
// reallocates. An object that does not fit stops the walk, which is redone
// with more room (rescan).
struct RawObject {
  uint64_t bias;
  size_t name_begin, name_end;        // in ScanBuffer::names
  size_t segment_begin, segment_end;  // in ScanBuffer::segments
};

struct ScanBuffer {
  std::vector<RawObject> objects;
  std::vector<std::pair<uint64_t, uint64_t>> segments;
  std::vector<char> names;
  Generation generation;
  bool full = false;

  void clear() {
    objects.clear();
    segments.clear();
    names.clear();
    full = false;
  }
  // Room for at least `objects_at_least` objects (4 segments and 128 name
  // bytes each), else doubles every capacity. Never during a walk.
  void grow(size_t objects_at_least) {
    const size_t n = std::max<size_t>({1, objects_at_least, 2 * objects.capacity()});
    objects.reserve(n);
    segments.reserve(std::max(4 * n, 2 * segments.capacity()));
    names.reserve(std::max(128 * n, 2 * names.capacity()));
  }
};

int scan_callback(dl_phdr_info* info, size_t size, void* data) noexcept {
  auto* scan = static_cast<ScanBuffer*>(data);
  const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
  const size_t len = std::strlen(name);
  size_t loads = 0;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i)
    if (info->dlpi_phdr[i].p_type == PT_LOAD && info->dlpi_phdr[i].p_memsz > 0) ++loads;
  if (scan->objects.size() == scan->objects.capacity() ||
      scan->segments.capacity() - scan->segments.size() < loads ||
      scan->names.capacity() - scan->names.size() < len) {
    scan->full = true;
    return 1;
  }
  const RawObject object{info->dlpi_addr, scan->names.size(), scan->names.size() + len,
                         scan->segments.size(), scan->segments.size() + loads};
  scan->names.insert(scan->names.end(), name, name + len);
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && ph.p_memsz > 0) {
      const uint64_t start = info->dlpi_addr + ph.p_vaddr;
      scan->segments.emplace_back(start, start + ph.p_memsz);
    }
  }
  scan->objects.push_back(object);
  if (has_counters(size)) scan->generation = Generation{info->dlpi_adds, info->dlpi_subs};
  return 0;
}

// The loaded objects, through scan_callback into `buffer` (kept between
// calls, so a steady object list allocates nothing), then copied into
// allocating structures once the loader's lock is released.
std::vector<LoadedObject> scan_objects(ScanBuffer& buffer, size_t initial_objects,
                                       Generation* generation) {
  if (buffer.objects.capacity() == 0) buffer.grow(initial_objects);
  for (;;) {
    buffer.clear();
    dl_iterate_phdr(scan_callback, &buffer);
    if (!buffer.full) break;
    buffer.grow(0);
  }
  std::vector<LoadedObject> objects;
  objects.reserve(buffer.objects.size());
  for (const RawObject& raw : buffer.objects) {
    LoadedObject object;
    object.name.assign(buffer.names.data() + raw.name_begin, raw.name_end - raw.name_begin);
    object.bias = raw.bias;
    object.segments.assign(buffer.segments.begin() + static_cast<ptrdiff_t>(raw.segment_begin),
                           buffer.segments.begin() + static_cast<ptrdiff_t>(raw.segment_end));
    object.first = objects.empty();
    objects.push_back(std::move(object));
  }
  *generation = buffer.generation;
  return objects;
}

std::string self_exe_path() {
  std::string path(256, '\0');
  for (;;) {
    const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size());
    if (n < 0) return "/proc/self/exe";
    if (static_cast<size_t>(n) < path.size()) {
      path.resize(static_cast<size_t>(n));
      return path;
    }
    path.resize(path.size() * 2);
  }
}

// A symbol table once it has been asked for; shared by the modules of
// successive scans while the object stays loaded.
struct TableSlot {
  bool attempted = false;
  std::optional<SymbolTable> table;
};

struct Module {
  std::string path;  // as reported
  std::string file;  // as opened ("" for the vDSO: read from memory)
  uint64_t bias = 0;
  bool vdso = false;
  TableSlot* slot = nullptr;
};

struct Range {
  uint64_t start;
  uint64_t end;
  size_t module;
};

// What is known about one looked-up address.
struct Resolved {
  std::string object;
  uint64_t base = 0;  // object_offset = address - base
  bool mapped = true;
  std::optional<std::string> symbol;
  std::optional<std::string> demangled;  // filled on first demangled use
  uint64_t symbol_start = 0;
};

// An address outside every loaded object, as /proc/self/maps placed it,
// and which read of that file said so.
struct Missed {
  Resolved resolved;
  uint64_t maps_epoch = 0;
};

}  // namespace

// Sources read at most once per batch.
struct SymbolizeBatch::State {
  bool maps_read = false;
  std::vector<Mapping> maps;
  uint64_t maps_epoch = 0;  // the Symbolizer's count of maps reads, at ours
  bool perf_map_refreshed = false;
};

SymbolizeBatch::SymbolizeBatch() : state_(std::make_unique<State>()) {}
SymbolizeBatch::~SymbolizeBatch() = default;

using Batch = SymbolizeBatch::State;

struct Symbolizer::Impl {
  explicit Impl(SymbolizerOptions o) : options(std::move(o)) {}

  SymbolizerOptions options;
  mutable std::mutex mutex;
  bool scanned = false;
  Generation generation;
  std::string exe_path;
  std::vector<Module> modules;
  std::vector<Range> ranges;  // sorted by start
  std::map<std::pair<std::string, uint64_t>, std::unique_ptr<TableSlot>> tables;
  std::unordered_map<uint64_t, Resolved> cache;  // keyed by looked-up address
  std::unordered_map<uint64_t, Missed> misses;   // outside every object, ditto
  detail::PerfMap perf_map;
  ScanBuffer scan_buffer;
  SymbolizerStats stats;

  // All below: `mutex` held.

  void sync() {
    if (scanned && current_generation() == generation) return;
    const bool had_scan = scanned;
    const Generation before = generation;
    rescan();
    // After an unload, cached addresses may now belong to something else.
    if (!had_scan || generation.subs != before.subs) cache.clear();
  }

  void rescan() {
    Generation scanned_generation;
    const std::vector<LoadedObject> objects =
        scan_objects(scan_buffer, options.initial_scan_objects, &scanned_generation);
    ++stats.rescans;
    if (exe_path.empty()) exe_path = self_exe_path();
    const uint64_t vdso_base = ::getauxval(AT_SYSINFO_EHDR);

    std::vector<Module> new_modules;
    std::vector<Range> new_ranges;
    for (const LoadedObject& object : objects) {
      Module m;
      m.bias = object.bias;
      const bool holds_vdso =
          vdso_base != 0 && std::any_of(object.segments.begin(), object.segments.end(),
                                        [vdso_base](const std::pair<uint64_t, uint64_t>& s) {
                                          return s.first <= vdso_base && vdso_base < s.second;
                                        });
      if (object.name.empty()) {
        if (!object.first) continue;  // only the main program has no name
        m.path = exe_path;
        m.file = "/proc/self/exe";  // opens the running binary even if replaced
      } else if (holds_vdso && object.name.front() != '/') {
        m.path = "[vdso]";
        m.vdso = true;
      } else {
        m.path = object.name;
        m.file = object.name;
      }
      std::unique_ptr<TableSlot>& slot = tables[{m.path, m.bias}];
      if (!slot) slot = std::make_unique<TableSlot>();
      m.slot = slot.get();
      for (const auto& [start, end] : object.segments) {
        new_ranges.push_back(Range{start, end, new_modules.size()});
      }
      new_modules.push_back(std::move(m));
    }
    std::sort(new_ranges.begin(), new_ranges.end(),
              [](const Range& a, const Range& b) { return a.start < b.start; });

    // Tables of objects no longer loaded go.
    for (auto it = tables.begin(); it != tables.end();) {
      const TableSlot* slot = it->second.get();
      const bool used = std::any_of(new_modules.begin(), new_modules.end(),
                                    [slot](const Module& m) { return m.slot == slot; });
      it = used ? std::next(it) : tables.erase(it);
    }
    modules = std::move(new_modules);
    ranges = std::move(new_ranges);
    generation = scanned_generation;
    scanned = true;
  }

  const Module* find_module(uint64_t address) const {
    auto it = std::upper_bound(ranges.begin(), ranges.end(), address,
                               [](uint64_t a, const Range& r) { return a < r.start; });
    if (it == ranges.begin()) return nullptr;
    --it;
    return address < it->end ? &modules[it->module] : nullptr;
  }

  std::optional<SymbolTable> load_vdso(Batch& batch) {
    const uint64_t base = ::getauxval(AT_SYSINFO_EHDR);
    const Mapping* mapping = find_mapping(maps(batch), base);
    if (base == 0 || mapping == nullptr) return std::nullopt;
    return SymbolTable::from_image(reinterpret_cast<const void*>(base), mapping->end - base);
  }

  const std::vector<Mapping>& maps(Batch& batch) {
    if (!batch.maps_read) {
      batch.maps = detail::read_self_maps();
      batch.maps_read = true;
      batch.maps_epoch = ++stats.maps_reads;
    }
    return batch.maps;
  }

  Resolved resolve_in_module(const Module& m, uint64_t address, Batch& batch) {
    TableSlot& slot = *m.slot;
    if (!slot.attempted) {
      slot.attempted = true;
      ++stats.objects_loaded;
      slot.table = m.vdso ? load_vdso(batch) : SymbolTable::load_file(m.file, options.debug_dir);
    }
    Resolved r;
    r.object = m.path;
    r.base = m.bias;
    if (slot.table) {
      if (auto hit = slot.table->lookup(address - m.bias)) {
        r.symbol.emplace(hit->name);
        r.symbol_start = hit->start + m.bias;
      }
      return r;
    }
    // The file is unreadable (deleted, no permission): the loader's own
    // dynamic symbols, only when their size proves they cover the address.
    Dl_info info;
    void* extra = nullptr;
    if (dladdr1(reinterpret_cast<void*>(address), &info, &extra, RTLD_DL_SYMENT) != 0 &&
        info.dli_sname != nullptr && info.dli_saddr != nullptr && extra != nullptr) {
      const auto* sym = static_cast<const ElfW(Sym)*>(extra);
      const uint64_t start = reinterpret_cast<uint64_t>(info.dli_saddr);
      if (address - start < sym->st_size) {
        r.symbol.emplace(info.dli_sname);
        r.symbol_start = start;
      }
    }
    return r;
  }

  std::string perf_map_path() const {
    if (!options.perf_map_path.empty()) return options.perf_map_path;
    return "/tmp/perf-" + std::to_string(::getpid()) + ".map";
  }

  // JIT answers are not cached (the perf map grows and code memory is
  // reused after purges): the perf map is refreshed once per batch. Answers
  // from /proc/self/maps are (misses): an address seen before is answered
  // from the cache without reading the file, and a batch that reads it
  // anyway (for an address not seen before) refreshes the cached answers
  // it meets from that same read. So a batch reads /proc/self/maps at most
  // once, and not at all when all its misses are known.
  Resolved resolve_outside_objects(uint64_t address, Batch& batch) {
    Resolved r;
    if (options.use_perf_map) {
      if (!batch.perf_map_refreshed) {
        batch.perf_map_refreshed = true;
        perf_map.refresh(perf_map_path());
      }
      if (const detail::PerfMap::Entry* e = perf_map.find(address)) {
        r.object = kErlangJit;
        r.symbol = e->name;
        r.symbol_start = e->start;
        return r;
      }
    }
    if (auto it = misses.find(address);
        it != misses.end() && (!batch.maps_read || it->second.maps_epoch == batch.maps_epoch)) {
      ++stats.cache_hits;
      return it->second.resolved;
    }
    if (const Mapping* m = find_mapping(maps(batch), address)) {
      if (m->name.empty()) {
        r.object = "[anon]";
        r.base = m->start;
      } else if (m->name.starts_with("/memfd:vmem")) {
        // The BEAM JIT's code (OTP 25+ maps it twice from a memfd named
        // "vmem", one view writable, one executable): Erlang code.
        r.object = kErlangJit;
        r.base = m->start;
      } else {
        r.object = m->name;
        r.base = m->name.front() == '/' ? m->start - m->offset : m->start;
      }
    } else {
      r.mapped = false;
    }
    if (misses.size() >= kMaxCachedAddresses) misses.clear();
    misses[address] = Missed{r, batch.maps_epoch};
    return r;
  }

  static Frame make_frame(uint64_t address, Resolved& r, bool demangle_names) {
    Frame f;
    f.address = address;
    f.object = r.object;
    f.object_offset = r.mapped ? address - r.base : 0;
    if (r.symbol) {
      f.symbol_offset = address - r.symbol_start;
      if (demangle_names) {
        if (!r.demangled) r.demangled = demangle(*r.symbol);
        f.symbol = *r.demangled;
      } else {
        f.symbol = *r.symbol;
      }
    }
    return f;
  }

  Frame resolve_one(uint64_t address, bool demangle_names, bool return_address, Batch& batch) {
    ++stats.lookups;
    const uint64_t lookup = return_address && address > 0 ? address - 1 : address;
    if (auto it = cache.find(lookup); it != cache.end()) {
      ++stats.cache_hits;
      return make_frame(address, it->second, demangle_names);
    }
    if (const Module* m = find_module(lookup)) {
      Resolved r = resolve_in_module(*m, lookup, batch);
      if (cache.size() >= kMaxCachedAddresses) cache.clear();
      return make_frame(address, cache.emplace(lookup, std::move(r)).first->second, demangle_names);
    }
    Resolved r = resolve_outside_objects(lookup, batch);
    return make_frame(address, r, demangle_names);
  }
};

Symbolizer::Symbolizer() : Symbolizer(SymbolizerOptions{}) {}

Symbolizer::Symbolizer(SymbolizerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

Symbolizer::~Symbolizer() = default;

Frame Symbolizer::resolve(uint64_t address, bool demangle_names, bool return_address) {
  SymbolizeBatch batch;
  return resolve(address, demangle_names, return_address, batch);
}

Frame Symbolizer::resolve(uint64_t address, bool demangle_names, bool return_address,
                          SymbolizeBatch& batch) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->sync();
  return impl_->resolve_one(address, demangle_names, return_address, *batch.state_);
}

std::vector<Frame> Symbolizer::resolve_all(const std::vector<uint64_t>& addresses,
                                           bool demangle_names, bool return_addresses) {
  std::vector<Frame> frames;
  frames.reserve(addresses.size());
  SymbolizeBatch batch;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->sync();
  for (const uint64_t address : addresses) {
    frames.push_back(impl_->resolve_one(address, demangle_names, return_addresses, *batch.state_));
  }
  return frames;
}

void Symbolizer::clear() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->cache.clear();
  impl_->misses.clear();
  impl_->modules.clear();
  impl_->ranges.clear();
  impl_->tables.clear();
  impl_->perf_map.clear();
  impl_->exe_path.clear();
  impl_->scanned = false;
}

SymbolizerStats Symbolizer::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  SymbolizerStats s = impl_->stats;
  s.cached_addresses = impl_->cache.size();
  s.cached_misses = impl_->misses.size();
  return s;
}

std::string demangle(const std::string& name) {
  // Only "_Z..." names: __cxa_demangle also accepts bare type encodings, so
  // a C function called "i" or "f" would come back as "int" or "float".
  if (name.size() < 3 || name.compare(0, 2, "_Z") != 0) return name;
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> out(
      abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), &std::free);
  if (status != 0 || out == nullptr) return name;
  return std::string(out.get());
}

}  // namespace mi::symbolize
