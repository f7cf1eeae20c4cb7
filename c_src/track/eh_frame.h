// Reading DWARF call-frame information as it sits in an object's .eh_frame
// and .eh_frame_hdr sections: records (CIE, FDE), the pointer encodings GCC,
// clang and the GNU assemblers emit, the .eh_frame_hdr search table, and the
// CFA program, run up to a return address into one row of rules.
//
// Pure: every function here reads only the bytes it is given, inside the
// Span it is given, and keeps no state. So it is usable from a malloc hook
// (the tracker's unwinder, unwind_cached.cpp, derives its rules with it)
// and testable on hand-assembled bytes (test/test_eh_frame.cpp). For every
// function: never allocates, never locks, never throws, never faults on any
// bytes inside the Span whatever they hold (a length, offset or count that
// points outside the Span makes the call fail instead of reading there),
// thread-safe, reentrant. errno is untouched.
//
// Only what the unwinder needs is modelled: the CFA rule, and the rules of
// the three registers that step an x86_64 frame (RBP, RSP, the return
// address column). Pointer values are computed with the addresses the
// bytes are at, as the loader maps them (pc-relative encodings are relative
// to the byte's own address), so a test's synthetic section behaves like a
// mapped one.
#ifndef MALLOCINFO_TRACK_EH_FRAME_H
#define MALLOCINFO_TRACK_EH_FRAME_H

#include <cstddef>
#include <cstdint>

namespace mi::track::eh {

// The bytes [lo, hi) a lookup may touch: a test's buffer, or the mapped
// extent of one loaded object (_dl_find_object's dlfo_map_start and
// dlfo_map_end), which holds its .eh_frame and .eh_frame_hdr. That extent
// may contain PROT_NONE gaps between segments: a well-formed .eh_frame never
// points into one, so only malformed CFI could still fault there.
struct Span {
  const uint8_t* lo;
  const uint8_t* hi;
  // Whether [p, p + n) lies inside. Compared as integers: p may be any
  // value computed from untrusted offsets.
  bool holds(const uint8_t* p, size_t n) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    const auto l = reinterpret_cast<uintptr_t>(lo);
    const auto h = reinterpret_cast<uintptr_t>(hi);
    return a >= l && a <= h && h - a >= n;
  }
};

// DWARF register numbers of x86_64 (System V psABI, figure 3.36).
constexpr uint64_t kRegBp = 6;
constexpr uint64_t kRegSp = 7;
constexpr uint64_t kRegRa = 16;  // the return address column
// Columns past this are refused, as libunwind 1.6 refuses them on x86_64.
constexpr uint64_t kNumRegs = 17;

// DW_EH_PE_omit: "no value" in any encoding byte.
constexpr uint8_t kPeOmit = 0xff;

// One length-prefixed record of an .eh_frame section.
enum class RecordKind : uint8_t {
  kCie,         // a common information entry
  kFde,         // a frame description entry
  kTerminator,  // a zero length: the end of the section's records
  kBad,         // a length or id that does not fit in the Span
};
struct Record {
  RecordKind kind;
  const uint8_t* start;  // the length field
  const uint8_t* body;   // after the length (and the 64-bit escape)
  const uint8_t* end;    // one past the record: the next record's start
  // kFde only: the CIE it names (its id field is an offset back to it),
  // still to be checked by parse_cie.
  const uint8_t* cie;
};
// Reads the record header at `at` (32-bit length, or 0xffffffff and a 64-bit
// one; then the CIE id / CIE pointer). Lengths over 1 GiB are kBad.
// Postcondition: for kCie and kFde, [start, end) lies in `s`.
Record read_record(Span s, const uint8_t* at);

struct Cie {
  uint64_t code_align;
  int64_t data_align;
  uint64_t ra_reg;
  uint8_t fde_enc;  // encoding of the FDEs' pc_begin (augmentation 'R'), 0 if none
  bool has_aug_data;
  bool signal_frame;     // augmentation 'S'
  const uint8_t* instr;  // the initial instructions, [instr, instr_end)
  const uint8_t* instr_end;
};
// The CIE whose record starts at `at`. Accepts versions 1 and 3 and the
// augmentations "", "z" followed by any of 'L', 'P', 'R', 'S'; anything else
// (an unknown augmentation, a truncated field) is false. On false *out is
// unspecified.
bool parse_cie(Span s, const uint8_t* at, Cie* out);

struct Fde {
  Cie cie;
  uintptr_t pc_begin;  // the code it covers: [pc_begin, pc_end)
  uintptr_t pc_end;
  const uint8_t* instr;  // its CFA program, [instr, instr_end)
  const uint8_t* instr_end;
};
// The FDE whose record starts at `at`, with its CIE. False for anything
// else (a CIE, a terminator, a record or CIE pointer outside `s`, an
// encoding read_encoded does not support).
bool parse_fde(Span s, const uint8_t* at, Fde* out);

enum class Lookup : uint8_t {
  kFound,    // *out covers pc
  kNone,     // no FDE covers pc (no entry at or below it, or the last such
             // FDE ends before pc): the code has no unwind info
  kUnknown,  // the table or the FDE could not be read: nothing is known
};
// The FDE covering pc, through the binary-search table of the
// .eh_frame_hdr at `hdr`: the last entry starting at or below pc, as
// libunwind picks it. Only version 1 with a datarel sdata4 table (what
// every linker writes) is read; anything else is kUnknown.
Lookup find_fde(Span s, const uint8_t* hdr, uintptr_t pc, Fde* out);

// Where the CFA program says a register of the caller is.
enum class Where : uint8_t {
  kSame,    // unchanged (same value)
  kUndef,   // undefined: for the return address, the end of the stack
  kCfaRel,  // saved at CFA + off
  kOther,   // somewhere this model does not follow (another register, an expression)
};
struct RegRule {
  Where where;
  int64_t off;
};

// One row of the CFI table: the rules in effect at one instruction.
struct Row {
  bool cfa_defined;
  bool cfa_expr;  // the CFA is a DWARF expression (DW_CFA_def_cfa_expression)
  uint64_t cfa_reg;
  int64_t cfa_off;  // CFA = cfa_reg + cfa_off (unless cfa_expr)
  RegRule bp;
  RegRule sp;
  RegRule ra;
  // An instruction before ra gave some register an expression rule, even
  // if a later restore_state dropped it: libunwind evaluates (and may fail
  // on) those, so the unwinder does not follow such a function.
  bool any_expr;
};

enum class Cfi : uint8_t { kOk, kUnsupported };
// The row in effect at the call whose return address is ra, in the function
// `fde` describes: the CIE's initial instructions, then the FDE's, each
// instruction applying when it is located before ra. kUnsupported when a
// program is truncated, uses an instruction outside the common set (set_loc,
// val_offset, vendor extensions), nests remember_state over 8 deep, restores
// an unremembered state, names a column >= kNumRegs, or places an
// instruction exactly at ra (libunwind versions disagree on whether that one
// applies, so no answer is given). Registers with no rule read kSame.
Cfi row_at(const Fde& fde, uintptr_t ra, Row* out);

}  // namespace mi::track::eh

#endif
