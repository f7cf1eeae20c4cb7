#!/usr/bin/env bash
# Phantoms after attach(): blocks the tracker records as live although they
# were freed through a path the patched slots do not cover (glibc freeing
# internally). Runs the same workloads on a node that attaches and on a
# node started with the interposer preloaded (which sees every free), then
# counts, after each workload released everything it holds:
#   demo: entries whose stack is in mallocinfo_demo_nif.so (0 = no phantom);
#   ssl:  entries whose stack is in libcrypto/libssl or crypto.so after 200
#         TLS handshakes and ssl:stop(), and all entries created meanwhile.
# Prints one line per mode. Reports; never gates.
set -eu -o pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
ebin=$root/_build/default/lib/mallocinfo/ebin
demo=$root/_build/demo  # make demo
so=$root/priv/libmallocinfo_preload.so
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mallocinfo-phantoms.XXXXXX")
cd "$tmp"
export ERL_CRASH_DUMP_BYTES=0
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/phantoms.erl" <<'ERL'
-module(phantoms).
-export([run/1]).

in_stack({ok, Sites}, Parts) ->
    lists:sum([C || #{count := C, stack := St} <- Sites,
                    lists:any(fun(#{object := O}) ->
                                      lists:any(fun(P) -> binary:match(O, P) =/= nomatch end, Parts)
                              end, St)]).

live() -> maps:get(live_entries, mallocinfo_trace:status()).

run(Mode) ->
    case Mode of
        attach -> ok = mallocinfo_trace:attach();
        preload -> ok
    end,
    _ = mallocinfo_trace:reset(),
    #{} = mallocinfo_demo:run(#{leak_blocks => 20000, hoard_terms => 1000}),
    ok = mallocinfo_demo:stop(),
    DemoLeft = in_stack(mallocinfo_trace:sites(100000), [<<"mallocinfo_demo_nif">>]),
    {ok, _} = application:ensure_all_started(ssl),
    timer:sleep(200),
    Before = live(),
    #{server_config := SC, client_config := CC} =
        public_key:pkix_test_data(#{server_chain => #{root => [{digest, sha256}], intermediates => [], peer => [{digest, sha256}]},
                                    client_chain => #{root => [{digest, sha256}], intermediates => [], peer => [{digest, sha256}]}}),
    {ok, L} = ssl:listen(0, [{active, false}, {reuseaddr, true}, {versions, ['tlsv1.2']} | SC]),
    {ok, {_, Port}} = ssl:sockname(L),
    Self = self(),
    Acceptor = spawn_link(fun Loop() ->
                                  {ok, T} = ssl:transport_accept(L),
                                  {ok, S} = ssl:handshake(T),
                                  ssl:close(S),
                                  Loop()
                          end),
    [begin
         {ok, S} = ssl:connect("localhost", Port, [{active, false}, {verify, verify_none},
                                                    {versions, ['tlsv1.2']} | CC]),
         ssl:close(S)
     end || _ <- lists:seq(1, 200)],
    unlink(Acceptor), exit(Acceptor, kill), ssl:close(L),
    ok = application:stop(ssl),
    erlang:garbage_collect(),
    timer:sleep(500),
    [erlang:garbage_collect(P) || P <- processes()],
    timer:sleep(500),
    SslLeft = in_stack(mallocinfo_trace:sites(100000), [<<"libcrypto">>, <<"libssl">>, <<"crypto.so">>]),
    io:format("~s: demo entries left ~p; ssl-stack entries left ~p, live entries ~p -> ~p; "
              "frees_untracked ~p~n",
              [Mode, DemoLeft, SslLeft, Before, live(),
               maps:get(frees_untracked, mallocinfo_trace:status())]),
    _ = Self.
ERL
erlc -o "$tmp" "$tmp/phantoms.erl"
env -u LD_PRELOAD erl -noshell -pa "$ebin" "$demo" "$tmp" -eval 'phantoms:run(attach), halt().'
LD_PRELOAD=$so MALLOCINFO_TRACE=full erl -noshell -pa "$ebin" "$demo" "$tmp" -eval 'phantoms:run(preload), halt().'
