// mallocinfo version string, shared by the NIF and (later) the interposer.
// Plain C so both link units can include it; no code, no erl_nif.
#ifndef MALLOCINFO_COMMON_MI_VERSION_H
#define MALLOCINFO_COMMON_MI_VERSION_H

#define MALLOCINFO_VERSION "0.1.0"

#endif
