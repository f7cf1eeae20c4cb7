%% @doc Reads heap dumps (`c_src/heapwalk/dump_format.h') and draws them.
%%
%% {@link read_summary/1} computes the per-arena figures of a dump in one
%% streaming pass; {@link render/2} writes PNG heap maps and an `index.html'
%% beside them. Pure Erlang (OTP's `zlib' and `erlang:crc32/1' for PNG), so
%% the `mallocinfo-heapmap' escript does the same offline on any machine
%% with Erlang.
%%
%% A dump can hold tens of millions of chunks: it is read record by record
%% and nothing proportional to the number of chunks is kept. Everything in
%% the file is checked before anything is drawn: magic, version, record
%% order and lengths, chunks covering each segment exactly, the top chunk,
%% PAGES geometry, site ids, END counts, nothing after END. A bad file
%% gives `{error, {bad_dump, Why}}' and leaves no output.
%%
%% A dump's summary has the keys of the live one (its types are
%% `mallocinfo_heap:arena_summary()' and `mallocinfo_heap:totals()'), so
%% the two can be compared key for key.
-module(mallocinfo_heapmap).

%% The work is done by internal modules, one concern each:
%% mallocinfo_heapmap_read (the reader and its checks, the summary),
%% mallocinfo_heapmap_draw (the PNGs), mallocinfo_heapmap_html (the page)
%% and mallocinfo_file (writing a set of files all or nothing).

-export([read_summary/1, render/2, format_summary/1, format_header/1]).
%% For the escript: render/2 plus what it read.
-export([render_report/2]).

-export_type([summary/0, arena_summary/0, totals/0, bad_dump/0, header/0]).

%% One arena's figures: the same type as the live summary's.
-type arena_summary() :: mallocinfo_heapmap_summary:arena_summary().
%% The arenas summed: the live summary's type; a dump's has
%% `tracked_mmap_bytes' and `tracked_mmap_chunks' but not `mmap_bytes' and
%% `mmap_chunks' (glibc's count, which the file does not hold).
-type totals() :: mallocinfo_heapmap_summary:totals().
-type summary() :: #{arenas := [arena_summary()], total := totals()}.
%% What HEADER says, for reports.
-type header() :: #{pid := non_neg_integer(), time_ms := non_neg_integer(),
                    glibc := binary(), page_size := pos_integer(),
                    heap_max := pos_integer(), tracker := boolean()}.
%% Why a dump was refused: a short atom, or an atom and where.
-type bad_dump() :: atom() | {atom(), term()}.

%%% ---------------------------------------------------------------------------
%%% API

%% @doc The summary of a heap dump, computed exactly as `mallocinfo_heap'
%% documents it: per arena (`arenas', in dump order) and in total. Runtime
%% conditions: `{error, Posix}' when the file cannot be read (`enoent',
%% `eacces', `eisdir', ...; `eftype' when it is a FIFO, a device or a
%% socket: only a regular file is read, symbolic links followed),
%% `{error, {bad_dump, Why}}' when it is not a
%% complete, self-consistent version 1 dump. A path that is not a file name
%% raises `badarg'.
-spec read_summary(file:name_all()) ->
          {ok, summary()} | {error, file:posix() | {bad_dump, bad_dump()}}.
read_summary(DumpPath) ->
    case mallocinfo_heapmap_read:read(mallocinfo_lib:path_name(DumpPath, [DumpPath])) of
        {ok, #{summary := Summary}} -> {ok, Summary};
        {error, _} = E -> E
    end.

%% @doc Draws a heap dump into `OutDir' (created with its parents when
%% missing): `index.html' (header, per-arena table, legend, call sites, one
%% heap map per segment) and the PNGs it shows, `arena<A>-seg<S>.png' and,
%% when the tracker saw mmapped blocks, `mmap.png'. Returns the files
%% written, `index.html' first. The dump is validated completely before
%% anything is written; files are written under temporary names, synced and
%% renamed at the end, so a failure leaves nothing new behind. A file of the
%% same name already in `OutDir' is replaced only when it is a regular
%% file: when one of the names is a directory the answer is
%% `{error, eisdir}', when it is anything else (a symbolic link, which is
%% never followed, a device, a FIFO, a socket) `{error, eexist}', and
%% nothing is drawn or touched. Errors as {@link read_summary/1}, plus
%% `{error, Posix}' for `OutDir' (`enotdir' when it is a file, `eacces',
%% `enoent', `enospc', ...).
-spec render(file:name_all(), file:name_all()) ->
          {ok, [file:filename_all()]} | {error, file:posix() | {bad_dump, bad_dump()}}.
render(DumpPath, OutDir) ->
    case render_report(DumpPath, OutDir) of
        {ok, Files, _Summary, _Header} -> {ok, Files};
        {error, _} = E -> E
    end.

%% @private render/2, also returning what the dump said (for the escript).
-spec render_report(file:name_all(), file:name_all()) ->
          {ok, [file:filename_all()], summary(), header()}
        | {error, file:posix() | {bad_dump, bad_dump()}}.
