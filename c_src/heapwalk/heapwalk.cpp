#include "heapwalk.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <link.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "../glibc/atomic_file.h"
#include "../sites/stack_merge.h"
#include "dump_format.h"
#include "ptmalloc.h"

namespace mi::heapwalk {

namespace hd = mi::heapdump;

bool pt::supported_glibc(const char* version) {
  unsigned major = 0, minor = 0;
  if (version == nullptr || std::sscanf(version, "%u.%u", &major, &minor) != 2) return false;
  // 2.35 added heap_info.pagesize; the layout is unchanged through 2.40.
  return major == 2 && minor >= 35 && minor <= 40;
}

namespace {

uint64_t mono_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// ---------------------------------------------------------------------------
// Reading the frozen image. In the child every address read has been checked
// to lie in a validated segment or a structure glibc owns; a wrong guess
// faults, and the fault handler turns that into a clean failure.

inline uint64_t rd(uint64_t addr) {
  uint64_t v;
  std::memcpy(&v, reinterpret_cast<const void*>(addr), sizeof v);
  return v;
}
inline uint32_t rd32(uint64_t addr) {
  uint32_t v;
  std::memcpy(&v, reinterpret_cast<const void*>(addr), sizeof v);
  return v;
}
inline uint16_t rd16(uint64_t addr) {
  uint16_t v;
  std::memcpy(&v, reinterpret_cast<const void*>(addr), sizeof v);
  return v;
}

// The malloc_state signature: every bin pair is either empty (both links
// point at the pair's own bin header) or two 16-aligned chunk pointers
// outside the structure; top is set. `w` is a copy of the candidate.
bool looks_like_arena(uint64_t addr, const uint64_t* w) {
  const uint64_t top = w[pt::kArenaTop / 8];
  if (top == 0 || (top & (pt::kAlign - 1)) != 0) return false;
  const uint64_t next = w[pt::kArenaNext / 8];
  if (next == 0 || (next & 7) != 0) return false;
  unsigned empty = 0;
  for (size_t k = 0; k < pt::kNBinPairs; ++k) {
    const uint64_t fd = w[pt::kArenaBins / 8 + 2 * k];
    const uint64_t bk = w[pt::kArenaBins / 8 + 2 * k + 1];
    const uint64_t self = addr + pt::kArenaBins + 16 * k - 16;
    if (fd == self || bk == self) {
      if (fd != bk) return false;
      ++empty;
      continue;
    }
    if (fd == 0 || bk == 0 || (fd & 15) != 0 || (bk & 15) != 0) return false;
    if ((fd >= addr && fd < addr + pt::kArenaSize) || (bk >= addr && bk < addr + pt::kArenaSize))
      return false;
  }
  return empty > 0;
}

bool arena_at(uint64_t addr) {
  uint64_t w[pt::kArenaSize / 8];
  std::memcpy(w, reinterpret_cast<const void*>(addr), sizeof w);
  return looks_like_arena(addr, w);
}

struct LibcData {
  uint64_t lo = 0, hi = 0;
};

// A dl_iterate_phdr callback: runs under the loader's lock, so it only
// writes the caller's POD (an allocation here would reach malloc's hooks
// with that lock held).
int find_libc_data(dl_phdr_info* info, size_t, void* ctx) {
  const char* name = info->dlpi_name;
  if (name == nullptr || std::strstr(name, "/libc.so.6") == nullptr) return 0;
  auto* out = static_cast<LibcData*>(ctx);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_W) == 0) continue;
    out->lo = info->dlpi_addr + ph.p_vaddr;
    out->hi = out->lo + ph.p_memsz;
  }
  return 1;
}

// ---------------------------------------------------------------------------
// Child-side memory: mmapped, growable, for trivially copyable T. Never
// touches malloc. Allocation failure is reported, not thrown.

template <class T>
class MapArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  MapArray() = default;
  MapArray(const MapArray&) = delete;
  MapArray& operator=(const MapArray&) = delete;
  ~MapArray() {
    if (data_ != nullptr) ::munmap(data_, cap_ * sizeof(T));
  }
  bool reserve(size_t n) {
    if (n <= cap_) return true;
    size_t cap = cap_ == 0 ? 4096 : cap_;
    while (cap < n) cap *= 2;
    void* p = data_ == nullptr ? ::mmap(nullptr, cap * sizeof(T), PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                               : ::mremap(data_, cap_ * sizeof(T), cap * sizeof(T), MREMAP_MAYMOVE);
    if (p == MAP_FAILED) return false;
    data_ = static_cast<T*>(p);
    cap_ = cap;
    return true;
  }
  bool push(const T& v) {
    if (size_ == cap_ && !reserve(size_ + 1)) return false;
    data_[size_++] = v;
    return true;
  }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  T& operator[](size_t i) { return data_[i]; }
  size_t size() const { return size_; }
  void clear() { size_ = 0; }
  void truncate(size_t n) { size_ = std::min(size_, n); }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t cap_ = 0;
};

// ---------------------------------------------------------------------------
// What the child sends the parent through the pipe.

constexpr uint32_t kReplyMagic = 0x4d495257;  // "MIRW"

enum ChildStatus : uint32_t {
  kOk = 0,
  kUnsupported = 1,
  kWalkFailed = 2,
  kOsError = 3,
};

