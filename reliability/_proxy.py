"""A loopback HTTP proxy that injects S3 faults, for reliability/fault_proxy.py.

It sits between S3Store's clients and an S3 server (moto, LocalStack) and, for each request,
draws from a seeded random generator whether to let it through or to play one fault:

* ``500``: an S3 ``InternalError`` answer; the request is not forwarded.
* ``503``: ``SlowDown`` with its S3 XML body; not forwarded.
* ``reset``: the connection is reset before anything is forwarded.
* ``lost``: the request is forwarded (S3 applies it), then the connection is reset instead of
  answering: the write happened, the client cannot know.
* ``late``: forwarded, then the answer is held past the client's read timeout, and the
  connection is closed: the write happened, the client gave up waiting.
* ``outage``: every request fails (one of the first three, at random) for a while.
* ``cut`` (only when asked for: not among the kinds drawn by default): forwarded, then the
  status and headers are sent, with only half the body, and the connection is reset: the
  answer breaks off mid-body (an answer without a body is reset, as ``lost``).

``fake-ack`` is for testing the runner, never for judging the store: a PUT is answered 200
with a made-up ETag and not forwarded, so a save is acknowledged that S3 never saw.

A request with the header ``x-fault-proxy: pass`` meets no fault (it is counted as a request):
the runner sends it to learn whether a State still saves once S3 answers again.
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final
from urllib.parse import urlsplit

KINDS: Final = ("500", "503", "reset", "lost", "late", "outage")
# Kinds drawn only when named (``Plan.kinds``, ``fault_proxy.py --kind``).
EXTRA_KINDS: Final = ("cut",)
LABELS: Final = {
    "500": "500 InternalError",
    "503": "503 SlowDown",
    "reset": "reset before forwarding",
    "lost": "answer lost after the write",
    "late": "answer after the read timeout",
    "outage": "failed in an outage",
    "cut": "answer cut off mid-body",
    "fake-ack": "PUT acknowledged, not forwarded (test only)",
}
XML: Final = {"Content-Type": "application/xml"}
PASS_HEADER: Final = "x-fault-proxy"  # its value "pass": let this request through
# Headers that describe one hop, not the request: never copied to the next hop.
HOP_HEADERS: Final = frozenset(
    ("connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade")
)


def _error_body(code: str, message: str) -> bytes:
    request_id = uuid.uuid4().hex[:16].upper()
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<RequestId>{request_id}</RequestId><HostId>fault-proxy</HostId></Error>"
    ).encode()


@dataclass
class Plan:
    """What the proxy does; change ``rate`` or ``paused`` while it runs.

    Attributes:
        rate: The chance that a request meets a fault (outages aside).
        late_seconds: How long a ``late`` answer is held (more than the client's read timeout).
        outage_seconds: The shortest and longest outage.
        kinds: The faults drawn from, equally likely but for an outage (a tenth as likely:
            each one fails every request for a while).
        fake_ack: The chance that a PUT is acknowledged without being forwarded (test only).
        paused: Let every request through.
    """

    rate: float
    late_seconds: float
    outage_seconds: tuple[float, float] = (0.3, 1.5)
    kinds: tuple[str, ...] = KINDS
    fake_ack: float = 0.0
    paused: bool = False


@dataclass
class Tally:
    """What the proxy has done so far (read it under ``lock``)."""

    requests: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    outages: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def total(self) -> int:
        """Faults injected so far, every kind."""
        with self.lock:
            return sum(self.faults.values())


class FaultProxy:
    """The proxy: ``start()``, point S3Store's ``endpoint_url`` at ``url``, ``stop()``."""

    def __init__(self, upstream: str, plan: Plan, seed: int) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"the proxy forwards to a plain http:// endpoint, not {upstream!r}")
        self.upstream = (parts.hostname, parts.port or 80)
        self.plan = plan
        self.tally = Tally()
        self._random = random.Random(seed)
        self._outage_until = 0.0
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The proxy's endpoint URL."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        """Serve on a thread of its own."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def choose(self, method: str, passing: bool = False) -> str | None:
        """The fault for the next request, or ``None``; counted. ``passing``: no fault."""
        plan = self.plan
        with self.tally.lock:
            self.tally.requests += 1
            if plan.paused or passing:
                return None
            now = time.monotonic()
            fault: str | None = None
            if now < self._outage_until:
                fault = "outage"
            elif method == "PUT" and plan.fake_ack and self._random.random() < plan.fake_ack:
                fault = "fake-ack"
            elif self._random.random() < plan.rate:
                weights = [0.1 if kind == "outage" else 1.0 for kind in plan.kinds]
                fault = self._random.choices(plan.kinds, weights)[0]
                if fault == "outage":
                    low, high = plan.outage_seconds
                    self._outage_until = now + self._random.uniform(low, high)
                    self.tally.outages += 1
            if fault is not None:
                self.tally.faults[fault] += 1
            return fault

    def outage_failure(self) -> str:
        """How one request fails in an outage: a 500, a 503 or a reset."""
        with self.tally.lock:
            return self._random.choice(("500", "503", "reset"))


