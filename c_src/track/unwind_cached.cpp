// The unwinder of the allocation tracker: per return address, the rule that
// finds the caller's frame, read from the DWARF CFI (.eh_frame) of the code
// at that address, cached per thread. It takes no lock and calls nothing
// that does (no libunwind, no dl_iterate_phdr, no dladdr): it runs inside
// malloc hooks, whose callers may hold the dynamic loader's lock (a
// dl_iterate_phdr callback, dlopen) or libunwind's (issue 15: a hook that
// waited for either deadlocked the node). See unwind.h for the contract.
//
// Finding the rule of a return address ra (derive_rule, the cold path):
// _dl_find_object (glibc 2.35+, lock-free, no allocation) gives the object
// and its .eh_frame_hdr; a binary search of the hdr's table gives the FDE;
// its CIE's and its own CFA programs are run up to the call instruction.
// On x86_64, GCC and clang describe nearly every call site with
//   CFA = RSP + k or RBP + k,  RA = [CFA - 8],  RBP unchanged or [CFA + j],
// so applying that row to (RSP, RBP) gives the caller's (RIP, RSP, RBP),
// which is all the next row needs. Functions with alloca/VLAs have an
// RBP-based row, functions without frame pointer an RSP-based one: the CFI
// says which, no observation of the stack is needed. The row is the one
// libunwind 1.6 evaluates (test_unwind.cpp compares whole stacks with it).
// Anything outside that shape (CFA or register expressions, DW_CFA_register
// on RBP/RSP/RA, signal frames, an object without .eh_frame_hdr, CFI read
// differently by different unwinders) gets a "stop" rule: the stack ends at
// that frame, shorter than libunwind's, never wrong and never blocked.
//
// Code without any unwind info (JIT output, BEAM's for one) gets the rule
// "guess": libunwind 1.6.2's own frame-pointer step for such frames
// (src/x86_64/Gstep.c, the branch taken when dwarf_step() fails with
// UNW_ENOINFO), redone here bit for bit; see step_guess.
//
// A warm walk (fast_walk) is, per frame: one rule load (found through the
// previous rule's `next` hint, not the hash), one or two stack loads, a few
// compares. A frame whose rule is not cached, or whose loads fall outside
// the stack window, is stepped by the cold walk (capture_slow), which
// derives and caches the rule and reads the stack through read_checked,
// then hands back to the warm walk.
//
// Memory safety: a fault here is a fault inside malloc. The warm walk loads
// stack memory only inside the cache's stack window [stack_lo, stack_hi), a
// range of the owning thread's stack that was proven readable (probe_pages)
// when it was learnt; the cold walk loads anything else with
// process_vm_readv, which fails where a load would fault. So a stale rule
// (code unmapped and replaced) can produce a wrong frame, never a fault.
// The CFI itself is read from objects the loader has mapped, with every
// read bounds-checked against its record.
//
// Thread safety: a cache belongs to one thread (unwind.h). The only shared
// state is the generation counter bumped by unwind_code_unmapped().
//
// x86_64 only; elsewhere capture_cached() follows frame-pointer records
// through read_checked (bottom).
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "unwind.h"

namespace mi::track {
namespace {

// Reads len bytes at addr without faulting: process_vm_readv on ourselves
// fails with EFAULT where a load would fault. False if unreadable or if the
// syscall is unavailable (seccomp). errno is left as it was.
bool read_checked(uintptr_t addr, void* dst, size_t len) {
  const int saved = errno;
  iovec local{dst, len};
  iovec remote{reinterpret_cast<void*>(addr), len};
  const long got = syscall(SYS_process_vm_readv, syscall(SYS_getpid), &local, 1, &remote, 1, 0);
  errno = saved;
  return got == static_cast<long>(len);
}

}  // namespace
}  // namespace mi::track

#if defined(__x86_64__)

namespace mi::track {

namespace {

// 8192 rules of 16 bytes: 128 KiB per thread. A workload's distinct return
// addresses on malloc paths are typically a few hundred to a few thousand.
constexpr unsigned kSlotBits = 13;
constexpr size_t kSlots = size_t{1} << kSlotBits;
constexpr size_t kProbe = 8;

constexpr uintptr_t kPage = 4096;
// The stack window grows by contiguous frames no larger than this: a bigger
// step is more likely a switch to another stack than a frame, and memory
// between two stacks may be unmapped later.
constexpr uintptr_t kMaxChainFrame = uintptr_t{1} << 20;
// Headroom probed below the deepest SP seen, so slightly deeper captures do
// not need a probe of their own.
constexpr uintptr_t kStackSlack = 16 * kPage;
// libunwind 1.6.2's frame-pointer guess accepts RBP in [CFA, CFA + 0x4000].
constexpr uintptr_t kGuessMaxRbpAboveCfa = 0x4000;

// Rule::kind. Values up to kStepMax are step rules, their bits telling how
// to step; an empty slot reads as one, which is harmless because lookups
// only ever return a slot whose ip matches a nonzero return address.
enum Kind : uint8_t {
  kCfaFromBp = 1,  // CFA = RBP + off, else RSP + off
  kBpSaved = 2,    // the caller's RBP is at CFA + 8 * bp_off8, else unchanged
  kStepMax = 3,
  kGuess = 4,    // no unwind info: libunwind's frame-pointer guess (step_guess)
  kEnd = 0x10,   // the CFI ends the stack here (return address or RBP undefined)
  kStop = 0x20,  // outside the supported shape (see the top): the stack ends here
};

struct Rule {
  uintptr_t ip;  // return address; 0 = empty slot
  // Byte offset of the caller's rule the last time through: a guess that
  // lets the next rule load start before this frame's return address is
  // read, which takes the hash off the critical path of a warm walk.
  uint32_t next;
  int16_t cfa_off8;  // CFA = (RBP or RSP) + 8 * cfa_off8
  int8_t bp_off8;
  uint8_t kind;
};
static_assert(sizeof(Rule) == 16, "a rule is 16 bytes");

// The registers that matter to a rule, for one frame.
struct Frame {
  uintptr_t ip;
  uintptr_t sp;
  uintptr_t bp;
};

uint32_t g_generation = 0;

}  // namespace

// Plain data in zero-filled memory: all-zero is a valid empty cache.
struct UnwindCache {
  Rule slots[kSlots];
  uint64_t hits;
  uint64_t misses;
  uint64_t fallbacks;
  uint64_t truncated;
  uint64_t entries;
  uint32_t generation;
  uint32_t evict;
  // The stack window: [stack_lo, stack_hi) is readable memory of the stack of
  // the thread whose TCB is stack_owner (see learn_window). Empty: lo == hi.
  uintptr_t stack_owner;
  uintptr_t stack_lo;
  uintptr_t stack_hi;
};

namespace {

inline size_t slot_of(uintptr_t ip) {
  return static_cast<size_t>((ip * 0x9E3779B97F4A7C15ull) >> (64 - kSlotBits));
}

inline Rule* find_rule(UnwindCache* cache, uintptr_t ip) {
  if (ip == 0) return nullptr;
  const size_t home = slot_of(ip);
  for (size_t i = 0; i < kProbe; ++i) {
    Rule* r = &cache->slots[(home + i) & (kSlots - 1)];
    if (r->ip == ip) return r;
    if (r->ip == 0) return nullptr;
  }
  return nullptr;
}

// Slots are never emptied one by one (only all at once), so overwriting a
// full probe window keeps every other key reachable.
void insert_rule(UnwindCache* cache, const Rule& rule) {
  if (rule.ip == 0) return;
  const size_t home = slot_of(rule.ip);
  for (size_t i = 0; i < kProbe; ++i) {
    Rule* r = &cache->slots[(home + i) & (kSlots - 1)];
    if (r->ip == rule.ip || r->ip == 0) {
      if (r->ip == 0) ++cache->entries;
      *r = rule;
      return;
    }
  }
  cache->slots[(home + (cache->evict++ % kProbe)) & (kSlots - 1)] = rule;
}

void flush_if_stale(UnwindCache* cache) {
  const uint32_t gen = __atomic_load_n(&g_generation, __ATOMIC_ACQUIRE);
  if (gen == cache->generation) return;
  memset(cache->slots, 0, sizeof cache->slots);
  cache->entries = 0;
  cache->generation = gen;
}

// ---------------------------------------------------------------------------
// Reading .eh_frame_hdr / .eh_frame. The data comes from loaded ELF objects;
// every read is still bounds-checked so a malformed object only makes its
// addresses "slow".

struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  bool ok;

