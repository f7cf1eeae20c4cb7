#include "atoms.h"

namespace mi::nif {

Atoms atoms;

void make_atoms(ErlNifEnv* env) {
  auto a = [env](const char* name) { return enif_make_atom(env, name); };
  atoms.ok = a("ok");
  atoms.error = a("error");
  atoms.true_ = a("true");
  atoms.false_ = a("false");
  atoms.undefined = a("undefined");
  atoms.enomem = a("enomem");
  atoms.mallocinfo_error = a("mallocinfo_error");
  atoms.arena = a("arena");
  atoms.ordblks = a("ordblks");
  atoms.smblks = a("smblks");
  atoms.hblks = a("hblks");
  atoms.hblkhd = a("hblkhd");
  atoms.usmblks = a("usmblks");
  atoms.fsmblks = a("fsmblks");
  atoms.uordblks = a("uordblks");
  atoms.fordblks = a("fordblks");
  atoms.keepcost = a("keepcost");
  atoms.released = a("released");
  atoms.rss_before = a("rss_before");
  atoms.rss_after = a("rss_after");
}

}  // namespace mi::nif
