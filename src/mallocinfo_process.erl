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
%% <li>Only processes that are idle in a `gen_server' or `gen_statem' loop
%%     get a system message, unless `sys => true' asks for it; others
%%     (plain processes, hibernated ones, other loops such as `gen_server2'
%%     or `p1_server', OTP processes busy in a callback) are read with
%%     `process_info/2' only, and their state is left out: `heap/2' and
%%     `print/2' then say so, how much of the heap was not seen, and
%%     whether `sys => true' would measure it.</li>
%% <li>Copies are bounded: at most `max_terms' terms, none larger than
%%     `max_words' (bigger ones are summarised), nothing at all when the
%%     heap exceeds `max_heap_words' or the queue `max_terms'; `heap/2' and
%%     `print/2' then say what was not measured, why, and which option
%%     would measure it.</li>
%% <li>Remote pids are inspected on their node with `erpc'; this module is
%%     loaded there from this node's object code if missing.</li>
%% </ul>
-module(mallocinfo_process).

-export([inspect_heap/1, inspect_heap/2, inspect/2, heap/1, heap/2, top/2, print/1, print/2]).
%% Run inside the inspected process (through sys:replace_state/3) or on a
%% remote node (through erpc); not for direct use.
-export([in_process/3, remote/3, report_local/2]).
%% Pure, exported for tests.
-export([verdict/1, binaries/1]).
%% A process's name and how it prints, for the report, the tracker and the
%% layers' culprits.
-export([name/1, name_text/1]).

-export_type([opts/0, item/0, gap/0]).

%% A pid on another node that cannot be reached, or where this module
%% cannot be loaded.
-type remote_error() :: {erpc, term()} | {load_failed, node(), term()}.

-type gap() :: #{what := kind() | messages | terms | sharing | [kind()],
                 reason := heap_too_large | queue_too_long | off_heap_queue | sys_timeout
                         | max_terms | size_budget | shared_too_much | not_asked | no_sys
                         | sys_failed,
                 detail := binary(), option := opts()}.

-type opts() :: #{max_terms => pos_integer(), max_words => pos_integer(),
                  max_heap_words => pos_integer(), size_budget => non_neg_integer(),
                  timeout => non_neg_integer(), sys => boolean()}.
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
%% timeout: for the system message to an idle gen_* process; sys: send
%% that message to any process started through proc_lib, not only to one
%% idle in a gen_server or gen_statem loop (a process that does not handle
%% system messages keeps it in its queue).
-define(DEFAULTS, #{max_terms => 1000, max_words => 100000, max_heap_words => 1000000,
                    size_budget => 2000, timeout => 100, sys => false}).
%% On a VM that cannot read one key of another process's dictionary (before
%% OTP 26.2), names are read from a copy of the whole dictionary only for
%% a heap up to this many words (the dictionary is on the heap, so the copy
%% is at most this big), or up to max_heap_words when heap/2 or print/2 was
%% given a larger one.
-define(NAME_HEAP_WORDS, 1000000).
-define(TRUNCATED, '$mallocinfo_truncated').
-define(PREVIEW_DEPTH, 8).
-define(PREVIEW_CHARS, 300).

%%% ---------------------------------------------------------------------------
%%% API

