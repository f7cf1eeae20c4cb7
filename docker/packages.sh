#!/bin/sh
# Prints the Debian packages mallocinfo needs on a release, one per line,
# with that release's names: docker/packages-short.txt (and, unless
# --short, docker/packages.txt) mapped through docker/renames.txt.
# Usage: docker/packages.sh [--short] [RELEASE]
# RELEASE: a codename (bookworm, trixie, forky) or a suite (sid);
# default: this machine's (VERSION_CODENAME of /etc/os-release).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
lists="$here/packages-short.txt $here/packages.txt"
if [ "${1:-}" = --short ]; then
  lists="$here/packages-short.txt"
  shift
fi
release=${1:-$(. /etc/os-release && echo "${VERSION_CODENAME:-}")}
grep -hv '^#' $lists | tr -s ' \t' '\n' | grep . | while read -r p; do
  grep -v '^#' "$here/renames.txt" | awk -v p="$p" -v r="$release" '
    BEGIN { out = p }
    $1 == p { for (i = 2; i < NF; ++i) if ($i == r) out = $NF }
    END { if (out != "-") print out }'
done
