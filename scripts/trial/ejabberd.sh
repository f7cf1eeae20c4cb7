#!/bin/sh
# Debian's ejabberd, on loopback only, for trying mallocinfo on a real XMPP
# server by hand (doc/injecting.md). Not used by any test.
#
#   scripts/trial/ejabberd.sh loopback         # once: every listener and the distribution on
#                                              # 127.0.0.1 (edits /etc/ejabberd, keeps *.orig)
#   scripts/trial/ejabberd.sh start [PRELOAD_SO]  # with PRELOAD_SO, the tracker preloaded
#   scripts/trial/ejabberd.sh shell            # ejabberdctl debug (leave: ^G q)
#   scripts/trial/ejabberd.sh users [N]        # registers load1..loadN@localhost (default 16)
#   scripts/trial/ejabberd.sh load [ARGS]      # xmpp_load.py ARGS: TLS sessions that grow
#   scripts/trial/ejabberd.sh stop
#
# Debian's ejabberdctl ignores --config (it always reads
# /etc/ejabberd/ejabberd.yml), hence the edit for loopback; the preload goes
# through a copy of ejabberdctl.cfg given with --ctl-config.
set -e
here=$(dirname "$0")
etc=/etc/ejabberd

case "$1" in
    loopback)
        [ -f "$etc/ejabberd.yml.orig" ] || cp -p "$etc/ejabberd.yml" "$etc/ejabberd.yml.orig"
        [ -f "$etc/ejabberdctl.cfg.orig" ] || cp -p "$etc/ejabberdctl.cfg" "$etc/ejabberdctl.cfg.orig"
        sed -i 's/^    ip: "::"$/    ip: "127.0.0.1"/' "$etc/ejabberd.yml"
        sed -i 's/^#INET_DIST_INTERFACE=127.0.0.1$/INET_DIST_INTERFACE=127.0.0.1/' \
            "$etc/ejabberdctl.cfg"
        grep -n '^    ip:' "$etc/ejabberd.yml"
        grep -n '^INET_DIST_INTERFACE' "$etc/ejabberdctl.cfg"
        ;;
    start)
        if [ -n "$2" ]; then
            cfg=$(mktemp /tmp/ejabberdctl.XXXXXX.cfg)
            cp "$etc/ejabberdctl.cfg" "$cfg"
            echo "ERL_OPTIONS=\"\$ERL_OPTIONS -env LD_PRELOAD $2\"" >> "$cfg"
            chmod 644 "$cfg"
            ejabberdctl --ctl-config "$cfg" start
        else
            ejabberdctl start
        fi
        ejabberdctl started
        ejabberdctl status
        ;;
    shell)
        exec ejabberdctl debug
        ;;
    users)
        n=${2:-16}
        i=1
        while [ "$i" -le "$n" ]; do
            ejabberdctl register "load$i" localhost pw || true
            i=$((i + 1))
        done
        ;;
    load)
        shift
        exec /usr/bin/python3 "$here/xmpp_load.py" "$@"
        ;;
    stop)
        ejabberdctl stop
        ejabberdctl stopped
        ;;
    *)
        sed -n '2,13p' "$0" >&2
        exit 2
        ;;
esac