struct ReplyHeader {
  uint32_t magic = kReplyMagic;
  uint32_t status = kOk;
  int32_t err = 0;
  uint32_t n_arenas = 0;
  char detail[32] = {};
  uint64_t chunks = 0, segments = 0, mmap_chunks = 0, mmap_bytes = 0, file_bytes = 0;
  uint64_t walk_ns = 0;
  uint32_t tracker = 0;
  uint32_t n_sites = 0;
  glibc::Mallinfo mallinfo{};
  uint64_t xml_len = 0;  // ~0: malloc_info failed in the child
};

struct ReplySite {
  uint32_t id;
  uint32_t depth;
  uint64_t live_bytes;
  uint64_t live_blocks;
};

static_assert(std::is_trivially_copyable_v<ArenaSummary>);

// ---------------------------------------------------------------------------
// The child.

constexpr size_t kMaxArenas = 4096;
constexpr size_t kMaxStackDepth = 64;

struct Seg {
  uint64_t base, end, first;
  uint32_t arena;
  uint32_t main;
};

struct Cached {
  uint64_t addr;
  uint64_t kind;
};

struct Live {
  uint64_t addr;  // user pointer
  uint64_t size;
  uint32_t stack;
  uint32_t site;
};

struct StackAgg {
  uint32_t stack;
  uint32_t site;
  uint64_t bytes;
  uint64_t count;
};

// The tracker's stacks for mi::sites::canonicalize (ctx: the ABI).
uint32_t abi_stack(void* abi, uint32_t id, uint64_t* out, uint32_t max) {
  return static_cast<const mi_preload_abi*>(abi)->stack(id, out, max);
}
uint64_t abi_stack_hash(void* abi, uint32_t id) {
  return static_cast<const mi_preload_abi*>(abi)->stack_hash(id);
}
mi::sites::HashStack abi_stack_hasher(const mi_preload_abi* abi) {
  const bool has =
      abi->struct_size >= offsetof(mi_preload_abi, stack_hash) + sizeof(abi->stack_hash) &&
      abi->stack_hash != nullptr;
  return has ? abi_stack_hash : nullptr;
}

// The pipe to the parent, for the fault handler.
volatile int g_reply_fd = -1;

[[noreturn]] void on_fault(int) {
  ReplyHeader h;
  h.status = kWalkFailed;
  std::memcpy(h.detail, "fault", 6);
  if (g_reply_fd >= 0) {
    ssize_t n = ::write(g_reply_fd, &h, sizeof h);
    (void)n;
  }
  ::_exit(4);
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

// Buffered record writer over an mmapped buffer.
class Writer {
 public:
  explicit Writer(int fd) : fd_(fd) {
    void* p = ::mmap(nullptr, kBuf, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      err_ = errno;
    } else {
      buf_ = static_cast<char*>(p);
    }
  }
  ~Writer() {
    if (buf_ != nullptr) ::munmap(buf_, kBuf);
  }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  void bytes(const void* p, size_t n) {
    if (fd_ < 0 || err_ != 0) return;
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      if (len_ == kBuf) flush();
      if (err_ != 0) return;
      const size_t k = std::min(n, kBuf - len_);
      std::memcpy(buf_ + len_, c, k);
      len_ += k;
      c += k;
      n -= k;
    }
  }
  void u32(uint32_t v) { bytes(&v, 4); }
  void u64(uint64_t v) { bytes(&v, 8); }
  void record(uint32_t tag, uint32_t len) {
    u32(tag);
    u32(len);
  }
  void flush() {
    if (fd_ < 0 || err_ != 0 || len_ == 0) return;
    if (!write_all(fd_, buf_, len_)) err_ = errno;
    total_ += len_;
    len_ = 0;
  }
  int error() const { return err_; }
  uint64_t total() const { return total_ + len_; }

 private:
  static constexpr size_t kBuf = 1 << 20;
  int fd_;
  char* buf_ = nullptr;
  size_t len_ = 0;
  uint64_t total_ = 0;
  int err_ = 0;
};

class Child {
 public:
  Child(const DumpOptions& o, int file_fd, uint64_t main_arena, pid_t pid)
      : opt_(o), out_(file_fd), main_arena_(main_arena), pid_(pid) {}

  // Walks, writes, fills reply; returns a ChildStatus.
  uint32_t run(ReplyHeader& h);

  ArenaSummary sums[kMaxArenas];
  MapArray<StackAgg> chosen;  // the dumped sites, sorted by id

 private:
  bool fail(uint32_t status, const char* why) {
    status_ = status;
    why_ = why;
    return false;
  }
  bool find_arenas();
  bool find_segments();
  template <class F>
  bool walk(const Seg& s, F&& f);
  bool scan_segments();
  bool collect_fastbins();
  bool collect_tcaches();
  bool collect_tracker();
  const Seg* seg_of(uint64_t chunk) const;
  bool write_dump();
  bool write_segment(const Seg& s, ArenaSummary& sum);
  bool write_mmaps();

  const DumpOptions& opt_;
  Writer out_;
  uint64_t main_arena_;
  pid_t pid_;
  uint32_t status_ = kOk;
  const char* why_ = "";

