%% @deprecated Renamed {@link mallocinfo_process} in 0.2.0 (the name read
%% like `/proc', but the module is about Erlang processes). Every function
%% here calls the one of the same name there; `inspect_heap/1,2' keep
%% 0.1.0's result (the list, not `{ok, List}'), so code written for this
%% name works unchanged. This module goes in 0.3.0.
%% @doc The old name of {@link mallocinfo_process}, kept for one release.
-module(mallocinfo_proc).

-deprecated([{'_', '_', "use mallocinfo_process, the same functions under the new name"}]).

-export([inspect_heap/1, inspect_heap/2, inspect/2, heap/1, heap/2, top/2, print/1, print/2]).

-export_type([opts/0, item/0, gap/0]).

-type opts() :: mallocinfo_process:opts().
-type item() :: mallocinfo_process:item().
-type gap() :: mallocinfo_process:gap().

%% @doc {@link mallocinfo_process:inspect_heap/1}'s terms, as 0.1.0 returned
%% them: the list itself, or `{error, Reason}'.
inspect_heap(Pid) -> list_or_error(mallocinfo_process:inspect_heap(Pid)).
%% @doc {@link mallocinfo_process:inspect_heap/2}'s terms, as 0.1.0 returned
%% them.
inspect_heap(Pid, Opts) -> list_or_error(mallocinfo_process:inspect_heap(Pid, Opts)).
%% @equiv mallocinfo_process:inspect(Pid, Opts)
inspect(Pid, Opts) -> mallocinfo_process:inspect(Pid, Opts).
%% @equiv mallocinfo_process:heap(Pid)
heap(Pid) -> mallocinfo_process:heap(Pid).
%% @equiv mallocinfo_process:heap(Pid, Opts)
heap(Pid, Opts) -> mallocinfo_process:heap(Pid, Opts).
%% @equiv mallocinfo_process:top(N, By)
top(N, By) -> mallocinfo_process:top(N, By).
%% @equiv mallocinfo_process:print(Pid)
print(Pid) -> mallocinfo_process:print(Pid).
%% @equiv mallocinfo_process:print(Pid, Opts)
print(Pid, Opts) -> mallocinfo_process:print(Pid, Opts).

list_or_error({ok, Terms}) -> Terms;
list_or_error({error, _} = E) -> E.
