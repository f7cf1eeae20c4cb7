#include "elf_relocs.h"

#include <elf.h>

#include <cstring>

namespace mi::preload {

namespace {

struct Tables {
  const ElfW(Sym) * symtab = nullptr;
  const char* strtab = nullptr;
  size_t strsz = 0;
  const ElfW(Rela) * rela = nullptr;
  size_t relasz = 0;
  const ElfW(Rel) * rel = nullptr;
  size_t relsz = 0;
  uintptr_t jmprel = 0;
  size_t pltrelsz = 0;
  ElfW(Sxword) pltrel = DT_RELA;
};

// glibc rewrites most d_ptr entries of a writable PT_DYNAMIC to absolute
// addresses at load; objects with a read-only dynamic section (the vdso,
// some loaders) keep them relative. An address below the load bias cannot
// be absolute, so it is an offset.
uintptr_t absolute(const LoadedObject& obj, ElfW(Addr) p) {
  return p < obj.base ? obj.base + p : p;
}

const ElfW(Dyn) * dynamic_of(const LoadedObject& obj) {
  for (size_t i = 0; i < obj.phnum; ++i)
    if (obj.phdr[i].p_type == PT_DYNAMIC)
      return reinterpret_cast<const ElfW(Dyn)*>(obj.base + obj.phdr[i].p_vaddr);
  return nullptr;
}

#if defined(__x86_64__)
bool kind_of(uint32_t type, SlotKind* kind) {
  switch (type) {
    case R_X86_64_JUMP_SLOT:
      *kind = SlotKind::kJumpSlot;
      return true;
    case R_X86_64_GLOB_DAT:
      *kind = SlotKind::kGlobDat;
      return true;
    case R_X86_64_64:
      *kind = SlotKind::kAbs64;
      return true;
    default:
      return false;
  }
}
#else
bool kind_of(uint32_t, SlotKind*) {
  return false;
}
#endif

struct Walker {
  const LoadedObject& obj;
  const Tables& t;
  const char* const* names;
  size_t nnames;
  SlotFn fn;
  void* ctx;

  // One relocation; addend is 0 for REL (the addend then lives in the
  // slot, and the caller only patches slots holding the bare symbol value).
  void visit(ElfW(Addr) offset, ElfW(Xword) info, ElfW(Sxword) addend) const {
    SlotKind kind;
    if (!kind_of(static_cast<uint32_t>(ELF64_R_TYPE(info)), &kind)) return;
    if (kind == SlotKind::kAbs64 && addend != 0) return;
    const size_t sym = ELF64_R_SYM(info);
    if (sym == 0) return;
    const ElfW(Sym)& s = t.symtab[sym];
    if (s.st_name >= t.strsz) return;
    const char* name = t.strtab + s.st_name;
    for (size_t i = 0; i < nnames; ++i) {
      if (std::strcmp(name, names[i]) != 0) continue;
      fn(ctx, RelocSlot{obj.base + offset, i, kind, s.st_shndx != SHN_UNDEF});
      return;
    }
  }
};

}  // namespace

ElfWalk find_reloc_slots(const LoadedObject& obj, const char* const* names, size_t nnames,
                         SlotFn fn, void* ctx) {
  const ElfW(Dyn)* dyn = dynamic_of(obj);
  if (dyn == nullptr) return ElfWalk::kNoDynamic;
  Tables t;
  for (const ElfW(Dyn)* d = dyn; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
      case DT_SYMTAB:
        t.symtab = reinterpret_cast<const ElfW(Sym)*>(absolute(obj, d->d_un.d_ptr));
        break;
      case DT_STRTAB:
        t.strtab = reinterpret_cast<const char*>(absolute(obj, d->d_un.d_ptr));
        break;
      case DT_STRSZ:
        t.strsz = d->d_un.d_val;
        break;
      case DT_RELA:
        t.rela = reinterpret_cast<const ElfW(Rela)*>(absolute(obj, d->d_un.d_ptr));
        break;
      case DT_RELASZ:
        t.relasz = d->d_un.d_val;
        break;
      case DT_REL:
        t.rel = reinterpret_cast<const ElfW(Rel)*>(absolute(obj, d->d_un.d_ptr));
        break;
      case DT_RELSZ:
        t.relsz = d->d_un.d_val;
        break;
      case DT_JMPREL:
        t.jmprel = absolute(obj, d->d_un.d_ptr);
        break;
      case DT_PLTRELSZ:
        t.pltrelsz = d->d_un.d_val;
        break;
      case DT_PLTREL:
        t.pltrel = static_cast<ElfW(Sxword)>(d->d_un.d_val);
        break;
      default:
        break;
    }
  }
  const bool has_relocs = t.relasz != 0 || t.relsz != 0 || t.pltrelsz != 0;
  if (!has_relocs) return ElfWalk::kOk;
  if (t.symtab == nullptr || t.strtab == nullptr || t.strsz == 0) return ElfWalk::kUnknownLayout;
  if ((t.relasz != 0 && t.rela == nullptr) || (t.relsz != 0 && t.rel == nullptr) ||
      (t.pltrelsz != 0 && t.jmprel == 0) || (t.pltrel != DT_RELA && t.pltrel != DT_REL))
    return ElfWalk::kUnknownLayout;