  bool need(size_t n) {
    if (!ok || static_cast<size_t>(end - p) < n) ok = false;
    return ok;
  }
  template <typename T>
  T fixed() {
    T v{};
    if (need(sizeof v)) {
      memcpy(&v, p, sizeof v);
      p += sizeof v;
    }
    return v;
  }
  uint8_t u8() { return fixed<uint8_t>(); }
  uint64_t uleb() {
    uint64_t v = 0;
    for (unsigned shift = 0; need(1); shift += 7) {
      const uint8_t b = *p++;
      if (shift < 64) v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    return 0;
  }
  int64_t sleb() {
    uint64_t v = 0;
    unsigned shift = 0;
    while (need(1)) {
      const uint8_t b = *p++;
      if (shift < 64) v |= static_cast<uint64_t>(b & 0x7f) << shift;
      shift += 7;
      if ((b & 0x80) == 0) {
        if (shift < 64 && (b & 0x40) != 0) v |= ~uint64_t{0} << shift;
        return static_cast<int64_t>(v);
      }
    }
    return 0;
  }
};

constexpr uint8_t kPeOmit = 0xff;

// A DW_EH_PE-encoded pointer. Supports what GCC, clang and the GNU
// assemblers emit: absolute or pc-relative (plus data-relative when a base
// is given), not indirect, text- or function-relative or aligned.
bool read_encoded(Reader& r, uint8_t enc, uintptr_t data_base, uintptr_t* out) {
  if (enc == kPeOmit || (enc & 0x80) != 0) return false;
  const uintptr_t at = reinterpret_cast<uintptr_t>(r.p);
  uint64_t v = 0;
  switch (enc & 0x0f) {
    case 0x00:
    case 0x04:
      v = r.fixed<uint64_t>();
      break;
    case 0x01:
      v = r.uleb();
      break;
    case 0x02:
      v = r.fixed<uint16_t>();
      break;
    case 0x03:
      v = r.fixed<uint32_t>();
      break;
    case 0x09:
      v = static_cast<uint64_t>(r.sleb());
      break;
    case 0x0a:
      v = static_cast<uint64_t>(static_cast<int64_t>(r.fixed<int16_t>()));
      break;
    case 0x0b:
      v = static_cast<uint64_t>(static_cast<int64_t>(r.fixed<int32_t>()));
      break;
    case 0x0c:
      v = r.fixed<uint64_t>();
      break;
    default:
      return false;
  }
  switch (enc & 0x70) {
    case 0x00:
      break;
    case 0x10:
      v += at;
      break;
    case 0x30:
      if (data_base == 0) return false;
      v += data_base;
      break;
    default:
      return false;
  }
  *out = static_cast<uintptr_t>(v);
  return r.ok;
}

// Skips a value of the given encoding without interpreting it (personality).
bool skip_encoded(Reader& r, uint8_t enc) {
  if (enc == kPeOmit) return true;
  switch (enc & 0x0f) {
    case 0x00:
    case 0x04:
    case 0x0c:
      r.fixed<uint64_t>();
      break;
    case 0x01:
      r.uleb();
      break;
    case 0x02:
    case 0x0a:
      r.fixed<uint16_t>();
      break;
    case 0x03:
    case 0x0b:
      r.fixed<uint32_t>();
      break;
    case 0x09:
      r.sleb();
      break;
    default:
      return false;
  }
  return r.ok;
}

// Length-prefixed .eh_frame record at p: sets *body to after the length,
// *end to the end of the record.
bool record_bounds(const uint8_t* p, const uint8_t** body, const uint8_t** end) {
  uint32_t len32;
  memcpy(&len32, p, 4);
  p += 4;
  uint64_t len = len32;
  if (len32 == 0xffffffffu) {
    memcpy(&len, p, 8);
    p += 8;
  }
  if (len == 0 || len > (uint64_t{1} << 30)) return false;
  *body = p;
  *end = p + len;
  return true;
}

struct Cie {
  uint64_t code_align;
  int64_t data_align;
  uint64_t ra_reg;
  uint8_t fde_enc;
  bool has_aug_data;
  bool signal_frame;
  const uint8_t* instr;
  const uint8_t* instr_end;
};

bool parse_cie(const uint8_t* cie, Cie* out) {
  const uint8_t* body;
  const uint8_t* end;
  if (!record_bounds(cie, &body, &end)) return false;
  const bool is64 = body - cie == 12;
  Reader r{body, end, true};
  const uint64_t id = is64 ? r.fixed<uint64_t>() : r.fixed<uint32_t>();
  if (id != 0) return false;
  const uint8_t version = r.u8();
  if (version != 1 && version != 3) return false;
  const char* aug = reinterpret_cast<const char*>(r.p);
  size_t aug_len = 0;
  while (r.need(1) && *r.p != 0) {
    ++r.p;
    ++aug_len;
  }
  r.u8();
  out->code_align = r.uleb();
  out->data_align = r.sleb();
  out->ra_reg = version == 1 ? r.u8() : r.uleb();
  out->fde_enc = 0;
  out->signal_frame = false;
  out->has_aug_data = aug_len > 0 && aug[0] == 'z';
  if (aug_len > 0 && !out->has_aug_data) return false;
  if (out->has_aug_data) {
    const uint64_t len = r.uleb();
    if (!r.need(len)) return false;
    const uint8_t* aug_end = r.p + len;
    for (size_t i = 1; i < aug_len; ++i) {
      switch (aug[i]) {
        case 'L':
          r.u8();
          break;
        case 'P':
          if (!skip_encoded(r, r.u8())) return false;
          break;
        case 'R':
          out->fde_enc = r.u8();
          break;
        case 'S':
          out->signal_frame = true;
          break;
        default:
          return false;
      }
    }
    if (!r.ok || r.p > aug_end) return false;
    r.p = aug_end;
  }
  out->instr = r.p;
  out->instr_end = end;
  return r.ok;
}

struct Fde {
  Cie cie;
  uintptr_t pc_begin;
  uintptr_t pc_end;
  const uint8_t* instr;
  const uint8_t* instr_end;
};

bool parse_fde(const uint8_t* fde, Fde* out) {
  const uint8_t* body;
  const uint8_t* end;
  if (!record_bounds(fde, &body, &end)) return false;
  const bool is64 = body - fde == 12;
  Reader r{body, end, true};
  const uint64_t cie_off = is64 ? r.fixed<uint64_t>() : r.fixed<uint32_t>();
  if (!r.ok || cie_off == 0) return false;
  if (!parse_cie(body - cie_off, &out->cie)) return false;
  uintptr_t range = 0;
  if (!read_encoded(r, out->cie.fde_enc, 0, &out->pc_begin)) return false;
  if (!read_encoded(r, out->cie.fde_enc & 0x0f, 0, &range)) return false;
  out->pc_end = out->pc_begin + range;
  if (out->cie.has_aug_data) {
    const uint64_t len = r.uleb();
    if (!r.need(len)) return false;
    r.p += len;
  }
  out->instr = r.p;
  out->instr_end = end;
  return r.ok;
}

enum class Lookup { kFound, kNone, kUnknown };

// The FDE covering pc, through the binary-search table of .eh_frame_hdr,
// exactly as libunwind finds it (last entry starting at or before pc).
// kNone only where libunwind 1.6.2 (no .debug_frame support on x86_64) finds
// nothing either and its dwarf_step fails with UNW_ENOINFO: pc outside every
// loaded object, no table entry at or below pc, or an FDE whose range ends
// before pc. Anything this parser cannot read is kUnknown, and so is an
// object without .eh_frame_hdr (libunwind would search its .eh_frame).
// _dl_find_object (glibc 2.35+) takes no lock (the loader publishes its
// object list for it lock-free; libgcc's exception unwinder relies on the
// same) and does not allocate. Without it (older glibc) every pc is
// kUnknown: stacks end at their first frame.
Lookup find_fde(uintptr_t pc, Fde* out) {
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 35)
  dl_find_object obj;
  if (_dl_find_object(reinterpret_cast<void*>(pc), &obj) != 0) return Lookup::kNone;
  const uint8_t* hdr = static_cast<const uint8_t*>(obj.dlfo_eh_frame);
  if (hdr == nullptr) return Lookup::kUnknown;
#else
  const uint8_t* hdr = nullptr;
  if (hdr == nullptr) return Lookup::kUnknown;
#endif
  const uintptr_t base = reinterpret_cast<uintptr_t>(hdr);
  // version, eh_frame_ptr encoding, fde_count encoding, table encoding.
  if (hdr[0] != 1 || hdr[3] != 0x3b) return Lookup::kUnknown;
  Reader r{hdr + 4, hdr + 4 + 16, true};
  uintptr_t eh_frame = 0;
  uintptr_t count = 0;
  if (!read_encoded(r, hdr[1], base, &eh_frame)) return Lookup::kUnknown;
  if (!read_encoded(r, hdr[2], base, &count)) return Lookup::kUnknown;
  if (count == 0) return Lookup::kNone;
  const uint8_t* table = r.p;
  const int64_t rel = static_cast<int64_t>(pc - base);
  size_t lo = 0;
  size_t hi = count;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    int32_t start;
    memcpy(&start, table + mid * 8, 4);
    if (start <= rel) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo == 0) return Lookup::kNone;
  int32_t fde_rel;
  memcpy(&fde_rel, table + (lo - 1) * 8 + 4, 4);
  if (!parse_fde(hdr + fde_rel, out)) return Lookup::kUnknown;
  if (pc < out->pc_begin) return Lookup::kUnknown;
  return pc < out->pc_end ? Lookup::kFound : Lookup::kNone;
}

