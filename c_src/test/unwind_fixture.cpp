// Call chains of particular frame shapes for test_unwind.cpp: with and
// without frame pointer, alloca, VLA, over-aligned locals, hand-written CFI
// (a CFA expression; a CFI instruction exactly at a return address; a frame
// whose RBP can be made to lie) and code without any CFI, both mapped at run
// time like JIT output (with a valid RBP chain, a chosen RBP, a fake frame
// record) and inside the binary's .text. Every chain level is two frames: the
// dispatcher unwind_fixture_run() and one shape function. noipa keeps GCC
// from inlining, cloning or turning the recursion into a loop.
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "unwind_fixture.h"

#if defined(__x86_64__)

extern "C" {
int unwind_fixture_badfp_frame(unwind_fixture::Ctx* c, int level);
int unwind_fixture_code_fp(unwind_fixture::Ctx* c, int level);
extern const char unwind_fixture_code_bp[];
extern const char unwind_fixture_code_fake[];
extern const char unwind_fixture_code_end[];
}

namespace {

using unwind_fixture::Ctx;
using unwind_fixture::Shape;

// Uses a value so the compiler must keep the frame's work after the call.
inline int keep(int v) {
  __asm__ volatile("" : "+r"(v)::"memory");
  return v;
}

__attribute__((noipa, optimize("no-omit-frame-pointer"))) int shape_fp(Ctx* c, int level) {
  return keep(unwind_fixture_run(c, level + 1)) + 1;
}

__attribute__((noipa, optimize("omit-frame-pointer"))) int shape_nofp(Ctx* c, int level) {
  volatile char pad[40];
  pad[0] = static_cast<char>(level);
  return keep(unwind_fixture_run(c, level + 1)) + pad[0];
}

__attribute__((noipa, optimize("omit-frame-pointer"))) int shape_alloca(Ctx* c, int level) {
  char* p = static_cast<char*>(__builtin_alloca(c->bytes + static_cast<size_t>(level) + 1));
  p[0] = static_cast<char>(level);
  __asm__ volatile("" ::"r"(p) : "memory");
  return keep(unwind_fixture_run(c, level + 1)) + p[0];
}

__attribute__((noipa, optimize("omit-frame-pointer"))) int shape_vla(Ctx* c, int level) {
  char vla[c->bytes + 1];
  vla[0] = static_cast<char>(level);
  __asm__ volatile("" ::"r"(vla) : "memory");
  return keep(unwind_fixture_run(c, level + 1)) + vla[0];
}

__attribute__((noipa, optimize("omit-frame-pointer"))) int shape_aligned(Ctx* c, int level) {
  alignas(64) char buf[64];
  buf[0] = static_cast<char>(level);
  __asm__ volatile("" ::"r"(buf) : "memory");
  return keep(unwind_fixture_run(c, level + 1)) + buf[0];
}

// A frame with pushes around the call (CFA offset changes mid-function) and
// many callee-saved registers in use.
__attribute__((noipa, optimize("omit-frame-pointer"))) int shape_busy(Ctx* c, int level) {
  int a = level, b = level * 3, d = level * 5, e = level * 7, f = level * 11;
  __asm__ volatile("" : "+r"(a), "+r"(b), "+r"(d), "+r"(e), "+r"(f));
  const int r = keep(unwind_fixture_run(c, level + 1));
  __asm__ volatile("" : "+r"(a), "+r"(b), "+r"(d), "+r"(e), "+r"(f));
  return r + a + b + d + e + f;
}

using ShapeFn = int (*)(Ctx*, int);

// Code without CFI, copied at run time into an anonymous executable mapping
// like a JIT's output: unwind_fixture_code_fp .. unwind_fixture_code_end.
struct Jit {
  ShapeFn fp, bp, fake, edge;
};

// unwind_fixture_code_fp's return address: push, mov, add, call (1 + 3 +
// 3 + 3 bytes) in.
constexpr size_t kCodeFpReturn = 10;

const Jit* jit_code() {
  static const Jit* jit = [] {
    static Jit j{};
    const char* begin = reinterpret_cast<const char*>(&unwind_fixture_code_fp);
    const size_t size = static_cast<size_t>(unwind_fixture_code_end - begin);
    // Two pages: the code at the start, and a second copy of code_fp whose
    // return address is 6 bytes before the first page's end (an unwinder
    // reading the 8 bytes there reads into the second page).
    void* mem = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return static_cast<const Jit*>(nullptr);
    auto* code = static_cast<char*>(mem);
    memcpy(code, begin, size);
    char* edge = code + 4096 - 6 - kCodeFpReturn;
    memcpy(edge, begin, static_cast<size_t>(unwind_fixture_code_bp - begin));
    if (mprotect(mem, 8192, PROT_READ | PROT_EXEC) != 0) return static_cast<const Jit*>(nullptr);
    j.fp = reinterpret_cast<ShapeFn>(code);
    j.bp = reinterpret_cast<ShapeFn>(code + (unwind_fixture_code_bp - begin));
    j.fake = reinterpret_cast<ShapeFn>(code + (unwind_fixture_code_fake - begin));
    j.edge = reinterpret_cast<ShapeFn>(edge);
    return static_cast<const Jit*>(&j);
  }();
  return jit;
}

}  // namespace

