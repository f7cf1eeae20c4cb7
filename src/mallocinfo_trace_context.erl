%% @private The Erlang context of native allocations (issue 25): learning
%% where the VM keeps what runs on a scheduler thread, checking it, handing
%% it to the tracker, and turning what the tracker recorded with it back
%% into Erlang terms.
%%
%% The VM does not say where a scheduler keeps its running process, nor
%% where a process keeps its current function and stack (OTP 29's beam.smp
%% exports nothing but the NIF and driver API), and the layouts change
%% between releases (OTP 25 keeps the heap pointers at other words than 27
%% and 29). So the NIF learns them from its own calls (c_src/nif/
%% erlang_context_nif.h): enable/0 calls its probe through three known
%% functions of this module, once on a normal and once on a dirty
%% scheduler, and accepts the layout only when both probes agree, the pid
%% they found is this process, and the return addresses they found on its
%% stack name the same functions as the VM's own
%% `process_info(self(), current_stacktrace)'. Anything else is
%% `{error, {unsupported, erlang_context}}', and the tracker runs as before.
-module(mallocinfo_trace_context).

-export([enable/0, ensure/0, refresh/0, split/1, mfa_terms/2]).
%% Called through their own names so that each is a frame of its own.
-export([probe_chain/2]).

-define(LAYOUT_KEYS, [key, sd_env, sd_process, env_proc, p_current, p_htop, p_stop, p_heap,
                      p_hend]).
-define(MAX_CPS, 8).
-define(SCAN_WORDS, 256).

%% @doc Learns the VM's layout and hands it to the tracker. `ok' (also when
%% the tracker had it already), `{error, not_preloaded | not_recording}'
%% without a recording tracker, `{error, {unsupported, erlang_context}}'
%% when the layout cannot be learned or does not check out.
-spec enable() -> ok | {error, not_preloaded | not_recording | {unsupported, erlang_context}}.
enable() ->
    case mallocinfo_nif:trace_status() of
        #{erlang_context := on} ->
            ok;
        #{recording := true} ->
            Result = learn(),
            _ = application:set_env(mallocinfo, erlang_context, Result),
            Result;
        #{preloaded := false, attached := false} ->
            {error, not_preloaded};
        #{} ->
            {error, not_recording}
    end.

%% @doc enable/0 unless it failed on this node before (its answer is kept).
-spec ensure() -> ok | {error, term()}.
ensure() ->
    case application:get_env(mallocinfo, erlang_context) of
        {ok, {error, {unsupported, _}} = E} -> E;
        _ -> enable()
    end.

%% @doc Tells the NIF how many atoms the VM has now: a recorded word is
%% named as an atom only when its index is below that count. Cheap (a
%% normal-scheduler NIF); called before every view that names Erlang
%% functions. Atoms are never freed, so an older count is only less
%% complete, never unsafe.
-spec refresh() -> ok.
refresh() ->
    mallocinfo_nif:ectx_atoms(erlang:system_info(atom_count)).

learn() ->
    T = fresh(),
    try
        Normal = checked(normal, T),
        Dirty = checked(dirty, T),
        %% The block both kinds of scheduler keep at the same key and words
        %% (a normal scheduler also holds its thread-progress data, which
        %% has the env and the process too, at other words).
        [{N, D} | _] = [{N, D} || N <- Normal, D <- Dirty,
                                  maps:with(?LAYOUT_KEYS, N) =:= maps:with(?LAYOUT_KEYS, D)],
        Shadow = case D of
                     #{sd_shadow := S} when is_integer(S) -> S;
                     #{sd_process := P} -> P
                 end,
        Layout = (maps:with(?LAYOUT_KEYS, N))#{sd_shadow => Shadow, max_cps => ?MAX_CPS,
                                               scan_words => ?SCAN_WORDS},
        ok = refresh(),
        ok = mallocinfo_nif:ectx_enable(Layout)
    catch
        _:_ -> {error, {unsupported, erlang_context}}
    end.

%% One probe's candidates that check out: the pid is ours, and the first
%% return addresses found name this module's chain as the VM names it.
checked(Kind, T) ->
    {{ok, #{pid := Pid, candidates := Candidates}}, Trace} = ?MODULE:probe_chain(Kind, T),
    true = Pid =:= self(),
    Expected = [{M, F, A} || {M, F, A, _} <- Trace, M =:= ?MODULE,
                             lists:member(F, [chain_b, chain_a, probe_chain])],
    [{?MODULE, chain_b, 2}, {?MODULE, chain_a, 2}, {?MODULE, probe_chain, 2}] = Expected,
    AtomCount = erlang:system_info(atom_count),
    [C || #{cps := Cps} = C <- Candidates,
          lists:prefix(Expected, dedup([X || X <- mallocinfo_nif:code_names(Cps, AtomCount),
                                             X =/= none]))].

%% Three frames of this module below the NIF, none of them a tail call;
%% the VM's own view of the same stack is taken at the bottom.
probe_chain(Kind, T) ->
    keep(chain_a(Kind, T)).

chain_a(Kind, T) ->
    keep(chain_b(Kind, T)).

chain_b(normal, _) ->
    R = mallocinfo_nif:ectx_probe(fresh()),
    {current_stacktrace, Trace} = process_info(self(), current_stacktrace),
    keep({R, Trace});
chain_b(dirty, _) ->
    R = mallocinfo_nif:ectx_probe_dirty(fresh()),
    {current_stacktrace, Trace} = process_info(self(), current_stacktrace),
    keep({R, Trace}).

keep(X) -> X.

%% A tuple on this process's young heap, where the probe looks for the
%% heap pointers around it: built just before each probe, since a garbage
%% collection between two probes may move an older one to the old heap
%% (the dirty probe of a peer node failed that way).
fresh() ->
    list_to_tuple([self(), erlang:unique_integer(), node()]).

%% A repeated return address is one frame in a stack trace.
dedup([X, X | Rest]) -> dedup([X | Rest]);
dedup([X | Rest]) -> [X | dedup(Rest)];
dedup([]) -> [].

%% @doc A packed stack (native 64-bit words, mallocinfo_trace's snapshots)
%% split into its native frames and its Erlang context:
%% `{Native, none | {process, Mfa, Cps} | {scheduler} | {thread, Name}}',
%% Mfa a `{ModuleWord, FunctionWord, Arity}' of raw words or `none'.
-spec split(binary()) -> {binary(), none | tuple()}.
split(Bin) ->
    %% The header is found where mallocinfo_trace_growth:native/1 ends the
    %% native frames.
    At = byte_size(mallocinfo_trace_growth:native(Bin)),
    case Bin of
        <<_:At/binary, H:64/native, Rest/binary>> ->
            case context(H, [X || <<X:64/native>> <= Rest]) of
                none -> {Bin, none};
                Ctx -> {binary:part(Bin, 0, At), Ctx}
            end;
        _ ->
            {Bin, none}
    end.

context(H, Words) ->
    Kind = (H bsr 16) band 16#FF,
    Mfa = (H bsr 8) band 16#F,
    Cps = (H bsr 4) band 16#F,
    Names = H band 16#F,
    case {Kind, Mfa, Names, length(Words) =:= Mfa + Cps + Names} of
        {1, _, 0, true} when Mfa =:= 0; Mfa =:= 3 ->
            {M, CpWords} = lists:split(Mfa, Words),
            {process, case M of [Mo, Fu, Ar] -> {Mo, Fu, Ar}; [] -> none end, CpWords};
        {2, 0, 0, true} when Cps =:= 0 ->
            {scheduler};
        {3, 0, 2, true} when Cps =:= 0 ->
            {thread, hd(binary:split(<< <<X:64/native>> || X <- Words >>, <<0>>))};
        _ ->
            none
    end.

%% @doc Raw {Module, Function, Arity} words as terms, or `none' where a word
%% is not an atom of this VM.
-spec mfa_terms([{non_neg_integer(), non_neg_integer(), non_neg_integer()}],
                non_neg_integer()) -> [{atom(), atom(), non_neg_integer()} | none].
mfa_terms(Mfas, AtomCount) ->
    mallocinfo_nif:atom_terms(Mfas, AtomCount).
