#include "tracker_abi.h"

#include <dlfcn.h>

#include <atomic>
#include <string>

#include "quiet.h"

namespace mi::nif {

namespace {

// The interposer's ABI when it reached this process one of two ways:
// preloaded (its symbols are global: dlsym(RTLD_DEFAULT)), or dlopen()ed
// by attach() (RTLD_LOCAL: only its handle finds it). nullptr otherwise,
// or when its version is not one we understand. Looked up on every call
// until found: a failed lookup must not stick (attach() may come later,
// and tests load and unload the NIF freely).
const mi_preload_abi* checked(mi_preload_abi_fn fn) {
  const mi_preload_abi* abi = fn != nullptr ? fn() : nullptr;
  // An interposer from before churn (issue 26) is still read: only its
  // churn() is missing (has_churn()). Older ones are refused.
  if (abi == nullptr || abi->abi_version != MI_ABI_VERSION ||
      abi->struct_size < offsetof(mi_preload_abi, churn))
    return nullptr;
  return abi;
}

std::atomic<const mi_preload_abi*> g_preloaded{nullptr};
std::atomic<const mi_preload_abi*> g_attached{nullptr};

// priv/libmallocinfo_preload.so, next to this NIF.
std::string preload_path() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&checked), &info) == 0 || info.dli_fname == nullptr)
    return "libmallocinfo_preload.so";
  std::string path(info.dli_fname);
  const size_t slash = path.rfind('/');
  return (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) +
         "libmallocinfo_preload.so";
}

// The dlopen()ed interposer's ABI if it is loaded (RTLD_NOLOAD: never
// loads it unless `load`), whether or not it ever attached.
const mi_preload_abi* loaded_local_abi(bool load) {
  const std::string path = preload_path();
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | (load ? 0 : RTLD_NOLOAD));
  if (h == nullptr) return nullptr;
  // The library is linked -z nodelete; the handle is never closed anyway:
  // its code may be running in a hook on another thread.
  const mi_preload_abi* abi =
      checked(reinterpret_cast<mi_preload_abi_fn>(::dlsym(h, MI_ABI_SYMBOL)));
  if (abi != nullptr && abi->struct_size < offsetof(mi_preload_abi, attach_status) + sizeof(void*))
    return nullptr;
  return abi;
}

bool ever_attached(const mi_preload_abi* abi) {
  mi_attach_status st{};
  abi->attach_status(&st, sizeof st);
  return st.ever != 0;
}

const mi_preload_abi* find_abi() {
  if (const mi_preload_abi* abi = g_preloaded.load(std::memory_order_acquire)) return abi;
  if (const mi_preload_abi* abi = g_attached.load(std::memory_order_acquire)) return abi;
  if (const mi_preload_abi* abi = preloaded_abi()) {
    learn_quiet(abi);
    g_preloaded.store(abi, std::memory_order_release);
    return abi;
  }
  // This NIF may have been reloaded since attach(): the library is still there.
  const mi_preload_abi* abi = loaded_local_abi(false);
  if (abi != nullptr && ever_attached(abi)) {
    learn_quiet(abi);
    g_attached.store(abi, std::memory_order_release);
    return abi;
  }
  return nullptr;
}

// The modes and their atoms, both ways.
struct ModeAtom {
  uint32_t mode;
  const ERL_NIF_TERM* atom;
};
const ModeAtom kModes[] = {{MI_MODE_FULL, &atoms.full},
                           {MI_MODE_SAMPLE, &atoms.sample},
                           {MI_MODE_COUNTERS, &atoms.counters},
                           {MI_MODE_OFF, &atoms.off}};

}  // namespace

const mi_preload_abi* tracker_abi() {
  return find_abi();
}

const mi_preload_abi* recording_tracker() {
  const mi_preload_abi* abi = find_abi();
  if (abi == nullptr) return nullptr;
  mi_abi_status st{};
  abi->status(&st, sizeof st);
  return st.recording != 0 && st.mode >= MI_MODE_SAMPLE ? abi : nullptr;
}

bool is_preloaded(const mi_preload_abi* abi) {
  return abi != nullptr && abi == g_preloaded.load(std::memory_order_acquire);
}

const mi_preload_abi* preloaded_abi() {
  return checked(reinterpret_cast<mi_preload_abi_fn>(::dlsym(RTLD_DEFAULT, MI_ABI_SYMBOL)));
}

const mi_preload_abi* load_interposer() {
  return loaded_local_abi(true);
}

void remember_attached(const mi_preload_abi* abi) {
  g_attached.store(abi, std::memory_order_release);
}

ERL_NIF_TERM not_preloaded(ErlNifEnv* env) {
  return error_tuple(env, atoms.not_preloaded);
}

const mi_preload_abi* recording_abi(ErlNifEnv* env, ERL_NIF_TERM* error, mi_abi_status* st) {
  const mi_preload_abi* abi = find_abi();
  if (abi == nullptr) {
    *error = not_preloaded(env);
    return nullptr;
  }
  *st = mi_abi_status{};
  abi->status(st, sizeof *st);
  if (st->recording == 0) {
    *error = error_tuple(env, atoms.not_recording);
    return nullptr;
  }
  return abi;
}

bool has_reclaim(const mi_preload_abi* abi) {
  return abi->struct_size >= offsetof(mi_preload_abi, reclaim) + sizeof(abi->reclaim);
}

bool has_regions(const mi_preload_abi* abi) {
  return abi->struct_size >= offsetof(mi_preload_abi, regions) + sizeof(abi->regions) &&
         abi->regions != nullptr;
}

bool has_resident(const mi_preload_abi* abi) {
  return abi->struct_size >= offsetof(mi_preload_abi, resident) + sizeof(abi->resident) &&
         abi->resident != nullptr;
}

bool has_churn(const mi_preload_abi* abi) {
  return abi->struct_size >= offsetof(mi_preload_abi, churn) + sizeof(abi->churn) &&
         abi->churn != nullptr;
}

ERL_NIF_TERM mode_atom(uint32_t mode) {
  for (const ModeAtom& m : kModes)
    if (m.mode == mode) return *m.atom;
  return atoms.off;
}

uint32_t decode_mode(ERL_NIF_TERM t) {
  for (const ModeAtom& m : kModes)
    if (enif_is_identical(t, *m.atom)) return m.mode;
  throw BadArg{};
}

}  // namespace mi::nif
