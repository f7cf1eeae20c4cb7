#!/usr/bin/python3
"""AMQP load for a real RabbitMQ: publish messages to a queue nobody
consumes, so that the queue process grows (the shape of issue 22's trial).

    /usr/bin/python3 scripts/trial/amqp_load.py [--queue q1] [--messages 40000]
        [--size 400] [--host 127.0.0.1] [--port 5672] [--drain]
        [--tls] [--connections 1] [--hold 0]

--tls speaks AMQP over TLS (the broker's ssl listener, 5671; its
certificate is not verified: a self-signed one on loopback);
--connections opens that many connections, each publishing its share;
--hold keeps them open that many seconds afterwards (their TLS sessions
stay live in the broker).

Needs python3-pika (Debian's, so /usr/bin/python3). --drain consumes and
acknowledges everything in the queue instead (to shrink it again). Prints
what it did and the queue's depth as the broker reports it. Not used by
any test.
"""
import argparse
import ssl
import sys
import time

import pika


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5672)
    ap.add_argument("--queue", default="q1")
    ap.add_argument("--messages", type=int, default=40000)
    ap.add_argument("--size", type=int, default=400)
    ap.add_argument("--drain", action="store_true")
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--connections", type=int, default=1)
    ap.add_argument("--hold", type=float, default=0)
    a = ap.parse_args()

    def connect():
        tls = None
        if a.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            tls = pika.SSLOptions(ctx, a.host)
        return pika.BlockingConnection(
            pika.ConnectionParameters(host=a.host, port=a.port, ssl_options=tls))

    others = [connect() for _ in range(a.connections - 1)]
    conn = connect()
    ch = conn.channel()
    depth = ch.queue_declare(queue=a.queue, durable=False).method.message_count
    start = time.monotonic()
    if a.drain:
        n = 0
        while True:
            method, _props, _body = ch.basic_get(queue=a.queue, auto_ack=True)
            if method is None:
                break
            n += 1
        print(f"drained {n} messages from {a.queue} in {time.monotonic() - start:.1f} s")
    else:
        body = bytes((i % 251 for i in range(a.size)))
        chans = [ch] + [c.channel() for c in others]
        for i in range(a.messages):
            chans[i % len(chans)].basic_publish(
                exchange="", routing_key=a.queue, body=body,
                properties=pika.BasicProperties(message_id=str(i)))
        print(f"published {a.messages} x {a.size} B to {a.queue} in "
              f"{time.monotonic() - start:.1f} s")
    depth = ch.queue_declare(queue=a.queue, durable=False).method.message_count
    print(f"{a.queue} now holds {depth} messages")
    if a.hold > 0:
        print(f"holding {len(others) + 1} connections{' (TLS)' if a.tls else ''} "
              f"for {a.hold:.0f} s", flush=True)
        end = time.monotonic() + a.hold
        while time.monotonic() < end:
            for c in others + [conn]:
                c.process_data_events(time_limit=0)
            time.sleep(1)
    for c in others:
        c.close()
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
