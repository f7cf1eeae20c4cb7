%% The heap dump format, version 1, in Erlang: the one Erlang copy of the
%% constants of c_src/heapwalk/dump_format.h (the C writer's contract; the
%% layout is explained there and, for operators, in doc/dump-format.md).
%% Included by the reader (mallocinfo_heapmap_read), the drawer
%% (mallocinfo_heapmap_draw, which reads chunk words) and the tests' writer
%% (test/mi_heapdump_writer.erl), so a change here reaches all three.
-ifndef(MALLOCINFO_HEAPDUMP_HRL).
-define(MALLOCINFO_HEAPDUMP_HRL, true).

%% The first 8 bytes of every dump; usable in binaries (<<?MAGIC>>).
-define(MAGIC, "MIHEAPD\n").
-define(VERSION, 1).
%% HEADER's alignment field: every chunk size is a multiple of it.
-define(ALIGNMENT, 16).
%% HEADER flags bit 0: the dump carries tracker data (sites, MMAP, SITE).
-define(FLAG_TRACKER, 1).
%% ARENA and SEGMENT flags bit 0: the main arena, its sbrk heap.
-define(FLAG_MAIN, 1).

%% Record tags.
-define(T_HEADER, 1).
-define(T_ARENA, 2).
-define(T_SEGMENT, 3).
-define(T_CHUNKS, 4).
-define(T_PAGES, 5).
-define(T_MMAP, 6).
-define(T_SITE, 7).
-define(T_END, 8).

%% Chunk kinds (bits 0-3 of a chunk word).
-define(K_IN_USE, 0).
-define(K_FREE, 1).
-define(K_FAST, 2).
-define(K_TCACHE, 3).
-define(K_TOP, 4).
-define(K_MMAP, 5).
-define(K_META, 6).

%% A chunk word: kind in bits 0-3, size in bits 4-47 (word band
%% ?SIZE_MASK), site id in bits 48-63.
-define(SIZE_MASK, 16#0000fffffffffff0).
-define(SITE_SHIFT, 48).
%% The site id of live blocks of sites beyond the dumped ones.
-define(SITE_OTHER, 65535).
%% Chunk words in one CHUNKS record, at most.
-define(MAX_CHUNKS_PER_RECORD, 65536).

-endif.
