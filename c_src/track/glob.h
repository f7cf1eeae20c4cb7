// Shell-style glob matching for MALLOCINFO_TRACE_EXE, without fnmatch(3)
// (which may allocate for multibyte locales). Supports `*`, `?`, and
// bracket expressions `[abc]`, `[a-z]`, `[!x]`/`[^x]`; `\` escapes.
// Pure, thread-safe, never allocates, bounded recursion-free.
#ifndef MALLOCINFO_TRACK_GLOB_H
#define MALLOCINFO_TRACK_GLOB_H

namespace mi::track {

bool glob_match(const char* pattern, const char* text);

}  // namespace mi::track

#endif
