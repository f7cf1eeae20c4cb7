# mallocinfo: the developer's entry points. Each target is one line of intent.
REBAR   ?= rebar3
EBIN    := _build/default/lib/mallocinfo/ebin
TARBALL := mallocinfo.tar.gz
export MALLOCINFO_TARBALL := $(CURDIR)/$(TARBALL)

.PHONY: deps build demo run test test-here test-short test-matrix test-elixir versions test-c test-san \
        eunit ct soak tarball bench fmt fmt-check lint docs clean

# Install missing Debian packages (docker/packages.sh: this release's names
# for docker/packages-short.txt and packages.txt); a no-op when all are
# present. DEPS=--short: only what the short matrix needs.
DEPS ?=
deps:
	@docker/install-deps.sh $(DEPS)

# Compile Erlang and (through rebar.config's pre_hook) the native code.
build: deps
	@$(REBAR) compile

# The demo workload (demo/: a NIF that leaks, fragments and keeps enif_alloc
# blocks on purpose, a bloated process): beams and NIF in _build/demo, never
# part of the application, its tarball or a release that depends on it.
DEMO_DIR := $(CURDIR)/_build/demo
demo: build
	@rm -f priv/mallocinfo_demo_nif.so  # where 0.1.0 built it: never ship it
	@mkdir -p $(DEMO_DIR)
	@$(MAKE) -s -C c_src demo DEMO_DIR=$(DEMO_DIR)
	@erlc +warnings_as_errors +debug_info -pa $(EBIN) -o $(DEMO_DIR) demo/*.erl

# The project's main job on its demo: start a node with the interposer
# preloaded, run the demo workload, print mallocinfo:report(), write
# malloc_info.xml and the heap map into ./mallocinfo-demo/, then leave a
# shell (none when stdin is not a terminal).
PRELOAD  := $(CURDIR)/priv/libmallocinfo_preload.so
RUN_EVAL := mallocinfo_demo:make_run("mallocinfo-demo")
run: demo
	@if [ -t 0 ]; then LD_PRELOAD=$(PRELOAD) erl -pa $(EBIN) $(DEMO_DIR) -eval '$(RUN_EVAL).'; \
	else LD_PRELOAD=$(PRELOAD) erl -noshell -pa $(EBIN) $(DEMO_DIR) -eval '$(RUN_EVAL), halt().'; fi

# Everything on this machine (formatting, xref and dialyzer, Catch2, the
# interposer's smoke and stress tests, EUnit, Common Test but the Elixir
# suite), and meanwhile, in the background, the short matrix on Debian 13
# and unstable roots (scripts/matrix.sh: their roots are built, then each
# runs make test-short), whose output follows this machine's, with its
# "N passed, N failed" as the last line. Inside a matrix root
# (MALLOCINFO_IN_MATRIX set) only this machine's part runs.
MATRIX_SHORT := trixie sid
MATRIX_FULL  := bookworm trixie sid
test:
ifeq ($(MALLOCINFO_IN_MATRIX),)
	@$(MAKE) -s deps
	@scripts/matrix.sh start short $(MATRIX_SHORT)
	@$(MAKE) -s test-here || { scripts/matrix.sh stop; exit 1; }
	@scripts/matrix.sh wait
else
	@$(MAKE) -s test-here
endif

test-here: versions build fmt-check lint tarball test-c eunit ct

# The glibc, OTP, Elixir (when there is one) and compiler this runs on
# (first line of each matrix log).
versions:
	@printf 'glibc %s, OTP %s, %s%s\n' "$$(getconf GNU_LIBC_VERSION | cut -d' ' -f2)" \
	  "$$(erl -noshell -eval 'io:put_chars(erlang:system_info(otp_release)), halt().')" \
	  "$$(command -v elixir >/dev/null && elixir --version | sed -n 's/^\(Elixir [0-9.]*\).*/\1, /p')" \
	  "$$($${CXX:-g++} --version | head -1)"

# What the short matrix runs in each root: the build with warnings as
# errors (C++ -Werror through CI=true, Erlang through the test profile),
# EUnit, and the Common Test suites that read glibc and the VM's insides.
SHORT_SUITES := test/mallocinfo_context_SUITE,test/mallocinfo_trace_SUITE,test/mallocinfo_attach_SUITE,test/mallocinfo_heap_SUITE,test/mallocinfo_report_SUITE
# A VM that gets SIGTERM stops cleanly and exits 0, so each run must also
# have printed its summary (the matrix once saw a CT run end that way);
# a failed test leaves no such line either.
test-short: versions demo
	@$(REBAR) as test compile
	@$(REBAR) eunit | tee _build/eunit-short.log
	@sed 's/\x1b\[[0-9;]*m//g' _build/eunit-short.log | grep -q '^ *All [0-9]* tests passed'
	@$(REBAR) ct --suite=$(SHORT_SUITES) | tee _build/ct-short.log
	@sed 's/\x1b\[[0-9;]*m//g' _build/ct-short.log | grep -q '^All [0-9]* tests passed'

# The whole make test on Debian 12, 13 and unstable, each in its own root
# (built once, cached outside the clone), plus what make test leaves to it:
# the sanitizer builds and the Elixir suite. See TESTING.md.
test-matrix:
	@scripts/matrix.sh full $(MATRIX_FULL)