// ---------------------------------------------------------------------------
// Evaluating the CFA program.

constexpr uint64_t kRegBp = 6;
constexpr uint64_t kRegSp = 7;
constexpr uint64_t kRegRa = 16;
constexpr uint64_t kNumRegs = 17;  // libunwind rejects higher x86_64 columns

enum Where : uint8_t { kSame, kUndef, kCfaRel, kOther };

struct RegRule {
  Where where;
  int64_t off;
};

struct CfiState {
  bool cfa_defined;
  bool cfa_expr;
  uint64_t cfa_reg;
  int64_t cfa_off;
  RegRule bp;
  RegRule sp;
  RegRule ra;
};

constexpr int kStateStack = 8;

struct Eval {
  CfiState cur;
  CfiState initial;
  CfiState stack[kStateStack];
  int depth;
  bool any_expr;  // sticky: libunwind evaluates (and may fail on) expressions
};

void set_reg(CfiState& s, uint64_t reg, Where where, int64_t off) {
  RegRule* rr = reg == kRegBp ? &s.bp : reg == kRegSp ? &s.sp : reg == kRegRa ? &s.ra : nullptr;
  if (rr != nullptr) *rr = RegRule{where, off};
}

void restore_reg(Eval& e, uint64_t reg) {
  if (reg == kRegBp) e.cur.bp = e.initial.bp;
  if (reg == kRegSp) e.cur.sp = e.initial.sp;
  if (reg == kRegRa) e.cur.ra = e.initial.ra;
}

