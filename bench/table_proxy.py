"""``bench/latency_proxy.py`` with Nagle's algorithm off on the connections it answers.

    python bench/table_proxy.py --upstream http://127.0.0.1:5000 --delay-ms 20 --port 8000

The proxy writes a response's headers and its body in two sends. With Nagle's algorithm on
(the socket default), a small body waits for the client to acknowledge the headers, and
the client delays that acknowledgement (~40 ms on Linux): measured here, a GET of 200 B to
200 KB through the proxy at +0 ms took ~46-51 ms for bodies up to 20 KB and 3 ms for 200 KB,
and 3.4 ms at every size with ``TCP_NODELAY``. ``bench/table.py`` starts this proxy so that a
small GET costs the configured delay and not 40 ms more.
"""

from __future__ import annotations

import argparse
import threading
from http.server import BaseHTTPRequestHandler

from latency_proxy import LatencyProxy


class NoDelayProxy(LatencyProxy):
    """A :class:`LatencyProxy` that sets ``TCP_NODELAY`` on every connection it accepts."""

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        handler = super()._handler_class()
        handler.disable_nagle_algorithm = True  # StreamRequestHandler sets TCP_NODELAY
        return handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True, help="the emulator's http:// URL")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="added per request")
    parser.add_argument("--port", type=int, default=0, help="default: a free one")
    args = parser.parse_args()
    with NoDelayProxy(args.upstream, args.delay_ms / 1000, port=args.port) as proxy:
        print(f"proxy at {proxy.url} -> {args.upstream}, +{args.delay_ms:g} ms", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
