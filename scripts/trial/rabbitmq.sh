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
        sed -n '2,11p' "$0" >&2
        exit 2
        ;;
esac
