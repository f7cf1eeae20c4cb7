#include "child.h"

#include <gnu/libc-version.h>
#include <malloc.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "../common/mi_context.h"
#include "../common/mi_limits.h"
#include "../sites/abi_read.h"
#include "arena_probe.h"
#include "dump_format.h"
#include "map_array.h"
#include "ptmalloc.h"
#include "record_writer.h"
#include "reply.h"

namespace mi::heapwalk::detail {

namespace hd = mi::heapdump;

namespace {

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

// A word of this process read without faulting (an address not yet known
// to lie in a heap segment): 0 when it is not readable.
uint64_t safe_word(uint64_t addr) {
  uint64_t v = 0;
  iovec local{&v, sizeof v};
  iovec remote{reinterpret_cast<void*>(addr), sizeof v};
  if (::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) != sizeof v) return 0;
  return v;
}

// From 2.42, length + num_slots of every tcache bin of one tcache: all
// equal to mp_.tcache_count (at least 1: a tcache exists only then), but
// for at most one bin one off.
bool one_fill_count(const uint32_t* totals, size_t n) {
  size_t best = 0, best_votes = 0;
  for (size_t i = 0; i < n; ++i) {
    size_t votes = 0;
    for (size_t j = 0; j < n; ++j) votes += totals[j] == totals[i];
    if (votes > best_votes) {
      best = i;
      best_votes = votes;
    }
  }
  const uint32_t fill = totals[best];
  if (fill == 0) return false;
  size_t off = 0;
  for (size_t i = 0; i < n; ++i) {
    if (totals[i] == fill) continue;
    if (totals[i] + 1 != fill && totals[i] != fill + 1) return false;
    ++off;
  }
  return off <= 1;
}

class Child {
 public:
  Child(const DumpOptions& o, const pt::Layout& l, int file_fd, uint64_t main_arena, pid_t pid)
      : opt_(o), l_(l), out_(file_fd), main_arena_(main_arena), pid_(pid) {}

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
  bool mmapped_entry(uint64_t mem, uint64_t& size) const;
  bool collect_tracker();
  const Seg* seg_of(uint64_t chunk) const;
  bool write_dump();
  bool write_segment(const Seg& s, ArenaSummary& sum);
  bool write_mmaps();