  uint64_t arenas_[kMaxArenas] = {};
  uint64_t heaps_[4096] = {};  // one arena's heaps while they are listed
  size_t n_arenas_ = 0;
  MapArray<Seg> segs_;         // in arena order, oldest heap first
  MapArray<Seg> sorted_segs_;  // by address, for lookups
  MapArray<uint64_t> tcache_candidates_;
  MapArray<Cached> cached_;  // fast and tcache chunks, by address
  MapArray<Live> live_;      // tracker's live blocks, by address
  MapArray<uint64_t> words_;
  MapArray<uint8_t> pages_;
  uint64_t chunks_ = 0;
  uint64_t scanned_ = 0;  // chunks seen by the first pass: bounds list walks
  uint64_t mmap_chunks_ = 0, mmap_bytes_ = 0;
  uint64_t page_ = 4096;
  bool tracker_ = false;
};

bool Child::find_arenas() {
  if (!arena_at(main_arena_)) return fail(kUnsupported, "main_arena");
  arenas_[n_arenas_++] = main_arena_;
  for (uint64_t a = rd(main_arena_ + pt::kArenaNext); a != main_arena_;
       a = rd(a + pt::kArenaNext)) {
    if (n_arenas_ == kMaxArenas) return fail(kWalkFailed, "arena_list");
    // A non-main arena sits right after the heap_info of its first heap.
    const uint64_t heap = a - pt::kHeapInfoBytes;
    if ((heap & (pt::kHeapMax - 1)) != 0 || rd(heap + pt::kHeapInfoArPtr) != a)
      return fail(kUnsupported, "heap_info");
    if (!arena_at(a)) return fail(kUnsupported, "arena");
    arenas_[n_arenas_++] = a;
  }
  return true;
}

bool Child::find_segments() {
  for (size_t i = 0; i < n_arenas_; ++i) {
    const uint64_t a = arenas_[i];
    const uint64_t top = rd(a + pt::kArenaTop);
    const uint64_t system = rd(a + pt::kArenaSystemMem);
    sums[i].index = static_cast<uint32_t>(i);
    sums[i].address = a;
    sums[i].system_bytes = system;
    if (i == 0) {
      if (system == 0) continue;  // malloc never used the sbrk heap
      if ((rd32(a + pt::kArenaFlags) & pt::kNonContiguousBit) != 0)
        return fail(kWalkFailed, "noncontiguous");
      // The sbrk heap is contiguous and ends with top: its start follows.
      const uint64_t top_size = rd(top + 8) & ~pt::kFlagBits;
      const uint64_t end = top + top_size;
      if (end < system || end - system > top) return fail(kWalkFailed, "main_heap");
      const uint64_t base = end - system;
      if (!segs_.push(Seg{base, end, base, 0, 1})) return fail(kOsError, "mmap");
      continue;
    }
    // Non-main: the heap holding top, then its predecessors.
    uint64_t* heaps = heaps_;
    size_t n = 0;
    for (uint64_t h = top & ~(pt::kHeapMax - 1); h != 0; h = rd(h + pt::kHeapInfoPrev)) {
      if (n == 4096 || (h & (pt::kHeapMax - 1)) != 0 || rd(h + pt::kHeapInfoArPtr) != a)
        return fail(kWalkFailed, "heap_list");
      heaps[n++] = h;
    }
    uint64_t total = 0;
    for (size_t k = n; k-- > 0;) {
      const uint64_t h = heaps[k];
      const uint64_t size = rd(h + pt::kHeapInfoSize);
      if (size == 0 || size > pt::kHeapMax || (size & (page_ - 1)) != 0)
        return fail(kWalkFailed, "heap_size");
      const bool holds_arena = h + pt::kHeapInfoBytes == a;
      if (k == n - 1 && !holds_arena) return fail(kUnsupported, "first_heap");
      total += size;
      if (!segs_.push(Seg{h, h + size, pt::first_chunk_of_heap(h, holds_arena),
                          static_cast<uint32_t>(i), 0}))
        return fail(kOsError, "mmap");
    }
    if (total != system) return fail(kWalkFailed, "system_mem");
  }
  if (!sorted_segs_.reserve(segs_.size())) return fail(kOsError, "mmap");
  for (const Seg& s : segs_) sorted_segs_.push(s);
  std::sort(sorted_segs_.begin(), sorted_segs_.end(),
            [](const Seg& x, const Seg& y) { return x.base < y.base; });
  for (size_t i = 1; i < sorted_segs_.size(); ++i)
    if (sorted_segs_[i].base < sorted_segs_[i - 1].end) return fail(kWalkFailed, "overlap");
  return true;
}

const Seg* Child::seg_of(uint64_t chunk) const {
  auto& v = const_cast<MapArray<Seg>&>(sorted_segs_);
  auto it = std::upper_bound(v.begin(), v.end(), chunk,
                             [](uint64_t x, const Seg& s) { return x < s.base; });
  if (it == v.begin()) return nullptr;
  --it;
  if (chunk < it->first || chunk + pt::kMinSize > it->end) return nullptr;
  return it;
}

