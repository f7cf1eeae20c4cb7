%% A strict parser of the Prometheus text exposition format (0.0.4), for the
%% tests only. It tokenises line by line as the format's specification
%% describes, and refuses what a scraper would refuse:
%%
%%  - the text ends with a line feed; lines are split on "\n" only;
%%  - `# HELP name text' (escapes \\ and \n only) and `# TYPE name type'
%%    (counter, gauge, histogram, summary, untyped), each at most once per
%%    family, TYPE before the family's first sample; other `#' lines are
%%    comments;
%%  - a sample is `name [{label="value",...}] value [timestamp]': names
%%    [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]*, label
%%    values with escapes \\ \" \n only, a trailing comma allowed, values
%%    Go floats including NaN, +Inf, -Inf, an integer timestamp;
%%  - all lines of a family form one group; no label twice in a sample; no
%%    two samples with the same name and labels.
%%
%% parse/1 returns the families in order:
%%   [#{name, type, help, samples => [#{name, labels => #{Name => Value}, value}]}]
%% with type `untyped' and help `undefined' when absent, and values as
%% integers (when the text is an integer), floats, or nan / infinity /
%% neg_infinity. Errors raise `{prom, Why, LineNumber}'.
-module(mi_prom_parse).

-export([parse/1]).

parse(IoData) ->
    Bin = iolist_to_binary(IoData),
    Lines = case Bin of
                <<>> -> [];
                _ ->
                    case binary:last(Bin) of
                        $\n -> binary:split(binary:part(Bin, 0, byte_size(Bin) - 1), <<"\n">>, [global]);
                        _ -> error({prom, no_final_line_feed, 0})
                    end
            end,
    {_, St} = lists:foldl(fun(Line, {N, S}) -> {N + 1, line(Line, N, S)} end,
                          {1, #{order => [], fams => #{}, current => none, seen => #{}}},
                          Lines),
    #{order := Order, fams := Fams} = St,
    [finish(maps:get(F, Fams)) || F <- lists:reverse(Order)].

finish(#{samples := S} = F) -> F#{samples := lists:reverse(S)}.

line(Line, N, St) ->
    case skip_blank(Line) of
        <<>> -> St;
        <<$#, Rest/binary>> -> comment(skip_blank(Rest), N, St);
        Text -> sample(Text, N, St)
    end.

comment(Text, N, St) ->
    case token(Text) of
        {<<"HELP">>, Rest} when Rest =/= <<>> -> help(skip_blank(Rest), N, St);
        {<<"TYPE">>, Rest} when Rest =/= <<>> -> type(skip_blank(Rest), N, St);
        _ -> St
    end.

help(Text, N, St) ->
    {Name, Rest} = metric_name(Text, N),
    Doc = case Rest of
              <<>> -> <<>>;
              <<C, R/binary>> when C =:= $\s; C =:= $\t -> unescape_help(skip_blank(R), N, <<>>);
              _ -> fail(bad_help, N)
          end,
    St1 = enter(Name, N, St),
    F = family(Name, St1),
    case F of
        #{help := undefined} -> put_family(F#{help := Doc}, St1);
        _ -> fail({second_help, Name}, N)
    end.

type(Text, N, St) ->
    {Name, Rest} = metric_name(Text, N),
    Type = case token(skip_blank(Rest)) of
               {T, <<>>} when T =:= <<"counter">>; T =:= <<"gauge">>; T =:= <<"histogram">>;
                              T =:= <<"summary">>; T =:= <<"untyped">> ->
                   binary_to_atom(T);
               _ -> fail(bad_type, N)
           end,
    St1 = enter(Name, N, St),
    case family(Name, St1) of
        #{typed := true} -> fail({second_type, Name}, N);
        #{samples := [_ | _]} -> fail({type_after_samples, Name}, N);
        F -> put_family(F#{type := Type, typed := true}, St1)
    end.

sample(Text, N, St) ->
    {Name, R1} = metric_name(Text, N),
    {Labels, R2} = case skip_blank(R1) of
                       <<${, InBraces/binary>> -> labels(skip_blank(InBraces), N, #{});
                       _ -> {#{}, R1}
                   end,
    {ValueText, R3} = case R2 of
                          <<C, R/binary>> when C =:= $\s; C =:= $\t -> token(skip_blank(R));
                          _ -> fail(expected_value, N)
                      end,
    Value = value(ValueText, N),
    case skip_blank(R3) of
        <<>> -> ok;
        Ts ->
            case token(Ts) of
                {TsText, <<>>} -> timestamp(TsText, N);
                _ -> fail(trailing_text, N)
            end
    end,
    Fam = family_of(Name, St),
    St1 = enter(Fam, N, St),
    Key = {Name, lists:sort(maps:to_list(Labels))},
    case maps:is_key(Key, maps:get(seen, St1)) of
        true -> fail({duplicate_sample, Name, Labels}, N);
        false -> ok
    end,
    F = family(Fam, St1),
    St2 = put_family(F#{samples := [#{name => Name, labels => Labels, value => Value}
                                    | maps:get(samples, F)]}, St1),
    St2#{seen := (maps:get(seen, St2))#{Key => true}}.

%% A family's lines are one group: entering a family other than the
%% current one is allowed only the first time.
enter(Fam, N, #{current := Cur, order := Order, fams := Fams} = St) ->
    case Fam of
        Cur -> St;
        _ ->
            case maps:is_key(Fam, Fams) of
                true -> fail({family_not_contiguous, Fam}, N);
                false ->
                    F = #{name => Fam, type => untyped, typed => false, help => undefined,
                          samples => []},
                    St#{current := Fam, order := [Fam | Order], fams := Fams#{Fam => F}}
            end
    end.

family(Fam, #{fams := Fams}) -> maps:get(Fam, Fams).

put_family(#{name := Fam} = F, #{fams := Fams} = St) -> St#{fams := Fams#{Fam => F}}.

%% x_bucket, x_sum, x_count belong to family x when x is a histogram or
%% summary; every other sample is its own family.
family_of(Name, #{fams := Fams}) ->
    Bases = [binary:part(Name, 0, byte_size(Name) - byte_size(S))
             || S <- [<<"_bucket">>, <<"_sum">>, <<"_count">>],
                byte_size(Name) > byte_size(S),
                binary:part(Name, byte_size(Name) - byte_size(S), byte_size(S)) =:= S],
    case [B || B <- Bases, #{B := #{type := T}} <- [Fams], T =:= histogram orelse T =:= summary] of
        [Base | _] -> Base;
        [] -> Name
    end.

labels(<<$}, R/binary>>, _N, Acc) ->
    {Acc, R};
labels(Text, N, Acc) ->
    {Name, R1} = label_name(Text, N),
    case maps:is_key(Name, Acc) of
        true -> fail({repeated_label, Name}, N);
        false -> ok
    end,
    case skip_blank(R1) of
        <<$=, R2/binary>> ->
            case skip_blank(R2) of
                <<$", R3/binary>> ->
                    {Value, R4} = label_value(R3, N, <<>>),
                    Acc1 = Acc#{Name => Value},
                    case skip_blank(R4) of
                        <<$,, R5/binary>> -> labels(skip_blank(R5), N, Acc1);
                        <<$}, R5/binary>> -> {Acc1, R5};
                        _ -> fail(expected_comma_or_brace, N)
                    end;
                _ -> fail(expected_quote, N)
            end;
        _ -> fail(expected_equals, N)
    end.

label_value(<<$", R/binary>>, _N, Acc) -> {utf8(Acc), R};
label_value(<<"\\\\", R/binary>>, N, Acc) -> label_value(R, N, <<Acc/binary, $\\>>);
label_value(<<"\\\"", R/binary>>, N, Acc) -> label_value(R, N, <<Acc/binary, $">>);
label_value(<<"\\n", R/binary>>, N, Acc) -> label_value(R, N, <<Acc/binary, $\n>>);
label_value(<<$\\, _/binary>>, N, _) -> fail(bad_escape, N);
label_value(<<C, R/binary>>, N, Acc) -> label_value(R, N, <<Acc/binary, C>>);
label_value(<<>>, N, _) -> fail(unterminated_label_value, N).

unescape_help(<<>>, _N, Acc) -> utf8(Acc);
unescape_help(<<"\\\\", R/binary>>, N, Acc) -> unescape_help(R, N, <<Acc/binary, $\\>>);
unescape_help(<<"\\n", R/binary>>, N, Acc) -> unescape_help(R, N, <<Acc/binary, $\n>>);
unescape_help(<<$\\, _/binary>>, N, _) -> fail(bad_escape, N);
unescape_help(<<C, R/binary>>, N, Acc) -> unescape_help(R, N, <<Acc/binary, C>>).

utf8(B) ->
    case unicode:characters_to_binary(B) of
        B -> B;
        _ -> error({prom, invalid_utf8, 0})
    end.

metric_name(<<C, _/binary>> = Text, _N)
  when C >= $a, C =< $z; C >= $A, C =< $Z; C =:= $_; C =:= $: ->
    name_chars(Text, true, <<>>);
metric_name(_, N) ->
    fail(bad_metric_name, N).

label_name(<<C, _/binary>> = Text, _N) when C >= $a, C =< $z; C >= $A, C =< $Z; C =:= $_ ->
    name_chars(Text, false, <<>>);
label_name(_, N) ->
    fail(bad_label_name, N).

name_chars(<<C, R/binary>>, Colon, Acc)
  when C >= $a, C =< $z; C >= $A, C =< $Z; C >= $0, C =< $9; C =:= $_; C =:= $:, Colon ->
    name_chars(R, Colon, <<Acc/binary, C>>);
name_chars(R, _, Acc) ->
    {Acc, R}.

%% Go's strconv.ParseFloat as the format uses it: NaN, +Inf, -Inf, or a
%% decimal with optional sign, fraction and exponent.
value(<<"NaN">>, _) -> nan;
value(<<"+Inf">>, _) -> infinity;
value(<<"-Inf">>, _) -> neg_infinity;
value(<<"Inf">>, _) -> infinity;
value(Text, N) ->
    {Sign, Unsigned} = case Text of
                           <<$-, R/binary>> -> {<<"-">>, R};
                           <<$+, R/binary>> -> {<<>>, R};
                           _ -> {<<>>, Text}
                       end,
    {Int, R1} = digits(Unsigned, <<>>),
    {Frac, R2} = case R1 of
                     <<$., AfterDot/binary>> -> digits(AfterDot, <<>>);
                     _ -> {none, R1}
                 end,
    {Exp, R3} = case R2 of
                    <<E, AfterE/binary>> when E =:= $e; E =:= $E ->
                        {ES, R4} = case AfterE of
                                       <<$-, R5/binary>> -> {<<"-">>, R5};
                                       <<$+, R5/binary>> -> {<<>>, R5};
                                       _ -> {<<>>, AfterE}
                                   end,
                        case digits(R4, <<>>) of
                            {<<>>, _} -> fail(bad_value, N);
                            {Ds, R6} -> {<<ES/binary, Ds/binary>>, R6}
                        end;
                    _ -> {none, R2}
                end,
    case {Int, Frac, Exp, R3} of
        {_, _, _, Trailing} when Trailing =/= <<>> -> fail(bad_value, N);
        {<<>>, none, _, _} -> fail(bad_value, N);
        {<<>>, <<>>, _, _} -> fail(bad_value, N);
        {_, none, none, _} -> binary_to_integer(<<Sign/binary, Int/binary>>);
        _ ->
            I = case Int of <<>> -> <<"0">>; _ -> Int end,
            F = case Frac of none -> <<"0">>; <<>> -> <<"0">>; _ -> Frac end,
            X = case Exp of none -> <<"0">>; _ -> Exp end,
            binary_to_float(<<Sign/binary, I/binary, ".", F/binary, "e", X/binary>>)
    end.

timestamp(Text, N) ->
    case string:to_integer(Text) of
        {T, <<>>} when is_integer(T) -> T;
        _ -> fail(bad_timestamp, N)
    end.

digits(<<C, R/binary>>, Acc) when C >= $0, C =< $9 -> digits(R, <<Acc/binary, C>>);
digits(R, Acc) -> {Acc, R}.

token(Text) ->
    token(Text, <<>>).
token(<<C, _/binary>> = R, Acc) when C =:= $\s; C =:= $\t -> {Acc, R};
token(<<C, R/binary>>, Acc) -> token(R, <<Acc/binary, C>>);
token(<<>>, Acc) -> {Acc, <<>>}.

skip_blank(<<C, R/binary>>) when C =:= $\s; C =:= $\t -> skip_blank(R);
skip_blank(B) -> B.

fail(Why, N) -> error({prom, Why, N}).