  const DumpOptions& opt_;
  const pt::Layout& l_;
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
  if (!arena_at(l_, main_arena_)) return fail(kUnsupported, "main_arena");
  arenas_[n_arenas_++] = main_arena_;
  for (uint64_t a = rd(main_arena_ + l_.arena_next); a != main_arena_; a = rd(a + l_.arena_next)) {
    if (n_arenas_ == kMaxArenas) return fail(kWalkFailed, "arena_list");
    // A non-main arena sits right after the heap_info of its first heap.
    const uint64_t heap = a - pt::kHeapInfoBytes;
    if ((heap & (pt::kHeapMax - 1)) != 0 || rd(heap + pt::kHeapInfoArPtr) != a)
      return fail(kUnsupported, "heap_info");
    if (!arena_at(l_, a)) return fail(kUnsupported, "arena");
    arenas_[n_arenas_++] = a;
  }
  return true;
}

bool Child::find_segments() {
  for (size_t i = 0; i < n_arenas_; ++i) {
    const uint64_t a = arenas_[i];
    const uint64_t top = rd(a + l_.arena_top);
    const uint64_t system = rd(a + l_.arena_system_mem);
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
      if (!segs_.push(Seg{h, h + size, pt::first_chunk_of_heap(l_, h, holds_arena),
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

// Whether `mem` is the user memory of a chunk glibc mmapped, read without
// faulting; its size in `size`.
bool Child::mmapped_entry(uint64_t mem, uint64_t& size) const {
  const uint64_t hdr = safe_word(mem - 8);
  if ((hdr & pt::kIsMmapped) == 0) return false;
  size = hdr & ~pt::kFlagBits;
  return true;
}

// Calls f(address, size, kind) for each chunk of `s` in address order, where
// kind is what the chunk headers alone say (in_use, free, top or meta).
// Fails on any chunk that does not fit ptmalloc's invariants.
template <class F>
bool Child::walk(const Seg& s, F&& f) {
  const uint64_t top = rd(arenas_[s.arena] + l_.arena_top);
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
          if (k == hd::kInUse && size == l_.tcache_chunk && !tcache_candidates_.push(p)) ok = false;
        }))
      return false;
    if (!ok) return fail(kOsError, "mmap");
  }
  return true;
}

bool Child::collect_fastbins() {
  for (size_t i = 0; i < n_arenas_; ++i) {
    for (size_t b = 0; b < l_.n_fastbins; ++b) {
      uint64_t p = rd(arenas_[i] + l_.arena_fastbins + 8 * b);
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
// NULL-terminated list of chunks that fit the bin (one size per small bin;
// per large bin, a power-of-two range sorted by size), inside a heap, each
// carrying the process-wide tcache key, and its length must agree with
// the bin's count. Up to 2.41 that is counts[i], the entries in the bin;
// from 2.42 num_slots[i] is what the bin may still take, so length +
// num_slots[i] is mp_.tcache_count, the same for every bin. "Agree":
// tcache_put/tcache_get update the list and the count in two unlocked
// stores, and fork() may freeze another thread between them, so one bin
// may be one entry off. Anything else is not a tcache, and its chunks stay
// in_use.
bool Child::collect_tcaches() {
  bool have_key = false;
  uint64_t key = 0;
  for (uint64_t c : tcache_candidates_) {
    const uint64_t mem = c + pt::kChunkHeader;
    const size_t mark = cached_.size();
    bool valid = true;
    uint64_t candidate_key = key;
    bool candidate_has_key = have_key;
    uint32_t totals[pt::kMaxTcacheBins] = {};  // length + num_slots (2.42+)
    for (size_t b = 0; b < l_.tcache_bins && valid; ++b) {
      const uint32_t count = rd16(mem + 2 * b);
      // Up to 2.41 a chain may be one longer than its count; from 2.42 the
      // count says nothing alone (checked across bins below).
      const uint64_t max_length = l_.tcache_free_slots ? scanned_ : count + 1u;
      uint64_t e = rd(mem + l_.tcache_entries + 8 * b);
      uint32_t length = 0;
      uint64_t last_size = 0;
      for (; e != 0; ++length) {
        const Seg* s = e >= pt::kChunkHeader ? seg_of(e - pt::kChunkHeader) : nullptr;
        uint64_t size = 0, next = 0;
        if (length >= max_length || (e & (pt::kAlign - 1)) != 0) {
          valid = false;
          break;
        }
        if (s != nullptr) {
          size = rd(e - 8) & ~pt::kFlagBits;
        } else if (!(l_.mmap_trailer && b >= l_.tcache_small_bins && mmapped_entry(e, size))) {
          // 2.43 lets a large bin hold an mmapped chunk, outside every heap.
          valid = false;
          break;
        }
        const uint64_t entry_key = s != nullptr ? rd(e + 8) : safe_word(e + 8);
        if (!pt::fits_tcache_bin(l_, b, size) || size < last_size ||
            (candidate_has_key && entry_key != candidate_key)) {
          valid = false;
          break;
        }
        last_size = size;
        candidate_key = entry_key;
        candidate_has_key = true;
        if (s != nullptr && !cached_.push(Cached{e - pt::kChunkHeader, hd::kTcache}))
          return fail(kOsError, "mmap");
        next = s != nullptr ? rd(e) : safe_word(e);
        e = pt::reveal(e, next);
      }
      if (!valid) break;
      if (l_.tcache_free_slots)
        totals[b] = length + count;
      else if (length + 1 < count)
        valid = false;
    }
    if (valid && l_.tcache_free_slots) valid = one_fill_count(totals, l_.tcache_bins);
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
  mi::sites::canonicalize(keys.begin(), keys.size(), abi);
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
    // The bytes mapped from the chunk on, on every release: 2.43 keeps a
    // header after the chunk, outside its size.
    const uint64_t size = (hdr & ~pt::kFlagBits) + (l_.mmap_trailer ? pt::kChunkHeader : 0);
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
    const uint64_t top = rd(a + l_.arena_top);
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

}  // namespace

[[noreturn]] void child_main(const DumpOptions& opt, const pt::Layout& layout, int file_fd,
                             int reply_fd, FILE* xml, uint64_t main_arena, pid_t parent) {
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
  Child* c = new (mem) Child(opt, layout, file_fd, main_arena, parent);
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
      uint64_t frames[mi::limits::kMaxStackDepth + MI_CONTEXT_MAX_WORDS];
      uint32_t depth =
          opt.tracker->stack(a.stack, frames, mi::limits::kMaxStackDepth + MI_CONTEXT_MAX_WORDS);
      depth = std::min<uint32_t>(depth, mi::limits::kMaxStackDepth + MI_CONTEXT_MAX_WORDS);
      // The heap map labels sites by their native frames (the Erlang
      // context that may follow them is the tracker's views' to show).
      mi_context ctx;
      depth = std::min<uint32_t>(mi_context_split(frames, depth, &ctx), mi::limits::kMaxStackDepth);
      const ReplySite rs{a.site, depth, a.bytes, a.count};
      ok = ok && write_all(reply_fd, &rs, sizeof rs) &&
           write_all(reply_fd, frames, depth * sizeof(uint64_t));
    }
  }
  ::_exit(ok ? 0 : 6);
}

}  // namespace mi::heapwalk::detail