render_report(DumpPath0, OutDir0) ->
    Args = [DumpPath0, OutDir0],
    DumpPath = mallocinfo_lib:path_name(DumpPath0, Args),
    OutDir = mallocinfo_lib:path_name(OutDir0, Args),
    case mallocinfo_heapmap_read:read(DumpPath) of
        {ok, #{summary := Summary, header := Header} = Dump} ->
            case write_maps(DumpPath, OutDir, Dump) of
                {ok, Files} -> {ok, Files, Summary, Header};
                {error, _} = E -> E
            end;
        {error, _} = E ->
            E
    end.

%% The pictures, then the page that shows them; index.html is named first
%% so that it is renamed into place last: when it is there, so are its
%% images.
write_maps(DumpPath, OutDir, Dump) ->
    Images = mallocinfo_heapmap_draw:plan(Dump),
    Names = ["index.html" | [File || #{file := File} <- Images]],
    try
        mallocinfo_file:write_all(
          OutDir, Names,
          fun(TempOf) ->
                  mallocinfo_heapmap_draw:draw(DumpPath, Dump, Images, TempOf),
                  mallocinfo_file:write_file(TempOf("index.html"),
                                             mallocinfo_heapmap_html:page(Dump, Images))
          end)
    catch
        %% The dump changed between the two passes (write_all/3 has
        %% removed what was written).
        throw:{bad_dump, _} = Why -> {error, Why}
    end.

%% @doc A summary as a few lines of text (what the escript prints): one line
%% per arena, the largest 16 by system bytes, then the totals.
-spec format_summary(summary()) -> iodata().
format_summary(S) ->
    valid_summary(S) orelse erlang:error(badarg, [S]),
    summary_text(S).

summary_text(#{arenas := Arenas, total := T}) ->
    Cols = "~-7s ~10s ~10s ~10s ~10s ~10s ~10s ~10s ~9s~n",
    Head = io_lib:format(Cols, ["arena", "system", "in use", "free", "resident",
                                "trimmable", "pinned", "largest", "free#"]),
    Line = fun(Name, M) ->
                   io_lib:format(Cols, [Name | [mallocinfo_units:bytes(maps:get(K, M))
                                                || K <- [system_bytes, in_use_bytes, free_bytes,
                                                         resident_bytes, trimmable_bytes,
                                                         pinned_bytes, largest_free]]]
                                 ++ [integer_to_list(maps:get(free_chunks, M))])
           end,
    Sorted = lists:sublist(lists:reverse(lists:keysort(1, [{maps:get(system_bytes, A), A}
                                                            || A <- Arenas])), 16),
    More = case length(Arenas) - length(Sorted) of
               0 -> [];
               N -> io_lib:format("... ~b smaller arenas~n", [N])
           end,
    Mmap = case T of
               #{tracked_mmap_chunks := 0} -> [];
               #{tracked_mmap_chunks := MC, tracked_mmap_bytes := MB} ->
                   io_lib:format("mmapped blocks seen by the tracker: ~b, ~s~n", [MC, mallocinfo_units:bytes(MB)]);
               #{} -> []
           end,
    Live = case T of
               #{live_bytes := LB, live_chunks := LC, unrecorded_bytes := UB} ->
                   io_lib:format("live (tracked) ~s in ~b chunks, in use but not tracked ~s~n",
                                 [mallocinfo_units:bytes(LB), LC, mallocinfo_units:bytes(UB)]);
               #{} -> []
           end,
    [Head, [Line(integer_to_list(maps:get(arena, A)), A) || {_, A} <- Sorted], More,
     Line("total", T),
     io_lib:format("~b arenas, ~b chunks~n", [maps:get(arena_count, T), maps:get(chunks, T)]),
     Mmap, Live].

%% What summary_text/1 reads, checked first so that anything else is a
%% badarg rather than a crash halfway through the text.
valid_summary(#{arenas := Arenas, total := T}) ->
    Counters = [system_bytes, in_use_bytes, free_bytes, resident_bytes, trimmable_bytes,
                pinned_bytes, largest_free, free_chunks],
    proper_list(Arenas)
        andalso lists:all(fun(A) -> counters(A, [arena | Counters]) end, Arenas)
        andalso counters(T, [arena_count, chunks | Counters])
        andalso all_or_none(T, [tracked_mmap_chunks, tracked_mmap_bytes])
        andalso all_or_none(T, [live_bytes, live_chunks, unrecorded_bytes]);
valid_summary(_) ->
    false.

counters(M, Keys) ->
    is_map(M) andalso
        lists:all(fun(K) -> case M of
                                #{K := V} -> is_integer(V) andalso V >= 0;
                                #{} -> false
                            end
                  end, Keys).

all_or_none(M, Keys) ->
    case [K || K <- Keys, maps:is_key(K, M)] of
        [] -> true;
        Keys -> counters(M, Keys);
        _ -> false
    end.

proper_list([]) -> true;
proper_list([_ | T]) -> proper_list(T);
proper_list(_) -> false.

%% @doc What a dump's HEADER says, as one line of text. Anything but a
%% header map (as {@link render_report/2} returns it) raises `badarg'.
-spec format_header(header()) -> iodata().
format_header(#{pid := Pid, time_ms := T, glibc := G, page_size := PS, tracker := Tr} = H)
  when is_integer(Pid), Pid >= 0, is_integer(T), T >= 0, is_integer(PS), PS > 0,
       is_boolean(Tr), is_binary(G) orelse is_list(G) ->
    is_binary(G) orelse io_lib:char_list(G) orelse erlang:error(badarg, [H]),
    %% The glibc version is the dump's text: any bytes, shown escaped.
    io_lib:format("heap of pid ~b dumped ~s, glibc ~ts, page ~s~s~n",
                  [Pid, mallocinfo_units:utc(T), mallocinfo_text:name(G),
                   mallocinfo_units:bytes(PS),
                   case Tr of true -> ", with tracker data"; false -> "" end]);
format_header(H) ->
    erlang:error(badarg, [H]).
