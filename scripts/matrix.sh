#!/usr/bin/env bash
# mallocinfo's tests on other Debian releases, each in a root built from
# Debian's archive with mmdebstrap, run under bubblewrap.
#
#   scripts/matrix.sh short SUITE...   make test's short matrix: the build
#                                      with warnings as errors, EUnit, and the
#                                      tracker, attach, heap-map and report
#                                      Common Test suites (make test-short)
#   scripts/matrix.sh full SUITE...    make test-matrix: the whole make test,
#                                      the sanitizer builds (make test-san) and
#                                      the Elixir suite (make test-elixir)
#   scripts/matrix.sh elixir SUITE...  only the Elixir suite (make test-elixir:
#                                      the Mix dependency, mix release with the
#                                      preloaded tracker, iex), in the full roots
#   scripts/matrix.sh start short|full|elixir SUITE...
#                                      the same in the background (make test
#                                      runs its short matrix beside its own
#                                      tests); its output in <log dir>/<flavour>.out
#   scripts/matrix.sh wait             print a started run's output once it is
#                                      done, and exit with its status
#   scripts/matrix.sh stop             end a started run (its process group)
#   scripts/matrix.sh root short|full SUITE
#                                      only build (or find) the root; prints it
#   scripts/matrix.sh prefetch short|full SUITE...
#                                      start building the missing roots in the
#                                      background (niced) and return at once:
#                                      make test does this first, so that the
#                                      roots are ready when its matrix starts
#
# SUITE: bookworm (Debian 12), trixie (13), sid (unstable). Each root holds
# the packages docker/packages.sh lists for its release, and is built once
# and kept in $MALLOCINFO_MATRIX_CACHE (default /var/cache/mallocinfo-
# matrix), outside the clone, as <suite>-<flavour>-<hash of its package
# list>: a changed list builds a new root. A short run uses the full root
# when there is one. Suites run one after the other; their output goes to
# <log dir>/<suite>.log ($MALLOCINFO_MATRIX_LOGS, default _build/matrix),
# of which the tail is printed on failure.
#
# A run never changes its root: the tree (tracked and unignored files, as
# they are in the work tree: a clean copy without build products) is
# copied to a scratch directory bound at /build; /tmp, /root, /run and
# /var/tmp are fresh tmpfs; the run has its own PID, network (loopback
# only), IPC and UTS namespaces, so nothing it starts (epmd, peers,
# daemons) outlives it or meets the host's. bubblewrap's mounts live in
# its own mount namespace and vanish with it, also on failure; the trap
# removes the scratch copy. Needs root (mmdebstrap, bwrap --cap-add): run
# as another user, it runs itself through sudo.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${MALLOCINFO_MATRIX_CACHE:-/var/cache/mallocinfo-matrix}
logs=${MALLOCINFO_MATRIX_LOGS:-$here/_build/matrix}
mirror=${MALLOCINFO_MATRIX_MIRROR:-http://deb.debian.org/debian}

die() { echo "matrix: $*" >&2; exit 1; }

package_list() {  # flavour suite
  if [ "$1" = short ]; then "$here/docker/packages.sh" --short "$2"; else "$here/docker/packages.sh" "$2"; fi
}

root_dir() {  # flavour suite: where that root is (built or not)
  local hash
  hash=$( (echo "$2"; package_list "$1" "$2") | sha256sum | cut -c1-12)
  echo "$cache/$2-$1-$hash"
}

# Builds the root of `flavour` for `suite` unless it is there; prints its
# directory. Concurrent callers wait for one build (flock); a failed or
# interrupted build leaves only its .tmp directory, removed by the next.
build_root() {  # flavour suite
  local flavour=$1 suite=$2 dir full
  if [ "$flavour" = short ]; then
    full=$(root_dir full "$suite")
    [ -d "$full" ] && { echo "$full"; return 0; }
  fi
  dir=$(root_dir "$flavour" "$suite")
  [ -d "$dir" ] && { echo "$dir"; return 0; }
  mkdir -p "$cache"
  (
    flock 9
    [ -d "$dir" ] && exit 0
    rm -rf "$dir.tmp"
    local opts=(--variant=apt --include="$(package_list "$flavour" "$suite" | paste -sd, -)")
    # unstable's Release file may be past its Valid-Until on a mirror
    # snapshot; its signature is still checked.
    [ "$suite" = sid ] && opts+=(--aptopt='Acquire::Check-Valid-Until "false"')
    local start=$SECONDS
    echo "matrix: building the $suite root ($flavour) in $dir" >&2
    if ! nice -n 10 mmdebstrap "${opts[@]}" "$suite" "$dir.tmp" "deb $mirror $suite main" >"$dir.log" 2>&1; then
      tail -n 30 "$dir.log" >&2
      rm -rf "$dir.tmp"
      exit 1
    fi
    echo "$((SECONDS - start))" >"$dir.tmp/.mallocinfo-build-seconds"
    mv "$dir.tmp" "$dir"
    echo "matrix: $suite root ($flavour) built in $((SECONDS - start)) s" >&2
  ) 9>"$dir.lock" || die "could not build the $suite root"
  echo "$dir"
}

# Runs `make TARGET...` in a clean copy of the tree inside `root`.
run_in_root() {  # suite root target...
  local suite=$1 root=$2
  shift 2
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/mallocinfo-matrix.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  mkdir "$work/src"
  if git -C "$here" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$here" && git ls-files -z --cached --others --exclude-standard |
      tar --null --files-from=- -cf -) | tar -C "$work/src" -xf -
  else  # an unpacked source tree: everything but what a build makes
    tar -C "$here" --exclude=./_build --exclude=./c_src/build --exclude='./priv/*.so' \
      --exclude=./priv/mallocinfo-heapmap --exclude=./mallocinfo.tar.gz -cf - . | tar -C "$work/src" -xf -
  fi
  printf '127.0.0.1 localhost mallocinfo-%s\n::1 localhost\n' "$suite" >"$work/hosts"
  bwrap --bind "$root" / --bind "$work/src" /build --ro-bind "$work/hosts" /etc/hosts \
    --proc /proc --dev /dev --bind /sys /sys \
    --tmpfs /tmp --tmpfs /root --tmpfs /run --tmpfs /var/tmp \
    --unshare-pid --unshare-net --unshare-ipc --unshare-uts --hostname "mallocinfo-$suite" \
    --die-with-parent --cap-add ALL --chdir /build --clearenv \
    --setenv PATH /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --setenv HOME /root --setenv LANG C.UTF-8 --setenv CI true --setenv MALLOCINFO_IN_MATRIX "$suite" \
    make "$@"
  local rc=$?
  rm -rf "$work"
  trap - EXIT
  return $rc
}