%% @equiv inspect_heap(Pid, #{})
-spec inspect_heap(pid()) -> {ok, [{term(), non_neg_integer()}]} | {error, noproc}.
inspect_heap(Pid) ->
    inspect_heap(Pid, #{}).

%% @doc `{ok, Terms}': the terms on `Pid''s heap that can be seen, each with
%% its size in words (`erts_debug:size/1'), `{Term, Words}'. A term
%% larger than `max_words' appears as
%% `{'$mallocinfo_truncated', Words, Preview}' (a `~P'-style string).
-spec inspect_heap(pid(), opts()) ->
          {ok, [{term(), non_neg_integer()}]} | {error, noproc | remote_error()}.
inspect_heap(Pid, Opts) ->
    case inspect(Pid, Opts) of
        {ok, Items} -> {ok, [{T, W} || #{kind := K, term := T, words := W} <- Items, K =/= omitted]};
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

%% @doc `Pid''s heap in figures (words unless named `_bytes'): `name' (as
%% in {@link top/2}), `heap_size', `total_heap_size', `stack_size',
%% `live_words' (the sum of what {@link inspect/2} found), `flat_words' (the
%% same without sharing), `unseen_words' (`total_heap_size' minus
%% `live_words' and the stack: garbage, or terms no API exposes) - each of
%% these three `not_measured' when a limit kept every term from being
%% measured (a heap above `max_heap_words'), never a misleading 0;
%% `complete' (the state was measured and no limit left anything out:
%% only then is `live_words' all that is live),
%% `not_measured' (what was left out: a list of `#{what, reason, detail,
%% option}', `detail' a sentence that also says how many words of the heap
%% went unseen when the state is missing, `option' the options that would
%% measure it, the caller's own included, empty when none would; reasons
%% `heap_too_large' (`max_heap_words'), `queue_too_long' (`max_terms'),
%% `off_heap_queue', `sys_timeout' (`timeout'), `max_terms', `size_budget'
%% (sharing not computed), `shared_too_much' (not walked flat), and for the
%% state: `not_asked' (a process started through proc_lib but not idle in a
%% `gen_server' or `gen_statem' loop: hibernated, in a loop of its own such
%% as `gen_server2''s or `p1_server''s, or busy; `sys => true' asks it),
%% `no_sys' (not started through proc_lib: no option measures it) and
%% `sys_failed' (the process answered the system message with an error)),
%% `message_queue_len', `binaries'
%% (`#{count, bytes, shared_bytes}', see {@link binaries/1}),
%% `garbage_collection' (the process's settings), `fullsweep_after',
%% `items' (how many terms were inspected) and `verdict' (a sentence, or
%% `none'; never `none' when most of a heap of 10,000 words or more went
%% unseen).
%%
%% `Opts' as {@link inspect/2}, and `sys' (default `false'): `true' sends
%% the system message that measures the state to any process started
%% through proc_lib, hibernated or in a loop other than `gen_server''s or
%% `gen_statem''s (`gen_server2', `p1_server'...). Such loops answer it;
%% a process that does not handle system messages keeps it in its queue,
%% which is why it is not the default.
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
%% minus their use), `binary' (bytes of the distinct refc binaries the
%% process references, each counted once however many references it holds,
%% as {@link heap/2} counts them; a binary several processes reference
%% counts fully in each, so the values do not add up to
%% `erlang:memory(binary)'), `message_queue_len', `reductions'. One
%% `process_info/2' call per process and a bounded selection (no sort of
%% every process). Names are looked up for the winners only, the same way
%% as in {@link heap/2}, {@link print/2} and the report: the registered
%% name; else the process's label (`proc_lib:set_label/1' of OTP 27, read
%% as `proc_lib:get_label/1' reads it) or its `process_name' dictionary
%% entry (RabbitMQ's `{rabbit_amqqueue_process, {resource, <<"/">>, queue,
%% <<"q1">>}}'); else its initial call through
%% `proc_lib:translate_initial_call/1' (`{Mod, init, 1}' for a
%% `gen_server'). Only those dictionary keys are read, where the VM can
%% (OTP 26.2). On OTP 25, which can only copy a whole dictionary, that copy
%% is made for a heap within 1,000,000 words; a bigger process idle in a
%% `gen_server' or `gen_statem' loop is asked for the keys (a system
%% message), and any other bigger one (a hibernated `gen_server2') keeps
%% its raw initial call, `{proc_lib, init_p, 5}'.
%%
%% `By = native': the processes whose native allocations (malloc and its
%% siblings, from NIFs, drivers and the VM, made while the process ran)
%% hold the most live bytes, as the tracker recorded them with their Erlang
%% context ({@link mallocinfo_trace:sites/2} `by => process'), each row
%% also with the process's `memory' and `binary' bytes (as `top/2' by those
%% measures them), so that one list answers "which processes hold the most
%% memory, of every kind". `[]' without a recording tracker or without the
%% Erlang context; a process that exited keeps its row while its blocks
%% live (`memory', `binary' and `name' then `undefined').
-spec top(non_neg_integer(),
          memory | heap_waste | binary | message_queue_len | reductions | native) ->
          [#{pid := pid(), name := term(), value := non_neg_integer(), by := atom(),
             atom() => term()}].
top(N, native) when is_integer(N), N >= 0 ->
    %% The context on (on a preloaded node, from this call on) and the
    %% atom bound fresh, as mallocinfo_trace's views do.
    _ = mallocinfo_trace_context:ensure(),
    ok = mallocinfo_trace_context:refresh(),
    case mallocinfo_nif:trace_by_context(N, process) of
        {ok, Rows, _Without} ->
            [#{pid => P, name => name(P, ?DEFAULTS), value => Bytes, by => native,
               count => Count, estimated => Est, memory => value(P, memory),
               binary => value(P, binary)}
             || {P, Count, Bytes, Est} <- Rows];
        {error, _} ->
            []
    end;
top(N, By) when is_integer(N), N >= 0,
                (By =:= memory orelse By =:= heap_waste orelse By =:= binary orelse
                 By =:= message_queue_len orelse By =:= reductions) ->
    Best = lists:foldl(fun(P, Acc) -> keep_best(N, value(P, By), P, Acc) end,
                       {0, gb_trees:empty()}, erlang:processes()),
    {_, Tree} = Best,
    [#{pid => P, name => name(P, ?DEFAULTS), value => V, by => By}
     || {{V, _}, P} <- lists:reverse(gb_trees:to_list(Tree))];
top(N, By) ->
    erlang:error(badarg, [N, By]).

%% @equiv print(Pid, #{})
-spec print(pid()) -> ok | {error, noproc}.
print(Pid) ->
    print(Pid, #{}).

%% @doc A report an engineer reads at a glance: the pid and name, the heap
%% figures (`live' words only when the view is complete; otherwise the
%% words `measured' and those `unseen', in bytes too), what was not
%% measured (why, and the call with the option that would measure it), the
%% verdict, then the biggest terms first, each shown `~P'-truncated with
%% its size in words and bytes.
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
    maps:foreach(fun(sys, V) when is_boolean(V) -> ok;
                    (K, V) when K =:= timeout orelse K =:= size_budget,
                                is_integer(V), V >= 0 -> ok;
                    (K, V) when K =/= sys, is_integer(V), V > 0 -> ok;
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

%% Sends this module's object code to Node, with the units module it
%% formats sizes with (both pure Erlang).
load_remote(Node, Timeout) ->
    try mallocinfo_remote:load_modules(Node, [?MODULE, mallocinfo_units], Timeout) of
        ok -> ok;
        {error, {_, Why}} -> {error, {load_failed, Node, Why}}
    catch error:{erpc, Reason} -> {error, {erpc, Reason}}
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
        {ok, Items, Info} -> {ok, heap_map(Pid, Items, Info, O), Items};
        {error, _} = E -> E
    end;
report_local(Pid, O) ->
    erlang:error(badarg, [Pid, O]).

collect(Pid, O) ->
    case process_info(Pid, [heap_size, total_heap_size, stack_size, message_queue_len,
                            garbage_collection, binary, current_function, initial_call]) of
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

%% OTP processes idle in their loop (or any process started through
%% proc_lib, with sys => true): everything measured inside them, unless
%% the heap is too big to walk. Others: process_info/2 copies, bounded by
%% the limits, and the state is said not to have been measured, and why.
items(Pid, #{total_heap_size := Heap} = Info, O) ->
    case state_access(Pid, Info, O) of
        ask when Heap =< map_get(max_heap_words, O) ->
            inside(Pid, Info, O);
        ask ->
            outside(Pid, Info, O) ++ [omitted(state, {heap_too_large, Heap})];
        Why ->
            outside(Pid, Info, O) ++ [omitted(state, Why)]
    end.

%% Whether Pid is sent a system message for its state (ask), or why not:
%% {not_asked, Where, HeapWords} (Where: see where/2) for a process started
%% through proc_lib
%% that is not idle in a gen_server or gen_statem loop (hibernated, in
%% another behaviour's loop such as gen_server2's or p1_server's, or busy),
%% which sys => true would ask; {no_sys, InitialCall} for any other process,
%% which has no OTP state and whose loop's variables nothing reads.
state_access(Pid, #{current_function := CF, initial_call := IC, total_heap_size := H} = Info,
             O) ->
    case sys_idle(Pid, Info) of
        true -> ask;
        false ->
            case {IC, map_get(sys, O)} of
                {{proc_lib, init_p, _}, true} -> ask;
                {{proc_lib, init_p, _}, false} -> {not_asked, where(Pid, CF), H};
                _ -> {no_sys, IC}
            end
    end.

inside(Pid, Info, O) ->
    case in_target(Pid, fun(State, Reply) -> measure_inside(State, O, Reply) end,
                   maps:get(timeout, O)) of
        {ok, Items} -> Items;
        timeout -> outside(Pid, Info, O) ++ [omitted(state, sys_timeout)];
        {failed, Why} -> outside(Pid, Info, O) ++ [omitted(state, {sys_failed, Why})]
    end.

%% Runs Fun(State, Reply) inside Pid (a process that handles system
%% messages: see sys_idle/2 and the sys option) through
%% sys:replace_state/3; Fun calls Reply(Result) once. The function sys
%% runs in the target gives the state back unchanged and never raises: a
%% loop of its own may call it without a catch (RabbitMQ's gen_server2
%% does; the throw this once ended with killed a real queue process). The
%% target then answers sys with the whole state, which must not be copied
%% back: a short-lived helper makes the call, and the function kills it
%% and waits for its end before returning, so that the answer goes to a
%% process that no longer exists and is dropped without a copy. Results go
%% to an alias, dropped once we stop listening; a system message handled
%% after the deadline skips Fun.
in_target(Pid, Fun, Timeout) ->
    Alias = alias(),
    Deadline = erlang:monotonic_time(millisecond) + Timeout,
    Reply = fun(Result) -> Alias ! {Alias, Result} end,
    Helper =
        spawn(fun() ->
                      Me = self(),
                      Wrapped =
                          fun(State) ->
                                  case erlang:monotonic_time(millisecond) =< Deadline of
                                      true ->
                                          try Fun(State, Reply)
                                          catch Class:Why -> Alias ! {Alias, failed, {Class, Why}}
                                          end;
                                      false ->
                                          Alias ! {Alias, failed, late}
                                  end,
                                  Ref = monitor(process, Me),
                                  exit(Me, kill),
                                  receive {'DOWN', Ref, process, _, _} -> ok end,
                                  State
                          end,
                      %% Returns or raises only when Wrapped did not run.
                      try sys:replace_state(Pid, Wrapped, Timeout) of
                          _ -> Alias ! {Alias, failed, not_called}
                      catch
                          exit:{timeout, _} -> Alias ! {Alias, failed, late};
                          _:Why -> Alias ! {Alias, failed, Why}
                      end
              end),
    HelperRef = monitor(process, Helper),
    Result = receive
                 {Alias, failed, late} -> timeout;
                 {Alias, failed, Why} -> {failed, Why};
                 {Alias, R} -> {ok, R}
             after Timeout + 5000 ->
                 timeout
             end,
    %% The target ends the helper once it is done (its garbage collection
    %% after measuring included): wait for that, within the timeout, so
    %% that the caller finds it back in its loop.
    receive {'DOWN', HelperRef, process, _, _} -> ok after Timeout -> ok end,
    demonitor(HelperRef, [flush]),
    exit(Helper, kill),
    unalias(Alias),
    flush_alias(Alias),
    Result.

flush_alias(Alias) ->
    receive
        {Alias, _} -> flush_alias(Alias);
        {Alias, failed, _} -> flush_alias(Alias)
    after 0 -> ok
    end.

measure_inside(State, O, Reply) ->
    {total_heap_size, Before} = process_info(self(), total_heap_size),
    Reply(in_process(State, O, undefined)),
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
    idle_loop(CF)
        andalso process_info(Pid, initial_call) =:= {initial_call, {proc_lib, init_p, 5}}.

%% The functions gen_server and gen_statem wait for messages in, which
%% differ between releases: gen_server:loop/7 and gen_statem:loop_receive/3
%% on OTP 25 and 27; gen_server:loop/5 and gen_statem:loop/3 on OTP 29 (whose
%% loop_receive/3 is gone). OTP 25's gen_statem:loop/3 only dispatches (to
%% loop_receive/3 or loop_hibernate/3): a process seen there is busy, so
%% that one counts only where gen_statem has no loop_receive/3.
idle_loop({gen_server, loop, 7}) -> true;
idle_loop({gen_server, loop, 5}) -> true;
idle_loop({gen_statem, loop_receive, 3}) -> true;
idle_loop({gen_statem, loop, 3}) ->
    not lists:member({loop_receive, 3}, gen_statem:module_info(functions));
idle_loop(_) -> false.

%%% ---------------------------------------------------------------------------
%%% heap/1

heap_map(Pid, Items, Info, O) ->
    #{heap_size := HeapSize, total_heap_size := Total, stack_size := Stack,
      message_queue_len := QLen, garbage_collection := GC, binary := Bins} = Info,
    Seen = [I || #{kind := K} = I <- Items, K =/= omitted],
    Omitted = [I || #{kind := omitted} = I <- Items],
    %% Nothing was walked at all (a heap above max_heap_words, a queue too
    %% long to copy): a sum of zero would read as an empty heap. A state
    %% left out alone (a plain process with an empty dictionary) leaves 0
    %% words measured and the rest of the heap unseen.
    {Live, Flat, Unseen} =
        case Seen =:= [] andalso [I || #{term := {W, _}} = I <- Omitted, W =/= state] =/= [] of
            true ->
                {not_measured, not_measured, not_measured};
            false ->
                L = lists:sum([W || #{words := W} <- Seen]),
                {L, lists:sum([W || #{flat_words := W} <- Seen]), max(0, Total - L - Stack)}
        end,
    %% Everything live was seen: the state was measured and no limit left
    %% anything out. Only then can the rest of the heap be called garbage.
    Complete = lists:any(fun(#{kind := K}) -> K =:= state end, Seen)
        andalso Omitted =:= [] andalso not lists:any(fun blown_up/1, Seen),
    M = #{name => name(Pid, O),
          heap_size => HeapSize, total_heap_size => Total, stack_size => Stack,
          live_words => Live, flat_words => Flat, unseen_words => Unseen,
          complete => Complete,
          not_measured => gaps(Seen, Omitted, Unseen, O),
          message_queue_len => QLen,
          binaries => binaries(Bins),
          garbage_collection => GC,
          fullsweep_after => proplists:get_value(fullsweep_after, GC),
          items => length(Seen)},
    M#{verdict => verdict(M)}.

%% A term whose sharing, blown up flat, exceeded the bound: not walked.
blown_up(#{term := {?TRUNCATED, {more_than, _}, _}}) -> true;
blown_up(_) -> false.

%% @doc Refc binaries as `heap/2' and `top/2' count them, from
%% `process_info(Pid, binary)': `count' distinct binaries, `bytes' their
%% sizes, `shared_bytes' the sizes of those something else references too.
%% The list has one entry per reference the process holds: a binary
%% received in 1000 messages, or 1000 sub-binaries of one binary received
%% apart, are 1000 entries, each with the whole binary's size and the same
%% id. Each binary counts once: its reference count says how many
%% references exist in all, so it is shared when that exceeds this
%% process's own.
-spec binaries([{non_neg_integer(), non_neg_integer(), non_neg_integer()}]) ->
          #{count := non_neg_integer(), bytes := non_neg_integer(),
            shared_bytes := non_neg_integer()}.
binaries(Entries) when is_list(Entries) ->
    Add = fun({Id, Size, Refc}, Acc) when is_integer(Size), Size >= 0, is_integer(Refc),
                                          Refc >= 0 ->
                  case Acc of
                      #{Id := {S, R, N}} -> Acc#{Id := {S, R, N + 1}};
                      #{} -> Acc#{Id => {Size, Refc, 1}}
                  end;
             (_, _) ->
                  erlang:error(badarg, [Entries])
          end,
    ById = try lists:foldl(Add, #{}, Entries)
           catch error:function_clause -> erlang:error(badarg, [Entries])
           end,
    Unique = maps:values(ById),
    #{count => map_size(ById),
      bytes => lists:sum([S || {S, _, _} <- Unique]),
      shared_bytes => lists:sum([S || {S, Refc, N} <- Unique, Refc > N])};
binaries(Entries) ->
    erlang:error(badarg, [Entries]).

%% What was not measured: which kind of term, why (an atom and a
%% sentence, which says how many words of the heap went unseen when the
%% state is what is missing) and the options that would measure it, the
%% caller's own included (empty when none would).
gaps(Seen, Omitted, Unseen, O) ->
    User = user_options(O),
    Gap = fun(What, Reason, Format, Args, Option) ->
                  Opt = case map_size(Option) of
                            0 -> Option;
                            _ -> maps:merge(User, Option)
                        end,
                  #{what => What, reason => Reason,
                    detail => iolist_to_binary(io_lib:format(Format, Args)), option => Opt}
          end,
    Max = fun(K) -> maps:get(K, O) end,
    %% How much of the heap the missing state leaves unseen, when anything
    %% at all was measured (otherwise the heap-size gap says it).
    UnseenText = case Unseen of
                     not_measured -> "";
                     _ -> io_lib:format("; ~ts of the heap are unseen", [words(Unseen)])
                 end,
    Limits =
        [case Why of
             {heap_too_large, H} ->
                 Gap(What, heap_too_large, "the heap (~b words) is above max_heap_words (~b)",
                     [H, Max(max_heap_words)], #{max_heap_words => round_up(H)});
             {queue_too_long, Q} ->
                 %% All of the queue and what was already seen, so that the
                 %% max_terms cut keeps every message.
                 Gap(What, queue_too_long, "the queue (~b messages) is longer than max_terms (~b)",
                     [Q, Max(max_terms)], #{max_terms => Q + length(Seen)});
             {off_heap_queue, Q} ->
                 Gap(What, off_heap_queue, "the ~b messages are in an off_heap queue, whose size "
                     "cannot be checked before copying", [Q], #{});
             sys_timeout ->
                 Gap(What, sys_timeout, "the process did not answer a system message within "
                     "timeout (~b ms)~ts", [Max(timeout), UnseenText],
                     #{timeout => max(1000, 10 * Max(timeout))});
             {sys_failed, Reason} ->
                 Gap(What, sys_failed, "the process answered the system message with an "
                     "error, ~0tP~ts", [Reason, 6, UnseenText], #{});
             {not_asked, CF, H} ->
                 %% A heap above max_heap_words needs both options.
                 {TooLarge, Bigger} =
                     case H > Max(max_heap_words) of
                         true -> {io_lib:format(", and its heap (~b words) is above "
                                                "max_heap_words (~b)", [H, Max(max_heap_words)]),
                                  #{max_heap_words => round_up(H)}};
                         false -> {"", #{}}
                     end,
                 Gap(What, not_asked, "~ts, not idle in a gen_server or gen_statem loop, so it "
                     "was not sent a system message for its state~ts~ts",
                     [where_text(CF), TooLarge, hibernated_unseen(CF, Unseen, UnseenText)],
                     Bigger#{sys => true});
             {no_sys, IC} ->
                 Gap(What, no_sys, "the process was not started through proc_lib (initial "
                     "call ~ts): it has no OTP state to ask for, and nothing reads the "
                     "variables of its loop from outside~ts", [mfa_text(IC), UnseenText], #{});
             {max_terms, N} ->
                 Gap(What, max_terms, "there are more than max_terms (~b) terms", [N],
                     #{max_terms => 10 * N})
         end || #{term := {What, Why}} <- Omitted],
    Blown = [{K, B} || #{kind := K, term := {?TRUNCATED, {more_than, B}, _}} <- Seen],
    Shared = case Blown of
                 [] -> [];
                 _ -> [Gap(lists:usort([K || {K, _} <- Blown]), shared_too_much,
                           "~ts with shared subterms would take more than ~b words flat, and "
                           "nothing walks them flat",
                           [count(length(Blown), "term"), lists:min([B || {_, B} <- Blown])], #{})]
             end,
    Budget = [F || #{sharing := not_computed, flat_words := F} = I <- Seen, not blown_up(I)],
    Sharing = case Budget of
                  [] -> [];
                  _ ->
                      Inside = lists:sum([F || #{sharing := S, flat_words := F} = I <- Seen,
                                               S =/= copied, not blown_up(I)]),
                      [Gap(sharing, size_budget,
                           "the sharing of ~ts (~b flat words) is beyond size_budget (~b): "
                           "the flat size is given", [count(length(Budget), "term"),
                                                      lists:sum(Budget), Max(size_budget)],
                           #{size_budget => round_up(Inside)})]
              end,
    Limits ++ Shared ++ Sharing.

%% The options the caller set to something other than the default: kept in
%% the options a gap suggests, so that the call it names measures what the
%% caller's did and more.
user_options(O) ->
    maps:filter(fun(K, V) -> maps:get(K, ?DEFAULTS) =/= V end, maps:with(maps:keys(?DEFAULTS), O)).

%% Where a process that was not asked waits: `hibernated' once hibernation
%% has collected its heap down to what is live (no old heap, the young one
%% filled: the unseen words are then all live, and that is worth saying);
%% else its current function, {erlang, hibernate, 3} included (it says so
%% before the collection is done). From OTP 29, gen_server and gen_statem
%% hibernate with erlang:hibernate/0, which leaves no frame of its own: the
%% current function is then their loop_hibernate.
where(Pid, CF) when CF =:= {erlang, hibernate, 3}; CF =:= {gen_server, loop_hibernate, 4};
                    CF =:= {gen_statem, loop_hibernate, 3} ->
    case process_info(Pid, garbage_collection_info) of
        {garbage_collection_info, GI} ->
            G = fun(K) -> proplists:get_value(K, GI, 0) end,
            case G(old_heap_block_size) =:= 0
                andalso G(heap_block_size) - G(heap_size) =< G(heap_block_size) div 100 of
                true -> hibernated;
                false -> CF
            end;
        undefined ->
            CF
    end;
where(_, CF) ->
    CF.

where_text(hibernated) -> "the process is hibernated";
where_text({erlang, hibernate, 3}) -> "the process is hibernating";
where_text(CF) -> ["the process is in ", mfa_text(CF)].

hibernated_unseen(hibernated, Unseen, UnseenText) when is_integer(Unseen), Unseen > 0 ->
    [UnseenText, ", all of them live (hibernation left only live terms on it)"];
hibernated_unseen(_, _, UnseenText) ->
    UnseenText.

words(N) ->
    io_lib:format("~b words (~ts)", [N, mallocinfo_units:bytes(N * erlang:system_info(wordsize))]).

mfa_text({M, F, A}) when is_atom(M), is_atom(F), is_integer(A) ->
    io_lib:format("~ts:~ts/~b", [M, F, A]);
mfa_text(Other) -> io_lib:format("~0tP", [Other, 6]).

count(1, Noun) -> ["1 ", Noun];
count(N, Noun) -> [integer_to_list(N), " ", Noun, "s"].

%% A limit above N with headroom: N rounded up past its leading digit
%% (2,345,678 -> 3,000,000), since the heap or queue may grow before the
%% next call.
round_up(N) when N < 10 -> 10;
round_up(N) ->
    Step = pow10(length(integer_to_list(N)) - 1),
    (N div Step + 1) * Step.

pow10(0) -> 1;
pow10(E) -> 10 * pow10(E - 1).

%% @doc The one-line verdict of {@link heap/2}, from its figures: a sentence
%% about a heap that is mostly garbage, mostly refc binary references, or a
%% long message queue; when nothing was measured, or when the view is not
%% complete and more than half of a heap of at least 10,000 words went
%% unseen, what was not measured, why, and the option that would measure
%% it; otherwise `none'.
-spec verdict(map()) -> binary() | none.
verdict(#{total_heap_size := Total, live_words := Live, stack_size := Stack,
          message_queue_len := QLen, complete := Complete,
          binaries := #{bytes := BinBytes, count := BinCount, shared_bytes := Shared}} = M) ->
    WordBytes = erlang:system_info(wordsize),
    HeapBytes = Total * WordBytes,
    Garbage = Complete andalso Total >= 10000 andalso Live =/= not_measured
        andalso max(0, Total - Live - Stack) * 2 > Total,
    MostlyUnseen = not Complete andalso Total >= 10000 andalso Live =/= not_measured
        andalso max(0, Total - Live - Stack) * 2 > Total,
    if
        QLen >= 10000 ->
            iolist_to_binary(io_lib:format(
              "message queue of ~b messages: the process is not keeping up", [QLen]));
        BinBytes > 4 * HeapBytes, BinBytes >= 1024 * 1024 ->
            iolist_to_binary(io_lib:format(
              "mostly binary references: ~b refc binaries hold ~s (~s shared with other "
              "processes) against a ~s heap; a GC or hibernate releases those no longer used",
              [BinCount, mallocinfo_units:bytes(BinBytes), mallocinfo_units:bytes(Shared),
               mallocinfo_units:bytes(HeapBytes)]));
        Garbage ->
            Unseen = Total - Live - Stack,
            iolist_to_binary(io_lib:format(
              "mostly garbage: ~b% of the ~s heap is not reachable from what is visible; "
              "erlang:garbage_collect/1 would return most of it",
              [Unseen * 100 div Total, mallocinfo_units:bytes(HeapBytes)]));
        Live =:= not_measured ->
            iolist_to_binary(["not measured: " | gaps_text(M)]);
        MostlyUnseen ->
            %% Most of the heap is neither garbage we could name nor terms
            %% we saw: say so rather than "none" (a state that was not asked
            %% for, a plain process's loop).
            Unseen = Total - Live - Stack,
            iolist_to_binary(
              [io_lib:format("not measured: ~b% of the ~s heap is unseen",
                             [Unseen * 100 div Total, mallocinfo_units:bytes(HeapBytes)])
               | case gaps_text(M) of
                     [] -> [];
                     Text -> [": " | Text]
                 end]);
        true ->
            none
    end;
verdict(Heap) ->
    erlang:error(badarg, [Heap]).

%% Gaps with the same reason, sentence and option as one, their kinds
%% together: `dictionary and state: the heap ... is above ...'.
group_gaps(Gaps) ->
    Grouped = lists:foldl(fun(#{what := W, reason := R, detail := D, option := Opt}, Acc) ->
                                  maps:update_with({R, D, Opt}, fun(Ws) -> [W | Ws] end, [W], Acc)
                          end, #{}, Gaps),
    [{lists:usort(lists:flatten(Ws)), R, D, Opt}
     || {{R, D, Opt}, Ws} <- lists:sort(maps:to_list(Grouped))].

gaps_text(M) ->
    Option = fun(Opt) -> io_lib:format("the option ~0p", [Opt]) end,
    lists:join("; ", [gap_text(G, Option) || G <- group_gaps(maps:get(not_measured, M, []))]).

%% "What: why, Call(Option) would measure it" (or that nothing would).
gap_text({Whats, Reason, Detail, Opt}, Call) ->
    Remedy = case map_size(Opt) of
                 0 -> "no option measures it";
                 _ -> [Call(Opt), " ", remedy(Reason)]
             end,
    [kinds_text(Whats), ": ", Detail, "; ", Remedy].

remedy(max_terms) -> "would show more";
remedy(size_budget) -> "would measure it (the process pauses about 5 us per word)";
remedy(sys_timeout) -> "may measure it, if the process answers in time";
remedy(not_asked) -> "would ask for it, if the process handles system messages (OTP "
                     "behaviours and sys-based loops such as gen_server2 or p1_server do)";
remedy(_) -> "would measure it".

kinds_text([One]) -> atom_to_list(One);
kinds_text(Kinds) ->
    Names = [atom_to_list(K) || K <- Kinds],
    [lists:join(", ", lists:droplast(Names)), " and ", lists:last(Names)].

%%% ---------------------------------------------------------------------------
%%% top/2

value(P, memory) -> info(P, memory);
value(P, message_queue_len) -> info(P, message_queue_len);
value(P, reductions) -> info(P, reductions);
value(P, binary) ->
    case process_info(P, binary) of
        %% Most processes reference none: no map to build for them.
        {binary, []} -> 0;
        {binary, Entries} -> maps:get(bytes, binaries(Entries));
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

%% What a person would call the process, the same in top/2, heap/2, print/2
%% and (through top/2) the report and its verdicts, and the same whatever
%% the process's size where the VM allows it (see below):
%% 1. its registered name;
%% 2. its label: what proc_lib:set_label/1 (OTP 27) keeps under
%%    '$process_label', which proc_lib:get_label/1 reads, else a
%%    process_name entry of its dictionary, as RabbitMQ sets it
%%    ({rabbit_amqqueue_process, {resource, <<"/">>, queue, <<"q1">>}});
%% 3. its initial call, through proc_lib:translate_initial_call/1: for a
%%    process started through proc_lib (whose raw initial call is always
%%    proc_lib:init_p) the function it was started with, {Mod, init, 1} for
%%    a gen_server;
%% undefined for a process that has exited.
%%
%% Only the dictionary keys needed are read, with process_info(P,
%% {dictionary, Key}) (OTP 26.2). An older VM (OTP 25) reads another
%% process's dictionary only by copying all of it: that copy is made for a
%% heap within ?NAME_HEAP_WORDS words, or max_heap_words when that is
%% larger (the dictionary is on the heap, so the copy is bounded too); a
%% bigger process idle in a gen_server or gen_statem loop (or, with sys =>
%% true, any process started through proc_lib) reads the keys itself (a
%% system message, as for heap/2); any other bigger process gets its raw
%% initial call ({proc_lib, init_p, 5} for a hibernated gen_server2): on
%% OTP 25 only, that name depends on size.
%% @doc A process's name as top/2, heap/2 and the report give it: its
%% registered name, else its label or `process_name', else its initial
%% call (see top/2); `undefined' for a process that is gone.
-spec name(pid()) -> term().
name(P) when is_pid(P), node(P) =:= node() ->
    name(P, ?DEFAULTS);
name(P) ->
    erlang:error(badarg, [P]).

name(P, O) ->
    case process_info(P, [registered_name, initial_call]) of
        undefined ->
            undefined;
        [{registered_name, Registered} | _] when is_atom(Registered) ->
            Registered;
        [_, {initial_call, IC}] ->
            try dictionary_keys(P) of
                Dict -> named(Dict, IC)
            catch
                error:badarg -> name_by_copy(P, IC, O)
            end
    end.

-define(NAME_KEYS, ['$process_label', process_name, '$initial_call']).

%% The entries of ?NAME_KEYS that P's dictionary has, one key at a time;
%% badarg from a VM older than OTP 26.2. (Dialyzer reads OTP 25's contract
%% of process_info/2, which does not list that item yet, and concludes that
%% the function never returns.)
-dialyzer({nowarn_function, dictionary_keys/1}).
dictionary_keys(P) ->
    [{K, V} || K <- ?NAME_KEYS,
               {_, V} <- [process_info(P, {dictionary, K})], V =/= undefined].

%% OTP 25: the whole dictionary when the heap bounds it, else what the
%% process says of itself when it is idle in a gen loop, else nothing.
name_by_copy(P, IC, #{max_heap_words := MaxHeap, timeout := Timeout, sys := Sys}) ->
    Bound = max(?NAME_HEAP_WORDS, MaxHeap),
    case process_info(P, [total_heap_size, current_function]) of
        [{total_heap_size, H}, _] when H =< Bound ->
            case process_info(P, dictionary) of
                {dictionary, Dict} -> named(Dict, IC);
                undefined -> undefined
            end;
        [_, {current_function, CF}] ->
            Ask = sys_idle(P, #{current_function => CF})
                orelse Sys andalso element(1, IC) =:= proc_lib,
            Asked = case Ask of
                        true ->
                            in_target(P, fun(_State, Reply) ->
                                                 Reply([{K, V} || K <- ?NAME_KEYS,
                                                                  V <- [get(K)],
                                                                  V =/= undefined])
                                         end, Timeout);
                        false ->
                            timeout
                    end,
            case Asked of
                {ok, Dict} -> named(Dict, IC);
                _ -> IC
            end;
        undefined ->
            undefined
    end.

%% Steps 2 and 3 of name/2, from dictionary entries (all of them, or only
%% those of ?NAME_KEYS).
named(Dict, IC) ->
    case [V || K <- ['$process_label', process_name], {Key, V} <- Dict, Key =:= K,
               V =/= undefined] of
        [Label | _] ->
            Label;
        [] ->
            case IC of
                {proc_lib, init_p, _} ->
                    %% It takes a process_info/2 list with the dictionary,
                    %% and gives {proc_lib, init_p, 5} when '$initial_call'
                    %% is missing.
                    case proc_lib:translate_initial_call(
                           [{dictionary, [E || {'$initial_call', _} = E <- Dict]}]) of
                        {proc_lib, init_p, 5} -> IC;
                        MFA -> MFA
                    end;
                _ ->
                    IC
            end
    end.

%% @private How top/2, heap/2, print/2 and the report print a name: after
%% the pid, in parentheses; nothing for undefined.
-spec name_text(term()) -> iolist().
name_text(undefined) -> "";
name_text(Name) when is_atom(Name) -> [" (", mallocinfo_text:name(Name), ")"];
name_text({M, F, A}) when is_atom(M), is_atom(F), is_integer(A) ->
    [" (", mallocinfo_text:name(M), ":", mallocinfo_text:name(F), "/", integer_to_list(A), ")"];
%% A label is any term (a RabbitMQ queue's name is the client's bytes):
%% escaped as a whole, so nothing in it can act on a terminal.
name_text(Label) -> [" (", mallocinfo_text:name(io_lib:format("~0tP", [Label, 10])), ")"].

%%% ---------------------------------------------------------------------------
%%% print/1

format(Pid, H, Items) ->
    W = erlang:system_info(wordsize),
    #{name := Name, total_heap_size := Total, live_words := Live, flat_words := Flat,
      stack_size := Stack, message_queue_len := QLen, not_measured := Gaps,
      complete := Complete, unseen_words := Unseen,
      binaries := #{count := BC, bytes := BB, shared_bytes := BS}, verdict := V} = H,
    %% "live" only when everything live was seen; otherwise what was
    %% measured and what was not, so that a dictionary of 97 words never
    %% reads as the live data of a 2,185,112-word heap.
    LiveText = case {Live, Complete} of
                   {not_measured, _} ->
                       "live words not measured";
                   {_, true} ->
                       io_lib:format("live ~b words (~b if shared parts were copied)",
                                     [Live, Flat]);
                   {_, false} ->
                       io_lib:format("measured ~b words (~b if shared parts were copied), "
                                     "unseen ~ts", [Live, Flat, words(Unseen)])
               end,
    Header = io_lib:format(
               "~p~ts: heap ~s (~b words), ~ts, stack ~b words~n"
               "  queue ~b, refc binaries ~b = ~s (~s shared)~n",
               [Pid, name_text(Name), mallocinfo_units:bytes(Total * W), Total, LiveText, Stack,
                QLen, BC, mallocinfo_units:bytes(BB), mallocinfo_units:bytes(BS)]),
    Call = fun(Opt) -> io_lib:format("mallocinfo_process:print(~p, ~0p)", [Pid, Opt]) end,
    NotMeasured = [io_lib:format("  not measured: ~ts~n", [gap_text(G, Call)])
                   || G <- group_gaps(Gaps)],
    Verdict = case {Live, V} of
                  {not_measured, <<"not measured", _/binary>>} ->
                      "cannot tell, nothing was measured (see above)";
                  {_, <<"not measured", _/binary>>} ->
                      io_lib:format("cannot tell, ~b% of the heap was not measured (see above)",
                                    [Unseen * 100 div max(1, Total)]);
                  {_, none} ->
                      "none";
                  _ ->
                      V
              end,
    Sorted = lists:sort(fun(#{words := A}, #{words := B}) -> A >= B end,
                        [I || #{kind := K} = I <- Items, K =/= omitted]),
    Lines = [io_lib:format("  ~8b words ~10s  ~-15s ~P~n",
                           [Words, mallocinfo_units:bytes(Words * W), atom_to_list(Kind), Term, 6])
             || #{kind := Kind, term := Term, words := Words} <- Sorted],
    Table = case Lines of
                [] -> [];
                _ -> ["  words        bytes  kind            term\n" | Lines]
            end,
    [Header, NotMeasured, io_lib:format("  verdict: ~ts~n", [Verdict]) | Table].
