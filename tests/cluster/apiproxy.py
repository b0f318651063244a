#!/usr/bin/env python3
"""A TLS-terminating HTTP/1.1 proxy between one gpu-share extender and kube-apiserver, for the
fault runner (tests/chaos.rs): it passes every byte through until told to misbehave.

Its own control port (plain HTTP on loopback) takes:
  GET /mode?pass                 forward everything (the start)
  GET /mode?slow=SECONDS         hold every byte from the API server that long before passing it
                                 on: a bind's answer comes after the extender gave up on it, and
                                 every watch lags behind
  GET /mode?drop                 close every open connection and every new one at once, as a
                                 network partition from the extender's side does
  GET /expire                    each watch of the extender's is answered, once per resource,
                                 with the API server's own "too old resource version" (410
                                 Expired) event instead of being forwarded; open watches are cut
                                 so that they come back at once
  GET /stats                     JSON: connections, requests, watches expired, mode

The extender trusts it as the API server: its certificate is issued by the cluster's CA for
127.0.0.1 (tests/cluster/up.sh). The extender's own credentials pass through unchanged.
"""

import argparse
import asyncio
import json
import ssl
import time
import urllib.parse


class Proxy:
    def __init__(self, upstream_host, upstream_port, client_ctx):
        self.upstream = (upstream_host, upstream_port)
        self.client_ctx = client_ctx
        self.mode = "pass"
        self.delay = 0.0
        self._open = {}  # id -> {"writer", "upstream", "watching"}
        self.expire_paths = None  # None: not expiring; else the paths already expired
        self.stats = {"connections": 0, "requests": 0, "watches_expired": 0, "dropped": 0}

    # ---- the proxied side --------------------------------------------------------------------
    async def handle(self, reader, writer):
        self.stats["connections"] += 1
        if self.mode == "drop":
            self.stats["dropped"] += 1
            writer.transport.abort()
            return
        conn = {"writer": writer, "watching": False, "upstream": None}
        self._open[id(conn)] = conn
        try:
            up_reader, up_writer = await asyncio.open_connection(
                *self.upstream, ssl=self.client_ctx, server_hostname="127.0.0.1"
            )
        except OSError:
            writer.transport.abort()
            self._forget(conn)
            return
        conn["upstream"] = up_writer
        down = asyncio.ensure_future(self.downstream(up_reader, writer, conn))
        try:
            await self.requests(reader, up_writer, writer, conn)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            down.cancel()
            for w in (writer, up_writer):
                try:
                    w.transport.abort()
                except Exception:
                    pass
            self._forget(conn)

    def _forget(self, conn):
        self._open.pop(id(conn), None)

    async def requests(self, reader, up_writer, writer, conn):
        """Client to API server, request by request (HTTP/1.1, no pipelining)."""
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            line, _, rest = head.partition(b"\r\n")
            method, target, _ = line.decode("latin-1").split(" ", 2)
            headers = {}
            for h in rest.decode("latin-1").split("\r\n"):
                if ":" in h:
                    k, v = h.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            body = b""
            if "content-length" in headers:
                body = await reader.readexactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding", "").lower() == "chunked":
                body = await self.chunked(reader)
            self.stats["requests"] += 1
            url = urllib.parse.urlsplit(target)
            query = urllib.parse.parse_qs(url.query)
            watch = query.get("watch", ["false"])[0] in ("true", "1")
            rv = query.get("resourceVersion", [""])[0]
            if watch and rv not in ("", "0") and self.expire_paths is not None and url.path not in self.expire_paths:
                self.expire_paths.add(url.path)
                self.stats["watches_expired"] += 1
                await self.gone(writer, rv)
                return
            conn["watching"] = watch
            up_writer.write(head + body)
            await up_writer.drain()

    @staticmethod
    async def chunked(reader):
        out = b""
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            out += size_line + chunk
            if size == 0:
                return out

    async def gone(self, writer, rv):
        """What kube-apiserver answers a watch from a resourceVersion it no longer has."""
        event = json.dumps(
            {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": f"too old resource version: {rv} ({int(rv) + 1 if rv.isdigit() else 0})",
                    "reason": "Expired",
                    "code": 410,
                },
            }
        ).encode() + b"\n"
        chunk = b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunk
        )
        await writer.drain()

    async def downstream(self, up_reader, writer, conn):
        """API server to client, each piece held `delay` seconds while slow."""
        try:
            while True:
                data = await up_reader.read(65536)
                if not data:
                    break
                if self.mode == "slow":
                    due = time.monotonic() + self.delay
                    while time.monotonic() < due and self.mode == "slow":
                        await asyncio.sleep(min(0.05, max(0.0, due - time.monotonic())))
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            try:
                writer.transport.abort()
            except Exception:
                pass

    def cut(self, only_watches=False):
        for conn in list(self._open.values()):
            if only_watches and not conn["watching"]:
                continue
            for w in (conn["writer"], conn["upstream"]):
                if w is not None:
                    w.transport.abort()

    # ---- control -----------------------------------------------------------------------------
    async def control(self, reader, writer):
        try:
            line = (await reader.readuntil(b"\r\n")).decode("latin-1")
            await reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            return
        target = line.split(" ")[1] if " " in line else "/"
        url = urllib.parse.urlsplit(target)
        status, body = 200, ""
        if url.path == "/mode":
            q = url.query
            if q == "pass":
                self.mode, self.delay = "pass", 0.0
            elif q.startswith("slow="):
                self.mode, self.delay = "slow", float(q[5:])
            elif q == "drop":
                self.mode = "drop"
                self.cut()
            else:
                status, body = 400, f"unknown mode {q!r}"
            self.expire_paths = None if status == 200 else self.expire_paths
        elif url.path == "/expire":
            self.expire_paths = set()
            self.cut(only_watches=True)
        elif url.path != "/stats":
            status, body = 404, "not found"
        if status == 200:
            body = json.dumps(dict(self.stats, mode=self.mode, delay=self.delay, open=len(self._open)))
        data = body.encode()
        writer.write(
            b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (status, len(data), data)
        )
        await writer.drain()
        writer.close()


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", type=int, required=True)
    ap.add_argument("--control", type=int, required=True)
    ap.add_argument("--upstream", required=True, help="host:port of kube-apiserver")
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--ca", required=True)
    a = ap.parse_args()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(a.cert, a.key)
    server_ctx.set_alpn_protocols(["http/1.1"])
    client_ctx = ssl.create_default_context(cafile=a.ca)
    client_ctx.set_alpn_protocols(["http/1.1"])
    host, port = a.upstream.rsplit(":", 1)
    p = Proxy(host, int(port), client_ctx)
    srv = await asyncio.start_server(p.handle, "127.0.0.1", a.listen, ssl=server_ctx, limit=1 << 20)
    ctl = await asyncio.start_server(p.control, "127.0.0.1", a.control)
    async with srv, ctl:
        await asyncio.gather(srv.serve_forever(), ctl.serve_forever())


if __name__ == "__main__":
    asyncio.run(main())
