// The unwinder's pure parts on synthetic input: .eh_frame and .eh_frame_hdr
// bytes assembled here by hand (track/eh_frame.h), and step rules evaluated
// on a fake register set over a fake stack (track/cfi.h). Nothing here
// depends on how this binary was compiled, so each case states exactly what
// the CFI says and what the unwinder must make of it.
//
// Every section lives in a heap block of exactly its size, so under ASan
// (make test-san) a read one byte past it fails the test: the truncated and
// corrupted inputs below check that bad lengths and offsets are refused
// rather than followed.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>
#include "catch.h"

#include "../track/cfi.h"
#include "../track/eh_frame.h"

using namespace mi::track;

namespace {

// DWARF call-frame instructions and pointer encodings used below.
constexpr uint8_t kAdvanceLoc = 0x40;  // | delta
constexpr uint8_t kOffset = 0x80;      // | register, then ULEB offset / data_align
constexpr uint8_t kRestore = 0xc0;     // | register
constexpr uint8_t kRememberState = 0x0a;
constexpr uint8_t kRestoreState = 0x0b;
constexpr uint8_t kDefCfa = 0x0c;
constexpr uint8_t kDefCfaRegister = 0x0d;
constexpr uint8_t kDefCfaOffset = 0x0e;
constexpr uint8_t kDefCfaExpression = 0x0f;
constexpr uint8_t kUndefined = 0x07;
constexpr uint8_t kNop = 0x00;
constexpr uint8_t kPcrelSdata4 = 0x1b;
constexpr uint8_t kUdata4 = 0x03;
constexpr uint8_t kDatarelSdata4 = 0x3b;

// Bytes built little-endian, then copied to an exactly sized heap block.
struct Builder {
  std::vector<uint8_t> b;
  size_t size() const { return b.size(); }
  void u8(uint8_t v) { b.push_back(v); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void s32(int64_t v) { u32(static_cast<uint32_t>(static_cast<int32_t>(v))); }
  void put32(size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
  }
  void uleb(uint64_t v) {
    do {
      uint8_t byte = v & 0x7f;
      v >>= 7;
      if (v != 0) byte |= 0x80;
      b.push_back(byte);
    } while (v != 0);
  }
  void sleb(int64_t v) {
    for (;;) {
      const uint8_t byte = v & 0x7f;
      v >>= 7;
      const bool done = (v == 0 && (byte & 0x40) == 0) || (v == -1 && (byte & 0x40) != 0);
      b.push_back(done ? byte : byte | 0x80);
      if (done) return;
    }
  }
  void bytes(std::initializer_list<uint8_t> l) { b.insert(b.end(), l); }
  // Starts a record with a 32-bit length filled in by end_record.
  size_t begin_record() {
    const size_t at = size();
    u32(0);
    return at;
  }
  void end_record(size_t at) {
    while ((size() - at) % 4 != 0) u8(kNop);  // records are padded with nops
    put32(at, static_cast<uint32_t>(size() - at - 4));
  }
};

// A heap block of exactly n bytes holding the first n bytes of src.
struct Block {
  std::unique_ptr<uint8_t[]> mem;
  size_t n;
  Block(const std::vector<uint8_t>& src, size_t len)
      : mem(new uint8_t[len == 0 ? 1 : len]), n(len) {
    if (len != 0) memcpy(mem.get(), src.data(), len);
  }
  const uint8_t* at(size_t off) const { return mem.get() + off; }
  eh::Span span() const { return eh::Span{mem.get(), mem.get() + n}; }
  uintptr_t addr(size_t off) const { return reinterpret_cast<uintptr_t>(mem.get()) + off; }
};

// The section: a CIE like GCC's for x86_64 ("zR", pcrel sdata4 pointers,
// CFA = RSP + 8 and the return address at CFA - 8 on entry), then
//   leaf  a function without a frame: no instructions of its own
//   fp    push %rbp; mov %rsp,%rbp; ...; an epilogue that remembers the
//         body's state, describes the frame popped, and restores the state
//         for code after it
//   expr  a CFA given as a DWARF expression
//   undef the outermost frame: the return address column undefined
// then a zero terminator and, after it, an .eh_frame_hdr of the four. The
// "code" they describe lies at kCode (an offset from the section's start),
// never read: the encodings are pc-relative, so the addresses follow the
// block wherever the heap puts it.
constexpr size_t kCode = 0x10000;
constexpr size_t kLeaf = kCode, kLeafLen = 0x10;
constexpr size_t kFp = kCode + 0x100, kFpLen = 0x40;
constexpr size_t kExpr = kCode + 0x200, kExprLen = 0x10;
constexpr size_t kUndef = kCode + 0x300, kUndefLen = 0x10;

struct Section {
  std::vector<uint8_t> bytes;
  size_t cie, leaf, fp, expr, undef, terminator, hdr;
  size_t fp_truncated_at;  // an offset inside fp's instructions
};

Section build() {
  Section s{};
  Builder b;
  s.cie = b.begin_record();
  b.u32(0);  // CIE id
  b.u8(1);   // version
  b.bytes({'z', 'R', 0});
  b.uleb(1);   // code alignment
  b.sleb(-8);  // data alignment
  b.u8(16);    // return address column
  b.uleb(1);   // augmentation data: the 'R' byte
  b.u8(kPcrelSdata4);
  b.bytes({kDefCfa, 7, 8});    // CFA = RSP + 8
  b.bytes({kOffset | 16, 1});  // RA at CFA - 8
  b.end_record(s.cie);

  auto fde = [&b, &s](size_t code, size_t len, std::initializer_list<uint8_t> program) {
    const size_t at = b.begin_record();
    b.u32(static_cast<uint32_t>(b.size() - s.cie));                      // back to the CIE
    b.s32(static_cast<int64_t>(code) - static_cast<int64_t>(b.size()));  // pc_begin, pcrel
    b.u32(static_cast<uint32_t>(len));
    b.uleb(0);  // no augmentation data
    b.bytes(program);
    b.end_record(at);
    return at;
  };
  s.leaf = fde(kLeaf, kLeafLen, {});
  s.fp = fde(kFp, kFpLen,
             {
                 kAdvanceLoc | 1, kDefCfaOffset, 16,   // after push %rbp: CFA = RSP + 16
                 kOffset | 6, 2,                       // RBP saved at CFA - 16
                 kAdvanceLoc | 3, kDefCfaRegister, 6,  // after mov %rsp,%rbp: CFA = RBP + 16
                 kAdvanceLoc | 0x30, kRememberState,   // at +0x34, the epilogue:
                 kDefCfa, 7, 8,                        // after leave: CFA = RSP + 8,
                 kRestore | 6,                         // RBP as on entry
                 kAdvanceLoc | 2, kRestoreState,       // at +0x36, the body's rules again
             });
  // length, CIE pointer, pc_begin, range, augmentation length, then
  // advance_loc and DW_CFA_def_cfa_offset: the cut leaves out its operand.
  s.fp_truncated_at = s.fp + 4 + 4 + 4 + 4 + 1 + 2;
  s.expr = fde(kExpr, kExprLen, {kAdvanceLoc | 1, kDefCfaExpression, 2, 0x77, 0x08});
  s.undef = fde(kUndef, kUndefLen, {kUndefined, 16});
  s.terminator = b.size();
  b.u32(0);

  // .eh_frame_hdr: version, eh_frame_ptr pcrel sdata4, count udata4, table
  // datarel sdata4; entries (start, FDE) relative to the hdr, sorted.
  s.hdr = b.size();
  b.bytes({1, kPcrelSdata4, kUdata4, kDatarelSdata4});
  b.s32(static_cast<int64_t>(s.cie) - static_cast<int64_t>(b.size()));
  b.u32(4);
  const size_t entries[][2] = {{kLeaf, s.leaf}, {kFp, s.fp}, {kExpr, s.expr}, {kUndef, s.undef}};
  for (const auto& e : entries) {
    b.s32(static_cast<int64_t>(e[0]) - static_cast<int64_t>(s.hdr));
    b.s32(static_cast<int64_t>(e[1]) - static_cast<int64_t>(s.hdr));
  }
  s.bytes = b.b;
  return s;
}

// The row at return address ra of the FDE at fde_off.
eh::Cfi row_of(const Block& blk, size_t fde_off, size_t ra, eh::Row* row,
               eh::Fde* fde_out = nullptr) {
  eh::Fde fde;
  REQUIRE(eh::parse_fde(blk.span(), blk.at(fde_off), &fde));
  if (fde_out != nullptr) *fde_out = fde;
  return eh::row_at(fde, blk.addr(ra), row);
}

}  // namespace

TEST_CASE("eh_frame: records are walked to the zero terminator", "[eh_frame]") {
  const Section s = build();
  const Block blk(s.bytes, s.bytes.size());
  std::vector<eh::RecordKind> kinds;
  std::vector<size_t> starts;
  const uint8_t* p = blk.at(0);
  for (;;) {
    const eh::Record r = eh::read_record(blk.span(), p);
    kinds.push_back(r.kind);
    starts.push_back(static_cast<size_t>(p - blk.at(0)));
    if (r.kind != eh::RecordKind::kCie && r.kind != eh::RecordKind::kFde) break;
    if (r.kind == eh::RecordKind::kFde) CHECK(r.cie == blk.at(s.cie));
    p = r.end;
  }
  using K = eh::RecordKind;
  CHECK(kinds == std::vector<K>{K::kCie, K::kFde, K::kFde, K::kFde, K::kFde, K::kTerminator});
  CHECK(starts == std::vector<size_t>{s.cie, s.leaf, s.fp, s.expr, s.undef, s.terminator});
}

TEST_CASE("eh_frame: a zR CIE and its FDEs' pc-relative ranges", "[eh_frame]") {
  const Section s = build();
  const Block blk(s.bytes, s.bytes.size());
  eh::Cie cie;
  REQUIRE(eh::parse_cie(blk.span(), blk.at(s.cie), &cie));
  CHECK(cie.code_align == 1);
  CHECK(cie.data_align == -8);
  CHECK(cie.ra_reg == 16);
  CHECK(cie.fde_enc == kPcrelSdata4);
  CHECK(cie.has_aug_data);
  CHECK_FALSE(cie.signal_frame);
  CHECK(cie.instr_end - cie.instr >= 5);

  eh::Fde fde;
  REQUIRE(eh::parse_fde(blk.span(), blk.at(s.fp), &fde));
  CHECK(fde.pc_begin == blk.addr(kFp));
  CHECK(fde.pc_end == blk.addr(kFp + kFpLen));
  CHECK(fde.cie.data_align == -8);
  // A CIE is not an FDE and the terminator is neither.
  CHECK_FALSE(eh::parse_fde(blk.span(), blk.at(s.cie), &fde));
  CHECK_FALSE(eh::parse_fde(blk.span(), blk.at(s.terminator), &fde));
  CHECK_FALSE(eh::parse_cie(blk.span(), blk.at(s.fp), &cie));
}

TEST_CASE("eh_frame: the CIE's row at function entry: CFA = RSP + 8, RA at CFA - 8", "[eh_frame]") {
  const Section s = build();
  const Block blk(s.bytes, s.bytes.size());
  eh::Row row;
  for (const size_t ra : {kLeaf + 1, kLeaf + 8, kFp}) {
    INFO("ra at +" << ra - kCode);
    REQUIRE(row_of(blk, ra < kFp ? s.leaf : s.fp, ra, &row) == eh::Cfi::kOk);
    CHECK(row.cfa_defined);
    CHECK_FALSE(row.cfa_expr);
    CHECK(row.cfa_reg == eh::kRegSp);
    CHECK(row.cfa_off == 8);
    CHECK(row.ra.where == eh::Where::kCfaRel);
    CHECK(row.ra.off == -8);
    CHECK(row.bp.where == eh::Where::kSame);
    CHECK(row.sp.where == eh::Where::kSame);
  }
}

TEST_CASE("eh_frame: advance_loc, def_cfa_offset, offset, def_cfa_register, remember/restore",
          "[eh_frame]") {
  const Section s = build();
  const Block blk(s.bytes, s.bytes.size());
  eh::Row row;
  // After push %rbp: CFA = RSP + 16, RBP at CFA - 16.
  REQUIRE(row_of(blk, s.fp, kFp + 2, &row) == eh::Cfi::kOk);
  CHECK(row.cfa_reg == eh::kRegSp);
  CHECK(row.cfa_off == 16);
  CHECK(row.bp.where == eh::Where::kCfaRel);
  CHECK(row.bp.off == -16);
  // The body: CFA = RBP + 16.
  for (const size_t ra : {kFp + 5, kFp + 0x20, kFp + 0x33}) {
    INFO("ra at +" << ra - kFp);
    REQUIRE(row_of(blk, s.fp, ra, &row) == eh::Cfi::kOk);
    CHECK(row.cfa_reg == eh::kRegBp);
    CHECK(row.cfa_off == 16);
    CHECK(row.bp.where == eh::Where::kCfaRel);
    CHECK(row.bp.off == -16);
  }
  // Inside the epilogue: the remembered state is set aside.
  REQUIRE(row_of(blk, s.fp, kFp + 0x35, &row) == eh::Cfi::kOk);
  CHECK(row.cfa_reg == eh::kRegSp);
  CHECK(row.cfa_off == 8);
  CHECK(row.bp.where == eh::Where::kSame);
  // After it: restore_state brings the body's rules back.
  REQUIRE(row_of(blk, s.fp, kFp + 0x37, &row) == eh::Cfi::kOk);
  CHECK(row.cfa_reg == eh::kRegBp);
  CHECK(row.cfa_off == 16);
  CHECK(row.bp.where == eh::Where::kCfaRel);
  CHECK(row.bp.off == -16);
  // An instruction located exactly at the return address: no answer.
  CHECK(row_of(blk, s.fp, kFp + 1, &row) == eh::Cfi::kUnsupported);
  CHECK(row_of(blk, s.fp, kFp + 4, &row) == eh::Cfi::kUnsupported);
  CHECK(row_of(blk, s.fp, kFp + 0x34, &row) == eh::Cfi::kUnsupported);
}

TEST_CASE("eh_frame: .eh_frame_hdr lookup finds the FDE covering pc, or none", "[eh_frame]") {
  const Section s = build();
  const Block blk(s.bytes, s.bytes.size());
  eh::Fde fde;
  auto find = [&](size_t pc) {
    return eh::find_fde(blk.span(), blk.at(s.hdr), blk.addr(pc), &fde);
  };
  REQUIRE(find(kFp + 0x10) == eh::Lookup::kFound);
  CHECK(fde.pc_begin == blk.addr(kFp));
  REQUIRE(find(kLeaf) == eh::Lookup::kFound);
  CHECK(fde.pc_begin == blk.addr(kLeaf));
  REQUIRE(find(kUndef + kUndefLen - 1) == eh::Lookup::kFound);
  CHECK(fde.pc_begin == blk.addr(kUndef));
  CHECK(find(kCode - 1) == eh::Lookup::kNone);           // below every entry
  CHECK(find(kFp + kFpLen) == eh::Lookup::kNone);        // between two functions
  CHECK(find(kUndef + kUndefLen) == eh::Lookup::kNone);  // past the last one
  // An .eh_frame_hdr of another version or table encoding is not guessed at.
  std::vector<uint8_t> other = s.bytes;
  other[s.hdr + 3] = 0x1b;
  const Block blk2(other, other.size());
  CHECK(eh::find_fde(blk2.span(), blk2.at(s.hdr), blk2.addr(kFp), &fde) == eh::Lookup::kUnknown);
}

TEST_CASE("eh_frame: truncated sections are refused without reading past their end", "[eh_frame]") {
  const Section s = build();
  // Every length the section can be cut to, each in a block of exactly that
  // size: whatever is cut off (a length, an id, a CIE field, an FDE's range,
  // an instruction's operand), nothing reads beyond the block (ASan), and
  // what is returned lies inside it.
  for (size_t len = 0; len <= s.terminator; ++len) {
    INFO("cut at " << len);
    const Block blk(s.bytes, len);
    for (const size_t rec : {s.cie, s.leaf, s.fp, s.expr, s.undef}) {
      if (rec > len) continue;
      const eh::Record r = eh::read_record(blk.span(), blk.at(rec));
      if (r.kind == eh::RecordKind::kCie || r.kind == eh::RecordKind::kFde) {
        CHECK(blk.span().holds(r.start, static_cast<size_t>(r.end - r.start)));
      }
      eh::Fde fde;
      if (eh::parse_fde(blk.span(), blk.at(rec), &fde)) {
        CHECK(blk.span().holds(fde.instr, static_cast<size_t>(fde.instr_end - fde.instr)));
        eh::Row row;
        (void)eh::row_at(fde, fde.pc_begin + 0x20, &row);
      }
    }
  }
  // Cut inside fp's first instruction's operand: the record is whole only
  // if its length still fits, so it is refused.
  const Block cut(s.bytes, s.fp_truncated_at);
  eh::Fde fde;
  CHECK(eh::read_record(cut.span(), cut.at(s.fp)).kind == eh::RecordKind::kBad);
  CHECK_FALSE(eh::parse_fde(cut.span(), cut.at(s.fp), &fde));
}

TEST_CASE("eh_frame: garbage lengths, offsets and programs are refused", "[eh_frame]") {
  const Section s = build();
  eh::Fde fde;
  eh::Cie cie;
  SECTION("a length past the section") {
    std::vector<uint8_t> g = s.bytes;
    g[s.fp + 0] = 0xf0;
    g[s.fp + 1] = 0xff;
    g[s.fp + 2] = 0xff;
    g[s.fp + 3] = 0x7f;
    const Block blk(g, g.size());
    CHECK(eh::read_record(blk.span(), blk.at(s.fp)).kind == eh::RecordKind::kBad);
    CHECK_FALSE(eh::parse_fde(blk.span(), blk.at(s.fp), &fde));
  }
  SECTION("a 64-bit length escape with a huge length") {
    std::vector<uint8_t> g = s.bytes;
    memset(&g[s.leaf], 0xff, 12);
    const Block blk(g, g.size());
    CHECK(eh::read_record(blk.span(), blk.at(s.leaf)).kind == eh::RecordKind::kBad);
  }
  SECTION("a CIE pointer before the section") {
    std::vector<uint8_t> g = s.bytes;
    g[s.fp + 4] = 0xf0;
    g[s.fp + 5] = 0xff;
    g[s.fp + 6] = 0x00;
    g[s.fp + 7] = 0x00;
    const Block blk(g, g.size());
    CHECK(eh::read_record(blk.span(), blk.at(s.fp)).kind == eh::RecordKind::kBad);
    CHECK_FALSE(eh::parse_fde(blk.span(), blk.at(s.fp), &fde));
  }
  SECTION("an unknown augmentation") {
    std::vector<uint8_t> g = s.bytes;
    g[s.cie + 10] = 'Q';  // "zQ"
    const Block blk(g, g.size());
    CHECK_FALSE(eh::parse_cie(blk.span(), blk.at(s.cie), &cie));
    CHECK_FALSE(eh::parse_fde(blk.span(), blk.at(s.fp), &fde));
  }
  SECTION("an .eh_frame_hdr count past the section") {
    std::vector<uint8_t> g = s.bytes;
    g[s.hdr + 8] = 0xff;
    g[s.hdr + 9] = 0xff;
    const Block blk(g, g.size());
    CHECK(eh::find_fde(blk.span(), blk.at(s.hdr), blk.addr(kFp), &fde) == eh::Lookup::kUnknown);
  }
  SECTION("an instruction cut short by its record's end") {
    // The leaf's record, its program replaced by DW_CFA_def_cfa with one
    // operand and nothing after it.
    Builder b;
    b.b.assign(s.bytes.begin(), s.bytes.begin() + static_cast<long>(s.leaf));
    const size_t at = b.begin_record();
    b.u32(static_cast<uint32_t>(b.size() - s.cie));
    b.s32(static_cast<int64_t>(kLeaf) - static_cast<int64_t>(b.size()));
    b.u32(kLeafLen);
    b.uleb(0);
    b.bytes({kDefCfa, 7, 0x80});  // the offset's ULEB never ends
    b.put32(at, static_cast<uint32_t>(b.size() - at - 4));
    const Block blk(b.b, b.size());
    eh::Row row;
    REQUIRE(eh::parse_fde(blk.span(), blk.at(at), &fde));
    CHECK(eh::row_at(fde, blk.addr(kLeaf + 4), &row) == eh::Cfi::kUnsupported);
  }
  SECTION("every byte flipped, one at a time") {
    // Whatever a flipped byte turns into, every answer stays inside the
    // block (and ASan sees no read outside it).
    for (size_t i = 0; i < s.bytes.size(); ++i) {
      std::vector<uint8_t> g = s.bytes;
      g[i] ^= 0xff;
      const Block blk(g, g.size());
      for (const size_t rec : {s.cie, s.leaf, s.fp, s.expr, s.undef}) {
        const eh::Record r = eh::read_record(blk.span(), blk.at(rec));
        if (r.kind == eh::RecordKind::kCie || r.kind == eh::RecordKind::kFde)
          REQUIRE(blk.span().holds(r.start, static_cast<size_t>(r.end - r.start)));
        if (eh::parse_fde(blk.span(), blk.at(rec), &fde)) {
          eh::Row row;
          (void)eh::row_at(fde, fde.pc_begin + 3, &row);
        }
      }
      for (const size_t pc : {kLeaf, kFp + 0x10, kUndef + 1})
        (void)eh::find_fde(blk.span(), blk.at(s.hdr), blk.addr(pc), &fde);
    }
  }
}

// ---------------------------------------------------------------------------
// Step rules on a fake register set and a fake stack.

namespace {

// 64 words of fake stack; reads outside them are "unreadable".
struct FakeStack {
  uintptr_t w[64] = {};
  uintptr_t at(size_t i) const { return reinterpret_cast<uintptr_t>(&w[i]); }
  auto reader() const {
    return [this](uintptr_t a, uintptr_t* va, uintptr_t b, uintptr_t* vb) {
      auto ok = [this](uintptr_t x) { return x >= at(0) && x + 8 <= at(64) && x % 8 == 0; };
      if (!ok(a) || !ok(b)) return Step::kEnd;
      *va = *reinterpret_cast<const uintptr_t*>(a);
      *vb = *reinterpret_cast<const uintptr_t*>(b);
      return Step::kStep;
    };
  }
};

Rule rule_at(const Block& blk, size_t fde_off, size_t ra) {
  eh::Row row;
  eh::Fde fde;
  REQUIRE(row_of(blk, fde_off, ra, &row, &fde) == eh::Cfi::kOk);
  return rule_from_row(blk.addr(ra), fde.cie, row);
}

}  // namespace

TEST_CASE("cfi: at function entry the caller's RIP is at RSP and its RSP is RSP + 8", "[cfi]") {
  const Section s = build();
  const Block blk(s.bytes, s.bytes.size());
  const Rule r = rule_at(blk, s.leaf, kLeaf + 4);
  CHECK(r.kind == 0);  // RSP-based, RBP unchanged
  CHECK(r.cfa_off8 == 1);
  FakeStack st;
  st.w[10] = 0xca11e4;
  Frame f{r.ip, st.at(10), 0xb9b9};
  REQUIRE(step(r, f, st.reader()) == Step::kStep);
  CHECK(f.ip == 0xca11e4);
  CHECK(f.sp == st.at(11));
  CHECK(f.bp == 0xb9b9);
}

TEST_CASE("cfi: after push %rbp the caller's RBP is the word saved at CFA - 16", "[cfi]") {
  const Section s = build();
  const Block blk(s.bytes, s.bytes.size());
  const Rule r = rule_at(blk, s.fp, kFp + 2);
  CHECK(r.kind == kBpSaved);
  CHECK(r.cfa_off8 == 2);
  CHECK(r.bp_off8 == -2);
  FakeStack st;
  st.w[8] = st.at(30);  // the caller's RBP, pushed
  st.w[9] = 0xca11e4;   // the return address
  Frame f{r.ip, st.at(8), 0x1234};
  REQUIRE(step(r, f, st.reader()) == Step::kStep);
  CHECK(f.ip == 0xca11e4);
  CHECK(f.sp == st.at(10));
  CHECK(f.bp == st.at(30));
}

TEST_CASE("cfi: an RBP-based frame after push %rbp; mov %rsp,%rbp steps through RBP", "[cfi]") {
  const Section s = build();
  const Block blk(s.bytes, s.bytes.size());
  const Rule r = rule_at(blk, s.fp, kFp + 0x20);
  CHECK(r.kind == (kCfaFromBp | kBpSaved));
  CHECK(r.cfa_off8 == 2);
  CHECK(r.bp_off8 == -2);
  FakeStack st;
  st.w[20] = st.at(40);  // saved RBP at RBP
  st.w[21] = 0xca11e4;   // return address at RBP + 8
  // RSP anywhere below RBP (locals, alloca): the CFA does not depend on it.
  for (const size_t sp : {size_t{4}, size_t{12}, size_t{20}}) {
    Frame f{r.ip, st.at(sp), st.at(20)};
    REQUIRE(step(r, f, st.reader()) == Step::kStep);
    CHECK(f.ip == 0xca11e4);
    CHECK(f.sp == st.at(22));
    CHECK(f.bp == st.at(40));
  }
  // RBP below RSP (a frame the rule no longer fits): refused, not followed.
  Frame bad{r.ip, st.at(30), st.at(20)};
  CHECK(step(r, bad, st.reader()) == Step::kStop);
  CHECK(bad.sp == st.at(30));
  // The same CFA with RBP left unchanged (no saved slot to check): a CFA
  // less than a slot above RSP is refused by itself.
  const Rule bp_kept{r.ip, 0, 2, 0, kCfaFromBp};
  Frame fits{r.ip, st.at(20), st.at(20)};
  REQUIRE(step(bp_kept, fits, st.reader()) == Step::kStep);
  CHECK(fits.sp == st.at(22));
  CHECK(fits.bp == st.at(20));
  Frame below{r.ip, st.at(22), st.at(20)};  // CFA = RSP
  CHECK(step(bp_kept, below, st.reader()) == Step::kStop);
}

TEST_CASE("cfi: expressions are refused, an undefined return address ends the stack", "[cfi]") {
  const Section s = build();
  const Block blk(s.bytes, s.bytes.size());
  eh::Row row;
  eh::Fde fde;
  REQUIRE(row_of(blk, s.expr, kExpr + 4, &row, &fde) == eh::Cfi::kOk);
  CHECK(row.cfa_expr);
  const Rule expr = rule_from_row(blk.addr(kExpr + 4), fde.cie, row);
  CHECK(expr.kind == kStop);
  FakeStack st;
  st.w[11] = 0xca11e4;
  Frame f{expr.ip, st.at(10), st.at(12)};
  CHECK(step(expr, f, st.reader()) == Step::kStop);
  CHECK(f.ip == expr.ip);  // untouched

  const Rule undef = rule_at(blk, s.undef, kUndef + 4);
  CHECK(undef.kind == kEnd);
  Frame g{undef.ip, st.at(10), 0};
  CHECK(step(undef, g, st.reader()) == Step::kEnd);

  // A register with an expression rule (DW_CFA_expression): refused too.
  eh::Row with_expr = row;
  with_expr.cfa_expr = false;
  with_expr.cfa_reg = eh::kRegSp;
  with_expr.cfa_off = 8;
  with_expr.any_expr = true;
  CHECK(rule_from_row(1, fde.cie, with_expr).kind == kStop);
}

TEST_CASE("cfi: an unreadable slot or a return address of 0 ends the stack", "[cfi]") {
  const Section s = build();
  const Block blk(s.bytes, s.bytes.size());
  const Rule r = rule_at(blk, s.leaf, kLeaf + 4);
  FakeStack st;
  Frame top{r.ip, st.at(63), 0};  // the return address slot is st.w[63]: readable, 0
  CHECK(step(r, top, st.reader()) == Step::kEnd);
  Frame off{r.ip, st.at(64), 0};  // past the fake stack
  CHECK(step(r, off, st.reader()) == Step::kEnd);
  CHECK(off.sp == st.at(64));
}

TEST_CASE("cfi: code without unwind info steps like libunwind's frame-pointer guess", "[cfi]") {
  FakeStack st;
  st.w[20] = st.at(40);
  st.w[21] = 0xca11e4;
  const Rule g = kind_rule(0x5000, kGuess);
  Frame f{g.ip, st.at(10), st.at(20)};
  REQUIRE(step(g, f, st.reader()) == Step::kStep);
  CHECK(f.ip == 0xca11e4);
  CHECK(f.sp == st.at(10) + 16);  // CFA + 16, not RBP + 16
  CHECK(f.bp == st.at(40));
  Frame zero{g.ip, st.at(10), 0};  // RBP 0: the end
  CHECK(step(g, zero, st.reader()) == Step::kEnd);
  Frame far{g.ip, st.at(0), st.at(0) + kGuessMaxRbpAboveCfa + 8};  // RBP too far above
  CHECK(step(g, far, st.reader()) == Step::kEnd);
}