enum class Run { kOk, kUnsupported };

// Runs CFA instructions while the location is <= target (the return
// address), like libunwind's run_cfi_program. The DWARF row for a call is
// the one before the return address; libunwind versions have disagreed on
// whether instructions located exactly at it apply (1.6.2 here ignores a
// DW_CFA_offset there; later sources apply most of them). Such addresses are
// refused (the stack ends there), so no rule depends on which reading is
// right.
Run run_cfi(Eval& e, const Cie& cie, const uint8_t* p, const uint8_t* end, uintptr_t loc,
            uintptr_t target) {
  Reader r{p, end, true};
  while (r.ok && r.p < r.end && loc <= target) {
    const uint8_t byte = r.u8();
    const uint8_t high = byte & 0xc0;
    const uint8_t low = byte & 0x3f;
    if (high == 0x40) {
      loc += low * cie.code_align;
      continue;
    }
    uint64_t delta = 0;
    bool advance = true;
    switch (byte) {
      case 0x02:
        delta = r.u8();
        break;
      case 0x03:
        delta = r.fixed<uint16_t>();
        break;
      case 0x04:
        delta = r.fixed<uint32_t>();
        break;
      default:
        advance = false;
    }
    if (advance) {
      loc += delta * cie.code_align;
      continue;
    }
    if (byte == 0x00) continue;  // DW_CFA_nop
    if (loc == target) return Run::kUnsupported;
    if (high == 0x80) {  // DW_CFA_offset
      if (low >= kNumRegs) return Run::kUnsupported;
      set_reg(e.cur, low, kCfaRel, static_cast<int64_t>(r.uleb()) * cie.data_align);
      continue;
    }
    if (high == 0xc0) {  // DW_CFA_restore
      if (low >= kNumRegs) return Run::kUnsupported;
      restore_reg(e, low);
      continue;
    }
    switch (byte) {
      case 0x05: {  // DW_CFA_offset_extended
        const uint64_t reg = r.uleb();
        const int64_t off = static_cast<int64_t>(r.uleb()) * cie.data_align;
        if (reg >= kNumRegs) return Run::kUnsupported;
        set_reg(e.cur, reg, kCfaRel, off);
        break;
      }
      case 0x11: {  // DW_CFA_offset_extended_sf
        const uint64_t reg = r.uleb();
        const int64_t off = r.sleb() * cie.data_align;
        if (reg >= kNumRegs) return Run::kUnsupported;
        set_reg(e.cur, reg, kCfaRel, off);
        break;
      }
      case 0x2f: {  // DW_CFA_GNU_negative_offset_extended
        const uint64_t reg = r.uleb();
        const int64_t off = -(static_cast<int64_t>(r.uleb()) * cie.data_align);
        if (reg >= kNumRegs) return Run::kUnsupported;
        set_reg(e.cur, reg, kCfaRel, off);
        break;
      }
      case 0x06: {  // DW_CFA_restore_extended
        const uint64_t reg = r.uleb();
        if (reg >= kNumRegs) return Run::kUnsupported;
        restore_reg(e, reg);
        break;
      }
      case 0x07:    // DW_CFA_undefined
      case 0x08: {  // DW_CFA_same_value
        const uint64_t reg = r.uleb();
        if (reg >= kNumRegs) return Run::kUnsupported;
        set_reg(e.cur, reg, byte == 0x07 ? kUndef : kSame, 0);
        break;
      }
      case 0x09: {  // DW_CFA_register
        const uint64_t reg = r.uleb();
        r.uleb();
        if (reg >= kNumRegs) return Run::kUnsupported;
        set_reg(e.cur, reg, kOther, 0);
        break;
      }
      case 0x0a:  // DW_CFA_remember_state
        if (e.depth == kStateStack) return Run::kUnsupported;
        e.stack[e.depth++] = e.cur;
        break;
      case 0x0b:  // DW_CFA_restore_state
        if (e.depth == 0) return Run::kUnsupported;
        e.cur = e.stack[--e.depth];
        break;
      case 0x0c:    // DW_CFA_def_cfa
      case 0x12: {  // DW_CFA_def_cfa_sf
        const uint64_t reg = r.uleb();
        const int64_t off =
            byte == 0x0c ? static_cast<int64_t>(r.uleb()) : r.sleb() * cie.data_align;
        if (reg >= kNumRegs) return Run::kUnsupported;
        e.cur.cfa_defined = true;
        e.cur.cfa_expr = false;
        e.cur.cfa_reg = reg;
        e.cur.cfa_off = off;
        break;
      }
      case 0x0d: {  // DW_CFA_def_cfa_register
        const uint64_t reg = r.uleb();
        if (reg >= kNumRegs) return Run::kUnsupported;
        e.cur.cfa_expr = false;
        e.cur.cfa_reg = reg;
        break;
      }
      case 0x0e:  // DW_CFA_def_cfa_offset
        e.cur.cfa_off = static_cast<int64_t>(r.uleb());
        break;
      case 0x13:  // DW_CFA_def_cfa_offset_sf
        e.cur.cfa_off = r.sleb() * cie.data_align;
        break;
      case 0x0f: {  // DW_CFA_def_cfa_expression
        const uint64_t len = r.uleb();
        if (!r.need(len)) return Run::kUnsupported;
        r.p += len;
        e.cur.cfa_defined = true;
        e.cur.cfa_expr = true;
        break;
      }
      case 0x10:    // DW_CFA_expression
      case 0x16: {  // DW_CFA_val_expression
        const uint64_t reg = r.uleb();
        const uint64_t len = r.uleb();
        if (reg >= kNumRegs || !r.need(len)) return Run::kUnsupported;
        r.p += len;
        set_reg(e.cur, reg, kOther, 0);
        e.any_expr = true;
        break;
      }
      case 0x2e:  // DW_CFA_GNU_args_size: matters to unw_resume only
        r.uleb();
        break;
      default:
        // DW_CFA_set_loc, val_offset, vendor ops: libunwind 1.6 either
        // reads them differently or not at all.
        return Run::kUnsupported;
    }
  }
  return r.ok ? Run::kOk : Run::kUnsupported;
}