if [ "$(id -u)" -ne 0 ]; then
  # mmdebstrap builds the roots as root, and bwrap needs it for mknod and
  # the namespaces: through sudo, as make deps does.
  command -v sudo >/dev/null 2>&1 || die "needs root or sudo (mmdebstrap builds the roots, bwrap runs them)"
  exec sudo --preserve-env=MALLOCINFO_MATRIX_CACHE,MALLOCINFO_MATRIX_LOGS,MALLOCINFO_MATRIX_MIRROR "$0" "$@"
fi
usage="usage: $0 short|full|elixir SUITE... | $0 start short|full|elixir SUITE... | $0 prefetch short|full SUITE... | $0 wait|stop | $0 root short|full SUITE"
case ${1:-} in
  short | full | elixir) [ $# -ge 2 ] || die "$usage" ;;
  start | prefetch) [ $# -ge 3 ] || die "$usage" ;;
  root) [ $# -eq 3 ] || die "$usage" ;;
  wait | stop) ;;
  *) die "$usage" ;;
esac
case $1 in
  root)
    build_root "$2" "$3"
    exit 0
    ;;
  prefetch)
    mkdir -p "$cache"
    for suite in "${@:3}"; do
      [ -d "$(root_dir "$2" "$suite")" ] && continue
      [ "$2" = short ] && [ -d "$(root_dir full "$suite")" ] && continue
      setsid "$0" root "$2" "$suite" >"$cache/$suite-$2.prefetch.log" 2>&1 </dev/null &
    done
    exit 0
    ;;
  start)
    mkdir -p "$logs"
    rm -f "$logs/run.rc" "$logs/run.out"
    setsid bash -c 'out=$1; shift; "$0" "$@" >"$out.out" 2>&1; echo $? >"$out.rc"' \
      "$0" "$logs/run" "${@:2}" \
      </dev/null >/dev/null 2>&1 &
    echo $! >"$logs/run.pid"
    exit 0
    ;;
  wait)
    while [ ! -f "$logs/run.rc" ]; do
      kill -0 "$(cat "$logs/run.pid")" 2>/dev/null || break
      sleep 2
    done
    cat "$logs/run.out"
    exit "$(cat "$logs/run.rc" 2>/dev/null || echo 1)"
    ;;
  stop)
    [ -f "$logs/run.pid" ] && kill -- -"$(cat "$logs/run.pid")" 2>/dev/null
    exit 0
    ;;
  short) target=(test-short DEPS=--short) ;;
  full) target=(test test-san test-elixir) ;;
  elixir) target=(versions test-elixir) ;;  # in the full root: elixir, tmux
  *) die "unknown flavour $1" ;;
esac
name=$1
flavour=$1
[ "$flavour" = elixir ] && flavour=full
shift
mkdir -p "$logs"
# The roots of the later suites build while the first one's run.
[ $# -gt 1 ] && "$0" prefetch "$flavour" "${@:2}"
failed=()
for suite in "$@"; do
  start=$SECONDS
  root=$(build_root "$flavour" "$suite")
  log="$logs/$suite.log"
  if run_in_root "$suite" "$root" "${target[@]}" >"$log" 2>&1; then
    echo "matrix: $suite ($name) passed in $((SECONDS - start)) s: $(grep -o 'glibc [0-9.]*, OTP [0-9]*\(, Elixir [0-9.]*\)\?' "$log" | head -1)"
  else
    echo "matrix: $suite ($name) FAILED after $((SECONDS - start)) s; the end of $log:" >&2
    tail -n 40 "$log" >&2
    failed+=("$suite")
  fi
done
echo "matrix: $(($# - ${#failed[@]})) passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ] || die "failed on: ${failed[*]}"
