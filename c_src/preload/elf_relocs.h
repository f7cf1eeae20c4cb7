// Reading the dynamic relocations of an object already loaded in this
// process: which words the dynamic linker filled with the address of a
// given symbol (PLT slots, GOT slots, absolute data pointers). Used only by
// attach (attach.cpp) to redirect the malloc family without LD_PRELOAD;
// kept free of any patching so the attach tests (test/attach/) can link
// it alone.
//
// Everything here only reads memory the loader keeps mapped for the
// object's lifetime (PT_DYNAMIC, the symbol and string tables, the
// relocation tables). Thread-safe, never allocates, never locks: callers
// may use it inside a dl_iterate_phdr callback. The caller keeps the object
// loaded meanwhile (holding the loader's list lock, as dl_iterate_phdr does).
#ifndef MALLOCINFO_PRELOAD_ELF_RELOCS_H
#define MALLOCINFO_PRELOAD_ELF_RELOCS_H

#include <link.h>

#include <cstddef>
#include <cstdint>

namespace mi::preload {

// One loaded object, as dl_iterate_phdr describes it.
struct LoadedObject {
  uintptr_t base;  // load bias (dlpi_addr)
  const ElfW(Phdr) * phdr;
  size_t phnum;
  const char* name;  // "" for the main executable
};

inline LoadedObject loaded_object(const dl_phdr_info& info) {
  return LoadedObject{info.dlpi_addr, info.dlpi_phdr, info.dlpi_phnum,
                      info.dlpi_name != nullptr ? info.dlpi_name : ""};
}

enum class SlotKind : uint8_t {
  kJumpSlot = 0,  // R_X86_64_JUMP_SLOT: a PLT slot (maybe still unresolved)
  kGlobDat = 1,   // R_X86_64_GLOB_DAT: a GOT slot, resolved at load
  kAbs64 = 2,     // R_X86_64_64 with addend 0: a pointer in data
};

struct RelocSlot {
  uintptr_t address;  // the word the loader wrote
  size_t name_index;  // index into the names passed to find_reloc_slots
  SlotKind kind;
  bool defined_here;  // the object defines the symbol itself (an allocator)
};

enum class ElfWalk {
  kOk = 0,
  kNoDynamic,      // no PT_DYNAMIC: a static object, nothing to patch
  kUnknownLayout,  // relocations without a symbol/string table, or out of bounds
};

using SlotFn = void (*)(void* ctx, const RelocSlot& slot);

// Calls fn for every relocation of `obj` (DT_JMPREL, DT_RELA, DT_REL) of a
// supported kind whose symbol's name is one of names[0..nnames). Symbol
// versions are not checked (the malloc family has one version each).
ElfWalk find_reloc_slots(const LoadedObject& obj, const char* const* names, size_t nnames,
                         SlotFn fn, void* ctx);

// True when addr lies inside one of obj's PT_LOAD segments.
bool object_contains(const LoadedObject& obj, uintptr_t addr);

// Where a slot may be written: kWritable (a writable PT_LOAD outside RELRO),
// kRelro (inside PT_GNU_RELRO's page-aligned part: read-only once loaded,
// make it writable around the store), kReadOnly (neither: text relocations,
// not patched).
enum class SlotAccess { kWritable, kRelro, kReadOnly };
SlotAccess slot_access(const LoadedObject& obj, uintptr_t addr, size_t page_size);

}  // namespace mi::preload

#endif
