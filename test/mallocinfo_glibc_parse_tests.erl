-module(mallocinfo_glibc_parse_tests).
-include_lib("eunit/include/eunit.hrl").

-define(STATS, <<"Arena 0:\n"
                 "system bytes     =     135168\n"
                 "in use bytes     =      74560\n"
                 "Arena 1:\n"
                 "system bytes     =     139264\n"
                 "in use bytes     =       3072\n"
                 "Total (incl. mmap):\n"
                 "system bytes     =    4468736\n"
                 "in use bytes     =    4271936\n"
                 "max mmap regions =          2\n"
                 "max mmap bytes   =    4325376\n"
                 "mmap regions     =          1\n"
                 "mmap bytes       =    4194304\n">>).

stats_test() ->
    ?assertEqual(
       #{arenas => [#{arena => 0, system_bytes => 135168, in_use_bytes => 74560},
                    #{arena => 1, system_bytes => 139264, in_use_bytes => 3072}],
         system_bytes => 135168 + 139264, in_use_bytes => 74560 + 3072,
         system_incl_mmap_bytes => 4468736, in_use_incl_mmap_bytes => 4271936,
         max_mmap_regions => 2, max_mmap_bytes => 4325376,
         mmap_regions => 1, mmap_bytes => 4194304},
       mallocinfo_glibc_parse:stats(?STATS)).

stats_ignores_stray_lines_test() ->
    Noisy = <<"some other thread wrote this\n", ?STATS/binary, "and = this\n">>,
    ?assertEqual(mallocinfo_glibc_parse:stats(?STATS), mallocinfo_glibc_parse:stats(Noisy)).

stats_missing_total_test() ->
    ?assertError({bad_stats, mmap_regions},
                 mallocinfo_glibc_parse:stats(<<"Arena 0:\nsystem bytes = 1\nin use bytes = 1\n"
                                          "Total (incl. mmap):\nsystem bytes = 1\n"
                                          "in use bytes = 1\n">>)).

-define(XML, <<"<malloc version=\"1\">\n"
               "<heap nr=\"0\">\n<sizes>\n"
               "<size from=\"17\" to=\"32\" total=\"64\" count=\"2\"/>\n"
               "<size from=\"1009\" to=\"1009\" total=\"1009\" count=\"1\"/>\n"
               "<unsorted from=\"400\" to=\"400\" total=\"400\" count=\"1\"/>\n"
               "</sizes>\n"
               "<total type=\"fast\" count=\"2\" size=\"64\"/>\n"
               "<total type=\"rest\" count=\"3\" size=\"5000\"/>\n"
               "<system type=\"current\" size=\"135168\"/>\n"
               "<system type=\"max\" size=\"200000\"/>\n"
               "<aspace type=\"total\" size=\"135168\"/>\n"
               "<aspace type=\"mprotect\" size=\"135168\"/>\n"
               "</heap>\n"
               "<heap nr=\"1\">\n<sizes>\n</sizes>\n"
               "<total type=\"fast\" count=\"0\" size=\"0\"/>\n"
               "<total type=\"rest\" count=\"1\" size=\"1000\"/>\n"
               "<system type=\"current\" size=\"4096\"/>\n"
               "<system type=\"max\" size=\"4096\"/>\n"
               "<aspace type=\"total\" size=\"4096\"/>\n"
               "<aspace type=\"mprotect\" size=\"4096\"/>\n"
               "<aspace type=\"subheaps\" size=\"1\"/>\n"
               "</heap>\n"
               "<total type=\"fast\" count=\"2\" size=\"64\"/>\n"
               "<total type=\"rest\" count=\"4\" size=\"6000\"/>\n"
               "<total type=\"mmap\" count=\"1\" size=\"4194304\"/>\n"
               "<system type=\"current\" size=\"139264\"/>\n"
               "<system type=\"max\" size=\"204096\"/>\n"
               "<aspace type=\"total\" size=\"139264\"/>\n"
               "<aspace type=\"mprotect\" size=\"139264\"/>\n"
               "</malloc>\n">>).

