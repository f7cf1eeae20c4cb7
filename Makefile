# mallocinfo: the developer's entry points. Each target is one line of intent.
REBAR   ?= rebar3
EBIN    := _build/default/lib/mallocinfo/ebin
TARBALL := mallocinfo.tar.gz
export MALLOCINFO_TARBALL := $(CURDIR)/$(TARBALL)

.PHONY: deps build demo run test test-c eunit ct soak tarball bench fmt fmt-check lint docs clean

# Install missing Debian packages (docker/packages.txt); a no-op when all are present.
deps:
	@docker/install-deps.sh

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

# Everything: formatting, xref and dialyzer, Catch2, EUnit, Common Test (release injection). CT's summary is the last line.
test: build fmt-check lint tarball test-c eunit ct

test-c: deps
	@$(MAKE) -s -C c_src -j$(shell nproc) test-bins
	@$(MAKE) -s -C c_src test test-san test-preload test-attach

eunit: demo
	@$(REBAR) eunit

ct: demo tarball
	@$(REBAR) ct

# Liveness under load for a minute (issue 15; `make test` runs each for less):
# threads allocating inside dl_iterate_phdr callbacks and from new call sites
# under the interposer, 5000 forked children of an attached process calling
# dlopen, then a preloaded node answering every query during an allocation
# storm, with a watchdog.
soak: build
	@$(MAKE) -s -C c_src stress-bin
	@LD_PRELOAD=$(PRELOAD) MALLOCINFO_TRACE_EXE=stress_loader_lock c_src/build/stress_loader_lock 60
	@c_src/build/stress_fork_dlopen 5000
	@MALLOCINFO_STRESS_SECONDS=60 $(REBAR) ct --suite=test/mallocinfo_stress_SUITE

# Tracker overhead side by side with glibc and heaptrack, then the heap map's
# dump and render of a 1 GB fragmented heap; results go to BENCHMARKS.md.
bench: demo
	@c_src/bench/run.sh
	@c_src/bench/heapmap.sh

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

fmt-check: deps
	@clang-format --dry-run --Werror $(FMT_FILES)

# Static checks of the Erlang side: xref (undefined calls, unused locals,
# deprecated calls) and dialyzer, both clean; the module graph without a
# circle (no module calls up into its callers).
lint: build
	@$(REBAR) as lint xref
	@$(REBAR) as lint dialyzer
	@escript scripts/module_graph.escript _build/lint/lib/mallocinfo/ebin

# Module reference from the public modules' @doc (OTP's edoc), into _build/docs.
docs: build
	@$(REBAR) edoc

clean:
	@$(REBAR) clean -a >/dev/null 2>&1 || true
	@$(MAKE) -s -C c_src clean
	@rm -rf _build $(TARBALL) mallocinfo-demo
