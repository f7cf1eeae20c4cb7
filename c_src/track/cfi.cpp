// From a CFI row to a step rule (cfi.h).
#include "cfi.h"

namespace mi::track {

Rule rule_from_row(uintptr_t ra, const eh::Cie& cie, const eh::Row& s) {
  using eh::Where;
  if (cie.signal_frame) return kind_rule(ra, kStop);
  if (cie.ra_reg != eh::kRegRa || s.any_expr || !s.cfa_defined || s.cfa_expr)
    return kind_rule(ra, kStop);
  if (s.ra.where == Where::kUndef || s.bp.where == Where::kUndef) return kind_rule(ra, kEnd);
  if (s.cfa_reg != eh::kRegSp && s.cfa_reg != eh::kRegBp) return kind_rule(ra, kStop);
  if (s.sp.where != Where::kSame || s.ra.where != Where::kCfaRel || s.ra.off != -8)
    return kind_rule(ra, kStop);
  // Offsets are whole words in practice; 16 bits of them reach 256 KiB.
  if (s.cfa_off % 8 != 0 || s.cfa_off / 8 < INT16_MIN || s.cfa_off / 8 > INT16_MAX)
    return kind_rule(ra, kStop);
  if (s.cfa_reg == eh::kRegSp && s.cfa_off <= 0) return kind_rule(ra, kStop);
  Rule rule{ra, 0, static_cast<int16_t>(s.cfa_off / 8), 0, 0};
  if (s.cfa_reg == eh::kRegBp) rule.kind |= kCfaFromBp;
  if (s.bp.where == Where::kCfaRel) {
    // A saved RBP lives in the frame being popped, below the CFA.
    if (s.bp.off >= 0 || s.bp.off < -1024 || s.bp.off % 8 != 0) return kind_rule(ra, kStop);
    rule.kind |= kBpSaved;
    rule.bp_off8 = static_cast<int8_t>(s.bp.off / 8);
  } else if (s.bp.where != Where::kSame) {
    return kind_rule(ra, kStop);
  }
  return rule;
}

}  // namespace mi::track
