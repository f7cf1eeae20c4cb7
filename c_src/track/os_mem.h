// Memory for the tracker, straight from the kernel. Never from malloc: the
// tracker runs inside malloc.
#ifndef MALLOCINFO_TRACK_OS_MEM_H
#define MALLOCINFO_TRACK_OS_MEM_H

#include <cstddef>

namespace mi::track {

// `bytes` rounded up to whole 4 KiB pages: tables that place one array
// after another (or give their pages back by range) start each on a page.
constexpr size_t os_page_up(size_t bytes) {
  return (bytes + 4095) & ~size_t{4095};
}

// Zero-filled, page-aligned, lazily backed (MAP_NORESERVE) and never in
// transparent huge pages (MADV_NOHUGEPAGE): untouched pages cost no
// resident memory. nullptr on failure. Thread-safe.
void* os_map(size_t bytes);
void os_unmap(void* p, size_t bytes);
// Gives the pages of [p, p + bytes) back to the kernel (MADV_DONTNEED):
// they read as zero afterwards and cost no resident memory until written.
// p page-aligned. No other thread may write there meanwhile (a write racing
// the call may be lost). Thread-safe otherwise.
void os_release(void* p, size_t bytes);
// The same for the whole pages inside [begin, end) (none when the range
// holds no whole page): for ranges of records whose ends need not fall on
// a page. Returns the bytes given back.
size_t os_release_within(const void* begin, const void* end);
// The kernel's page size (sysconf, read once). Never allocates.
size_t os_page_size();
// Resident bytes of the page-aligned mapping [p, p + bytes) (mincore).
// Never allocates. Thread-safe.
size_t os_resident(const void* p, size_t bytes);

// Counts the resident bytes of page-aligned ranges. Opened on pagemap
// (PageCounter::pagemap(): opens /proc/self/pagemap, so not for hooks), it
// counts pages of memory of their own: present and mapped by this process
// alone (pagemap bits 63 and 56). A page only ever read maps the kernel's
// shared zero page, which mincore counts and this does not (a stack sweep
// reads every slot of the stack table), nor a page shared with a forked
// child while the child lives. Otherwise (the default, and where pagemap
// cannot be opened) mincore's count. Never allocates.
class PageCounter {
 public:
  PageCounter() = default;  // mincore
  static PageCounter pagemap();
  ~PageCounter();
  PageCounter(PageCounter&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  PageCounter(const PageCounter&) = delete;
  PageCounter& operator=(const PageCounter&) = delete;
  size_t count(const void* p, size_t bytes) const;
  bool reads_pagemap() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace mi::track

#endif
