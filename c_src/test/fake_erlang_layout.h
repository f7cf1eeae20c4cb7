// The word indices of a fake VM's memory, as the probe finds them on OTP 27
// (sd: scheduler data, p: process, env_proc: the env's process word), for
// the tests' and the benchmark's fake schedulers (test_erlang_context,
// bench/bench_context). max_cps and scan_words are left to each user.
#ifndef MALLOCINFO_TEST_FAKE_ERLANG_LAYOUT_H
#define MALLOCINFO_TEST_FAKE_ERLANG_LAYOUT_H

#include "../common/mi_abi.h"

namespace mi::test {

inline mi_erlang_layout fake_erlang_layout() {
  mi_erlang_layout l{};
  l.version = MI_ERLANG_LAYOUT_VERSION;
  l.key = 4;
  l.sd_process = 21;
  l.sd_env = 26;
  l.sd_shadow = 27;
  l.env_proc = 1;
  l.p_current = 58;
  l.p_htop = 10;
  l.p_stop = 11;
  l.p_heap = 24;
  l.p_hend = 25;
  return l;
}

}  // namespace mi::test

#endif
