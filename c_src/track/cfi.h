// The tracker's step rules: what one row of DWARF CFI (eh_frame.h) says
// about an x86_64 frame, cut down to the shape GCC and clang emit at nearly
// every call site,
//   CFA = RSP + k or RBP + k,  RA = [CFA - 8],  RBP unchanged or [CFA + j],
// packed into 16 bytes so a per-thread cache can hold thousands
// (unwind_cached.cpp), and evaluated on a frame's (RIP, RSP, RBP) to give
// the caller's. Functions with alloca/VLAs have an RBP-based row, functions
// without frame pointer an RSP-based one: the CFI says which, no look at the
// stack is needed. Code without unwind info gets libunwind 1.6.2's
// frame-pointer guess instead (step_guess).
//
// Pure: nothing here reads memory but through the caller's read callback,
// or keeps state. Every function: never allocates, never locks, never
// throws, thread-safe, reentrant; usable from a malloc hook. The step
// functions are inline because they are the unwinder's hot path.
#ifndef MALLOCINFO_TRACK_CFI_H
#define MALLOCINFO_TRACK_CFI_H

#include <cstddef>
#include <cstdint>

#include "eh_frame.h"

namespace mi::track {

// Rule::kind. Values up to kStepMax are step rules, their bits telling how
// to step; an all-zero Rule reads as one, which is harmless because a cache
// only ever returns a slot whose ip matches a nonzero return address.
enum Kind : uint8_t {
  kCfaFromBp = 1,  // CFA = RBP + off, else RSP + off
  kBpSaved = 2,    // the caller's RBP is at CFA + 8 * bp_off8, else unchanged
  kStepMax = 3,
  kGuess = 4,    // no unwind info: libunwind's frame-pointer guess (step_guess)
  kEnd = 0x10,   // the CFI ends the stack here (return address or RBP undefined)
  kStop = 0x20,  // outside the supported shape: the stack ends here
};

struct Rule {
  uintptr_t ip;  // return address; 0 = empty cache slot
  // Byte offset of the caller's rule in the cache the last time through: a
  // guess that lets the next rule load start before this frame's return
  // address is read (unwind_cached.cpp). Not part of the rule proper.
  uint32_t next;
  int16_t cfa_off8;  // CFA = (RBP or RSP) + 8 * cfa_off8
  int8_t bp_off8;
  uint8_t kind;
};
static_assert(sizeof(Rule) == 16, "a rule is 16 bytes");

// One frame as the unwinder sees it: ip, the return address into the
// function it belongs to (what a stack reports, and what its rule is keyed
// by); sp and bp, the RSP and RBP that function had at the call.
struct Frame {
  uintptr_t ip;
  uintptr_t sp;
  uintptr_t bp;
};

// What one step of a frame gave.
enum class Step : uint8_t {
  kStep,     // the caller's frame is in f
  kEnd,      // the stack ends here, as it does for libunwind
  kStop,     // this unwinder cannot step the frame: the stack ends here
  kOutside,  // the step needs a load the reader does not make: someone else steps it
};

// libunwind 1.6.2's frame-pointer guess accepts RBP in [CFA, CFA + 0x4000].
constexpr uintptr_t kGuessMaxRbpAboveCfa = 0x4000;

// A rule that steps nothing (kind kGuess, kEnd or kStop) for return address ip.
inline Rule kind_rule(uintptr_t ip, Kind kind) {
  return Rule{ip, 0, 0, 0, kind};
}

// The rule for return address ra from the row in effect there (eh::row_at)
// and its CIE: a step rule when the row has the supported shape; kEnd when
// the row makes the return address or RBP undefined (the outermost frame);
// kStop for anything else: a CFA or register expression, DW_CFA_register on
// RBP/RSP/RA, a signal frame's CIE, a return address column other than 16,
// a CFA not a whole number of words or beyond +-256 KiB, an RSP-based CFA
// not above RSP, a saved RBP not in the frame being popped (more than 1 KiB
// below the CFA, or at or above it).
Rule rule_from_row(uintptr_t ra, const eh::Cie& cie, const eh::Row& row);

// Where step rule r (kind <= kStepMax) finds f's caller: its CFA (the
// caller's RSP), the slot of the return address, and, for kBpSaved, the
// slot of the caller's RBP. False when the rule cannot apply to f's
// registers: a CFA less than a slot above SP, or a saved-RBP slot below SP
// (a caller's frame lies above its callee's, which also bounds every walk).
struct Slots {
  uintptr_t cfa;
  uintptr_t ra;
  uintptr_t bp;  // meaningful with kBpSaved only
};
inline __attribute__((always_inline)) bool locate(const Rule& r, const Frame& f, Slots* out) {
  // Every address is base + a constant of the rule, so each load can issue
  // as soon as base is known: the RBP chain of frame-pointer code costs one
  // load a frame.
  const uintptr_t base = (r.kind & kCfaFromBp) != 0 ? f.bp : f.sp;
  const intptr_t off8 = r.cfa_off8;
  out->cfa = base + 8 * off8;
  out->ra = base + 8 * (off8 - 1);
  out->bp = base + 8 * (off8 + r.bp_off8);
  if (out->cfa < f.sp + 8) return false;
  return (r.kind & kBpSaved) == 0 || out->bp >= f.sp;
}

// libunwind 1.6.2's unw_step() (src/x86_64/Gstep.c) for a frame whose
// dwarf_step() failed with UNW_ENOINFO, on the path a guess rule stands for:
// the code at ip is mapped, not a PLT entry, and not a signal frame. With
// cfa = f.sp and rbp = f.bp:
//   rbp == 0                                     -> returns 0: end of stack
//   [rbp] unreadable, rbp < cfa, rbp - cfa > 0x4000 -> returns 0: end
//   [rbp + 8] unreadable                         -> returns < 0: end too
//   else ip = [rbp + 8], cfa += 16 (sic, not rbp + 16), rbp = [rbp], and
//   RSP's location is lost (only the CFA-based rules below can follow).
// A new ip of 0 ends the stack here (libunwind reports a 0 frame, then takes
// paths that depend on its own stack). `words(at, &bp, &ip)` reads
// [at, at + 16) and returns kStep, kOutside (not read: the caller steps the
// frame another way) or anything else (unreadable: the end).
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

// One step of f by any rule r, reading the stack through
//   Step read(uintptr_t a, uintptr_t* va, uintptr_t b, uintptr_t* vb)
// which loads the words at a and b (b may equal a) and returns kStep,
// kOutside (not loaded: the caller steps the frame another way) or kEnd
// (unreadable: the stack ends there, as libunwind's validated loads end
// it). On kStep, f is the caller's frame; otherwise f is unchanged. A
// return address of 0 ends the stack without being reported (0 marks the
// outermost frame). Precondition: r.ip == f.ip (r is f's rule).
template <class Read>
inline __attribute__((always_inline)) Step step(const Rule& r, Frame& f, Read&& read) {
  if (r.kind == kEnd) return Step::kEnd;
  if (r.kind == kGuess) {
    return step_guess(f, [&read](uintptr_t at, uintptr_t* bp, uintptr_t* ip) {
      return read(at, bp, at + 8, ip);
    });
  }
  if (r.kind > kStepMax) return Step::kStop;
  Slots s;
  if (!locate(r, f, &s)) return Step::kStop;
  uintptr_t ip;
  uintptr_t bp = f.bp;
  const Step got =
      (r.kind & kBpSaved) != 0 ? read(s.ra, &ip, s.bp, &bp) : read(s.ra, &ip, s.ra, &ip);
  if (got != Step::kStep) return got;
  if (ip == 0) return Step::kEnd;
  f = Frame{ip, s.cfa, bp};
  return Step::kStep;
}

}  // namespace mi::track

#endif
