#!/usr/bin/python3
"""XMPP/TLS load for a real ejabberd: sessions over STARTTLS, senders that
send messages to receivers, and receivers that enable stream management
(XEP-0198) but never answer the server's ack requests (a phone on a bad
link), so that ejabberd keeps every stanza it sent them in their c2s
process until they ack: the connection processes grow (the shape of
issue 22's trial).

    /usr/bin/python3 scripts/trial/xmpp_load.py [--sessions 16]
        [--receivers 4] [--messages 1000] [--size 1000] [--hold 0]
        [--host 127.0.0.1] [--port 5222] [--domain localhost]
        [--user load] [--password pw]

Users are <user>1..<user>N@<domain> with one password; create them first
(ejabberdctl register load1 localhost pw ...; scripts/trial/ejabberd.sh
load does). The server's certificate is not verified (a test server's
self-signed one). --hold keeps the sessions open that many seconds after
the load (0: until interrupted). Needs python3-slixmpp (Debian:
/usr/bin/python3). Not used by any test.
"""
import argparse
import asyncio
import ssl
import sys
import time

import slixmpp
import slixmpp.plugins.xep_0198.stanza
import slixmpp.xmlstream.handler
import slixmpp.xmlstream.matcher


class Client(slixmpp.ClientXMPP):
    def __init__(self, jid, password, silent):
        super().__init__(jid, password)
        self.ssl_context.check_hostname = False
        self.ssl_context.verify_mode = ssl.CERT_NONE
        self.ready = asyncio.get_event_loop().create_future()
        self.received = 0
        self.register_plugin("xep_0198")
        if silent:
            # Never answer <r/>: the server keeps what it sent us, unacked.
            # (The plugin registered its answering handler by name.)
            self.remove_handler("Stream Management Request Ack")
            self.register_handler(slixmpp.xmlstream.handler.Callback(
                "Stream Management Request Ack (ignored)",
                slixmpp.xmlstream.matcher.MatchXPath(
                    slixmpp.plugins.xep_0198.stanza.RequestAck.tag_name()),
                lambda req: None, instream=True))
        self.add_event_handler("session_start", self.started)
        self.add_event_handler("message", self.got)
        self.add_event_handler("failed_auth", self.failed)

    async def started(self, _event):
        self.send_presence()
        if not self.ready.done():
            self.ready.set_result(True)

    def failed(self, _event):
        if not self.ready.done():
            self.ready.set_exception(RuntimeError(f"authentication failed for {self.boundjid}"))

    def got(self, msg):
        if msg["type"] in ("chat", "normal"):
            self.received += 1


async def run(a):
    n_recv = min(a.receivers, a.sessions - 1)
    clients = []
    for i in range(1, a.sessions + 1):
        silent = i > a.sessions - n_recv
        c = Client(f"{a.user}{i}@{a.domain}/load", a.password, silent)
        c.connect(address=(a.host, a.port))
        clients.append(c)
    await asyncio.wait_for(asyncio.gather(*(c.ready for c in clients)), 60)
    senders, receivers = clients[:-n_recv], clients[-n_recv:]
    print(f"{len(clients)} sessions up ({len(senders)} senders, {len(receivers)} receivers "
          f"that never ack)", flush=True)
    body = ("x" * a.size)
    start = time.monotonic()
    for k in range(a.messages):
        s = senders[k % len(senders)]
        r = receivers[k % len(receivers)]
        s.send_message(mto=r.boundjid, mbody=f"{k} {body}", mtype="chat")
        if k % 100 == 99:
            await asyncio.sleep(0.05)
    await asyncio.sleep(2)
    got = sum(r.received for r in receivers)
    print(f"sent {a.messages} x {a.size} B in {time.monotonic() - start:.1f} s; "
          f"receivers got {got}", flush=True)
    if a.hold > 0:
        await asyncio.sleep(a.hold)
    else:
        await asyncio.Event().wait()
    for c in clients:
        c.disconnect()
    await asyncio.sleep(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5222)
    ap.add_argument("--domain", default="localhost")
    ap.add_argument("--user", default="load")
    ap.add_argument("--password", default="pw")
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--receivers", type=int, default=4)
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--hold", type=float, default=0)
    a = ap.parse_args()
    try:
        asyncio.get_event_loop().run_until_complete(run(a))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