// Calls f(address, size, kind) for each chunk of `s` in address order, where
// kind is what the chunk headers alone say (in_use, free, top or meta).
// Fails on any chunk that does not fit ptmalloc's invariants.
template <class F>
bool Child::walk(const Seg& s, F&& f) {
  const uint64_t top = rd(arenas_[s.arena] + pt::kArenaTop);
  uint64_t p = s.first;
  while (p < s.end) {
    if (p + pt::kChunkHeader > s.end) return fail(kWalkFailed, "chunk_overrun");
    const uint64_t hdr = rd(p + 8);
    const uint64_t size = hdr & ~pt::kFlagBits;
    if (p == top) {
      if (p + size != s.end) return fail(kWalkFailed, "top");
      f(p, size, hd::kTop);
      return true;
    }
    // sysmalloc retires an old heap's top (when it opens a new heap) into
    // fenceposts: a 16-byte chunk and a final 0-size header; when less than
    // MINSIZE was left, the old top itself becomes a small in-use chunk
    // without the NON_MAIN_ARENA bit, right before the final header. The
    // sbrk heap gets fenceposts only around foreign sbrk() calls.
    const bool last =
        !s.main && p + size + pt::kChunkHeader == s.end && rd(p + size + 8) == pt::kPrevInuse;
    if (!s.main && size == 0 && p + pt::kChunkHeader == s.end) {
      f(p, pt::kChunkHeader, hd::kMeta);
      return true;
    }
    if (size == pt::kChunkHeader ||
        (last && size < 2 * pt::kMinSize && (hdr & pt::kNonMainArena) == 0)) {
      if (s.main) return fail(kWalkFailed, "foreign_sbrk");
      f(p, size, hd::kMeta);
      p += size;
      continue;
    }
    if (size < pt::kMinSize || (size & (pt::kAlign - 1)) != 0 || (hdr & pt::kIsMmapped) != 0)
      return fail(kWalkFailed, "chunk_header");
    if (size > s.end - p - pt::kChunkHeader) return fail(kWalkFailed, "chunk_overrun");
    const uint64_t next = p + size;
    const bool in_use = (rd(next + 8) & pt::kPrevInuse) != 0;
    // Only in-use chunks carry the bit (free() needs it to find the arena;
    // consolidation rewrites free chunks' headers without it).
    if (in_use && !s.main && (hdr & pt::kNonMainArena) == 0) return fail(kWalkFailed, "arena_bit");
    f(p, size, in_use ? hd::kInUse : hd::kFree);
    p = next;
  }
  return fail(kWalkFailed, "segment_end");
}

bool Child::scan_segments() {
  for (const Seg& s : segs_) {
    bool ok = true;
    if (!walk(s, [&](uint64_t p, uint64_t size, hd::Kind k) {
          ++scanned_;
          if (k == hd::kInUse && size == pt::kTcacheStructChunk && !tcache_candidates_.push(p))
            ok = false;
        }))
      return false;
    if (!ok) return fail(kOsError, "mmap");
  }
  return true;
}

bool Child::collect_fastbins() {
  for (size_t i = 0; i < n_arenas_; ++i) {
    for (size_t b = 0; b < pt::kNFastbins; ++b) {
      uint64_t p = rd(arenas_[i] + pt::kArenaFastbins + 8 * b);
      for (uint64_t steps = 0; p != 0; ++steps) {
        const Seg* s = seg_of(p);
        if (s == nullptr || s->arena != i || (p & (pt::kAlign - 1)) != 0 ||
            (rd(p + 8) & ~pt::kFlagBits) != pt::bin_chunk_size(b) || steps > scanned_)
          return fail(kWalkFailed, "fastbin");
        if (!cached_.push(Cached{p, hd::kFast})) return fail(kOsError, "mmap");
        p = pt::reveal(p + 16, rd(p + 16));
      }
    }
  }
  return true;
}

// A thread's tcache is an ordinary in-use chunk; it is told apart from data
// that merely has its size by following every bin: each chain must be a
// NULL-terminated list of chunks of the bin's size inside a heap, each
// carrying the process-wide tcache key, about counts[i] long. "About":
// tcache_put/tcache_get update entries[i] and counts[i] in two unlocked
// stores, and fork() may freeze another thread between them, so a chain
// one entry longer or shorter than its count is accepted. Anything else is
// not a tcache, and its chunks stay in_use.
bool Child::collect_tcaches() {
  bool have_key = false;
  uint64_t key = 0;
  for (uint64_t c : tcache_candidates_) {
    const uint64_t mem = c + pt::kChunkHeader;
    const size_t mark = cached_.size();
    bool valid = true;
    uint64_t candidate_key = key;
    bool candidate_has_key = have_key;
    for (size_t b = 0; b < pt::kTcacheBins && valid; ++b) {
      const uint32_t count = rd16(mem + 2 * b);
      uint64_t e = rd(mem + pt::kTcacheEntriesOffset + 8 * b);
      uint32_t length = 0;
      for (; e != 0; ++length) {
        const Seg* s = e >= pt::kChunkHeader ? seg_of(e - pt::kChunkHeader) : nullptr;
        if (length > count || s == nullptr || (e & (pt::kAlign - 1)) != 0 ||
            (rd(e - 8) & ~pt::kFlagBits) != pt::bin_chunk_size(b)) {
          valid = false;
          break;
        }
        const uint64_t entry_key = rd(e + 8);
        if (candidate_has_key && entry_key != candidate_key) {
          valid = false;
          break;
        }
        candidate_key = entry_key;
        candidate_has_key = true;
        if (!cached_.push(Cached{e - pt::kChunkHeader, hd::kTcache})) return fail(kOsError, "mmap");
        e = pt::reveal(e, rd(e));
      }
      if (valid && length + 1 < count) valid = false;
    }
    if (!valid) {
      cached_.truncate(mark);
    } else if (candidate_has_key) {
      key = candidate_key;
      have_key = true;
    }
  }
  return true;
}

