#include "stack_merge.h"

#include <algorithm>

namespace mi::sites {

namespace {

uint64_t hash_frames(const uint64_t* f, uint32_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  for (uint32_t i = 0; i < n; ++i) {
    h ^= f[i];
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  // 0 is reserved for "unknown".
  return h != 0 ? h : 1;
}

bool same_frames(uint32_t a, uint32_t b, FetchStack fetch, void* ctx) {
  uint64_t fa[kMaxFrames];
  uint64_t fb[kMaxFrames];
  const uint32_t na = std::min(fetch(ctx, a, fa, kMaxFrames), kMaxFrames);
  const uint32_t nb = std::min(fetch(ctx, b, fb, kMaxFrames), kMaxFrames);
  return na != 0 && na == nb && std::equal(fa, fa + na, fb);
}

}  // namespace

void canonicalize(StackKey* keys, size_t n, FetchStack fetch, HashStack hash, void* ctx) {
  uint64_t frames[kMaxFrames];
  for (size_t i = 0; i < n; ++i) {
    StackKey& k = keys[i];
    if (k.id == 0) {
      k.hash = 0;
    } else if (hash != nullptr) {
      k.hash = hash(ctx, k.id);
    } else {
      const uint32_t depth = std::min(fetch(ctx, k.id, frames, kMaxFrames), kMaxFrames);
      k.hash = depth == 0 ? 0 : hash_frames(frames, depth);
    }
    k.canonical = k.hash == 0 ? 0 : k.id;
  }
  std::sort(keys, keys + n, [](const StackKey& a, const StackKey& b) {
    return a.hash != b.hash ? a.hash < b.hash : a.id < b.id;
  });
  // Within a run of equal hashes (in id order), each key joins the first
  // earlier key with the same frames; a hash collision between different
  // stacks leaves both their own.
  for (size_t run = 0; run < n;) {
    size_t end = run + 1;
    while (end < n && keys[end].hash == keys[run].hash) ++end;
    if (keys[run].hash != 0) {
      for (size_t i = run + 1; i < end; ++i)
        for (size_t j = run; j < i; ++j)
          if (keys[j].canonical == keys[j].id && same_frames(keys[j].id, keys[i].id, fetch, ctx)) {
            keys[i].canonical = keys[j].id;
            break;
          }
    }
    run = end;
  }
}

}  // namespace mi::sites