test-c: deps
	@$(MAKE) -s -C c_src -j$(shell nproc) test-bins
	@$(MAKE) -s -C c_src test test-preload test-attach

# The Catch2 tests under ASan+UBSan and TSan (make soak and make test-matrix).
test-san: deps
	@$(MAKE) -s -C c_src -j$(shell nproc) san-bins
	@$(MAKE) -s -C c_src test-san

eunit: demo
	@$(REBAR) eunit

# Every Common Test suite but the Elixir one (make test-elixir), which
# make test-matrix runs on each release.
CT_SUITES := $(shell ls test/*_SUITE.erl | grep -v elixir | paste -sd, -)
ct: demo tarball
	@$(REBAR) ct --suite=$(CT_SUITES)

# mallocinfo as a Mix dependency, its mix release with the tracker
# preloaded and an iex session (doc/elixir.md; make test-matrix, and alone
# in the matrix's roots: scripts/matrix.sh elixir SUITE...).
test-elixir: demo tarball
	@$(REBAR) ct --suite=test/mallocinfo_elixir_SUITE

# Liveness under load for a minute (issue 15; `make test` runs each for less):
# threads allocating inside dl_iterate_phdr callbacks and from new call sites
# under the interposer, 5000 forked children of an attached process calling
# dlopen, then a preloaded node answering every query during an allocation
# storm, with a watchdog; then the Catch2 tests under ASan+UBSan and TSan
# (make test-san), which make test leaves to make soak and make test-matrix.
soak: build
	@$(MAKE) -s -C c_src stress-bin
	@LD_PRELOAD=$(PRELOAD) MALLOCINFO_TRACE_EXE=stress_loader_lock c_src/build/stress_loader_lock 60
	@c_src/build/stress_fork_dlopen 5000
	@MALLOCINFO_STRESS_SECONDS=60 $(REBAR) ct --suite=test/mallocinfo_stress_SUITE
	@$(MAKE) -s test-san

# Tracker overhead side by side with glibc and heaptrack, then the heap map's
# dump and render of a 1 GB fragmented heap; results go to BENCHMARKS.md.
bench: demo
	@c_src/bench/run.sh
	@c_src/bench/heapmap.sh
	@c_src/bench/sampler.sh
	@c_src/bench/context.sh
	@c_src/bench/churn.sh

# ebin + priv as real files, for hosts with no compiler: untar anywhere, code:add_path/1.
# priv/mallocinfo-heapmap (the offline renderer escript) travels with it.
tarball: build
	@rm -rf _build/tarball && mkdir -p _build/tarball/mallocinfo
	@cp -rL $(EBIN) _build/tarball/mallocinfo/ebin
	@mkdir -p _build/tarball/mallocinfo/priv && cp -L priv/mallocinfo_nif.so priv/libmallocinfo_preload.so priv/mallocinfo-heapmap _build/tarball/mallocinfo/priv/
	@tar -C _build/tarball -czf $(TARBALL) mallocinfo
	@echo "tarball: $(TARBALL)"

FMT_FILES = $(shell find c_src -path c_src/build -prune -o \( -name '*.cpp' -o -name '*.h' \) -print)
fmt:
	@clang-format -i $(FMT_FILES)

# The tree is formatted by Debian 12's clang-format 14; 19 and 21 (Debian
# 13, unstable) lay out a few constructs differently, so there the check
# says it is not this version and passes: Debian 12 machines and the
# matrix's bookworm root check the format.
FMT_MAJOR := 14
fmt-check: deps
	@! grep -ln 'include <catch2/' c_src/test/*.cpp || \
	  { echo "fmt-check: include Catch2 through c_src/test/catch.h (version 2 and 3)"; exit 1; }
	@v=$$(clang-format --version | sed -n 's/.*version \([0-9]*\).*/\1/p'); \
	if [ "$$v" = $(FMT_MAJOR) ]; then clang-format --dry-run --Werror $(FMT_FILES); \
	else echo "fmt-check: clang-format $$v is not $(FMT_MAJOR), which the tree follows: not checked here"; fi

# Static checks of the Erlang side: xref (undefined calls, unused locals,
# deprecated calls) and dialyzer, both clean; the module graph without a
# circle (no module calls up into its callers).
lint: build
	@$(REBAR) as lint xref
	@$(REBAR) as lint dialyzer
	@escript scripts/module_graph.escript _build/lint/lib/mallocinfo/ebin

# Module reference from the public modules' @doc (OTP's edoc), into
# _build/docs, opening on doc/overview.edoc; the guides and the top-level
# Markdown files are copied beside it, as they sit in the tree (so their
# links between each other hold), and every link is checked.
DOCS := _build/docs
docs: build
	@$(REBAR) edoc
	@mkdir -p $(DOCS)/doc $(DOCS)/c_src/heapwalk
	@cp README.md TESTING.md BENCHMARKS.md CHANGELOG.md $(DOCS)/
	@cp -r doc/*.md doc/*.png doc/img $(DOCS)/doc/
	@cp c_src/heapwalk/dump_format.h $(DOCS)/c_src/heapwalk/
	@escript scripts/docs_links.escript $(DOCS)

clean:
	@$(REBAR) clean -a >/dev/null 2>&1 || true
	@$(MAKE) -s -C c_src clean
	@rm -rf _build $(TARBALL) mallocinfo-demo