Rule slow_rule(uintptr_t ip, Kind kind) {
  return Rule{ip, 0, 0, 0, kind};
}

// The rule for code at ra that has no FDE: libunwind's frame-pointer guess,
// on the path it takes when the code is mapped and is not a PLT entry. Its
// unw_step reads the 8 bytes at ra to check it is mapped (its RIP fix-up
// path otherwise reads the stack of whoever called unw_getcontext), and 16
// bytes to match a PLT entry (jmp *x(%rip); push $n; jmp ...), whose frame
// it steps differently; this unwinder ends the stack at both.
Rule guess_rule(uintptr_t ra) {
  uint64_t code[2] = {0, 0};
  if ((ra & (kPage - 1)) > kPage - 8 || !read_checked(ra, &code[0], 8)) return slow_rule(ra, kStop);
  if (read_checked(ra + 8, &code[1], 8) && (code[0] & 0xffff) == 0x25ff &&
      ((code[0] >> 48) & 0xff) == 0x68 && ((code[1] >> 24) & 0xff) == 0xe9)
    return slow_rule(ra, kStop);
  return slow_rule(ra, kGuess);
}

// The rule for a frame whose return address is ra (so the CFI row is looked
// up at ra - 1, as libunwind does for every frame but a signal frame's
// successor, and signal frames end the stack here). Lock-free, no
// allocation: callable from a malloc hook.
Rule derive_rule(uintptr_t ra) {
  Fde fde;
  if (ra < 2) return slow_rule(ra, kStop);
  switch (find_fde(ra - 1, &fde)) {
    case Lookup::kFound:
      break;
    case Lookup::kNone:
      return guess_rule(ra);
    case Lookup::kUnknown:
      return slow_rule(ra, kStop);
  }
  if (fde.cie.signal_frame) return slow_rule(ra, kStop);
  Eval e{};
  e.cur.bp = e.cur.sp = e.cur.ra = RegRule{kSame, 0};
  if (run_cfi(e, fde.cie, fde.cie.instr, fde.cie.instr_end, 0, ~uintptr_t{0}) != Run::kOk)
    return slow_rule(ra, kStop);
  e.initial = e.cur;
  e.depth = 0;
  if (run_cfi(e, fde.cie, fde.instr, fde.instr_end, fde.pc_begin, ra) != Run::kOk)
    return slow_rule(ra, kStop);
  const CfiState& s = e.cur;
  if (fde.cie.ra_reg != kRegRa || e.any_expr || !s.cfa_defined || s.cfa_expr)
    return slow_rule(ra, kStop);
  if (s.ra.where == kUndef || s.bp.where == kUndef) return slow_rule(ra, kEnd);
  if (s.cfa_reg != kRegSp && s.cfa_reg != kRegBp) return slow_rule(ra, kStop);
  if (s.sp.where != kSame || s.ra.where != kCfaRel || s.ra.off != -8) return slow_rule(ra, kStop);
  // Offsets are whole words in practice; 16 bits of them reach 256 KiB.
  if (s.cfa_off % 8 != 0 || s.cfa_off / 8 < INT16_MIN || s.cfa_off / 8 > INT16_MAX)
    return slow_rule(ra, kStop);
  if (s.cfa_reg == kRegSp && s.cfa_off <= 0) return slow_rule(ra, kStop);
  Rule rule{ra, 0, static_cast<int16_t>(s.cfa_off / 8), 0, 0};
  if (s.cfa_reg == kRegBp) rule.kind |= kCfaFromBp;
  if (s.bp.where == kCfaRel) {
    // A saved RBP lives in the frame being popped, below the CFA.
    if (s.bp.off >= 0 || s.bp.off < -1024 || s.bp.off % 8 != 0) return slow_rule(ra, kStop);
    rule.kind |= kBpSaved;
    rule.bp_off8 = static_cast<int8_t>(s.bp.off / 8);
  } else if (s.bp.where != kSame) {
    return slow_rule(ra, kStop);
  }
  return rule;
}

// ---------------------------------------------------------------------------
// The stack window.

// The TCB address (glibc's pthread_self()): one load, no call.
inline uintptr_t thread_self() {
  uintptr_t tcb;
  __asm__("movq %%fs:0, %0" : "=r"(tcb));
  return tcb;
}

inline uintptr_t page_down(uintptr_t a) {
  return a & ~(kPage - 1);
}

inline bool in_window(const UnwindCache* cache, uintptr_t sp) {
  return sp - cache->stack_lo < cache->stack_hi - cache->stack_lo;
}

// Whether [addr, addr + len) lies in the window (which must be the caller's).
inline bool window_covers(const UnwindCache* cache, uintptr_t addr, size_t len) {
  return addr >= cache->stack_lo && addr <= cache->stack_hi && cache->stack_hi - addr >= len;
}