bool Child::collect_tracker() {
  const mi_preload_abi* abi = opt_.tracker;
  if (abi == nullptr) return true;
  tracker_ = true;
  mi_abi_status st{};
  abi->status(&st, sizeof st);
  if (!live_.reserve(st.live_entries + 1024)) return fail(kOsError, "mmap");
  struct Ctx {
    MapArray<Live>* live;
    bool ok;
  } ctx{&live_, true};
  abi->snapshot(
      [](void* p, const mi_abi_entry* e, size_t n) {
        Ctx& c = *static_cast<Ctx*>(p);
        for (size_t i = 0; i < n && c.ok; ++i)
          c.ok = c.live->push(Live{e[i].address, e[i].size, e[i].stack_id, 0});
      },
      &ctx);
  if (!ctx.ok) return fail(kOsError, "mmap");

  // One call site may have several stack ids (stored twice by racing
  // threads); an id whose stack was freed meanwhile names none. Map every
  // id to its canonical one (0 for none) before grouping.
  auto by_stack_id = [](const Live& x, const Live& y) { return x.stack < y.stack; };
  std::sort(live_.begin(), live_.end(), by_stack_id);
  MapArray<mi::sites::StackKey> keys;
  if (!keys.reserve(live_.size() + 1)) return fail(kOsError, "mmap");
  for (const Live& l : live_)
    if (keys.size() == 0 || keys[keys.size() - 1].id != l.stack)
      keys.push(mi::sites::StackKey{l.stack});
  mi::sites::canonicalize(keys.begin(), keys.size(), abi_stack, abi_stack_hasher(abi),
                          const_cast<mi_preload_abi*>(abi));
  std::sort(keys.begin(), keys.end(),
            [](const mi::sites::StackKey& x, const mi::sites::StackKey& y) { return x.id < y.id; });
  size_t k = 0;
  for (Live& l : live_) {
    while (keys[k].id < l.stack) ++k;
    l.stack = keys[k].canonical;
  }
  std::sort(live_.begin(), live_.end(), by_stack_id);

  // Group by stack, keep the biggest max_sites as numbered sites; every
  // other live block is "other".
  MapArray<StackAgg> all;
  if (!all.reserve(live_.size() + 1)) return fail(kOsError, "mmap");
  for (const Live& l : live_) {
    if (all.size() > 0 && all[all.size() - 1].stack == l.stack) {
      all[all.size() - 1].bytes += l.size;
      all[all.size() - 1].count += 1;
    } else {
      all.push(StackAgg{l.stack, 0, l.size, 1});
    }
  }
  const size_t keep =
      std::min<size_t>(std::min<uint32_t>(opt_.max_sites, hd::kSiteOther - 1), all.size());
  auto by_bytes = [](const StackAgg& x, const StackAgg& y) {
    return x.bytes != y.bytes ? x.bytes > y.bytes : x.stack < y.stack;
  };
  std::partial_sort(all.begin(), all.begin() + keep, all.end(), by_bytes);
  if (!chosen.reserve(keep + 1)) return fail(kOsError, "mmap");
  // Blocks without a stack (stack table full, capture failed) have no call
  // site to name: they stay "other".
  for (size_t i = 0; i < keep; ++i) {
    StackAgg a = all[i];
    if (a.stack == 0) continue;
    a.site = static_cast<uint32_t>(chosen.size() + 1);
    chosen.push(a);
  }
  // Label live blocks: both lists sorted by stack, one merge pass.
  MapArray<StackAgg> by_stack;
  if (!by_stack.reserve(keep + 1)) return fail(kOsError, "mmap");
  for (const StackAgg& c : chosen) by_stack.push(c);
  std::sort(by_stack.begin(), by_stack.end(),
            [](const StackAgg& x, const StackAgg& y) { return x.stack < y.stack; });
  size_t j = 0;
  for (Live& l : live_) {
    while (j < by_stack.size() && by_stack[j].stack < l.stack) ++j;
    l.site =
        j < by_stack.size() && by_stack[j].stack == l.stack ? by_stack[j].site : hd::kSiteOther;
  }
  std::sort(live_.begin(), live_.end(),
            [](const Live& x, const Live& y) { return x.addr < y.addr; });
  return true;
}