heaps_test() ->
    H = mallocinfo_glibc_parse:heaps(?XML),
    #{version := 1, heaps := [H0, H1], total := Total, system := System} = H,
    ?assertEqual(#{fast => #{count => 2, size => 64},
                   rest => #{count => 4, size => 6000},
                   mmap => #{count => 1, size => 4194304}}, Total),
    ?assertEqual(#{current => 139264, max => 204096}, System),
    ?assertEqual(6064, maps:get(free_bytes, H)),
    ?assertEqual(139264 - 6064, maps:get(in_use_bytes, H)),
    ?assertMatch(#{nr := 0,
                   sizes := [#{from := 17, to := 32, total := 64, count := 2},
                             #{from := 1009, to := 1009, total := 1009, count := 1}],
                   unsorted := [#{from := 400, count := 1}],
                   fast := #{count := 2, size := 64},
                   rest := #{count := 3, size := 5000},
                   system := #{current := 135168, max := 200000},
                   free_bytes := 5064,
                   in_use_bytes := 130104}, H0),
    ?assertMatch(#{nr := 1, sizes := [], aspace := #{subheaps := 1}}, H1).

%% malloc_stats() text of the heap ?XML describes: 135168 + 4096 bytes in
%% the arenas, 130104 + 3096 in use, one mmapped block of 4 MiB.
-define(SAME_HEAP_STATS, <<"Arena 0:\n"
                           "system bytes     =     135168\n"
                           "in use bytes     =     130104\n"
                           "Arena 1:\n"
                           "system bytes     =       4096\n"
                           "in use bytes     =       3096\n"
                           "Total (incl. mmap):\n"
                           "system bytes     =    4333568\n"
                           "in use bytes     =    4327504\n"
                           "max mmap regions =          1\n"
                           "max mmap bytes   =    4194304\n"
                           "mmap regions     =          1\n"
                           "mmap bytes       =    4194304\n">>).

%% One name, one meaning: heaps/1 and stats/1 of the same heap agree on
%% system_bytes (as heaps/1's system current) and in_use_bytes, in total
%% and per arena; only the _incl_mmap figures count the mmapped block.
same_heap_same_figures_test() ->
    H = mallocinfo_glibc_parse:heaps(?XML),
    S = mallocinfo_glibc_parse:stats(?SAME_HEAP_STATS),
    ?assertEqual(maps:get(in_use_bytes, H), maps:get(in_use_bytes, S)),
    ?assertEqual(maps:get(current, maps:get(system, H)), maps:get(system_bytes, S)),
    ?assertEqual([{N, U} || #{nr := N, in_use_bytes := U} <- maps:get(heaps, H)],
                 [{N, U} || #{arena := N, in_use_bytes := U} <- maps:get(arenas, S)]),
    #{mmap := #{size := Mmap}} = maps:get(total, H),
    ?assertEqual(maps:get(in_use_bytes, H) + Mmap, maps:get(in_use_incl_mmap_bytes, S)),
    ?assertEqual(maps:get(current, maps:get(system, H)) + Mmap,
                 maps:get(system_incl_mmap_bytes, S)).

%% glibc 2.43 has no fastbins: its malloc_info prints no <total
%% type="fast">, in a heap or in the totals; both read as zero.
heaps_without_fastbins_test() ->
    Xml = binary:replace(?XML, [<<"<total type=\"fast\" count=\"2\" size=\"64\"/>\n">>,
                                <<"<total type=\"fast\" count=\"0\" size=\"0\"/>\n">>],
                         <<>>, [global]),
    ?assertEqual(nomatch, binary:match(Xml, <<"fast">>)),
    #{heaps := [H0, _], total := Total, free_bytes := Free} = mallocinfo_glibc_parse:heaps(Xml),
    ?assertEqual(#{count => 0, size => 0}, maps:get(fast, Total)),
    ?assertEqual(#{count => 0, size => 0}, maps:get(fast, H0)),
    ?assertEqual(6000, Free).

heaps_rejects_other_xml_test() ->
    ?assertError({bad_xml, not_malloc_info}, mallocinfo_glibc_parse:heaps(<<"<foo/>">>)),
    ?assertError({bad_xml, _}, mallocinfo_glibc_parse:heaps(<<"<malloc version=\"1\">">>)).
