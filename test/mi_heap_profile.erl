%% A reader of the two heap profile text formats the HTTP endpoint returns,
%% for the tests only: it checks a profile is whole and well formed, which
%% a half-written or interleaved file is not.
%%
%%  - gperftools' legacy format (the tracker's and tcmalloc's):
%%      heap profile: N: B [N: B] @ heapprofile
%%      N: B [N: B] @ 0xADDR 0xADDR ...
%%      ...
%%      MAPPED_LIBRARIES:
%%      /proc/self/maps lines
%%  - jemalloc's heap_v2:
%%      heap_v2/RATE
%%        t*: N: B [N: B]
%%        tID: N: B [N: B] ...
%%      @ 0xADDR ...
%%        t*: N: B [N: B]
%%        tID: ...
%%      (blank line)
%%      MAPPED_LIBRARIES:
%%      /proc/self/maps lines
%%
%% parse/1 returns #{format => legacy | heap_v2, total => {N, B},
%% records => [{N, B, [Addr]}], maps => [Line]}, the in-use figures (the
%% first pair). Every line must be complete (the text ends with a line
%% feed), every memory-map line well formed and non-empty. Errors raise
%% `{heap_profile, Why, Line}'.
-module(mi_heap_profile).

-export([parse/1]).

parse(Bin) when is_binary(Bin) ->
    byte_size(Bin) > 0 andalso binary:last(Bin) =:= $\n orelse fail(not_ending_in_line_feed, <<>>),
    Lines = binary:split(binary:part(Bin, 0, byte_size(Bin) - 1), <<"\n">>, [global]),
    case Lines of
        [<<"heap profile:", Rest/binary>> | Body] -> legacy(Rest, Body);
        [<<"heap_v2/", Rate/binary>> | Body] -> heap_v2(Rate, Body);
        [First | _] -> fail(unknown_header, First)
    end.

legacy(Header, Lines) ->
    {Total, Type} = counts_then(Header),
    Type =:= <<"@ heapprofile">> orelse fail(bad_header_type, Header),
    {Records, Maps} = legacy_records(Lines, []),
    #{format => legacy, total => Total, records => Records, maps => maps_section(Maps)}.

legacy_records([<<>>, <<"MAPPED_LIBRARIES:">> | Maps], Acc) ->
    {lists:reverse(Acc), Maps};
legacy_records([<<"MAPPED_LIBRARIES:">> | Maps], Acc) ->
    {lists:reverse(Acc), Maps};
legacy_records([Line | Rest], Acc) ->
    {{N, B}, Stack} = counts_then(Line),
    case Stack of
        <<"@ ", Addrs/binary>> -> legacy_records(Rest, [{N, B, addresses(Addrs, Line)} | Acc]);
        _ -> fail(bad_record, Line)
    end;
legacy_records([], _) ->
    fail(no_mapped_libraries, <<>>).

heap_v2(RateText, [Total | Lines]) ->
    _ = int(RateText, RateText),
    {TotalCounts, <<>>} = thread_line(<<"t*">>, Total),
    {Records, Maps} = v2_records(skip_threads(Lines, Total), []),
    #{format => heap_v2, total => TotalCounts, records => Records, maps => maps_section(Maps)};
heap_v2(_, []) ->
    fail(no_totals, <<>>).

v2_records([<<"@ ", Addrs/binary>> = Line, Total | Rest], Acc) ->
    {Counts, <<>>} = thread_line(<<"t*">>, Total),
    {N, B} = Counts,
    v2_records(skip_threads(Rest, Total), [{N, B, addresses(Addrs, Line)} | Acc]);
v2_records([<<>>, <<"MAPPED_LIBRARIES:">> | Maps], Acc) ->
    {lists:reverse(Acc), Maps};
v2_records([Line | _], _) ->
    fail(bad_record, Line);
v2_records([], _) ->
    fail(no_mapped_libraries, <<>>).

%% Per-thread lines "  tID: N: B [N: B]" after a t* line.
skip_threads([<<"  t", _/binary>> = Line | Rest], Context) ->
    [Id, _] = binary:split(binary:part(Line, 3, byte_size(Line) - 3), <<":">>),
    _ = int(Id, Line),
    _ = thread_line(<<"t", Id/binary>>, Line),
    skip_threads(Rest, Context);
skip_threads(Lines, _) ->
    Lines.

thread_line(Tag, Line) ->
    Prefix = <<"  ", Tag/binary, ":">>,
    case Line of
        <<Prefix:(byte_size(Prefix))/binary, Rest/binary>> -> counts_then(Rest);
        _ -> fail(bad_thread_line, Line)
    end.

%% " N: B [N: B]" then the rest of the line after one space (or nothing).
counts_then(Text) ->
    case binary:split(Text, <<"]">>) of
        [Counts, After] ->
            case [T || T <- binary:split(Counts, [<<" ">>, <<":">>, <<"[">>], [global]), T =/= <<>>] of
                [N1, B1, N2, B2] ->
                    _ = int(N2, Text),
                    _ = int(B2, Text),
                    {{int(N1, Text), int(B1, Text)}, string:trim(After, leading)};
                _ ->
                    fail(bad_counts, Text)
            end;
        _ ->
            fail(bad_counts, Text)
    end.

addresses(Text, Line) ->
    Addrs = binary:split(Text, <<" ">>, [global, trim_all]),
    Addrs =/= [] orelse fail(empty_stack, Line),
    [case A of
         <<"0x", Hex/binary>> when byte_size(Hex) > 0, byte_size(Hex) =< 16 ->
             try binary_to_integer(Hex, 16) catch error:badarg -> fail(bad_address, Line) end;
         _ -> fail(bad_address, Line)
     end || A <- Addrs].

%% /proc/self/maps: "start-end perms offset dev inode [path]".
maps_section([]) ->
    fail(empty_memory_map, <<>>);
maps_section(Lines) ->
    [map_line(L) || L <- Lines].

map_line(Line) ->
    case binary:split(Line, <<" ">>, [global, trim_all]) of
        [Range, Perms, Offset, Dev, Inode | _] ->
            [Lo, Hi] = case binary:split(Range, <<"-">>) of
                           [_, _] = LH -> LH;
                           _ -> fail(bad_map_line, Line)
                       end,
            _ = [hex(X, Line) || X <- [Lo, Hi, Offset]],
            byte_size(Perms) =:= 4 orelse fail(bad_map_line, Line),
            binary:match(Dev, <<":">>) =/= nomatch orelse fail(bad_map_line, Line),
            _ = int(Inode, Line),
            Line;
        _ ->
            fail(bad_map_line, Line)
    end.

hex(Text, Line) ->
    try binary_to_integer(Text, 16) catch error:badarg -> fail(bad_hex, Line) end.

int(Text, Line) ->
    try binary_to_integer(Text) catch error:badarg -> fail(bad_integer, Line) end.

fail(Why, Line) ->
    error({heap_profile, Why, Line}).
