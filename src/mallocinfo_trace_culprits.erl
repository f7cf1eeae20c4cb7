%% @private The tracker's culprit engine, impure: it symbolizes through the
%% NIF and reads `/proc/self/maps'. Who holds a call site's memory (its
%% culprit: the first frame outside the allocator family, and its label
%% `native', `erts' or `self'), found depth by depth so that a stack costs
%% one or two symbol lookups, not its whole depth; raw sites rolled up by
%% culprit (`mallocinfo_trace:sites/2' with `by'); rows with packed frames
%% symbolized in one batch (`diff/2', `growth/2', `olds/2' of a
%% snapshot); the tracker's mapped regions rolled up by stack, function or
%% object (`mappings/2'). The pure rules (the allocator family, labels,
%% the roll-up of sites) are `mallocinfo_trace_growth''s. Not an API:
%% `mallocinfo_trace' checks every argument first.
-module(mallocinfo_trace_culprits).

-export([symbolized/2, stack_label/1, symbolize_stacks/2, culprits/2, rollup/3, mappings/2,
         function_processes/1]).

%% Raw sites ({Count, Bytes, Estimated, PackedFrames}) rolled up by the
%% function or the object of their culprits (mallocinfo_trace_growth:rollup/3).
-spec rollup(function | object, [tuple()], boolean()) -> [map()].
rollup(By, Raw, Demangle) ->
    mallocinfo_trace_growth:rollup(By, Raw, culprits(Raw, Demangle), callers(Raw)).

%% The processes whose blocks each native function holds now (the Erlang
%% context: the tracker's sites split by process), as
%% `#{RowKey => #{Pid => Bytes}}', RowKey a roll-up by function's row key
%% (mallocinfo_trace_growth:row_key/1). `{error, _}' without a recording
%% tracker; an empty map without the Erlang context.
-spec function_processes(boolean()) -> {ok, #{tuple() => #{pid() => non_neg_integer()}}}
                                          | {error, atom()}.
function_processes(Demangle) ->
    _ = mallocinfo_trace_context:ensure(),
    ok = mallocinfo_trace_context:refresh(),
    case mallocinfo_nif:trace_by_context(1 bsl 62, site_process) of
        {ok, Rows, _Without} ->
            Culprits = culprits([{C, B, E, F} || {F, _, C, B, E} <- Rows], Demangle),
            {ok, lists:foldl(
                   fun({F, Pid, _, B, _}, Acc) ->
                           Key = mallocinfo_trace_growth:row_key(
                                   row_of(maps:get(F, Culprits))),
                           Pids = maps:get(Key, Acc, #{}),
                           Acc#{Key => Pids#{Pid => maps:get(Pid, Pids, 0) + B}}
                   end, #{}, Rows)};
        {error, _} = E ->
            E
    end.

row_of({Label, undefined}) -> #{label => Label};
row_of({Label, Frame}) -> #{label => Label, frame => Frame}.

%% #{PackedFrames => #{module, function, arity}} for every raw site with
%% an Erlang context: the Erlang function that drove it, as
%% `sites(N, #{by => erlang_function})' picks it (the first named return
%% address on the process's stack, else the running function). The
%% return addresses of all sites are named in one batch.
-spec callers([tuple()]) -> #{binary() => map()}.
callers(Raw) ->
    Split = [{F, Ctx} || {_, _, _, F} <- Raw,
                         {_, {process, _, _} = Ctx} <- [mallocinfo_trace_context:split(F)]],
    case Split of
        [] ->
            #{};
        _ ->
            Atoms = erlang:system_info(atom_count),
            Cps = lists:usort([Cp || {_, {process, _, Cs}} <- Split, Cp <- Cs]),
            Named = maps:from_list(lists:zip(Cps, mallocinfo_nif:code_names(Cps, Atoms))),
            Mfas = lists:usort([M || {_, {process, M, _}} <- Split, M =/= none]),
            Running = maps:from_list(lists:zip(Mfas, mallocinfo_trace_context:mfa_terms(Mfas,
                                                                                        Atoms))),
            maps:from_list(
              [{F, fn(Fn)}
               || {F, {process, M, Cs}} <- Split,
                  Fn <- [case [N || Cp <- Cs, N <- [maps:get(Cp, Named)], N =/= none] of
                             [First | _] -> First;
                             [] when M =/= none -> maps:get(M, Running);
                             [] -> none
                         end],
                  Fn =/= none])
    end.

fn({M, F, A}) -> #{module => M, function => F, arity => A}.

%% Rows with packed frames get `stack', `culprit' and `label'; their stacks
%% symbolized in one batch.
-spec symbolized([map()], boolean()) -> [map()].
symbolized(Rows, Demangle) ->
    Stacks = symbolize_mixed([F || #{frames := F} <- Rows], Demangle),
    [begin
         {Stack, Erlang, Thread} = maps:get(F, Stacks),
         R1 = (maps:remove(frames, R))#{stack => Stack, erlang => Erlang,
                                        culprit => mallocinfo_trace_growth:culprit(Stack),
                                        label => stack_label(Stack)},
         case Thread of
             undefined -> R1;
             _ -> R1#{thread => Thread}
         end
     end || #{frames := F} = R <- Rows].

%% A symbolized stack's label: `self' when a frame is in mallocinfo's own
%% objects, else by its culprit (mallocinfo_trace_growth:label/2).
-spec stack_label([map()]) -> native | erts | self.
stack_label(Stack) ->
    Self = lists:any(fun(#{object := O}) -> mallocinfo_trace_growth:self_object(O) end, Stack),
    mallocinfo_trace_growth:label(mallocinfo_trace_growth:culprit(Stack), Self).

%% #{PackedFrames => [frame()]}, one symbolizer batch.
-spec symbolize_stacks([binary()], boolean()) -> #{binary() => [map()]}.
symbolize_stacks(FramesList, Demangle) ->
    maps:map(fun(_, {Stack, _, _}) -> Stack end, symbolize_mixed(FramesList, Demangle)).

%% #{PackedFrames => {MixedStack, ErlangFunctions, ThreadName | undefined}},
%% one batch: native frames, then the Erlang context's functions (their
%% symbol "module:function/arity", their object the module), then the
%% allocating thread's name (c_src/nif/mixed_stack.h).
-spec symbolize_mixed([binary()], boolean()) ->
          #{binary() => {[map()], [map()], binary() | undefined}}.
symbolize_mixed(FramesList, Demangle) ->
    Unique = lists:usort(FramesList),
    ok = mallocinfo_trace_context:refresh(),
    maps:from_list(lists:zip(Unique, mallocinfo_nif:trace_symbolize_stacks(Unique, Demangle))).

%% #{PackedFrames => {Label, CulpritFrame | undefined}} for every raw site.
%% Depth by depth: each round symbolizes (in one batch) frame I of every
%% stack whose frames so far were all allocator frames, so the usual stack
%% costs one or two lookups, not its whole depth. Whether a stack is
%% mallocinfo's own is read from the address ranges of mallocinfo's
%% objects, without symbols, walking the packed frames in place (20,000
%% stacks of depth 32 are 640,000 addresses: no list of them is built).
-spec culprits([tuple()], boolean()) -> #{binary() => {native | erts | self, map() | undefined}}.
culprits(Raw, Demangle) ->
    Ranges = self_ranges(),
    Found = culprit_rounds([{F, 0} || {_, _, _, F} <- Raw], Demangle, #{}, #{}),
    maps:map(fun(F, Frame) ->
                     Self = Ranges =/= [] andalso
                         in_ranges(mallocinfo_trace_growth:native(F), Ranges),
                     {mallocinfo_trace_growth:label(Frame, Self), Frame}
             end, Found).

%% Pending: [{Frames, ByteOffsetOfTheNextFrame}]; First: the first frame
%% of each stack seen so far (the culprit when every frame is an allocator
%% frame).
culprit_rounds([], _, _, Found) ->
    Found;
culprit_rounds(Pending, Demangle, First, Found0) ->
    %% A stack's native frames end at its end or at its Erlang context.
    {Done, Live} = lists:partition(
                     fun({F, Off}) ->
                             Off >= byte_size(F) orelse
                                 byte_size(mallocinfo_trace_growth:native(
                                             binary:part(F, Off, 8))) =:= 0
                     end, Pending),
    Found1 = lists:foldl(fun({F, _}, Acc) -> Acc#{F => maps:get(F, First, undefined)} end,
                         Found0, Done),
    Want = lists:usort([frame_at(F, Off) || {F, Off} <- Live]),
    Symbols = case Want of
                  [] -> #{};
                  _ -> maps:from_list(lists:zip(Want, mallocinfo_nif:trace_symbolize(Want, Demangle)))
              end,
    {Next, First1, Found2} =
        lists:foldl(
          fun({F, Off}, {N, Fi, Fo}) ->
                  Frame = maps:get(frame_at(F, Off), Symbols),
                  Fi1 = case Off of 0 -> Fi#{F => Frame}; _ -> Fi end,
                  case mallocinfo_trace_growth:allocator_frame(Frame) of
                      false -> {N, Fi1, Fo#{F => Frame}};
                      true -> {[{F, Off + 8} | N], Fi1, Fo}
                  end
          end, {[], First, Found1}, Live),
    culprit_rounds(Next, Demangle, First1, Found2).

frame_at(F, Off) ->
    <<_:Off/binary, A:64/native, _/binary>> = F,
    A.

%% Address ranges of mallocinfo's own objects in this process, the
%% mappings of one object merged.
self_ranges() ->
    case file:read_file("/proc/self/maps") of
        {ok, Maps} ->
            Ranges = lists:sort(
                       [{binary_to_integer(Lo, 16), binary_to_integer(Hi, 16)}
                        || Line <- binary:split(Maps, <<"\n">>, [global]),
                           [Range, _Perms, _Off, _Dev, _Inode, Path | _] <-
                               [binary:split(Line, <<" ">>, [global, trim_all])],
                           mallocinfo_trace_growth:self_object(Path),
                           [Lo, Hi] <- [binary:split(Range, <<"-">>)]]),
            merge_ranges(Ranges);
        {error, _} ->
            []
    end.

merge_ranges([{L1, H1}, {L2, H2} | Rest]) when L2 =< H1 -> merge_ranges([{L1, max(H1, H2)} | Rest]);
merge_ranges([R | Rest]) -> [R | merge_ranges(Rest)];
merge_ranges([]) -> [].

%% True when an address packed in Frames is in one of Ranges.
in_ranges(<<A:64/native, Rest/binary>>, Ranges) ->
    in_any(A, Ranges) orelse in_ranges(Rest, Ranges);
in_ranges(<<>>, _) ->
    false.

in_any(A, [{Lo, Hi} | Rest]) -> (A >= Lo andalso A < Hi) orelse in_any(A, Rest);
in_any(_, []) -> false.

%%% Mapped regions --------------------------------------------------------------

%% Regions (mallocinfo_nif:trace_regions/1) to mallocinfo_trace:mapping()
%% rows, largest first. `stack': one row per call stack (frames compared by
%% address); `function' and `object': by the frame that called mmap (the
%% culprit, as for malloc's sites), labelled as sites/2 labels them.
-spec mappings(stack | function | object, [map()]) -> [map()].
mappings(By, Regions) ->
    Groups = lists:foldl(
               fun(R, Acc) ->
                       {Key, Row0} = mapping_key(By, R),
                       maps:update_with(Key, fun(Row) -> add_region(R, Row) end,
                                        add_region(R, Row0#{count => 0, bytes => 0, resident => 0,
                                                            flags => [], oldest_age_ms => 0}),
                                        Acc)
               end, #{}, Regions),
    lists:sort(fun(#{bytes := A}, #{bytes := B}) -> A >= B end, maps:values(Groups)).

%% A region's group and the identity columns of its row.
mapping_key(stack, #{stack := Stack}) ->
    {[A || #{address := A} <- Stack], #{stack => Stack}};
mapping_key(By, #{stack := Stack}) ->
    culprit_key(By, stack_label(Stack), mallocinfo_trace_growth:culprit(Stack)).

culprit_key(_, Label, undefined) ->
    {{Label, none}, #{label => Label, object => undefined}};
culprit_key(object, Label, #{object := O}) ->
    {{Label, O}, #{label => Label, object => O}};
culprit_key(function, Label, #{object := O} = F) ->
    Name = maps:get(symbol, F, undefined),
    Key = case Name of
              undefined -> {Label, O, maps:get(address, F)};
              _ -> {Label, O, Name}
          end,
    {Key, #{label => Label, object => O, function => Name, frame => F}}.

add_region(#{length := L, resident := Res, flags := F, age_ms := Age},
           #{count := C, bytes := B, resident := R0, flags := F0, oldest_age_ms := O} = Row) ->
    Row#{count := C + 1, bytes := B + L, resident := R0 + Res,
         flags := lists:usort(F ++ F0), oldest_age_ms := max(O, Age)}.