// The stubs give capture_libunwind, unw_backtrace and capture_cached with a
// null cache the signature of capture_cached, without a frame of their own
// (a tail jump), so all of them can be called through one call site.
// Hand-written CFI: the expression frame's CFA is DW_CFA_def_cfa_expression
// (DW_OP_breg6 16), i.e. RBP + 16 written in a form the cache does not
// evaluate. The quirk frame has a (harmless) CFI instruction exactly at the
// return address, where libunwind and the DWARF standard disagree on which
// row applies.
__asm__(R"(
  .text
  .p2align 4
  .globl unwind_fixture_expr_frame
  .type unwind_fixture_expr_frame, @function
unwind_fixture_expr_frame:
  .cfi_startproc
  pushq %rbp
  .cfi_def_cfa_offset 16
  .cfi_offset %rbp, -16
  movq %rsp, %rbp
  .cfi_escape 0x0f, 0x02, 0x76, 0x10
  addl $1, %esi
  call unwind_fixture_run
  addl $1, %eax
  popq %rbp
  .cfi_def_cfa %rsp, 8
  ret
  .cfi_endproc
  .size unwind_fixture_expr_frame, .-unwind_fixture_expr_frame

  .p2align 4
  .globl unwind_fixture_quirk_frame
  .type unwind_fixture_quirk_frame, @function
unwind_fixture_quirk_frame:
  .cfi_startproc
  pushq %rbp
  .cfi_def_cfa_offset 16
  .cfi_offset %rbp, -16
  movq %rsp, %rbp
  addl $1, %esi
  call unwind_fixture_run
  .cfi_offset %rbp, -16
  addl $1, %eax
  popq %rbp
  .cfi_def_cfa_offset 8
  ret
  .cfi_endproc
  .size unwind_fixture_quirk_frame, .-unwind_fixture_quirk_frame

  .p2align 4
  .globl unwind_fixture_badfp_frame
  .type unwind_fixture_badfp_frame, @function
unwind_fixture_badfp_frame:
  .cfi_startproc
  pushq %rbp
  .cfi_def_cfa_offset 16
  .cfi_offset %rbp, -16
  movq %rsp, %rbp
  .cfi_def_cfa_register %rbp
  pushq %r12
  .cfi_offset %r12, -24
  pushq %r12
  movq %rbp, %r12
  movq 56(%rdi), %rax
  testq %rax, %rax
  cmovnzq %rax, %rbp
  addl $1, %esi
  call unwind_fixture_run
  movq %r12, %rbp
  popq %r12
  popq %r12
  popq %rbp
  .cfi_def_cfa %rsp, 8
  ret
  .cfi_endproc
  .size unwind_fixture_badfp_frame, .-unwind_fixture_badfp_frame

  # Code without CFI (jit_code() copies it): no .cfi_startproc, so no FDE
  # covers it. Each calls ctx->run(ctx, level + 1).
  .p2align 4
  .globl unwind_fixture_code_fp
  .type unwind_fixture_code_fp, @function
unwind_fixture_code_fp:
  pushq %rbp
  movq %rsp, %rbp
  addl $1, %esi
  call *48(%rdi)
  popq %rbp
  ret
  .size unwind_fixture_code_fp, .-unwind_fixture_code_fp
  .globl unwind_fixture_code_bp
unwind_fixture_code_bp:
  pushq %rbp
  movq %rsp, %rbp
  pushq %r12
  pushq %r12
  movq %rbp, %r12
  movq 56(%rdi), %rbp
  addl $1, %esi
  call *48(%rdi)
  movq %r12, %rbp
  popq %r12
  popq %r12
  popq %rbp
  ret
  .globl unwind_fixture_code_fake
unwind_fixture_code_fake:
  pushq %rbp
  leaq 0(%rip), %rax
  pushq %rax
  pushq $0
  movq %rsp, %rbp
  addl $1, %esi
  call *48(%rdi)
  addq $16, %rsp
  popq %rbp
  ret
  .globl unwind_fixture_code_end
unwind_fixture_code_end:
  int3

  .p2align 4
  .globl unwind_fixture_libunwind_stub
  .type unwind_fixture_libunwind_stub, @function
unwind_fixture_libunwind_stub:
  .cfi_startproc
  movq %rsi, %rdi
  movq %rdx, %rsi
  jmp _ZN16unwind_reference17capture_libunwindEPmm
  .cfi_endproc
  .size unwind_fixture_libunwind_stub, .-unwind_fixture_libunwind_stub

  .p2align 4
  .globl unwind_fixture_nocache_stub
  .type unwind_fixture_nocache_stub, @function
unwind_fixture_nocache_stub:
  .cfi_startproc
  xorl %edi, %edi
  jmp _ZN2mi5track14capture_cachedEPNS0_11UnwindCacheEPmm
  .cfi_endproc
  .size unwind_fixture_nocache_stub, .-unwind_fixture_nocache_stub

  .p2align 4
  .globl unwind_fixture_backtrace_stub
  .type unwind_fixture_backtrace_stub, @function
unwind_fixture_backtrace_stub:
  .cfi_startproc
  movq %rsi, %rdi
  movl $0x7fffffff, %esi
  cmpq %rsi, %rdx
  cmovbl %edx, %esi
  jmp unw_backtrace@PLT
  .cfi_endproc
  .size unwind_fixture_backtrace_stub, .-unwind_fixture_backtrace_stub
)");

