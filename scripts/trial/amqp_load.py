#!/usr/bin/python3
"""AMQP load for a real RabbitMQ: publish messages to a queue nobody
consumes, so that the queue process grows (the shape of issue 22's trial).

    /usr/bin/python3 scripts/trial/amqp_load.py [--queue q1] [--messages 40000]
        [--size 400] [--host 127.0.0.1] [--port 5672] [--drain]

Needs python3-pika (Debian's, so /usr/bin/python3). --drain consumes and
acknowledges everything in the queue instead (to shrink it again). Prints
what it did and the queue's depth as the broker reports it. Not used by
any test.
"""
import argparse
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
    a = ap.parse_args()

    conn = pika.BlockingConnection(pika.ConnectionParameters(host=a.host, port=a.port))
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
        for i in range(a.messages):
            ch.basic_publish(exchange="", routing_key=a.queue, body=body,
                             properties=pika.BasicProperties(message_id=str(i)))
        print(f"published {a.messages} x {a.size} B to {a.queue} in "
              f"{time.monotonic() - start:.1f} s")
    depth = ch.queue_declare(queue=a.queue, durable=False).method.message_count
    print(f"{a.queue} now holds {depth} messages")
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