bool Child::write_segment(const Seg& s, ArenaSummary& sum) {
  const uint64_t first_page = s.base & ~(page_ - 1);
  const uint64_t end_page = (s.end + page_ - 1) & ~(page_ - 1);
  const uint64_t n_pages = (end_page - first_page) / page_;
  pages_.clear();
  if (!pages_.reserve(n_pages + 1)) return fail(kOsError, "mmap");
  if (::mincore(reinterpret_cast<void*>(first_page), end_page - first_page, pages_.begin()) != 0)
    return fail(kOsError, "mincore");
  auto resident = [&](uint64_t page_addr) {
    return (pages_[(page_addr - first_page) / page_] & 1) != 0;
  };
  for (uint64_t i = 0; i < n_pages; ++i)
    if (pages_[i] & 1) sum.resident_bytes += page_;

  out_.record(hd::kSegmentRec, 4 + 4 + 8 + 8 + 8);
  out_.u32(s.arena);
  out_.u32(s.main ? 1 : 0);
  out_.u64(s.base);
  out_.u64(s.end - s.base);
  out_.u64(s.first);

  // Cursors into the address-sorted side tables.
  Cached* cached = std::lower_bound(cached_.begin(), cached_.end(), s.first,
                                    [](const Cached& c, uint64_t a) { return c.addr < a; });
  Live* live = std::lower_bound(live_.begin(), live_.end(), s.first,
                                [](const Live& l, uint64_t a) { return l.addr < a; });
  words_.clear();
  auto flush_words = [&] {
    if (words_.size() == 0) return;
    out_.record(hd::kChunksRec, static_cast<uint32_t>(words_.size() * 8));
    out_.bytes(words_.begin(), words_.size() * 8);
    words_.clear();
  };
  if (!words_.reserve(hd::kMaxChunksPerRecord)) return fail(kOsError, "mmap");
  const bool ok = walk(s, [&](uint64_t p, uint64_t size, hd::Kind kind) {
    while (cached != cached_.end() && cached->addr < p) ++cached;
    if (kind == hd::kInUse && cached != cached_.end() && cached->addr == p)
      kind = static_cast<hd::Kind>(cached->kind);
    uint16_t site = 0;
    while (live != live_.end() && live->addr < p + pt::kChunkHeader) ++live;
    if (kind == hd::kInUse && live != live_.end() && live->addr == p + pt::kChunkHeader)
      site = static_cast<uint16_t>(live->site);
    words_.push(hd::chunk_word(size, kind, site));
    if (words_.size() == hd::kMaxChunksPerRecord) flush_words();

    ++sum.chunks;
    sum.by_kind[kind] += size;
    const bool freeish = kind == hd::kFree || kind == hd::kFast || kind == hd::kTcache;
    if (freeish) ++sum.free_chunks;
    if (freeish || kind == hd::kTop) sum.largest_free = std::max(sum.largest_free, size);
    if (kind == hd::kFree || kind == hd::kFast) {
      // mtrim (malloc_trim) madvises the whole pages of each free chunk past
      // its struct malloc_chunk; fastbins are consolidated into bins first.
      const uint64_t lo = (p + pt::kMallocChunkStruct + page_ - 1) & ~(page_ - 1);
      const uint64_t hi = (p + size) & ~(page_ - 1);
      uint64_t whole = 0;
      for (uint64_t a = lo; a < hi; a += page_) {
        whole += page_;
        if (resident(a)) sum.trimmable_bytes += page_;
      }
      sum.pinned_bytes += size - whole;
    } else if (kind == hd::kTop && s.main && size > pt::kMinSize + 1) {
      // systrim shrinks the sbrk heap by the whole pages of top beyond
      // MINSIZE + 1 bytes. Non-main tops are only shrunk by free()'s
      // heap_trim, never by malloc_trim.
      const uint64_t extra = (size - pt::kMinSize - 1) & ~(page_ - 1);
      for (uint64_t a = p + size - extra; a < p + size; a += page_)
        if (resident(a)) sum.trimmable_bytes += page_;
    }
    if (tracker_ && kind == hd::kInUse) {
      if (site != 0) {
        sum.live_bytes += size;
        ++sum.live_chunks;
      } else {
        sum.unrecorded_bytes += size;
      }
    }
  });
  if (!ok) return false;
  flush_words();

  out_.record(hd::kPagesRec, static_cast<uint32_t>(16 + (n_pages + 7) / 8));
  out_.u64(first_page);
  out_.u64(n_pages);
  uint8_t bits = 0;
  for (uint64_t i = 0; i < n_pages; ++i) {
    if (pages_[i] & 1) bits |= static_cast<uint8_t>(1u << (i % 8));
    if (i % 8 == 7 || i + 1 == n_pages) {
      out_.bytes(&bits, 1);
      bits = 0;
    }
  }
  ++sum.segments;
  return true;
}

// Live blocks outside every heap segment are mmapped chunks (or not
// glibc's at all). Their header is read with process_vm_readv, which fails
// cleanly where a plain load would fault on a block unmapped since.
bool Child::write_mmaps() {
  if (!tracker_) return true;
  words_.clear();
  const pid_t self = ::getpid();
  auto flush = [&] {
    if (words_.size() == 0) return;
    out_.record(hd::kMmapRec, static_cast<uint32_t>(words_.size() * 8));
    out_.bytes(words_.begin(), words_.size() * 8);
    words_.clear();
  };
  for (const Live& l : live_) {
    if (l.addr < pt::kChunkHeader || seg_of(l.addr - pt::kChunkHeader) != nullptr) continue;
    uint64_t hdr = 0;
    iovec local{&hdr, sizeof hdr};
    iovec remote{reinterpret_cast<void*>(l.addr - 8), sizeof hdr};
    if (::process_vm_readv(self, &local, 1, &remote, 1, 0) != sizeof hdr) continue;
    if ((hdr & pt::kIsMmapped) == 0) continue;
    const uint64_t size = hdr & ~pt::kFlagBits;
    words_.push(l.addr - pt::kChunkHeader);
    words_.push(hd::chunk_word(size, hd::kMmap, static_cast<uint16_t>(l.site)));
    ++mmap_chunks_;
    mmap_bytes_ += size;
    if (words_.size() >= hd::kMaxChunksPerRecord) flush();
  }
  flush();
  return true;
}

