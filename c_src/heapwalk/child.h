// The heap walker's child: runs in a fork() of the node, walks its frozen
// copy of glibc's heaps, writes the dump's arena and chunk records to the
// file and the reply (reply.h) to the pipe, and _exits. It never returns,
// never calls malloc (the fork may hold malloc's locks of threads that do
// not exist in it) and turns a fault into a kWalkFailed reply.
#ifndef MALLOCINFO_HEAPWALK_CHILD_H
#define MALLOCINFO_HEAPWALK_CHILD_H

#include <sys/types.h>

#include <cstdint>
#include <cstdio>

#include "dump_types.h"
#include "ptmalloc.h"

namespace mi::heapwalk::detail {

// `layout` is this glibc's (pt::layout_for), `file_fd` may be -1 (summary
// only), `xml` nullptr (no malloc_info). Call only in the child of fork().
// Exit status: 0 reply sent, 4 fault, 5 no memory for the walk, 6 the
// reply could not be written.
[[noreturn]] void child_main(const DumpOptions& opt, const pt::Layout& layout, int file_fd,
                             int reply_fd, FILE* xml, uint64_t main_arena, pid_t parent);

}  // namespace mi::heapwalk::detail

#endif
