#!/bin/sh
# Installs the Debian packages mallocinfo needs that are missing, with this
# release's names (docker/packages.sh; --short: only what the short matrix
# needs). Does nothing (and needs no network or root) when all are present.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
pkgs=$("$here/packages.sh" "$@" | tr '\n' ' ')
missing=""
for p in $pkgs; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing="$missing $p"
  fi
done
[ -z "$missing" ] && exit 0
echo "install-deps: installing:$missing"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-deps: need root or sudo for:$missing" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# shellcheck disable=SC2086
$sudo apt-get install -y -qq --no-install-recommends $missing
