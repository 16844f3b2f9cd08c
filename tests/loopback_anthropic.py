"""A loopback HTTP server that answers the Messages API, for the real anthropic SDK.

The SDK (made the standard way, with ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY in the
environment) sends real HTTP requests here; a script decides each response. Responses are
Messages API JSON, so the SDK parses them as it parses Claude's.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[dict[str, Any]], dict[str, Any] | tuple[int, dict[str, Any]]]


def message(
    *content: dict[str, Any],
    stop_reason: str | None = None,
    input_tokens: int = 10,
    output_tokens: int = 5,
) -> dict[str, Any]:
    """A Messages API response body."""
    if stop_reason is None:
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    return {
        "id": "msg_loopback",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5",
        "content": list(content),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(call_id: str, name: str, **tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": tool_input}


class LoopbackAnthropic:
    """Serves POST /v1/messages on 127.0.0.1; ``requests`` keeps every request body."""

    def __init__(self, responder: Responder):
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self.received = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length))
                with outer.received:
                    outer.requests.append(body)
                    outer.received.notify_all()
                try:
                    result = outer.responder(body)
                except Exception as e:  # noqa: BLE001 - a bug in a test's script: answer 500 with it
                    result = (
                        500,
                        {"type": "error", "error": {"type": "api_error", "message": repr(e)}},
                    )
                status, payload = result if isinstance(result, tuple) else (200, result)
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                if status == 429:
                    self.send_header("retry-after", "0")
                self.end_headers()
                try:
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def wait_for(self, count: int, timeout: float = 30) -> None:
        """Block until ``count`` requests have arrived."""
        with self.received:
            if not self.received.wait_for(lambda: len(self.requests) >= count, timeout):
                raise TimeoutError(f"{len(self.requests)} of {count} requests arrived")

    def env(self) -> dict[str, str]:
        """Environment variables that point a standard SDK client here."""
        return {"ANTHROPIC_BASE_URL": self.url, "ANTHROPIC_API_KEY": "test-key"}


@contextmanager
def loopback(responder: Responder) -> Iterator[LoopbackAnthropic]:
    server = LoopbackAnthropic(responder)
    server._thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()