bool Child::write_dump() {
  const char* version = ::gnu_get_libc_version();
  const size_t vlen = std::strlen(version);
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  out_.bytes(hd::kMagic, sizeof hd::kMagic);
  out_.record(hd::kHeaderRec, static_cast<uint32_t>(4 * 4 + 3 * 8 + vlen));
  out_.u32(hd::kVersion);
  out_.u32(static_cast<uint32_t>(page_));
  out_.u32(static_cast<uint32_t>(pt::kAlign));
  out_.u32(tracker_ ? 1 : 0);
  out_.u64(static_cast<uint64_t>(pid_));
  out_.u64(static_cast<uint64_t>(now.tv_sec) * 1000 + static_cast<uint64_t>(now.tv_nsec) / 1000000);
  out_.u64(pt::kHeapMax);
  out_.bytes(version, vlen);

  size_t next_seg = 0;
  for (size_t i = 0; i < n_arenas_; ++i) {
    const uint64_t a = arenas_[i];
    const uint64_t top = rd(a + pt::kArenaTop);
    out_.record(hd::kArenaRec, 4 + 4 + 8 * 4);
    out_.u32(static_cast<uint32_t>(i));
    out_.u32(i == 0 ? 1 : 0);
    out_.u64(a);
    out_.u64(sums[i].system_bytes);
    out_.u64(top);
    out_.u64(sums[i].system_bytes == 0 ? 0 : rd(top + 8) & ~pt::kFlagBits);
    for (; next_seg < segs_.size() && segs_[next_seg].arena == i; ++next_seg)
      if (!write_segment(segs_[next_seg], sums[i])) return false;
  }
  for (size_t i = 0; i < n_arenas_; ++i) chunks_ += sums[i].chunks;
  if (!write_mmaps()) return false;
  out_.flush();
  if (out_.error() != 0) {
    errno = out_.error();
    return fail(kOsError, "write");
  }
  return true;
}

uint32_t Child::run(ReplyHeader& h) {
  page_ = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const bool ok = find_arenas() && find_segments() && scan_segments() && collect_fastbins() &&
                  collect_tcaches();
  if (ok) {
    std::sort(cached_.begin(), cached_.end(),
              [](const Cached& x, const Cached& y) { return x.addr < y.addr; });
  }
  if (ok && collect_tracker() && write_dump()) {
    h.n_arenas = static_cast<uint32_t>(n_arenas_);
    h.chunks = chunks_;
    h.segments = segs_.size();
    h.mmap_chunks = mmap_chunks_;
    h.mmap_bytes = mmap_bytes_;
    h.file_bytes = out_.total();
    h.tracker = tracker_ ? 1 : 0;
    h.n_sites = static_cast<uint32_t>(chosen.size());
    return kOk;
  }
  h.err = status_ == kOsError ? errno : 0;
  std::snprintf(h.detail, sizeof h.detail, "%s", why_);
  return status_;
}

