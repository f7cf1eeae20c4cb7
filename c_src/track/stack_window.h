// Reading stack memory from inside a malloc hook without ever faulting: the
// checked read (a system call that fails where a load would fault), and the
// stack window, a range of one thread's stack proven readable once so the
// unwinder's warm path can load from it directly (unwind_cached.cpp).
//
// The window: [lo, hi) of the stack of the thread whose TCB is `owner`,
// learnt by a cold walk (the contiguous frames from the capturing function's
// caller up, each under kMaxChainFrame), proven readable page by page with
// process_vm_readv (mincore where that syscall is refused), and extended
// down by probing when a capture starts deeper. A thread's stack stays
// mapped while the thread runs, and the owner is checked on every capture,
// so a load inside the window cannot fault. Captures on a signal alternate
// stack learn no window (it may be freed while the window lives).
//
// For every function here: never allocates, never locks, never throws,
// preserves errno; callable from a malloc hook. A StackWindow is plain data
// (all zero: empty) used by one thread at a time, its owner's; nothing here
// is shared between threads.
#ifndef MALLOCINFO_TRACK_STACK_WINDOW_H
#define MALLOCINFO_TRACK_STACK_WINDOW_H

#include <cstddef>
#include <cstdint>

namespace mi::track {

constexpr uintptr_t kPage = 4096;
// The window grows by contiguous frames no larger than this: a bigger step
// is more likely a switch to another stack than a frame, and memory between
// two stacks may be unmapped later.
constexpr uintptr_t kMaxChainFrame = uintptr_t{1} << 20;

// Reads len bytes at addr into dst without faulting (process_vm_readv on
// this process). False if any byte is unreadable or the system call is
// refused (seccomp); then dst is unspecified. Any thread.
bool read_checked(uintptr_t addr, void* dst, size_t len);

#if defined(__x86_64__)

// The calling thread's TCB address (glibc's pthread_self()): one load, no call.
inline uintptr_t thread_self() {
  uintptr_t tcb;
  __asm__("movq %%fs:0, %0" : "=r"(tcb));
  return tcb;
}

// One word of stack memory the caller has proven readable (inside a
// window). Inline asm, so sanitizers do not instrument loads of other
// frames' slots.
inline uintptr_t load_word(uintptr_t addr) {
  uintptr_t v;
  __asm__("movq %1, %0" : "=r"(v) : "m"(*reinterpret_cast<const uintptr_t*>(addr)));
  return v;
}

struct StackWindow {
  uintptr_t owner;  // TCB of the thread whose stack it is; 0: none yet
  uintptr_t lo;
  uintptr_t hi;  // [lo, hi); empty when lo == hi

  // Whether sp lies in the window (one compare).
  bool contains(uintptr_t sp) const { return sp - lo < hi - lo; }

  // Whether [addr, addr + len) lies in the window.
  bool covers(uintptr_t addr, size_t len) const {
    return addr >= lo && addr <= hi && hi - addr >= len;
  }

  // Whether a walk starting at sp (the caller's stack pointer) may load
  // from the window: it is the calling thread's and contains sp, possibly
  // after growing down to sp (probing the pages in between: system calls)
  // when sp is at most kMaxChainFrame below it. Calling thread = owner
  // thread, or the answer is false.
  bool ready(uintptr_t sp) {
    if (owner != thread_self()) return false;
    if (contains(sp)) return true;
    return sp < lo && lo - sp <= kMaxChainFrame && lo < hi && extend_down(sp);
  }

  // After a cold walk: learns the window (had_window false) or grows it up
  // (true) from [caller_sp, chain_top), the stack the walk crossed by
  // contiguous frames of at most kMaxChainFrame each, starting at the frame
  // of the capturing function's caller. Only pages proven readable are
  // added; nothing on a signal alternate stack, nothing over 64 MiB.
  void learn(bool had_window, uintptr_t caller_sp, uintptr_t chain_top);

  // Grows the window down to a little below sp. Cold; true when it then
  // contains sp.
  bool extend_down(uintptr_t sp);
};

// Two stack words at a and b for a walk that may not trust them: from the
// window w where it covers both (w: the calling thread's window of this
// stack, or null), else with one process_vm_readv. False when either is
// unreadable.
bool read_two(const StackWindow* w, uintptr_t a, uintptr_t* va, uintptr_t b, uintptr_t* vb);

#endif  // __x86_64__

}  // namespace mi::track

#endif
