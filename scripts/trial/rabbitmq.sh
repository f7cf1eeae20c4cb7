#!/bin/sh
# Debian's rabbitmq-server, on loopback only, for trying mallocinfo on a
# real broker by hand (doc/injecting.md). Not used by any test.
#
#   scripts/trial/rabbitmq.sh start [PRELOAD_SO]  # node rabbit@localhost, AMQP on 127.0.0.1:5672;
#                                                 # with PRELOAD_SO, the tracker preloaded
#   scripts/trial/rabbitmq.sh shell               # rabbitmq-diagnostics remote_shell (leave: ^G q)
#   scripts/trial/rabbitmq.sh load [ARGS]         # amqp_load.py ARGS: a queue that grows
#   scripts/trial/rabbitmq.sh stop
#
# The tarball must be unpacked where the rabbitmq user can read it.
# Nothing under /etc is changed: the settings are environment variables.
# A TLS listener: RABBITMQ_CONFIG_FILE=DIR/rabbitmq.conf in the environment
# of `start' (listeners.ssl.default = 127.0.0.1:5671, ssl_options.*; see
# doc/injecting.md), then `load --tls --port 5671'.
set -e
export RABBITMQ_NODENAME=rabbit@localhost
export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
# Distribution on loopback too, for the node and for the CLI tools' nodes.
LOOPBACK='-kernel inet_dist_use_interface {127,0,0,1}'
export RABBITMQ_CTL_ERL_ARGS="$LOOPBACK"
here=$(dirname "$0")

case "$1" in
    start)
        args=$LOOPBACK
        [ -n "$2" ] && args="$args -env LD_PRELOAD $2"
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=$args rabbitmq-server -detached
        # -detached returns before the node is registered with epmd, and
        # await_startup gives up at once on a node it cannot find (exit
        # 69): wait for the registration first, 60 s at most.
        i=0
        until epmd -names 2>/dev/null | grep -q "^name ${RABBITMQ_NODENAME%@*} "; do
            i=$((i + 1))
            [ "$i" -le 60 ] || { echo "rabbit node not registered after 60 s" >&2; exit 1; }
            sleep 1
        done
        rabbitmqctl -n "$RABBITMQ_NODENAME" await_startup
        ;;
    shell)
        exec rabbitmq-diagnostics -n "$RABBITMQ_NODENAME" remote_shell
        ;;
    load)
        shift
        exec /usr/bin/python3 "$here/amqp_load.py" "$@"
        ;;
    stop)
        rabbitmqctl -n "$RABBITMQ_NODENAME" stop
        ;;
    *)
        sed -n '2,14p' "$0" >&2
        exit 2
        ;;
esac