[[noreturn]] void child_main(const DumpOptions& opt, int file_fd, int reply_fd, FILE* xml,
                             uint64_t main_arena, pid_t parent) {
  g_reply_fd = reply_fd;
  // The child never execs, so O_CLOEXEC does not apply: close every
  // descriptor of the node (sockets, ports, other dumps' pipes) so that it
  // holds none of them open while it walks.
  int keep[3] = {file_fd, reply_fd, xml != nullptr ? ::fileno(xml) : -1};
  std::sort(keep, keep + 3);
  unsigned lo = 0;
  for (int k : keep) {
    if (k < 0) continue;
    if (static_cast<unsigned>(k) > lo) ::close_range(lo, static_cast<unsigned>(k) - 1, 0);
    lo = static_cast<unsigned>(k) + 1;
  }
  ::close_range(lo, ~0u, 0);
  // The node's signal handlers and mask are not the child's: defaults,
  // nothing blocked, and a fault handler on its own stack (a fault may come
  // from a stack overflow).
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  constexpr size_t kAltStack = 1 << 16;
  void* alt =
      ::mmap(nullptr, kAltStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (alt != MAP_FAILED) {
    stack_t ss{};
    ss.ss_sp = alt;
    ss.ss_size = kAltStack;
    ::sigaltstack(&ss, nullptr);
  }
  struct sigaction sa {};
  sa.sa_handler = on_fault;
  sa.sa_flags = SA_ONSTACK;
  ::sigaction(SIGSEGV, &sa, nullptr);
  ::sigaction(SIGBUS, &sa, nullptr);

  // The Child is big (per-arena sums): keep it off the stack.
  void* mem =
      ::mmap(nullptr, sizeof(Child), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) ::_exit(5);
  const uint64_t t0 = mono_ns();
  Child* c = new (mem) Child(opt, file_fd, main_arena, parent);
  ReplyHeader h;
  h.status = c->run(h);
  h.walk_ns = mono_ns() - t0;
  if (h.status == kOk) {
    // The same snapshot: nothing in this process has allocated since the
    // walk, and neither call allocates (the XML stream was made unbuffered
    // by the parent, so printing to it needs no buffer).
    h.mallinfo = glibc::read_mallinfo();
    if (xml != nullptr && ::malloc_info(0, xml) != 0) h.xml_len = ~0ull;
  }
  bool ok = write_all(reply_fd, &h, sizeof h);
  if (h.status == kOk) {
    ok = ok && write_all(reply_fd, c->sums, sizeof(ArenaSummary) * h.n_arenas);
    for (const StackAgg& a : c->chosen) {
      uint64_t frames[kMaxStackDepth];
      uint32_t depth = opt.tracker->stack(a.stack, frames, kMaxStackDepth);
      depth = std::min<uint32_t>(depth, kMaxStackDepth);
      const ReplySite rs{a.site, depth, a.bytes, a.count};
      ok = ok && write_all(reply_fd, &rs, sizeof rs) &&
           write_all(reply_fd, frames, depth * sizeof(uint64_t));
    }
  }
  ::_exit(ok ? 0 : 6);
}

// ---------------------------------------------------------------------------
// The parent.

void put32(std::string& s, uint32_t v) {
  s.append(reinterpret_cast<const char*>(&v), 4);
}
void put64(std::string& s, uint64_t v) {
  s.append(reinterpret_cast<const char*>(&v), 8);
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

DumpStatus os_error(int err, const char* where) {
  return DumpStatus{Failure::os_error, err, where};
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
    if (rs.depth > kMaxStackDepth || r.size() < at + rs.depth * 8) return false;
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

// A read of this process's memory that fails instead of faulting: the
// parent checks candidates whose pointers it cannot trust yet.
bool safe_read(uint64_t addr, uint64_t* out) {
  iovec local{out, sizeof *out};
  iovec remote{reinterpret_cast<void*>(addr), sizeof *out};
  return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) ==
         static_cast<ssize_t>(sizeof *out);
}

// Beyond the bin signature: 0 when the arena list does not come back to
// the candidate through heap_info-backed arenas; 1 when it does; 2 when, in
// addition, a contiguous sbrk heap ends with top exactly at the current
// break (a foreign sbrk() breaks only that). A copy of the signature
// shifted by one bin pair (possible with large fastbins) fails both.
int plausible_main_arena(uint64_t a) {
  uint64_t next = 0;
  if (!safe_read(a + pt::kArenaNext, &next)) return 0;
  for (int steps = 0; next != a; ++steps) {
    const uint64_t heap = next - pt::kHeapInfoBytes;
    uint64_t ar = 0;
    if (steps > 4096 || (heap & (pt::kHeapMax - 1)) != 0 || !safe_read(heap, &ar) || ar != next ||
        !safe_read(next + pt::kArenaNext, &next))
      return 0;
  }
  uint64_t system = 0, top = 0, top_hdr = 0, flags = 0;
  if (!safe_read(a + pt::kArenaSystemMem, &system) || !safe_read(a + pt::kArenaTop, &top) ||
      !safe_read(a, &flags))
    return 0;
  if (system == 0 || ((flags >> 32) & pt::kNonContiguousBit) != 0) return 2;
  if (!safe_read(top + 8, &top_hdr)) return 1;
  return top + (top_hdr & ~pt::kFlagBits) == reinterpret_cast<uint64_t>(::sbrk(0)) ? 2 : 1;
}

}  // namespace

uint64_t find_main_arena() {
  static std::atomic<uint64_t> cached{0};
  uint64_t found = cached.load(std::memory_order_acquire);
  if (found != 0) return found;
  LibcData d;
  ::dl_iterate_phdr(find_libc_data, &d);
  if (d.lo == 0) return 0;
  // Other threads may be changing bins and the break while this reads: a
  // transient mismatch is retried; the child re-validates on its frozen
  // copy anyway. One spot must stand out: the only one whose list closes,
  // or else the only one that also ends at the break.
  for (int attempt = 0; attempt < 5 && found == 0; ++attempt) {
    int count[3] = {0, 0, 0};
    uint64_t match[3] = {0, 0, 0};
    for (uint64_t a = (d.lo + 7) & ~7ull; a + pt::kArenaSize <= d.hi; a += 8) {
      if (!arena_at(a)) continue;
      const int score = plausible_main_arena(a);
      for (int k = 1; k <= score; ++k) {
        ++count[k];
        match[k] = a;
      }
    }
    if (count[1] == 1)
      found = match[1];
    else if (count[2] == 1)
      found = match[2];
  }
  if (found != 0) cached.store(found, std::memory_order_release);
  return found;
}

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
  if (!pt::supported_glibc(version)) return DumpStatus{Failure::unsupported_glibc, 0, version};
  const uint64_t main_arena = find_main_arena();
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
  if (child.pid == 0) child_main(options, file.fd(), pipefd[1], xml.f, main_arena, parent);
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
