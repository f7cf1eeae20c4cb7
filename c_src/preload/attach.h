// The attach entry points of the ABI (common/mi_abi.h, attach block),
// implemented in attach.cpp. Thread-safe, serialised among themselves;
// never called from a hook (they take a mutex and the loader's list lock).
// They allocate nothing through malloc.
#ifndef MALLOCINFO_PRELOAD_ATTACH_H
#define MALLOCINFO_PRELOAD_ATTACH_H

#include <cstddef>

#include "../common/mi_abi.h"

namespace mi::preload {

void abi_attach(const mi_attach_config* config, size_t config_size, mi_attach_result* out,
                size_t out_size);
int abi_detach();
void abi_attach_status(mi_attach_status* out, size_t out_size);
// True once attach() succeeded and detach() undid it (until the next
// attach): nothing reaches the hooks then, so the process records nothing.
bool detached();

}  // namespace mi::preload

#endif
