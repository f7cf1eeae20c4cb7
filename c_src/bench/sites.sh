#!/usr/bin/env bash
# Tracker query benchmark: mallocinfo_trace:sites(20) and olds(20) over a
# full stack table (64K stacks of depth 32, about half a million live
# blocks), the ten biggest sites allocated from a NIF called from Erlang so
# that their stacks end in JIT code, with /proc/self/maps padded to
# REGIONS extra mappings (a node with many threads and carriers has
# thousands). Prints one line per query: the median of REPS calls (the
# first call, with a cold symbolizer, reported apart).
#
# Usage: c_src/bench/sites.sh [APP_DIR]
#   APP_DIR: a directory with ebin/ and priv/ (default: this checkout's
#   _build/default/lib/mallocinfo), e.g. an older build to compare with.
# Knobs (environment): REPS (default 7), REGIONS (default 0 20000, a list).
# A benchmark reports, it does not gate: exits 0 whatever the numbers.
set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
app=${1:-$root/_build/default/lib/mallocinfo}
reps=${REPS:-7}
regions_list=${REGIONS:-0 20000}

die() {
  echo "sites bench: $*" >&2
  exit 1
}

[[ -d $app/ebin && -f $app/priv/libmallocinfo_preload.so ]] || die "no ebin/ and priv/ under $app"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mallocinfo-sites.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$tmp"' EXIT
data=$root/test/mallocinfo_trace_SUITE_data
erts=$(erl -noshell -eval 'io:format("~ts/erts-~ts/include", [code:root_dir(), erlang:system_info(version)]), halt().')
cc -O1 -g -fPIC -shared -I"$erts" -o "$tmp/mi_leaky_nif.so" "$data/mi_leaky_nif.c" || die "cc failed"
erlc -o "$tmp" "$data/mi_leaky_nif.erl" || die "erlc failed"

echo "app: $app; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for regions in $regions_list; do
  LD_PRELOAD=$app/priv/libmallocinfo_preload.so erl -noshell -pa "$app/ebin" -pa "$tmp" -eval "
    Reps = $reps, Regions = $regions,
    mallocinfo_trace:reset(),
    ok = mi_leaky_nif:paths_jit(100000, 10, 100, 40000),
    ok = mi_leaky_nif:paths(0, 64000, 8, 16),
    ok = mi_leaky_nif:regions(Regions),
    #{stacks := Stacks, live_entries := Live} = mallocinfo_trace:status(),
    Ms = fun(F) -> {U, _} = timer:tc(F), U / 1000 end,
    Median = fun(F) -> L = lists:sort([Ms(F) || _ <- lists:seq(1, Reps)]),
                       lists:nth((Reps + 1) div 2, L) end,
    Sites = fun() -> mallocinfo_trace:sites(20) end,
    Olds = fun() -> mallocinfo_trace:olds(20) end,
    First = Ms(Sites),
    io:format(\"regions ~p, stacks ~p, live ~p: sites(20) first ~.1f ms, median ~.1f ms; \"
              \"olds(20) median ~.1f ms~n\", [Regions, Stacks, Live, First, Median(Sites), Median(Olds)]),
    halt()." || echo "sites bench: the node failed (regions $regions)" >&2
done
exit 0
