// Checked reads and the stack window (stack_window.h).
#include "stack_window.h"

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

namespace mi::track {

// process_vm_readv on ourselves fails with EFAULT where a load would fault.
bool read_checked(uintptr_t addr, void* dst, size_t len) {
  const int saved = errno;
  iovec local{dst, len};
  iovec remote{reinterpret_cast<void*>(addr), len};
  const long got = syscall(SYS_process_vm_readv, syscall(SYS_getpid), &local, 1, &remote, 1, 0);
  errno = saved;
  return got == static_cast<long>(len);
}

#if defined(__x86_64__)

namespace {

// Headroom probed below the deepest SP seen, so slightly deeper captures do
// not need a probe of their own.
constexpr uintptr_t kStackSlack = 16 * kPage;

inline uintptr_t page_down(uintptr_t a) {
  return a & ~(kPage - 1);
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

// Whether the calling thread runs on its signal alternate stack, whose memory
// may be freed while the cache lives: no window is learnt there.
bool on_alt_stack() {
  stack_t ss;
  return sigaltstack(nullptr, &ss) == 0 && (ss.ss_flags & SS_ONSTACK) != 0;
}

}  // namespace

// The pages between sp and the window are live or dead stack of this thread.
__attribute__((noinline, cold)) bool StackWindow::extend_down(uintptr_t sp) {
  const uintptr_t target = page_down(sp) > kStackSlack ? page_down(sp) - kStackSlack : 0;
  if (target >= lo) return false;
  lo -= probe_pages(lo - kPage, -static_cast<intptr_t>(kPage), (lo - target) / kPage) * kPage;
  return contains(sp);
}

// The pages are probed even though the walk read (with validation) or
// stepped between them: a window only ever holds pages that were readable;
// the window of a thread's own stack stays readable as long as the thread
// runs, and only the owning thread uses it.
void StackWindow::learn(bool had_window, uintptr_t caller_sp, uintptr_t chain_top) {
  const uintptr_t top = page_down(chain_top + kPage - 1);
  // A window as large as a default thread stack is plenty.
  constexpr uintptr_t kMaxWindow = uintptr_t{64} << 20;
  if (had_window) {
    if (top <= hi || top - lo > kMaxWindow) return;
    hi += probe_pages(hi, kPage, (top - hi) / kPage) * kPage;
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
  owner = thread_self();
  lo = start - down * kPage;
  hi = start + up * kPage;
}

bool read_two(const StackWindow* w, uintptr_t a, uintptr_t* va, uintptr_t b, uintptr_t* vb) {
  if (w != nullptr && w->covers(a, 8) && w->covers(b, 8)) {
    *va = load_word(a);
    *vb = load_word(b);
    return true;
  }
  const int saved = errno;
  uintptr_t got[2];
  iovec local{got, sizeof got};
  iovec remote[2] = {{reinterpret_cast<void*>(a), 8}, {reinterpret_cast<void*>(b), 8}};
  const long n = syscall(SYS_process_vm_readv, syscall(SYS_getpid), &local, 1, remote, 2, 0);
  errno = saved;
  if (n != static_cast<long>(sizeof got)) return false;
  *va = got[0];
  *vb = got[1];
  return true;
}

#endif  // __x86_64__

}  // namespace mi::track