  const Walker w{obj, t, names, nnames, fn, ctx};
  for (size_t i = 0; i < t.relasz / sizeof(ElfW(Rela)); ++i)
    w.visit(t.rela[i].r_offset, t.rela[i].r_info, t.rela[i].r_addend);
  for (size_t i = 0; i < t.relsz / sizeof(ElfW(Rel)); ++i)
    w.visit(t.rel[i].r_offset, t.rel[i].r_info, 0);
  // DT_JMPREL may overlap DT_RELA (some linkers count the PLT relocations in
  // both); a slot reported twice is harmless to the caller, which checks
  // the slot's current value before writing.
  if (t.pltrel == DT_RELA) {
    const auto* r = reinterpret_cast<const ElfW(Rela)*>(t.jmprel);
    for (size_t i = 0; i < t.pltrelsz / sizeof(ElfW(Rela)); ++i)
      w.visit(r[i].r_offset, r[i].r_info, r[i].r_addend);
  } else {
    const auto* r = reinterpret_cast<const ElfW(Rel)*>(t.jmprel);
    for (size_t i = 0; i < t.pltrelsz / sizeof(ElfW(Rel)); ++i)
      w.visit(r[i].r_offset, r[i].r_info, 0);
  }
  return ElfWalk::kOk;
}

bool object_contains(const LoadedObject& obj, uintptr_t addr) {
  for (size_t i = 0; i < obj.phnum; ++i) {
    const ElfW(Phdr)& p = obj.phdr[i];
    if (p.p_type != PT_LOAD) continue;
    const uintptr_t lo = obj.base + p.p_vaddr;
    if (addr >= lo && addr - lo < p.p_memsz) return true;
  }
  return false;
}

SlotAccess slot_access(const LoadedObject& obj, uintptr_t addr, size_t page_size) {
  for (size_t i = 0; i < obj.phnum; ++i) {
    const ElfW(Phdr)& p = obj.phdr[i];
    if (p.p_type != PT_GNU_RELRO) continue;
    // The loader protects whole pages only: from the page holding the
    // segment's start to the last page boundary inside it.
    const uintptr_t lo = (obj.base + p.p_vaddr) & ~(page_size - 1);
    const uintptr_t hi = (obj.base + p.p_vaddr + p.p_memsz) & ~(page_size - 1);
    if (addr >= lo && addr < hi) return SlotAccess::kRelro;
  }
  for (size_t i = 0; i < obj.phnum; ++i) {
    const ElfW(Phdr)& p = obj.phdr[i];
    if (p.p_type != PT_LOAD || (p.p_flags & PF_W) == 0) continue;
    const uintptr_t lo = obj.base + p.p_vaddr;
    if (addr >= lo && addr - lo < p.p_memsz) return SlotAccess::kWritable;
  }
  return SlotAccess::kReadOnly;
}

}  // namespace mi::preload
