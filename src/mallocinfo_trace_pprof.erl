%% @private The legacy gperftools heap profile text format, which `pprof',
%% `google-pprof' and `jeprof' read. Pure: {@link mallocinfo_trace:heap_profile/0}
%% feeds it the tracker's live sites and `/proc/self/maps'.
%%
%% ```
%% heap profile:   1002:   100512 [  1002:   100512] @ heapprofile
%%   1000:   100000 [  1000:   100000] @ 0x00007f3a1c2b1139 0x00007f3a1c2b11c4 ...
%%      2:      512 [     2:      512] @ 0x000055d0c1a0b2e0 ...
%%
%% MAPPED_LIBRARIES:
%% 55d0c19f7000-55d0c1a5d000 r--p 00000000 fe:00 9953300  /usr/lib/erlang/erts-13.1.5/bin/beam.smp
%% ...
%% '''
%%
%% One line per call site: live blocks and bytes, then the same pair again
%% in brackets (the format's "allocated since start" figures, which the
%% tracker does not keep; pprof shows them only with `--alloc_space'), then
%% the stack, innermost return address first. `@ heapprofile' tells the
%% readers the figures need no adjustment for sampling: the tracker's
%% sampled figures are already unbiased estimates.
-module(mallocinfo_trace_pprof).

-export([heap_profile/2]).

-export_type([site/0]).

-type site() :: {Blocks :: non_neg_integer(), Bytes :: non_neg_integer(),
                 Stack :: [Address :: non_neg_integer()]}.

%% @doc The profile text for `Sites' (in the order given; sites with an
%% empty stack are left out, since the readers would skip them and the
%% header would no longer be their sum) and the process's memory map,
%% `/proc/self/maps' as read, which the readers use to find the object and
%% offset of every address. Raises `badarg' for anything else.
-spec heap_profile([site()], Maps :: binary()) -> iodata().
heap_profile(Sites, Maps) when is_list(Sites), is_binary(Maps) ->
    sites(Sites) orelse erlang:error(badarg, [Sites, Maps]),
    Kept = [S || {_, _, [_ | _]} = S <- Sites],
    Blocks = lists:sum([N || {N, _, _} <- Kept]),
    Bytes = lists:sum([B || {_, B, _} <- Kept]),
    [<<"heap profile: ">>, counts(Blocks, Bytes), <<" @ heapprofile\n">>,
     [[counts(N, B), <<" @">>, [[$\s | address(A)] || A <- Stack], $\n]
      || {N, B, Stack} <- Kept],
     <<"\nMAPPED_LIBRARIES:\n">>, Maps,
     case Maps of
         <<>> -> [];
         _ when binary_part(Maps, byte_size(Maps), -1) =:= <<"\n">> -> [];
         _ -> <<"\n">>
     end];
heap_profile(Sites, Maps) ->
    erlang:error(badarg, [Sites, Maps]).

%% A proper list of sites.
sites([]) -> true;
sites([S | Rest]) -> is_site(S) andalso sites(Rest);
sites(_) -> false.

%% "  1000:   100000 [  1000:   100000]", the widths gperftools uses.
counts(N, B) ->
    Pair = [pad(N, 6), <<": ">>, pad(B, 8)],
    [Pair, <<" [">>, Pair, $]].

pad(I, Width) ->
    Digits = integer_to_binary(I),
    [lists:duplicate(max(0, Width - byte_size(Digits)), $\s), Digits].

address(A) ->
    Hex = integer_to_binary(A, 16),
    [<<"0x">>, lists:duplicate(max(0, 16 - byte_size(Hex)), $0), string:lowercase(Hex)].

is_site({N, B, Stack}) when is_integer(N), N >= 0, is_integer(B), B >= 0 ->
    addresses(Stack);
is_site(_) ->
    false.

addresses([]) -> true;
addresses([A | Rest]) -> is_address(A) andalso addresses(Rest);
addresses(_) -> false.

is_address(A) -> is_integer(A) andalso A >= 0 andalso A < 1 bsl 64.
