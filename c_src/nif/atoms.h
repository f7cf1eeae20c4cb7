// Every atom the NIF returns, made once at load (and again, idempotently, at
// upgrade). Read-only after load, so any scheduler may read it without locks.
#ifndef MALLOCINFO_NIF_ATOMS_H
#define MALLOCINFO_NIF_ATOMS_H

#include <erl_nif.h>

namespace mi::nif {

struct Atoms {
  ERL_NIF_TERM ok, error, true_, false_, undefined, enomem, mallocinfo_error;
  // mallinfo2 field names
  ERL_NIF_TERM arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks,
      keepcost;
  // trim result
  ERL_NIF_TERM released, rss_before, rss_after;
};

extern Atoms atoms;

// Fills `atoms`. Called from the load and upgrade callbacks only.
void make_atoms(ErlNifEnv* env);

}  // namespace mi::nif

#endif
