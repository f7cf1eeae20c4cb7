// .eh_frame / .eh_frame_hdr reading and CFA program evaluation (eh_frame.h).
//
// Every read goes through a Reader bounded by the record (or the Span) it
// belongs to: the unwinder runs this inside malloc hooks on whatever the
// loader mapped, and a malformed object must cost it a rule ("stop"), never
// a fault. The instruction set and its reading follow libunwind 1.6.2's
// run_cfi_program, which the tracker's stacks are compared with
// (test_unwind.cpp); where libunwind versions read an instruction
// differently, it is refused rather than guessed.
#include "eh_frame.h"

#include <string.h>

namespace mi::track::eh {

namespace {

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

bool below(const uint8_t* a, const uint8_t* b) {
  return reinterpret_cast<uintptr_t>(a) < reinterpret_cast<uintptr_t>(b);
}

}  // namespace

Record read_record(Span s, const uint8_t* at) {
  Record rec{RecordKind::kBad, at, nullptr, nullptr, nullptr};
  if (!s.holds(at, 4)) return rec;
  uint32_t len32;
  memcpy(&len32, at, 4);
  if (len32 == 0) {
    rec.kind = RecordKind::kTerminator;
    return rec;
  }
  const uint8_t* p = at + 4;
  uint64_t len = len32;
  size_t id_size = 4;
  if (len32 == 0xffffffffu) {
    if (!s.holds(p, 8)) return rec;
    memcpy(&len, p, 8);
    p += 8;
    id_size = 8;
  }
  // No real record comes near 1 GiB: such a length is garbage.
  if (len < id_size || len > (uint64_t{1} << 30) || !s.holds(p, len)) return rec;
  uint64_t id = 0;
  memcpy(&id, p, id_size);  // little-endian: the low bytes first
  rec.end = p + len;
  rec.body = p + id_size;
  if (id == 0) {
    rec.kind = RecordKind::kCie;
    return rec;
  }
  // An FDE's id is the distance from the id field itself back to its CIE.
  if (id >
      static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(s.lo)))
    return rec;
  rec.cie = p - id;
  rec.kind = RecordKind::kFde;
  return rec;
}

bool parse_cie(Span s, const uint8_t* at, Cie* out) {
  const Record rec = read_record(s, at);
  if (rec.kind != RecordKind::kCie) return false;
  Reader r{rec.body, rec.end, true};
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
    if (!r.ok || below(aug_end, r.p)) return false;
    r.p = aug_end;
  }
  out->instr = r.p;
  out->instr_end = rec.end;
  return r.ok;
}

bool parse_fde(Span s, const uint8_t* at, Fde* out) {
  const Record rec = read_record(s, at);
  if (rec.kind != RecordKind::kFde) return false;
  if (!parse_cie(s, rec.cie, &out->cie)) return false;
  Reader r{rec.body, rec.end, true};
  uintptr_t range = 0;
  if (!read_encoded(r, out->cie.fde_enc, 0, &out->pc_begin)) return false;
  // The range is a length: the same size, never relative to anything.
  if (!read_encoded(r, out->cie.fde_enc & 0x0f, 0, &range)) return false;
  out->pc_end = out->pc_begin + range;
  if (out->cie.has_aug_data) {
    const uint64_t len = r.uleb();
    if (!r.need(len)) return false;
    r.p += len;
  }
  out->instr = r.p;
  out->instr_end = rec.end;
  return r.ok;
}

Lookup find_fde(Span s, const uint8_t* hdr, uintptr_t pc, Fde* out) {
  // version, eh_frame_ptr encoding, fde_count encoding, table encoding
  // (0x3b: datarel sdata4, 8 bytes an entry).
  if (!s.holds(hdr, 4) || hdr[0] != 1 || hdr[3] != 0x3b) return Lookup::kUnknown;
  const uintptr_t base = reinterpret_cast<uintptr_t>(hdr);
  Reader r{hdr + 4, s.hi, true};
  uintptr_t eh_frame = 0;
  uintptr_t count = 0;
  if (!read_encoded(r, hdr[1], base, &eh_frame)) return Lookup::kUnknown;
  if (!read_encoded(r, hdr[2], base, &count)) return Lookup::kUnknown;
  if (count == 0) return Lookup::kNone;
  const uint8_t* table = r.p;
  if (count > static_cast<uintptr_t>(s.hi - table) / 8) return Lookup::kUnknown;
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
  // Computed as an integer: an offset pointing outside s is refused by
  // parse_fde, never formed into a pointer to be dereferenced.
  const auto* fde =
      reinterpret_cast<const uint8_t*>(base + static_cast<uintptr_t>(int64_t{fde_rel}));
  if (!parse_fde(s, fde, out)) return Lookup::kUnknown;
  if (pc < out->pc_begin) return Lookup::kUnknown;
  return pc < out->pc_end ? Lookup::kFound : Lookup::kNone;
}