// How many of the pages first, first + step, ... (count of them) are
// readable, counted in that order up to the first that is not: one byte of
// each through process_vm_readv, 64 pages a call. Where that syscall is
// refused (seccomp), mincore instead, which proves a page mapped rather than
// readable; every page probed here lies between live frames of one stack,
// which is mapped read-write. errno is left as it was.
size_t probe_pages(uintptr_t first, intptr_t step, size_t count) {
  constexpr size_t kBatch = 64;
  const int saved = errno;
  const long pid = syscall(SYS_getpid);
  size_t done = 0;
  bool use_mincore = false;
  while (done < count) {
    const uintptr_t at = first + static_cast<uintptr_t>(static_cast<intptr_t>(done) * step);
    if (use_mincore) {
      unsigned char vec;
      if (mincore(reinterpret_cast<void*>(page_down(at)), kPage, &vec) != 0) break;
      ++done;
      continue;
    }
    const size_t n = count - done < kBatch ? count - done : kBatch;
    char sink[kBatch];
    iovec local{sink, n};
    iovec remote[kBatch];
    for (size_t i = 0; i < n; ++i)
      remote[i] = iovec{
          reinterpret_cast<void*>(at + static_cast<uintptr_t>(static_cast<intptr_t>(i) * step)), 1};
    const long got = syscall(SYS_process_vm_readv, pid, &local, 1, remote, n, 0);
    if (got < 0 && errno != EFAULT) {
      use_mincore = true;
      continue;
    }
    if (got > 0) done += static_cast<size_t>(got);
    if (got < static_cast<long>(n)) break;
  }
  errno = saved;
  return done;
}

// Grows the window down to a little below sp (the caller's stack pointer,
// within kMaxChainFrame below the window): a deeper capture on the same
// stack. The pages in between are live or dead stack of this thread.
__attribute__((noinline, cold)) bool extend_window_down(UnwindCache* cache, uintptr_t sp) {
  const uintptr_t lo = cache->stack_lo;
  const uintptr_t target = page_down(sp) > kStackSlack ? page_down(sp) - kStackSlack : 0;
  if (target >= lo) return false;
  cache->stack_lo =
      lo - probe_pages(lo - kPage, -static_cast<intptr_t>(kPage), (lo - target) / kPage) * kPage;
  return in_window(cache, sp);
}

// The fast walk may start at sp: the cache has a window of this thread's
// stack containing it.
inline bool window_ready(UnwindCache* cache, uintptr_t sp) {
  if (cache->stack_owner != thread_self()) return false;
  if (in_window(cache, sp)) return true;
  return sp < cache->stack_lo && cache->stack_lo - sp <= kMaxChainFrame &&
         cache->stack_lo < cache->stack_hi && extend_window_down(cache, sp);
}

// Whether the calling thread runs on its signal alternate stack, whose memory
// may be freed while the cache lives: no window is learnt there.
bool on_alt_stack() {
  stack_t ss;
  return sigaltstack(nullptr, &ss) == 0 && (ss.ss_flags & SS_ONSTACK) != 0;
}

// Learns or grows the window after a cold walk. [caller_sp, chain_top) is
// the stack the walk crossed by contiguous frames of at most kMaxChainFrame
// each, starting at the frame of capture_cached's caller: one stack, read by
// the walk with validation or between such reads. The pages are probed all
// the same, so a window only ever holds pages that were readable; the window
// of a thread's own stack stays readable as long as the thread runs, and
// only the owning thread uses it.
void learn_window(UnwindCache* cache, bool had_window, uintptr_t caller_sp, uintptr_t chain_top) {
  const uintptr_t top = page_down(chain_top + kPage - 1);
  // A window as large as a default thread stack is plenty.
  constexpr uintptr_t kMaxWindow = uintptr_t{64} << 20;
  if (had_window) {
    if (top <= cache->stack_hi || top - cache->stack_lo > kMaxWindow) return;
    cache->stack_hi += probe_pages(cache->stack_hi, kPage, (top - cache->stack_hi) / kPage) * kPage;
    return;
  }
  const uintptr_t start = page_down(caller_sp);
  if (top <= start || top - start > kMaxWindow || on_alt_stack()) return;
  const size_t up = probe_pages(start, kPage, (top - start) / kPage);
  if (up == 0) return;
  // Below: this function's own frames (live) and some slack (dead stack).
  const uintptr_t here = page_down(reinterpret_cast<uintptr_t>(__builtin_frame_address(0)));
  const uintptr_t low = here < start ? here : start;
  const uintptr_t target = low > kStackSlack ? low - kStackSlack : 0;
  const size_t down =
      probe_pages(start - kPage, -static_cast<intptr_t>(kPage), (start - target) / kPage);
  cache->stack_owner = thread_self();
  cache->stack_lo = start - down * kPage;
  cache->stack_hi = start + up * kPage;
}

// ---------------------------------------------------------------------------
// The walks.

// Stack loads in inline asm: sanitizers would otherwise instrument reads of
// other frames' return-address and saved-RBP slots.
inline uintptr_t load_word(uintptr_t addr) {
  uintptr_t v;
  __asm__("movq %1, %0" : "=r"(v) : "m"(*reinterpret_cast<const uintptr_t*>(addr)));
  return v;
}

// What one step of a frame gave.
enum class Step : uint8_t {
  kStep,     // the caller's frame is in f
  kEnd,      // the stack ends here, as it does for libunwind
  kStop,     // this unwinder cannot step the frame: the stack ends here
  kOutside,  // the step needs a load outside the window: the cold walk does it
};

// A step rule applied to f in the window (whose top is hi; f.sp is never
// below its bottom): the CFA at least a return-address slot above SP and
// inside the window, the saved RBP slot inside the frame being popped, so
// both loads are inside the window. A return address of 0 ends the stack
// without being reported (0 marks the outermost frame; libunwind's step
// treats it as the end too, though how it reports it has varied).
inline __attribute__((always_inline)) Step apply_rule(const Rule& r, Frame& f, uintptr_t hi) {
  // Both loads address base + constant, so each is one load after base is
  // known: the RBP chain of frame-pointer code costs one load per frame.
  const uintptr_t base = (r.kind & kCfaFromBp) != 0 ? f.bp : f.sp;
  const intptr_t off8 = r.cfa_off8;
  const uintptr_t cfa = base + 8 * off8;
  if (cfa < f.sp + 8 || cfa > hi) return Step::kOutside;
  uintptr_t bp = f.bp;
  if ((r.kind & kBpSaved) != 0) {
    const uintptr_t slot = base + 8 * (off8 + r.bp_off8);
    if (slot < f.sp) return Step::kOutside;
    bp = load_word(slot);
  }
  const uintptr_t ip = load_word(base + 8 * (off8 - 1));
  if (ip == 0) return Step::kEnd;
  f = Frame{ip, cfa, bp};
  return Step::kStep;
}

