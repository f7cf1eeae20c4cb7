%% @private Pure functions that turn glibc's text and XML into terms.
%% Kept apart from the NIF calls so they are tested on canned input.
-module(mallocinfo_glibc_parse).

-include_lib("xmerl/include/xmerl.hrl").

-export([stats/1, heaps/1]).

-export_type([summary/0, heaps/0]).

-type arena() :: #{arena := non_neg_integer(),
                   system_bytes := non_neg_integer(),
                   in_use_bytes := non_neg_integer()}.
%% `system_bytes' and `in_use_bytes' are the arenas' (mmapped blocks
%% excluded), as everywhere in mallocinfo; the `_incl_mmap_bytes' pair is
%% malloc_stats()'s "Total (incl. mmap)".
-type summary() :: #{arenas := [arena()],
                     system_bytes := non_neg_integer(),
                     in_use_bytes := non_neg_integer(),
                     system_incl_mmap_bytes := non_neg_integer(),
                     in_use_incl_mmap_bytes := non_neg_integer(),
                     mmap_regions := non_neg_integer(),
                     mmap_bytes := non_neg_integer(),
                     max_mmap_regions := non_neg_integer(),
                     max_mmap_bytes := non_neg_integer()}.
-type heaps() :: #{version := non_neg_integer(),
                   heaps := [map()],
                   total := map(),
                   system := map(),
                   aspace := map(),
                   free_bytes := non_neg_integer(),
                   in_use_bytes := non_neg_integer()}.

%% @doc Parses `malloc_stats()' output (plus the two `mmap' lines the NIF's
%% capture appends) into a summary map. Unknown lines are ignored, so stray
%% text on stderr cannot break it; a missing total raises `{bad_stats, Key}'.
%% `system_bytes' and `in_use_bytes' are the sums over the arenas, the same
%% figures (and names) as `heaps/1' and the heap map give; malloc_stats()'s
%% own totals, which add the mmapped blocks, are `system_incl_mmap_bytes'
%% and `in_use_incl_mmap_bytes'.
-spec stats(binary()) -> summary().
stats(Text) when is_binary(Text) ->
    Lines = binary:split(Text, <<"\n">>, [global, trim_all]),
    {Arenas0, Totals} = stats_lines(Lines, none, [], #{}),
    Arenas = lists:reverse(Arenas0),
    Keys = [{system_bytes, system_incl_mmap_bytes}, {in_use_bytes, in_use_incl_mmap_bytes},
            mmap_regions, mmap_bytes, max_mmap_regions, max_mmap_bytes],
    lists:foldl(
      fun(K, Acc) ->
              {From, To} = case K of {_, _} -> K; _ -> {K, K} end,
              case Totals of
                  #{From := V} -> Acc#{To => V};
                  #{} -> error({bad_stats, From})
              end
      end, #{arenas => Arenas,
             system_bytes => lists:sum([maps:get(system_bytes, A, 0) || A <- Arenas]),
             in_use_bytes => lists:sum([maps:get(in_use_bytes, A, 0) || A <- Arenas])}, Keys);
stats(Other) ->
    erlang:error(badarg, [Other]).

stats_lines([], Cur, Arenas, Totals) ->
    {close_arena(Cur, Arenas), Totals};
stats_lines([Line | Rest], Cur, Arenas, Totals) ->
    case Line of
        <<"Arena ", N/binary>> ->
            Nr = binary_to_integer(string:trim(N, trailing, ":")),
            stats_lines(Rest, #{arena => Nr}, close_arena(Cur, Arenas), Totals);
        <<"Total", _/binary>> ->
            stats_lines(Rest, total, close_arena(Cur, Arenas), Totals);
        _ ->
            case name_value(Line) of
                {Key, Value} when Cur =:= total; Cur =:= none ->
                    stats_lines(Rest, Cur, Arenas, Totals#{Key => Value});
                {Key, Value} when is_map(Cur) ->
                    stats_lines(Rest, Cur#{Key => Value}, Arenas, Totals);
                skip ->
                    stats_lines(Rest, Cur, Arenas, Totals)
            end
    end.

close_arena(Cur, Arenas) when is_map(Cur) -> [Cur | Arenas];
close_arena(_, Arenas) -> Arenas.

name_value(Line) ->
    case binary:split(Line, <<"=">>) of
        [Name, Value] ->
            case {stat_key(string:trim(Name)), string:to_integer(string:trim(Value))} of
                {undefined, _} -> skip;
                {Key, {Int, <<>>}} -> {Key, Int};
                _ -> skip
            end;
        _ ->
            skip
    end.

stat_key(<<"system bytes">>) -> system_bytes;
stat_key(<<"in use bytes">>) -> in_use_bytes;
stat_key(<<"mmap regions">>) -> mmap_regions;
stat_key(<<"mmap bytes">>) -> mmap_bytes;
stat_key(<<"max mmap regions">>) -> max_mmap_regions;
stat_key(<<"max mmap bytes">>) -> max_mmap_bytes;
stat_key(_) -> undefined.

%% @doc Parses `malloc_info()' XML with xmerl. The caller makes sure xmerl is
%% loaded. Raises `{bad_xml, Why}' on a document that is not malloc_info's.
-spec heaps(binary()) -> heaps().
heaps(Xml) when is_binary(Xml) ->
    Doc = try xmerl_scan:string(binary_to_list(Xml), [{quiet, true}]) of
              {D, _Rest} -> D
          catch
              exit:Why -> error({bad_xml, Why})
          end,
    case Doc of
        #xmlElement{name = malloc, attributes = Attrs, content = Content} ->
            Elems = elements(Content),
            Heaps = [heap(E) || #xmlElement{name = heap} = E <- Elems],
            Top = groups([E || #xmlElement{name = N} = E <- Elems, N =/= heap]),
            %% glibc 2.43 has no fastbins and prints no <total type="fast">:
            %% zero, as in each heap.
            Total = maps:merge(#{fast => #{count => 0, size => 0}}, maps:get(total, Top, #{})),
            Fast = size_of(fast, Total),
            Rest = size_of(rest, Total),
            Current = maps:get(current, maps:get(system, Top, #{}), 0),
            #{version => int_attr(version, Attrs),
              heaps => Heaps,
              total => Total,
              system => maps:get(system, Top, #{}),
              aspace => maps:get(aspace, Top, #{}),
              free_bytes => Fast + Rest,
              in_use_bytes => Current - Fast - Rest};
        _ ->
            error({bad_xml, not_malloc_info})
    end;
heaps(Other) ->
    erlang:error(badarg, [Other]).

heap(#xmlElement{attributes = Attrs, content = Content}) ->
    Elems = elements(Content),
    Sizes = [E || #xmlElement{name = sizes} = E <- Elems],
    Buckets = lists:append([elements(C) || #xmlElement{content = C} <- Sizes]),
    G = groups([E || #xmlElement{name = N} = E <- Elems, N =/= sizes]),
    Total = maps:get(total, G, #{}),
    Fast = size_of(fast, Total),
    Rest = size_of(rest, Total),
    Current = maps:get(current, maps:get(system, G, #{}), 0),
    #{nr => int_attr(nr, Attrs),
      sizes => [bucket(B) || #xmlElement{name = size} = B <- Buckets],
      unsorted => [bucket(B) || #xmlElement{name = unsorted} = B <- Buckets],
      fast => maps:get(fast, Total, #{count => 0, size => 0}),
      rest => maps:get(rest, Total, #{count => 0, size => 0}),
      system => maps:get(system, G, #{}),
      aspace => maps:get(aspace, G, #{}),
      free_bytes => Fast + Rest,
      in_use_bytes => Current - Fast - Rest}.

bucket(#xmlElement{attributes = A}) ->
    #{from => int_attr(from, A), to => int_attr(to, A),
      total => int_attr(total, A), count => int_attr(count, A)}.

%% <total type="fast" count=".." size=".."/> -> #{total => #{fast => #{count, size}}}
%% <system type="current" size=".."/>        -> #{system => #{current => Size}}
groups(Elems) ->
    lists:foldl(
      fun(#xmlElement{name = Name, attributes = A}, Acc) ->
              Type = type_key(attr(type, A)),
              Value = case attr(count, A) of
                          undefined -> int_attr(size, A);
                          _ -> #{count => int_attr(count, A), size => int_attr(size, A)}
                      end,
              maps:update_with(Name, fun(M) -> M#{Type => Value} end, #{Type => Value}, Acc)
      end, #{}, Elems).

size_of(Type, Totals) ->
    case Totals of
        #{Type := #{size := S}} -> S;
        #{} -> 0
    end.

elements(Content) -> [E || #xmlElement{} = E <- Content].

attr(Name, Attrs) ->
    case lists:keyfind(Name, #xmlAttribute.name, Attrs) of
        #xmlAttribute{value = V} -> V;
        false -> undefined
    end.

int_attr(Name, Attrs) ->
    case attr(Name, Attrs) of
        undefined -> undefined;
        V -> list_to_integer(V)
    end.

%% The type names malloc_info uses; anything newer stays a binary rather than
%% growing the atom table from input.
type_key("fast") -> fast;
type_key("rest") -> rest;
type_key("mmap") -> mmap;
type_key("current") -> current;
type_key("max") -> max;
type_key("total") -> total;
type_key("mprotect") -> mprotect;
type_key("subheaps") -> subheaps;
type_key(Other) when is_list(Other) -> list_to_binary(Other);
type_key(undefined) -> undefined.
