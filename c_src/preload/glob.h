// Shell-style glob matching for MALLOCINFO_TRACE_EXE, without fnmatch(3)
// (which may allocate for multibyte locales). Supports `*`, `?`, and
// bracket expressions `[abc]`, `[a-z]`, `[!x]`/`[^x]`; `\` escapes.
// Pure, thread-safe, never allocates, bounded recursion-free. Used by the
// interposer's start-up (init.cpp) only; the Catch2 tests link it too.
#ifndef MALLOCINFO_PRELOAD_GLOB_H
#define MALLOCINFO_PRELOAD_GLOB_H

namespace mi::preload {

// Whether `text` matches `pattern` in full. Both NUL-terminated.
bool glob_match(const char* pattern, const char* text);

}  // namespace mi::preload

#endif
