%% The loading half of a test NIF's stub module (test/*_SUITE_data/):
%% define NIFS, the list of its NIF functions, then include this. They are
%% exported and declared -nifs once, from that one list; the shared object
%% beside the module's beam, named after the module, is loaded with it.
%% mi_ct:build_nif/2,3,4 builds both into priv_dir and passes this
%% directory with {i, _}. The stub module keeps its nif_error bodies.
-export(?NIFS).
-nifs(?NIFS).
-on_load(init/0).

init() ->
    erlang:load_nif(filename:join(filename:dirname(code:which(?MODULE)), ?MODULE_STRING), 0).