namespace {

constexpr int kStateStack = 8;

struct Eval {
  Row cur;
  Row initial;  // after the CIE's instructions: what DW_CFA_restore restores
  Row stack[kStateStack];
  int depth;
  bool any_expr;  // sticky, whatever restore_state brings back
};

void set_reg(Row& s, uint64_t reg, Where where, int64_t off) {
  RegRule* rr = reg == kRegBp ? &s.bp : reg == kRegSp ? &s.sp : reg == kRegRa ? &s.ra : nullptr;
  if (rr != nullptr) *rr = RegRule{where, off};
}

void restore_reg(Eval& e, uint64_t reg) {
  if (reg == kRegBp) e.cur.bp = e.initial.bp;
  if (reg == kRegSp) e.cur.sp = e.initial.sp;
  if (reg == kRegRa) e.cur.ra = e.initial.ra;
}

// Runs CFA instructions while the location is <= target (the return
// address), like libunwind's run_cfi_program. The DWARF row for a call is
// the one before the return address; libunwind versions have disagreed on
// whether instructions located exactly at it apply (1.6.2 here ignores a
// DW_CFA_offset there; later sources apply most of them). Such addresses are
// refused (the stack ends there), so no rule depends on which reading is
// right.
Cfi run_cfi(Eval& e, const Cie& cie, const uint8_t* p, const uint8_t* end, uintptr_t loc,
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
    if (loc == target) return Cfi::kUnsupported;
    if (high == 0x80) {  // DW_CFA_offset
      if (low >= kNumRegs) return Cfi::kUnsupported;
      set_reg(e.cur, low, Where::kCfaRel, static_cast<int64_t>(r.uleb()) * cie.data_align);
      continue;
    }
    if (high == 0xc0) {  // DW_CFA_restore
      if (low >= kNumRegs) return Cfi::kUnsupported;
      restore_reg(e, low);
      continue;
    }
    switch (byte) {
      case 0x05: {  // DW_CFA_offset_extended
        const uint64_t reg = r.uleb();
        const int64_t off = static_cast<int64_t>(r.uleb()) * cie.data_align;
        if (reg >= kNumRegs) return Cfi::kUnsupported;
        set_reg(e.cur, reg, Where::kCfaRel, off);
        break;
      }
      case 0x11: {  // DW_CFA_offset_extended_sf
        const uint64_t reg = r.uleb();
        const int64_t off = r.sleb() * cie.data_align;
        if (reg >= kNumRegs) return Cfi::kUnsupported;
        set_reg(e.cur, reg, Where::kCfaRel, off);
        break;
      }
      case 0x2f: {  // DW_CFA_GNU_negative_offset_extended
        const uint64_t reg = r.uleb();
        const int64_t off = -(static_cast<int64_t>(r.uleb()) * cie.data_align);
        if (reg >= kNumRegs) return Cfi::kUnsupported;
        set_reg(e.cur, reg, Where::kCfaRel, off);
        break;
      }
      case 0x06: {  // DW_CFA_restore_extended
        const uint64_t reg = r.uleb();
        if (reg >= kNumRegs) return Cfi::kUnsupported;
        restore_reg(e, reg);
        break;
      }
      case 0x07:    // DW_CFA_undefined
      case 0x08: {  // DW_CFA_same_value
        const uint64_t reg = r.uleb();
        if (reg >= kNumRegs) return Cfi::kUnsupported;
        set_reg(e.cur, reg, byte == 0x07 ? Where::kUndef : Where::kSame, 0);
        break;
      }
      case 0x09: {  // DW_CFA_register
        const uint64_t reg = r.uleb();
        r.uleb();
        if (reg >= kNumRegs) return Cfi::kUnsupported;
        set_reg(e.cur, reg, Where::kOther, 0);
        break;
      }
      case 0x0a:  // DW_CFA_remember_state
        if (e.depth == kStateStack) return Cfi::kUnsupported;
        e.stack[e.depth++] = e.cur;
        break;
      case 0x0b:  // DW_CFA_restore_state
        if (e.depth == 0) return Cfi::kUnsupported;
        e.cur = e.stack[--e.depth];
        break;
      case 0x0c:    // DW_CFA_def_cfa
      case 0x12: {  // DW_CFA_def_cfa_sf
        const uint64_t reg = r.uleb();
        const int64_t off =
            byte == 0x0c ? static_cast<int64_t>(r.uleb()) : r.sleb() * cie.data_align;
        if (reg >= kNumRegs) return Cfi::kUnsupported;
        e.cur.cfa_defined = true;
        e.cur.cfa_expr = false;
        e.cur.cfa_reg = reg;
        e.cur.cfa_off = off;
        break;
      }
      case 0x0d: {  // DW_CFA_def_cfa_register
        const uint64_t reg = r.uleb();
        if (reg >= kNumRegs) return Cfi::kUnsupported;
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
        if (!r.need(len)) return Cfi::kUnsupported;
        r.p += len;
        e.cur.cfa_defined = true;
        e.cur.cfa_expr = true;
        break;
      }
      case 0x10:    // DW_CFA_expression
      case 0x16: {  // DW_CFA_val_expression
        const uint64_t reg = r.uleb();
        const uint64_t len = r.uleb();
        if (reg >= kNumRegs || !r.need(len)) return Cfi::kUnsupported;
        r.p += len;
        set_reg(e.cur, reg, Where::kOther, 0);
        e.any_expr = true;
        break;
      }
      case 0x2e:  // DW_CFA_GNU_args_size: matters to unw_resume only
        r.uleb();
        break;
      default:
        // DW_CFA_set_loc, val_offset, vendor ops: libunwind 1.6 either
        // reads them differently or not at all.
        return Cfi::kUnsupported;
    }
  }
  return r.ok ? Cfi::kOk : Cfi::kUnsupported;
}

}  // namespace

Cfi row_at(const Fde& fde, uintptr_t ra, Row* out) {
  Eval e{};
  e.cur.bp = e.cur.sp = e.cur.ra = RegRule{Where::kSame, 0};
  if (run_cfi(e, fde.cie, fde.cie.instr, fde.cie.instr_end, 0, ~uintptr_t{0}) != Cfi::kOk)
    return Cfi::kUnsupported;
  e.initial = e.cur;
  e.depth = 0;
  if (run_cfi(e, fde.cie, fde.instr, fde.instr_end, fde.pc_begin, ra) != Cfi::kOk)
    return Cfi::kUnsupported;
  *out = e.cur;
  out->any_expr = e.any_expr;
  return Cfi::kOk;
}

}  // namespace mi::track::eh