class _Server(ThreadingHTTPServer):
    """The listening side; a client that drops its connection is no error worth printing."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """Print what went wrong unless it is a connection the client dropped."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    """Relays one connection's requests, playing the fault the proxy draws for each."""

    owner: FaultProxy
    protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients expect

    def log_message(self, format: str, *args: object) -> None:
        """No access log."""

    def do_GET(self) -> None:
        self.relay()

    def do_HEAD(self) -> None:
        self.relay()

    def do_PUT(self) -> None:
        self.relay()

    def do_POST(self) -> None:
        self.relay()

    def do_DELETE(self) -> None:
        self.relay()

    def read_body(self) -> bytes:
        """The request body: by Content-Length, or chunked."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def relay(self) -> None:
        body = self.read_body()
        fault = self.owner.choose(self.command, self.headers.get(PASS_HEADER) == "pass")
        if fault == "outage":
            fault = self.owner.outage_failure()
        if fault == "500":
            self.answer(500, _error_body("InternalError", "We encountered an internal error."), XML)
            return
        if fault == "503":
            self.answer(503, _error_body("SlowDown", "Please reduce your request rate."), XML)
            return
        if fault == "reset":
            self.reset()
            return
        if fault == "fake-ack":
            etag = f'"{uuid.uuid4().hex}"'
            self.answer(200, b"", {"ETag": etag})
            return
        try:
            status, headers, answer = self.forward(body)
        except OSError:
            self.answer(502, _error_body("BadGateway", "The upstream server did not answer."), XML)
            return
        if fault == "lost":
            self.reset()
            return
        if fault == "late":
            time.sleep(self.owner.plan.late_seconds)
            self.reset()
            return
        if fault == "cut":
            if self.command != "HEAD" and len(answer) >= 2:
                self.answer(status, answer[: len(answer) // 2], headers, length=len(answer))
            self.reset()
            return
        self.answer(status, answer, headers)

    def forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """Send the request upstream; its status, headers and body."""
        host, port = self.owner.upstream
        connection = http.client.HTTPConnection(host, port, timeout=60)
        try:
            headers = {
                k: v
                for k, v in self.headers.items()
                if k.lower() not in HOP_HEADERS and k.lower() != PASS_HEADER
            }
            headers["Content-Length"] = str(len(body))
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            answer = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_HEADERS]
            return response.status, kept, answer
        finally:
            connection.close()

    def answer(
        self,
        status: int,
        body: bytes,
        headers: list[tuple[str, str]] | dict[str, str] | None = None,
        length: int | None = None,
    ) -> None:
        """Send an answer on the kept-alive connection (``length``: the Content-Length to
        announce, if not the body's own)."""
        pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        try:
            self.send_response_only(status)
            length_given = False
            for key, value in pairs:
                if key.lower() == "content-length":
                    length_given = True
                    if self.command == "HEAD":
                        self.send_header(key, value)
                        continue
                    value = str(len(body) if length is None else length)
                self.send_header(key, value)
            if not length_given:
                self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            if self.command != "HEAD" and body:
                self.wfile.write(body)
        except OSError:
            self.close_connection = True

    def reset(self) -> None:
        """Drop the connection with a TCP reset, answering nothing."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass
