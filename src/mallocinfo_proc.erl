%% @doc What each Erlang process actually keeps on its heap.
%%
%% `inspect_heap/1' returns the terms reachable from a process's root set
%% that a stock VM lets us see, each with its size in words: every process
%% dictionary entry (as `{Key, Value}'), the OTP state of `gen_*' processes,
%% each queued message, and the `seq_trace' token when set. `heap/1' sets
%% that beside the process's own figures (heap, stack, refc binaries, GC
%% settings) and gives a one-line verdict. `top/2' ranks all processes.
%%
%% Safe on a live node:
%% <ul>
%% <li>For OTP processes the sizes are computed inside the process (through
%%     `sys:replace_state/3' with a function that returns the state
%%     unchanged), so `Words' is `erts_debug:size/1' with sharing preserved,
%%     and only bounded summaries of huge terms are copied out. The target
%%     runs that function for as long as walking its own terms takes, and
%%     not at all when its heap is above `max_heap_words'.</li>
%% <li>Only processes that are idle in a `gen_*' loop get a system message;
%%     others (plain processes, OTP processes busy in a callback) are read
%%     with `process_info/2' only, and their state is left out.</li>
%% <li>Copies are bounded: at most `max_terms' terms, none larger than
%%     `max_words' (bigger ones are summarised), nothing at all when the
%%     heap exceeds `max_heap_words' or the queue `max_terms'.</li>
%% <li>Remote pids are inspected on their node with `erpc'; this module is
%%     loaded there from this node's object code if missing.</li>
%% </ul>
-module(mallocinfo_proc).

-export([inspect_heap/1, inspect_heap/2, inspect/2, heap/1, heap/2, top/2, print/1, print/2]).
%% Run inside the inspected process (through sys:replace_state/3) or on a
%% remote node (through erpc); not for direct use.
-export([in_process/3, remote/3, report_local/2]).
%% Pure, exported for tests.
-export([verdict/1]).

-export_type([opts/0, item/0]).

%% A pid on another node that cannot be reached, or where this module
%% cannot be loaded.
-type remote_error() :: {erpc, term()} | {load_failed, node(), term()}.

-type opts() :: #{max_terms => pos_integer(), max_words => pos_integer(),
                  max_heap_words => pos_integer(), size_budget => non_neg_integer(),
                  timeout => non_neg_integer()}.
-type kind() :: dictionary | state | message | seq_trace_token | omitted.
-type item() :: #{kind := kind(), term := term(), words := non_neg_integer(),
                  flat_words := non_neg_integer(),
                  sharing := preserved | not_computed | copied}.

%% max_terms: terms returned; max_words: a bigger term is summarised;
%% max_heap_words: a bigger heap is not walked at all (walking runs inside
%% the target, about 6 ms per million words here); size_budget: flat words
%% of terms whose sharing-preserving size is computed inside the target
%% (erts_debug:size/1 is written in Erlang and costs about 5 us per word:
%% the default 2,000 words pause the target for at most ~10 ms);
%% timeout: for the system message to an idle gen_* process.
-define(DEFAULTS, #{max_terms => 1000, max_words => 100000, max_heap_words => 1000000,
                    size_budget => 2000, timeout => 100}).
-define(TRUNCATED, '$mallocinfo_truncated').
-define(PREVIEW_DEPTH, 8).
-define(PREVIEW_CHARS, 300).

%%% ---------------------------------------------------------------------------
%%% API

%% @equiv inspect_heap(Pid, #{})
-spec inspect_heap(pid()) -> [{term(), non_neg_integer()}] | {error, noproc}.
inspect_heap(Pid) ->
    inspect_heap(Pid, #{}).

%% @doc The terms on `Pid''s heap that can be seen, each with its size in
%% words (`erts_debug:size/1'), in the original proposal's shape. A term
%% larger than `max_words' appears as
%% `{'$mallocinfo_truncated', Words, Preview}' (a `~P'-style string).
-spec inspect_heap(pid(), opts()) ->
          [{term(), non_neg_integer()}] | {error, noproc | remote_error()}.
inspect_heap(Pid, Opts) ->
    case inspect(Pid, Opts) of
        {ok, Items} -> [{T, W} || #{kind := K, term := T, words := W} <- Items, K =/= omitted];
        {error, _} = E -> E
    end.

%% @doc Like {@link inspect_heap/2}, with each term's kind, its flat size
%% (`erts_debug:flat_size/1', what it would take if shared subterms were
%% copied) and how `words' was measured: `preserved' (inside the process,
%% `erts_debug:size/1'), `not_computed' (too big for `size_budget': the flat
%% size) or `copied' (read from a copy, which shares nothing: the flat
%% size; plain processes and all messages). Kinds: `dictionary', `state',
%% `message', `seq_trace_token', and `omitted' (what a limit left out, with
%% the reason as the term).
-spec inspect(pid(), opts()) -> {ok, [item()]} | {error, noproc | remote_error()}.
inspect(Pid, Opts) when is_pid(Pid), is_map(Opts) ->
    O = options(Opts, [Pid, Opts]),
    case run(Pid, report_local, O) of
        {ok, _Heap, Items} -> {ok, Items};
        {error, _} = E -> E
    end;
inspect(Pid, Opts) ->
    erlang:error(badarg, [Pid, Opts]).

%% @equiv heap(Pid, #{})
-spec heap(pid()) -> {ok, map()} | {error, noproc}.
heap(Pid) ->
    heap(Pid, #{}).

%% @doc `Pid''s heap in figures (words unless named `_bytes'):
%% `heap_size', `total_heap_size', `stack_size', `live_words' (the sum of
%% what {@link inspect/2} found), `flat_words' (the same without sharing),
%% `unseen_words' (`total_heap_size' minus `live_words' and the stack:
%% garbage, or terms no API exposes), `message_queue_len', `binaries'
%% (`#{count, bytes, shared_bytes}': refc binaries referenced, and the bytes
%% of those also referenced elsewhere), `garbage_collection' (the process's
%% settings), `fullsweep_after', `items' (how many terms were inspected) and
%% `verdict' (a sentence, or `none').
-spec heap(pid(), opts()) -> {ok, map()} | {error, noproc | remote_error()}.
heap(Pid, Opts) when is_pid(Pid), is_map(Opts) ->
    O = options(Opts, [Pid, Opts]),
    case run(Pid, report_local, O) of
        {ok, Heap, _Items} -> {ok, Heap};
        {error, _} = E -> E
    end;
heap(Pid, Opts) ->
    erlang:error(badarg, [Pid, Opts]).

%% @doc The `N' processes of this node with the largest `By', largest
%% first. `By': `memory' (bytes, `process_info/2'), `heap_waste' (words the
%% process's heaps have allocated but not filled: young and old heap block
%% minus their use), `binary' (bytes of refc binaries referenced),
%% `message_queue_len', `reductions'. One `process_info/2' call per process
%% and a bounded selection (no sort of every process); names and initial
%% calls are looked up for the winners only.
-spec top(non_neg_integer(), memory | heap_waste | binary | message_queue_len | reductions) ->
          [#{pid := pid(), name := term(), value := non_neg_integer(), by := atom()}].
top(N, By) when is_integer(N), N >= 0,
                (By =:= memory orelse By =:= heap_waste orelse By =:= binary orelse
                 By =:= message_queue_len orelse By =:= reductions) ->
    Best = lists:foldl(fun(P, Acc) -> keep_best(N, value(P, By), P, Acc) end,
                       {0, gb_trees:empty()}, erlang:processes()),
    {_, Tree} = Best,
    [#{pid => P, name => name(P), value => V, by => By}
     || {{V, _}, P} <- lists:reverse(gb_trees:to_list(Tree))];
top(N, By) ->
    erlang:error(badarg, [N, By]).

%% @equiv print(Pid, #{})
-spec print(pid()) -> ok | {error, noproc}.
print(Pid) ->
    print(Pid, #{}).

%% @doc A report an engineer reads at a glance: the heap figures and
%% verdict, then the biggest terms first, each shown `~P'-truncated with its
%% size in words and bytes.
-spec print(pid(), opts()) -> ok | {error, noproc}.
print(Pid, Opts) when is_pid(Pid), is_map(Opts) ->
    O = options(Opts, [Pid, Opts]),
    case run(Pid, report_local, O) of
        {ok, H, Items} -> io:put_chars(format(Pid, H, Items));
        {error, _} = E -> E
    end;
print(Pid, Opts) ->
    erlang:error(badarg, [Pid, Opts]).

%%% ---------------------------------------------------------------------------
%%% Where the work runs

options(Opts, Args) ->
    case maps:keys(Opts) -- maps:keys(?DEFAULTS) of
        [] -> ok;
        _ -> erlang:error(badarg, Args)
    end,
    O = maps:merge(?DEFAULTS, Opts),
    maps:foreach(fun(K, V) when K =:= timeout orelse K =:= size_budget,
                                is_integer(V), V >= 0 -> ok;
                    (_, V) when is_integer(V), V > 0 -> ok;
                    (_, _) -> erlang:error(badarg, Args)
                 end, O),
    O.

run(Pid, What, O) when node(Pid) =:= node() ->
    ?MODULE:What(Pid, O);
run(Pid, What, O) ->
    Node = node(Pid),
    Timeout = maps:get(timeout, O) + 5000,
    try erpc:call(Node, ?MODULE, remote, [What, Pid, O], Timeout)
    catch
        error:{exception, undef, [{?MODULE, remote, _, _} | _]} ->
            case load_remote(Node, Timeout) of
                ok ->
                    try erpc:call(Node, ?MODULE, remote, [What, Pid, O], Timeout)
                    catch error:{erpc, Reason} -> {error, {erpc, Reason}}
                    end;
                {error, _} = E ->
                    E
            end;
        error:{erpc, Reason} ->
            {error, {erpc, Reason}}
    end.

%% Sends this module's object code to Node (it is pure Erlang).
load_remote(Node, Timeout) ->
    case code:get_object_code(?MODULE) of
        {Mod, Bin, File} ->
            try erpc:call(Node, code, load_binary, [Mod, File, Bin], Timeout) of
                {module, Mod} -> ok;
                {error, Why} -> {error, {load_failed, Node, Why}}
            catch error:{erpc, Reason} -> {error, {erpc, Reason}}
            end;
        error ->
            {error, {load_failed, Node, no_object_code}}
    end.

%% @private The remote end of run/3.
remote(report_local = What, Pid, O) ->
    ?MODULE:What(Pid, O);
remote(What, Pid, O) ->
    erlang:error(badarg, [What, Pid, O]).

%% @private Figures and items from one look at the process: what inspect/2,
%% heap/2 and print/2 each shape (on the pid's own node).
report_local(Pid, O0) when is_pid(Pid), is_map(O0) ->
    O = options(O0, [Pid, O0]),
    case collect(Pid, O) of
        {ok, Items, Info} -> {ok, heap_map(Items, Info), Items};
        {error, _} = E -> E
    end;
report_local(Pid, O) ->
    erlang:error(badarg, [Pid, O]).

collect(Pid, O) ->
    case process_info(Pid, [heap_size, total_heap_size, stack_size, message_queue_len,
                            garbage_collection, binary, current_function]) of
        undefined ->
            {error, noproc};
        Info0 ->
            Info = maps:from_list(Info0),
            Items = case Pid =:= self() of
                        true -> in_process(self_items, O, undefined);
                        false -> items(Pid, Info, O)
                    end,
            {ok, lists:sublist(Items, maps:get(max_terms, O) + 1), Info}
    end.

%% OTP processes idle in their loop: everything measured inside them.
%% Others: process_info/2 copies, bounded by the limits.
items(Pid, #{total_heap_size := Heap} = Info, O) ->
    case Heap =< maps:get(max_heap_words, O) andalso sys_idle(Pid, Info) of
        true -> inside(Pid, Info, O);
        false -> outside(Pid, Info, O)
    end.

%% Runs in_process/3 inside the target through sys:replace_state/3. The
%% function throws once it has sent its answer, so sys leaves the state as
%% it was and replies with a small error instead of a copy of the whole
%% state. Answers go to an alias, dropped once we stop listening; a system
%% message handled after the deadline skips the work.
inside(Pid, Info, O) ->
    Timeout = maps:get(timeout, O),
    Alias = alias(),
    Deadline = erlang:monotonic_time(millisecond) + Timeout,
    Fun = fun(State) ->
                  case erlang:monotonic_time(millisecond) =< Deadline of
                      true -> measure_inside(Alias, State, O);
                      false -> ok
                  end,
                  throw(mallocinfo_done)
          end,
    Outcome = try sys:replace_state(Pid, Fun, Timeout) of
                  _ -> answered
              catch
                  _:_ -> answered
              end,
    Items = receive {Alias, Measured} -> Measured after 0 -> none end,
    unalias(Alias),
    receive {Alias, _} -> ok after 0 -> ok end,
    case {Outcome, Items} of
        {answered, none} -> outside(Pid, Info, O) ++ [omitted(state, sys_timeout)];
        {answered, _} -> Items
    end.

measure_inside(Alias, State, O) ->
    {total_heap_size, Before} = process_info(self(), total_heap_size),
    Alias ! {Alias, in_process(State, O, Alias)},
    %% Measuring allocates on this process's heap (erts_debug:size/1 builds
    %% maps): if the heap grew, collect, rather than leave the target bigger
    %% than we found it. Bounded by max_heap_words.
    case process_info(self(), total_heap_size) of
        {total_heap_size, After} when After > Before -> erlang:garbage_collect();
        _ -> ok
    end.

%% A process reads its own heap: called inside the target through
%% sys:replace_state/3 (State is its OTP state), or for self().
%% @private
in_process(State, O0, Ref) when is_map(O0) ->
    O1 = options(maps:remove(heap_words, O0), [State, O0, Ref]),
    {total_heap_size, HeapWords} = process_info(self(), total_heap_size),
    O = O1#{heap_words => HeapWords},
    Terms = [{dictionary, KV} || KV <- get()]
        ++ case State of
               self_items -> [];
               _ -> [{state, State}]
           end
        ++ case seq_trace:get_token() of
               [] -> [];
               T -> [{seq_trace_token, T}]
           end,
    {Items, _} = lists:mapfoldl(fun({Kind, T}, Budget) -> measured(Kind, T, O, Budget) end,
                                maps:get(size_budget, O),
                                lists:sublist(Terms, maps:get(max_terms, O) + 1)),
    %% Messages are not in reach from inside without receiving them: read
    %% as a copy, as from outside.
    {message_queue_len, QLen} = process_info(self(), message_queue_len),
    limit(Items ++ queued(self(), QLen, O), O);
in_process(State, O, Ref) ->
    erlang:error(badarg, [State, O, Ref]).

%% Inside the process: the sharing-preserving size while the budget lasts.
measured(Kind, Term, O, Budget) ->
    case count_nodes(Term, Budget) of
        Left when Left >= 0 -> {item(Kind, Term, O, preserved), Left};
        _ -> {item(Kind, Term, O, not_computed), Budget}
    end.

%% Any other process: copies through process_info/2 only, and only of a
%% heap small enough (max_heap_words) to copy.
outside(Pid, #{total_heap_size := Heap, message_queue_len := QLen}, O) ->
    Dict = case Heap =< maps:get(max_heap_words, O) of
               true -> copies(Pid, dictionary, O);
               false -> [omitted(dictionary, {heap_too_large, Heap})]
           end,
    limit(Dict ++ queued(Pid, QLen, O), O).

%% process_info(Pid, dictionary | messages) as items read from the copy.
copies(Pid, Key, O) ->
    Kind = case Key of
               dictionary -> dictionary;
               messages -> message
           end,
    case process_info(Pid, Key) of
        {Key, Terms} -> [item(Kind, T, O, copied) || T <- Terms];
        undefined -> []
    end.

%% The queue as copies, when it is short (max_terms) and its messages live on
%% the process heap, which max_heap_words bounds; an off-heap queue has no
%% size we can check before copying it, so it is only counted.
queued(Pid, QLen, O) ->
    case QLen =< maps:get(max_terms, O) of
        false ->
            [omitted(messages, {queue_too_long, QLen})];
        true when QLen =:= 0 ->
            [];
        true ->
            case process_info(Pid, [message_queue_data, total_heap_size]) of
                [{message_queue_data, on_heap}, {total_heap_size, H}] ->
                    case H =< maps:get(max_heap_words, O) of
                        true -> copies(Pid, messages, O);
                        false -> [omitted(messages, {heap_too_large, H})]
                    end;
                [{message_queue_data, off_heap}, _] ->
                    [omitted(messages, {off_heap_queue, QLen})];
                undefined ->
                    []
            end
    end.

limit(Items, O) ->
    Max = maps:get(max_terms, O),
    case length(Items) > Max of
        true -> lists:sublist(Items, Max) ++ [omitted(terms, {max_terms, Max})];
        false -> Items
    end.

%% Words is erts_debug:size/1 (sharing preserved) when computed inside the
%% process within the budget; otherwise the flat size, which is also exactly
%% erts_debug:size/1 of a copy (copies share nothing). A term with shared
%% subterms can be exponentially bigger flat than on the heap, so its nodes
%% are counted with a bound first: only a term known to be small is walked
%% by erts_debug (which does not yield) or copied.
item(Kind, Term, O, copied) ->
    %% A copy shares nothing: its flat size is its size, already in memory.
    sized(Kind, Term, erts_debug:flat_size(Term), O, copied);
item(Kind, Term, O, Sharing) ->
    %% Inside the process: an unshared term is at most as big as the heap,
    %% so more nodes than twice the heap means sharing blown up flat.
    Bound = max(maps:get(max_words, O), 2 * maps:get(heap_words, O, 0)),
    case count_nodes(Term, Bound) of
        Left when Left >= 0 ->
            sized(Kind, Term, erts_debug:flat_size(Term), O, Sharing);
        _ ->
            #{kind => Kind, term => {?TRUNCATED, {more_than, Bound}, preview(Term)},
              words => Bound, flat_words => Bound, sharing => not_computed}
    end.

sized(Kind, Term, Flat, O, Sharing) ->
    Words = case Sharing of
                preserved -> erts_debug:size(Term);
                _ -> Flat
            end,
    Shown = case Flat =< maps:get(max_words, O) of
                true -> Term;
                false -> {?TRUNCATED, Words, preview(Term)}
            end,
    #{kind => Kind, term => Shown, words => Words, flat_words => Flat, sharing => Sharing}.

%% Budget minus the number of nodes (list cells, tuple and map elements,
%% leaves) of Term counted flat, stopping as soon as it goes negative.
count_nodes(_, B) when B < 0 -> B;
count_nodes([H | T], B) -> count_nodes(T, count_nodes(H, B - 1));
count_nodes(T, B) when is_tuple(T) -> tuple_nodes(T, 1, tuple_size(T), B - 1);
count_nodes(M, B) when is_map(M) -> map_nodes(maps:iterator(M), B - 1);
count_nodes(_, B) -> B - 1.

tuple_nodes(_, _, _, B) when B < 0 -> B;
tuple_nodes(_, I, N, B) when I > N -> B;
tuple_nodes(T, I, N, B) -> tuple_nodes(T, I + 1, N, count_nodes(element(I, T), B)).

map_nodes(_, B) when B < 0 -> B;
map_nodes(It, B) ->
    case maps:next(It) of
        {K, V, Next} -> map_nodes(Next, count_nodes(V, count_nodes(K, B - 1)));
        none -> B
    end.

omitted(What, Why) ->
    #{kind => omitted, term => {What, Why}, words => 0, flat_words => 0, sharing => copied}.

preview(Term) ->
    S = lists:flatten(io_lib:format("~P", [Term, ?PREVIEW_DEPTH])),
    string:slice(S, 0, ?PREVIEW_CHARS).

%% A process that will answer a system message now: spawned by proc_lib
%% and waiting in the receive loop of gen_server or gen_statem. Anything
%% else (busy in a callback, blocked in a call, hibernating, gen_event with
%% several states) gets no system message.
sys_idle(Pid, #{current_function := CF}) ->
    lists:member(CF, [{gen_server, loop, 7}, {gen_statem, loop_receive, 3}])
        andalso process_info(Pid, initial_call) =:= {initial_call, {proc_lib, init_p, 5}};
sys_idle(_, _) ->
    false.

%%% ---------------------------------------------------------------------------
%%% heap/1

heap_map(Items, Info) ->
    #{heap_size := HeapSize, total_heap_size := Total, stack_size := Stack,
      message_queue_len := QLen, garbage_collection := GC, binary := Bins} = Info,
    Live = lists:sum([W || #{words := W} <- Items]),
    Flat = lists:sum([W || #{flat_words := W} <- Items]),
    %% A binary referenced twice by this process is one binary; it is shared
    %% when something else references it too.
    Unique = maps:values(lists:foldl(fun({Id, Size, Refs}, Acc) ->
                                             maps:update_with(Id, fun({S, R, N}) -> {S, R, N + 1} end,
                                                              {Size, Refs, 1}, Acc)
                                     end, #{}, Bins)),
    BinBytes = lists:sum([S || {S, _, _} <- Unique]),
    Shared = lists:sum([S || {S, Refs, N} <- Unique, Refs > N]),
    %% Everything live was seen: the state was measured and no limit left
    %% anything out. Only then can the rest of the heap be called garbage.
    Complete = lists:any(fun(#{kind := K}) -> K =:= state end, Items)
        andalso not lists:any(fun(#{kind := omitted}) -> true;
                                 (#{term := {?TRUNCATED, {more_than, _}, _}}) -> true;
                                 (_) -> false
                              end, Items),
    M = #{heap_size => HeapSize, total_heap_size => Total, stack_size => Stack,
          live_words => Live, flat_words => Flat,
          unseen_words => max(0, Total - Live - Stack),
          complete => Complete,
          message_queue_len => QLen,
          binaries => #{count => length(Unique), bytes => BinBytes, shared_bytes => Shared},
          garbage_collection => GC,
          fullsweep_after => proplists:get_value(fullsweep_after, GC),
          items => length([I || #{kind := K} = I <- Items, K =/= omitted])},
    M#{verdict => verdict(M)}.

%% @doc The one-line verdict of {@link heap/2}, from its figures: `none', or
%% a sentence about a heap that is mostly garbage, mostly refc binary
%% references, or a long message queue.
-spec verdict(map()) -> binary() | none.
verdict(#{total_heap_size := Total, live_words := Live, stack_size := Stack,
          message_queue_len := QLen, complete := Complete,
          binaries := #{bytes := BinBytes, count := BinCount, shared_bytes := Shared}}) ->
    WordBytes = erlang:system_info(wordsize),
    HeapBytes = Total * WordBytes,
    Unseen = max(0, Total - Live - Stack),
    if
        QLen >= 10000 ->
            iolist_to_binary(io_lib:format(
              "message queue of ~b messages: the process is not keeping up", [QLen]));
        BinBytes > 4 * HeapBytes, BinBytes >= 1024 * 1024 ->
            iolist_to_binary(io_lib:format(
              "mostly binary references: ~b refc binaries hold ~s (~s shared with other "
              "processes) against a ~s heap; a GC or hibernate releases those no longer used",
              [BinCount, mallocinfo_units:bytes(BinBytes), mallocinfo_units:bytes(Shared), mallocinfo_units:bytes(HeapBytes)]));
        Complete, Total >= 10000, Unseen * 2 > Total ->
            iolist_to_binary(io_lib:format(
              "mostly garbage: ~b% of the ~s heap is not reachable from what is visible; "
              "erlang:garbage_collect/1 would return most of it",
              [Unseen * 100 div Total, mallocinfo_units:bytes(HeapBytes)]));
        true ->
            none
    end;
verdict(Heap) ->
    erlang:error(badarg, [Heap]).


%%% ---------------------------------------------------------------------------
%%% top/2

value(P, memory) -> info(P, memory);
value(P, message_queue_len) -> info(P, message_queue_len);
value(P, reductions) -> info(P, reductions);
value(P, binary) ->
    case process_info(P, binary) of
        {binary, Bins} -> lists:sum([S || {_, S, _} <- Bins]);
        undefined -> undefined
    end;
value(P, heap_waste) ->
    case process_info(P, garbage_collection_info) of
        {garbage_collection_info, GI} ->
            G = fun(K) -> proplists:get_value(K, GI, 0) end,
            max(0, G(heap_block_size) - G(heap_size))
                + max(0, G(old_heap_block_size) - G(old_heap_size));
        undefined ->
            undefined
    end.

info(P, Key) ->
    case process_info(P, Key) of
        {Key, V} -> V;
        undefined -> undefined
    end.

%% Keeps the N largest in a tree of at most N entries: O(P log N).
keep_best(_N, undefined, _P, Acc) ->
    Acc;
keep_best(0, _V, _P, Acc) ->
    Acc;
keep_best(N, V, P, {Size, Tree}) when Size < N ->
    {Size + 1, gb_trees:insert({V, P}, P, Tree)};
keep_best(_N, V, P, {Size, Tree} = Acc) ->
    {{MinV, _} = Min, _} = gb_trees:smallest(Tree),
    case V > MinV of
        true -> {Size, gb_trees:insert({V, P}, P, gb_trees:delete(Min, Tree))};
        false -> Acc
    end.

%% The registered name, else the initial call (through proc_lib's record
%% of it when the heap is small enough to copy the dictionary), else
%% undefined for a process that has exited since it was ranked.
name(P) ->
    case process_info(P, [registered_name, initial_call, total_heap_size]) of
        [{registered_name, Name}, _, _] when is_atom(Name) -> Name;
        [_, {initial_call, {proc_lib, init_p, 5} = IC}, {total_heap_size, H}] when H =< 100000 ->
            case proc_lib:translate_initial_call(P) of
                {proc_lib, init_p, 5} -> IC;
                MFA -> MFA
            end;
        [_, {initial_call, IC}, _] -> IC;
        undefined -> undefined
    end.

%%% ---------------------------------------------------------------------------
%%% print/1

format(Pid, H, Items) ->
    W = erlang:system_info(wordsize),
    #{total_heap_size := Total, live_words := Live, flat_words := Flat,
      stack_size := Stack, message_queue_len := QLen,
      binaries := #{count := BC, bytes := BB, shared_bytes := BS}, verdict := V} = H,
    Header = io_lib:format(
               "~p: heap ~s (~b words), live ~b words (~b if shared parts were copied), "
               "stack ~b words~n  queue ~b, refc binaries ~b = ~s (~s shared)~n"
               "  verdict: ~ts~n",
               [Pid, mallocinfo_units:bytes(Total * W), Total, Live, Flat, Stack, QLen, BC, mallocinfo_units:bytes(BB),
                mallocinfo_units:bytes(BS), case V of none -> "none"; _ -> V end]),
    Sorted = lists:sort(fun(#{words := A}, #{words := B}) -> A >= B end, Items),
    Lines = [io_lib:format("  ~8b words ~10s  ~-15s ~P~n",
                           [Words, mallocinfo_units:bytes(Words * W), atom_to_list(Kind), Term, 6])
             || #{kind := Kind, term := Term, words := Words} <- Sorted],
    [Header, "  words        bytes  kind            term\n" | Lines].
