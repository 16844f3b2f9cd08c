"""A loopback HTTP proxy that makes an S3 emulator answer like S3 across a network.

    python bench/latency_proxy.py --upstream http://127.0.0.1:5000 --delay-ms 20

Every request waits ``delay`` before it is forwarded (S3 Standard in-region answers small
requests in ~10-30 ms), so round trips show in wall time as they would on S3, while the
emulator on this machine answers in microseconds of network. With ``cache_gets``, a GET of an
object (no query string, no Range) the proxy has answered before, and that no PUT, POST or
DELETE through the proxy has touched since, is answered from the proxy's memory (after the
delay), and so is a listing (ListObjectsV2) it has answered before with no PUT, POST or DELETE
through the proxy since: the emulator's CPU, which real S3 does not spend on the client's
machine, stays out of the figures (moto lists by going through every key of the bucket). Only
requests through the proxy invalidate its cache: write through it.

The proxy counts requests by method, cache hits, and *waves*: how many times a request
started while none was in flight, a lower bound on the sequential round trips of the client.
"""

from __future__ import annotations

import argparse
import http.client
import socketserver
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self
from urllib.parse import urlsplit

# Headers of one connection, not of the message: never forwarded.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-connection",
    }
)


@dataclass
class Cached:
    """A GET answer kept by the proxy."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass
class Stats:
    """What went through the proxy."""

    requests: Counter[str] = field(default_factory=Counter)
    cache_hits: int = 0
    waves: int = 0
    bytes_out: int = 0  # response bodies sent to the client
    in_flight: int = 0
    peak_in_flight: int = 0

    def clear(self) -> None:
        """Forget the counts (not the cache)."""
        self.requests.clear()
        self.cache_hits = self.waves = self.bytes_out = self.peak_in_flight = 0


class Serving:
    """A server of bench/ as a context manager: served on a daemon thread while entered."""

    def __init__(self, server: socketserver.BaseServer) -> None:
        self._served = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._served.shutdown()
        self._served.server_close()
        self._thread.join(10)


class LatencyProxy(Serving):
    """The proxy, run in threads of this process for as long as the ``with`` block lasts."""

    def __init__(
        self, upstream: str, delay: float, *, cache_gets: bool = True, port: int = 0
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http:// URL, not {upstream!r}")
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or 80
        self.delay = delay
        self.cache_gets = cache_gets
        self.stats = Stats()
        self._cache: dict[str, Cached] = {}
        self._guard = threading.Lock()
        self._local = threading.local()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._server.daemon_threads = True
        super().__init__(self._server)

    @property
    def url(self) -> str:
        """The proxy's endpoint URL, for ``S3Store(endpoint_url=...)``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # Inside the handler threads ---------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # TCP_NODELAY: headers and body go out in two sends, and with Nagle's algorithm a
            # small body waits for the client's delayed acknowledgement (~40 ms on Linux).
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: object) -> None:
                """Quiet."""

            def do_GET(self) -> None:
                proxy._serve(self)

            def do_HEAD(self) -> None:
                proxy._serve(self)

            def do_PUT(self) -> None:
                proxy._serve(self)

            def do_POST(self) -> None:
                proxy._serve(self)

            def do_DELETE(self) -> None:
                proxy._serve(self)

        return Handler

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        with self._guard:
            self.stats.requests[handler.command] += 1
            if self.stats.in_flight == 0:
                self.stats.waves += 1
            self.stats.in_flight += 1
            self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.stats.in_flight)
        try:
            body = _read_body(handler)
            time.sleep(self.delay)
            answer = self._answer(handler, body)
            self._send(handler, answer)
        finally:
            with self._guard:
                self.stats.in_flight -= 1

    def _answer(self, handler: BaseHTTPRequestHandler, body: bytes) -> Cached:
        path = handler.path
        listing = "list-type=2" in urlsplit(path).query.split("&")
        cacheable = (
            self.cache_gets
            and handler.command == "GET"
            and ("?" not in path or listing)
            and "range" not in {k.lower() for k in handler.headers}
        )
        if cacheable:
            with self._guard:
                hit = self._cache.get(path)
                if hit is not None:
                    self.stats.cache_hits += 1
                    return hit
        elif handler.command in ("PUT", "POST", "DELETE"):
            with self._guard:
                if handler.command == "POST":
                    self._cache.clear()  # DeleteObjects names its keys in the body
                else:
                    self._cache.pop(path.split("?", 1)[0], None)
                    # Any write may change any listing.
                    for cached in [p for p in self._cache if "?" in p]:
                        del self._cache[cached]
        answer = self._forward(handler, body)
        if cacheable and answer.status == 200:
            with self._guard:
                self._cache[path] = answer
        return answer

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes) -> Cached:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPConnection(self.upstream_host, self.upstream_port)
            self._local.connection = connection
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        try:
            connection.request(handler.command, handler.path, body=body, headers=headers)
            response = connection.getresponse()
        except (ConnectionError, http.client.HTTPException):
            connection.close()  # the emulator closed a kept-alive connection: once more
            connection.request(handler.command, handler.path, body=body, headers=headers)
            response = connection.getresponse()
        data = response.read()
        kept = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
        return Cached(response.status, kept, data)

    def _send(self, handler: BaseHTTPRequestHandler, answer: Cached) -> None:
        handler.send_response(answer.status)
        for name, value in answer.headers:
            if name.lower() != "content-length":
                handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(answer.body)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(answer.body)
            with self._guard:
                self.stats.bytes_out += len(answer.body)


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    """The request body: by Content-Length, or decoded from chunked transfer encoding."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks: list[bytes] = []
        while True:
            size = int(handler.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def main() -> None:
    """Run the proxy in the foreground until Ctrl+C."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True, help="the emulator's http:// URL")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="added per request")
    parser.add_argument("--no-cache", action="store_true", help="forward every GET")
    parser.add_argument("--port", type=int, default=0, help="default: a free one")
    args = parser.parse_args()
    delay = args.delay_ms / 1000
    with LatencyProxy(args.upstream, delay, cache_gets=not args.no_cache, port=args.port) as proxy:
        print(f"proxy at {proxy.url} -> {args.upstream}, +{args.delay_ms:g} ms per request")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print(f"requests: {dict(proxy.stats.requests)}, cache hits {proxy.stats.cache_hits}")


if __name__ == "__main__":
    main()
