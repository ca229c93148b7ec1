"""A fake OpenAI-compatible chat server on loopback (http.server in a thread) for the evaluations that ask a
judge: each test gives the function that answers a request body, and reads back every body it was sent."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion(content: str, logprobs: list[tuple[str, float]] | None = None) -> dict:
    """A chat completion whose answer is `content`; with `logprobs`, the first position's top list
    (the first entry the generated token)."""
    choice: dict = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
    if logprobs is not None:
        token, lp = logprobs[0]
        choice["logprobs"] = {
            "content": [
                {
                    "token": token,
                    "logprob": lp,
                    "top_logprobs": [{"token": t, "logprob": v} for t, v in logprobs],
                }
            ]
        }
    return {"id": "x", "object": "chat.completion", "choices": [choice]}


def top_logprobs(weights: dict[str, float]) -> list[tuple[str, float]]:
    """A top list from unnormalised weights (normalised to probabilities summing to 1), largest first."""
    total = sum(weights.values())
    return sorted(((t, math.log(w / total)) for t, w in weights.items()), key=lambda x: -x[1])


class LoopbackJudge:
    """``answer(body) -> dict | bytes | None``: the completion to return (a dict as JSON, bytes as they are),
    or None to stall past any client timeout. Every request body is kept in `bodies`; `max_in_flight` is the
    most requests that were being answered at once."""

    def __init__(self, answer: Callable[[dict], dict | bytes | None], delay: float = 0.0):
        self.answer, self.delay = answer, delay
        self.bodies: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with judge.lock:
                    judge.bodies.append(body)
                    judge.in_flight += 1
                    judge.max_in_flight = max(judge.max_in_flight, judge.in_flight)
                time.sleep(judge.delay)
                out = judge.answer(body)
                if out is None:
                    time.sleep(3.0)
                    out = b"{}"
                payload = out if isinstance(out, bytes) else json.dumps(out).encode()
                with judge.lock:
                    judge.in_flight -= 1
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> LoopbackJudge:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def closed_port_url() -> str:
    """The URL of a loopback port nothing listens on (a judge that is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def message_text(body: dict) -> str:
    """The text parts of a request's user message, joined."""
    user = [m for m in body["messages"] if m["role"] == "user"][0]
    return "".join(c["text"] for c in user["content"] if c.get("type") == "text")
