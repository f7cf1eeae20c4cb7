%% Units and addresses shared by the report's EUnit tests and their
%% canned data (mi_report_data).
-define(KiB, 1024).
-define(MiB, (1024 * 1024)).
%% mi_report_data:smaps/0 places its anonymous mappings in 64 MiB windows
%% (glibc's heap size) above this base: window N starts at ?H + N * ?W.
-define(H, 16#7f0000000000).
-define(W, (64 * ?MiB)).
