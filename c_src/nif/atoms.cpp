#include "atoms.h"

namespace mi::nif {

Atoms atoms;

void make_atoms(ErlNifEnv* env) {
#define MI_ATOM_MAKE(name, text) atoms.name = enif_make_atom(env, text);
  MI_ATOMS(MI_ATOM_MAKE)
#undef MI_ATOM_MAKE
}

}  // namespace mi::nif