extern "C" bool unwind_fixture_jit_available() {
  return jit_code() != nullptr;
}

extern "C" __attribute__((noipa)) int unwind_fixture_run(Ctx* c, int level) {
  if (level >= c->depth) {
    c->leaf(c->arg);
    return keep(0);
  }
  int r = 0;
  switch (c->shapes[static_cast<size_t>(level) % c->nshapes]) {
    case Shape::kFp:
      r = shape_fp(c, level);
      break;
    case Shape::kNoFp:
      r = shape_nofp(c, level);
      break;
    case Shape::kAlloca:
      r = shape_alloca(c, level);
      break;
    case Shape::kVla:
      r = shape_vla(c, level);
      break;
    case Shape::kAligned:
      r = shape_aligned(c, level);
      break;
    case Shape::kBusy:
      r = shape_busy(c, level);
      break;
    case Shape::kExpr:
      r = unwind_fixture_expr_frame(c, level);
      break;
    case Shape::kQuirk:
      r = unwind_fixture_quirk_frame(c, level);
      break;
    case Shape::kJit:
    case Shape::kJitBp:
    case Shape::kJitFake:
    case Shape::kJitEdge: {
      // Where W^X policy forbids the mapping, a plain frame stands in (and
      // the JIT tests say so).
      const Jit* jit = jit_code();
      const Shape shape = c->shapes[static_cast<size_t>(level) % c->nshapes];
      c->run = unwind_fixture_run;
      if (jit == nullptr) {
        r = shape_fp(c, level);
      } else {
        r = (shape == Shape::kJit       ? jit->fp
             : shape == Shape::kJitBp   ? jit->bp
             : shape == Shape::kJitEdge ? jit->edge
                                        : jit->fake)(c, level);
      }
      break;
    }
    case Shape::kNoCfi:
      c->run = unwind_fixture_run;
      r = unwind_fixture_code_fp(c, level);
      break;
    case Shape::kBadFp:
      r = unwind_fixture_badfp_frame(c, level);
      break;
  }
  return keep(r) + 1;
}

#endif  // __x86_64__