// libunwind 1.6.2's unw_step() (src/x86_64/Gstep.c) for a frame whose
// dwarf_step() failed with UNW_ENOINFO, on the path a guess rule stands for:
// the code at ip is mapped (invalid_prev_rip == 0), not a PLT entry, and not
// a signal frame (it never is there: sigcontext_format was just reset).
// With cfa = f.sp and rbp = f.bp:
//   rbp == 0                                     -> returns 0: end of stack
//   [rbp] unreadable, rbp < cfa, rbp - cfa > 0x4000 -> returns 0: end
//   [rbp + 8] unreadable                         -> returns < 0: end too
//   else ip = [rbp + 8], cfa += 16 (sic, not rbp + 16), rbp = [rbp], and
//   RSP's location is lost (only the CFA-based rules below can follow).
// A new ip of 0 ends the stack here (libunwind reports a 0 frame, then takes
// paths that depend on its own stack). `words` reads [rbp, rbp + 16): from
// the window, or checked.
template <class ReadWords>
inline __attribute__((always_inline)) Step step_guess(Frame& f, ReadWords&& words) {
  const uintptr_t rbp = f.bp;
  if (rbp == 0 || rbp < f.sp || rbp - f.sp > kGuessMaxRbpAboveCfa) return Step::kEnd;
  uintptr_t saved_bp, ip;
  switch (words(rbp, &saved_bp, &ip)) {
    case Step::kStep:
      break;
    case Step::kOutside:
      return Step::kOutside;
    default:
      return Step::kEnd;
  }
  if (ip == 0) return Step::kEnd;
  f = Frame{ip, f.sp + 16, saved_bp};
  return Step::kStep;
}

// Records frames from index *n on, starting with f, while cached rules and
// the window allow. Returns true when the stack is complete (ended, stopped
// or out full); false leaves *n - 1 as the index of the frame f, which the
// cold walk has to step. The caller has checked the window is this thread's.
inline __attribute__((always_inline)) bool fast_walk(UnwindCache* cache, uintptr_t* out, size_t max,
                                                     size_t* n, Frame& f) {
  char* const slots = reinterpret_cast<char*>(cache->slots);
  const uintptr_t hi = cache->stack_hi;
  uintptr_t* p = out + *n;
  uintptr_t* const end = out + max;
  bool complete = false;
  uint64_t resolved = 0;  // frames stepped or ended by a rule
  // Every load below is at or above f.sp, which only grows: it starts inside.
  Rule* r = in_window(cache, f.sp) ? find_rule(cache, f.ip) : nullptr;
  for (;;) {
    *p++ = f.ip;
    if (p == end) {
      complete = true;
      break;
    }
    if (r == nullptr) break;
    Rule* next = reinterpret_cast<Rule*>(slots + r->next);
    Step step;
    if (__builtin_expect(r->kind > kStepMax, 0)) {
      if (r->kind == kGuess) {
        step = step_guess(f, [hi](uintptr_t at, uintptr_t* bp, uintptr_t* ip) {
          if (at + 16 > hi) return Step::kOutside;
          *bp = load_word(at);
          *ip = load_word(at + 8);
          return Step::kStep;
        });
      } else {
        step = r->kind == kEnd ? Step::kEnd : Step::kStop;
      }
    } else {
      step = apply_rule(*r, f, hi);
    }
    if (__builtin_expect(step != Step::kStep, 0)) {
      if (step == Step::kOutside) break;
      ++resolved;
      cache->truncated += step == Step::kStop ? 1 : 0;
      complete = true;
      break;
    }
    ++resolved;
    if (__builtin_expect(next->ip != f.ip, 0)) {
      next = find_rule(cache, f.ip);
      if (next != nullptr) r->next = static_cast<uint32_t>(reinterpret_cast<char*>(next) - slots);
    }
    r = next;
  }
  cache->hits += resolved;
  *n = static_cast<size_t>(p - out);
  return complete;
}

// Two stack words at a and b for the cold walk: from the window where it
// holds them (window: the caller's cache has a window of this stack), else
// with one process_vm_readv. kStep when both were read, kEnd when either is
// unreadable.
Step read_two(const UnwindCache* cache, bool window, uintptr_t a, uintptr_t* va, uintptr_t b,
              uintptr_t* vb) {
  if (window && window_covers(cache, a, 8) && window_covers(cache, b, 8)) {
    *va = load_word(a);
    *vb = load_word(b);
    return Step::kStep;
  }
  const int saved = errno;
  uintptr_t got[2];
  iovec local{got, sizeof got};
  iovec remote[2] = {{reinterpret_cast<void*>(a), 8}, {reinterpret_cast<void*>(b), 8}};
  const long n = syscall(SYS_process_vm_readv, syscall(SYS_getpid), &local, 1, remote, 2, 0);
  errno = saved;
  if (n != static_cast<long>(sizeof got)) return Step::kEnd;
  *va = got[0];
  *vb = got[1];
  return Step::kStep;
}

// One step of f by rule r for the cold walk: the same arithmetic and checks
// as the warm walk, with every load validated (read_two). An unreadable
// slot ends the stack, where libunwind's validated loads end it too.
Step step_checked(const UnwindCache* cache, bool window, const Rule& r, Frame& f) {
  if (r.kind == kEnd) return Step::kEnd;
  if (r.kind == kGuess) {
    return step_guess(f, [cache, window](uintptr_t at, uintptr_t* bp, uintptr_t* ip) {
      return read_two(cache, window, at, bp, at + 8, ip);
    });
  }
  if (r.kind > kStepMax) return Step::kStop;
  const uintptr_t base = (r.kind & kCfaFromBp) != 0 ? f.bp : f.sp;
  const uintptr_t cfa = base + 8 * static_cast<intptr_t>(r.cfa_off8);
  // A caller's frame lies above its callee's: this also bounds the walk.
  if (cfa < f.sp + 8) return Step::kStop;
  uintptr_t bp = f.bp;
  uintptr_t ip;
  if ((r.kind & kBpSaved) != 0) {
    const uintptr_t slot = cfa + 8 * static_cast<intptr_t>(r.bp_off8);
    if (slot < f.sp) return Step::kStop;
    if (read_two(cache, window, cfa - 8, &ip, slot, &bp) != Step::kStep) return Step::kEnd;
  } else {
    uintptr_t unused;
    if (read_two(cache, window, cfa - 8, &ip, cfa - 8, &unused) != Step::kStep) return Step::kEnd;
  }
  if (ip == 0) return Step::kEnd;
  f = Frame{ip, cfa, bp};
  return Step::kStep;
}

