#include "glob.h"

namespace mi::preload {

namespace {

// Matches one bracket expression starting at p (just after '['). Sets *end
// to the character after the closing ']'. A '[' without a closing ']' is a
// literal '[' (returns -1 and leaves *end alone).
int match_bracket(const char* p, char c, const char** end) {
  bool negate = false;
  if (*p == '!' || *p == '^') {
    negate = true;
    ++p;
  }
  bool matched = false;
  bool first = true;
  for (; *p != '\0'; first = false) {
    if (*p == ']' && !first) {
      *end = p + 1;
      return matched != negate ? 1 : 0;
    }
    char lo = *p;
    if (lo == '\\' && p[1] != '\0') lo = *++p;
    ++p;
    char hi = lo;
    if (*p == '-' && p[1] != ']' && p[1] != '\0') {
      hi = p[1];
      if (hi == '\\' && p[2] != '\0') {
        hi = p[2];
        ++p;
      }
      p += 2;
    }
    if (lo <= c && c <= hi) matched = true;
  }
  return -1;
}

}  // namespace

bool glob_match(const char* pattern, const char* text) {
  // Iterative matcher with one backtrack point for the last '*': linear in
  // practice, no recursion.
  const char* p = pattern;
  const char* t = text;
  const char* star_p = nullptr;
  const char* star_t = nullptr;
  while (*t != '\0') {
    if (*p == '*') {
      star_p = ++p;
      star_t = t;
      continue;
    }
    bool ok = false;
    const char* next = p + 1;
    if (*p == '?') {
      ok = true;
    } else if (*p == '[') {
      const char* end = nullptr;
      const int r = match_bracket(p + 1, *t, &end);
      if (r < 0) {
        ok = (*t == '[');
      } else {
        ok = (r == 1);
        next = end;
      }
    } else if (*p == '\\' && p[1] != '\0') {
      ok = (p[1] == *t);
      next = p + 2;
    } else if (*p != '\0') {
      ok = (*p == *t);
    }
    if (ok) {
      p = next;
      ++t;
    } else if (star_p != nullptr) {
      p = star_p;
      t = ++star_t;
    } else {
      return false;
    }
  }
  while (*p == '*') ++p;
  return *p == '\0';
}

}  // namespace mi::preload