// The cold walk: out[0, n) are written; when n > 0, f is the frame of
// out[n - 1], which the warm walk could not step; when n == 0, f is the
// first frame (the return address into capture_cached's caller, with the
// caller's RSP and RBP). Steps frames one by one, deriving and caching the
// rules it lacks, and hands back to the warm walk wherever a cached rule and
// the window allow. cache may be null (every rule derived, every load
// checked). Learns the stack window from the frames it crossed. noinline:
// the warm path's frame stays small.
__attribute__((noinline)) size_t capture_slow(UnwindCache* cache, uintptr_t* out, size_t max,
                                              size_t n, Frame f, uintptr_t caller_sp) {
  bool window = false;
  if (cache != nullptr) {
    ++cache->fallbacks;
    window = cache->stack_owner == thread_self() && in_window(cache, caller_sp);
  }
  // The window follows frames of plausible size, from the caller's (the
  // warm walk's frames so far were all inside the window): one stack.
  uintptr_t chain_top = f.sp;
  bool chain = true;
  if (n == 0) out[n++] = f.ip;
  while (n < max) {
    Rule derived;
    const Rule* r = cache != nullptr ? find_rule(cache, f.ip) : nullptr;
    if (r == nullptr) {
      derived = derive_rule(f.ip);
      if (cache != nullptr) {
        ++cache->misses;
        insert_rule(cache, derived);
      }
      r = &derived;
    } else {
      ++cache->hits;
    }
    const Frame before = f;
    const Step step = step_checked(cache, window, *r, f);
    if (step != Step::kStep) {
      if (step == Step::kStop && cache != nullptr) ++cache->truncated;
      break;
    }
    // Guess steps count too: JIT frames sit between native frames of the
    // same stack, and their CFA, while not the real RSP, stays close to it.
    chain = chain && f.sp - before.sp <= kMaxChainFrame;
    if (chain) chain_top = f.sp;
    if (window) {
      // Whatever the warm walk crosses lies inside the window, up to f.
      if (fast_walk(cache, out, max, &n, f)) break;
      if (chain && f.sp > chain_top) chain_top = f.sp;
      continue;
    }
    out[n++] = f.ip;
  }
  if (cache != nullptr) learn_window(cache, window, caller_sp, chain_top);
  return n;
}

}  // namespace

size_t unwind_cache_bytes() {
  return sizeof(UnwindCache);
}

UnwindCache* unwind_cache_init(void* zeroed_memory) {
  auto* cache = static_cast<UnwindCache*>(zeroed_memory);
  cache->generation = __atomic_load_n(&g_generation, __ATOMIC_ACQUIRE);
  return cache;
}

UnwindCacheStats unwind_cache_stats(const UnwindCache* cache) {
  return UnwindCacheStats{cache->hits, cache->misses, cache->fallbacks, cache->truncated,
                          cache->entries};
}

void unwind_code_unmapped() {
  __atomic_add_fetch(&g_generation, 1, __ATOMIC_ACQ_REL);
}

}  // namespace mi::track

// The entry point proper, reached from the capture_cached stub below with the
// caller's return address, RSP and RBP as they were at the call: exact by
// construction, and no rule is needed for capture_cached's own frame.
extern "C" __attribute__((visibility("hidden"), used)) size_t mi_track_capture_cached_entry(
    mi::track::UnwindCache* cache, uintptr_t* out, size_t max, uintptr_t ra, uintptr_t sp,
    uintptr_t bp) {
  using namespace mi::track;
  if (max == 0) return 0;
  Frame f{ra, sp, bp};
  size_t n = 0;
  if (cache != nullptr) {
    flush_if_stale(cache);
    if (window_ready(cache, sp) && fast_walk(cache, out, max, &n, f)) return n;
  }
  return capture_slow(cache, out, max, n, f, sp);
}

namespace mi::track {

// A stub that cannot be inlined and has no frame of its own: it hands the
// caller's registers to the entry point and jumps there, so the entry point
// runs as if called directly from our caller.
__attribute__((naked)) size_t capture_cached(UnwindCache*, uintptr_t*, size_t) {
  // (With -fcf-protection, GCC puts the endbr64 in front by itself.)
  __asm__(
      "movq (%rsp), %rcx\n\t"
      "leaq 8(%rsp), %r8\n\t"
      "movq %rbp, %r9\n\t"
      "jmp mi_track_capture_cached_entry\n\t");
}

}  // namespace mi::track

#else  // !__x86_64__: no CFI rules; frame-pointer records, read with checks.

namespace mi::track {

struct UnwindCache {
  uint64_t misses;
  uint64_t fallbacks;
};

size_t unwind_cache_bytes() {
  return sizeof(UnwindCache);
}

UnwindCache* unwind_cache_init(void* zeroed_memory) {
  return static_cast<UnwindCache*>(zeroed_memory);
}

UnwindCacheStats unwind_cache_stats(const UnwindCache* cache) {
  return UnwindCacheStats{0, cache->misses, cache->fallbacks, 0, 0};
}

void unwind_code_unmapped() {}

// Follows frame records {caller's frame pointer, return address} from this
// function's own (AArch64's AAPCS64 layout, and x86_64's), each read with
// read_checked; ends at the first unreadable or non-ascending record. Code
// built without frame pointers is skipped over or ends the stack early.
__attribute__((noinline)) size_t capture_cached(UnwindCache* cache, uintptr_t* out, size_t max) {
  uintptr_t fp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  size_t n = 0;
  if (cache != nullptr) ++cache->fallbacks;
  while (n < max) {
    uintptr_t record[2];
    if (!read_checked(fp, record, sizeof record) || record[1] == 0) break;
    out[n++] = record[1];
    if (cache != nullptr) ++cache->misses;
    if (record[0] <= fp) break;
    fp = record[0];
  }
  __asm__ volatile("" : "+r"(n));
  return n;
}

}  // namespace mi::track

#endif
