"""Section `reward_server`: a load test of `t2i-gcpo reward-server` on loopback
(docs/guides/rewards.md#server): requests/s and latency at 1, 8 and 64 clients, then 64 clients with slow
clients beside them.

The server runs in a process of its own (``--body-timeout 5``) and serves a reward that costs nothing
(`reward_overlap.brightness`: each image's mean pixel), so what is timed is the server: accepting, reading,
decoding, answering. Each client is a thread of this process sending the same request through `remote:`'s HTTP
client (t2i_gcpo/rewards/http_client.py: one connection a request, as a run sends them) — 16 random-noise
images of 64 × 64 px, 265 KB of JSON — one request after another, each phase bounded by a request count and a
time limit (`SECONDS`). A request counts as answered when it gets a 200 with 16 scores; anything else (no
answer, a reset, a 503) is an error.

Slow clients (the last phase, `SLOW` of them beside the 64): half send a request's head and then its body a
byte every 0.5 s (the server cuts them at its body deadline, 5 s here, with a 408, and they start again), half
send half a head and nothing more (cut at the head deadline, 10 s). With the stdlib server they replaced, four
of them held its four slots for its 300 s read timeout and no other request was answered.

Latency is each request's wall time from the client (connecting included); p50 and p99 over the answered
requests of a phase. Server and clients share this machine's cores: on 2 cores the clients' threads take
CPU from the server, so requests/s here is a floor of what a server on its own machine does.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from benchmarks.suite.common import REPO, Context, load_average, shared_cpu_note

TITLE = (
    "A reward server under load: requests/s and latency at 1, 8 and 64 clients, slow clients beside them "
    "(`reward_server`)"
)
SECONDS = 60.0  # the most a phase runs
SLOW = 16  # slow clients in the last phase
IMAGES, SIDE = 16, 64  # one request: 16 images of 64 × 64 px


def start_server() -> tuple[subprocess.Popen, str]:
    """`t2i-gcpo reward-server` for `brightness` in a process of its own on a free loopback
    port: (process, URL)."""
    spec = f"{REPO / 'benchmarks' / 'suite' / 'reward_overlap.py'}:brightness"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-m",
        "t2i_gcpo.cli",
        "reward-server",
        "--reward",
        spec,
        "--port",
        "0",
        "--quiet",
        "--device",
        "cpu",
        "--body-timeout",
        "5",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        raise RuntimeError(f"the reward server did not start: {line} {proc.stderr.read()[-500:]}")
    return proc, line.split(" on ")[1].split(";")[0]


def request_body() -> bytes:
    import torch

    from t2i_gcpo.rewards.remote import encode_images

    images = torch.rand(IMAGES, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(0))
    return json.dumps({"images": encode_images(images), "prompts": ["a photo"] * IMAGES}).encode()


def one_request(url: str, body: bytes) -> float | None:
    """Seconds of one answered request; None for an error."""
    from t2i_gcpo.rewards import http_client

    tic = time.perf_counter()
    try:
        answer = http_client.request(
            url + "/score",
            method="POST",
            body=body,
            timeout=60,
            max_bytes=1 << 20,
            headers={"Content-Type": "application/json"},
        )
    except (http_client.NoAnswer, http_client.AnswerTooLarge):
        return None
    if answer.status != 200 or len(json.loads(answer.body)["scores"]) != IMAGES:
        return None
    return time.perf_counter() - tic


class SlowClients:
    """`n` slow clients in threads (module docstring) until `stop()`: how often the server cut them."""

    def __init__(self, url: str, n: int):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.address, self.running, self.cut, self.threads = (host, int(port)), True, [0, 0], []
        for i in range(n):
            thread = threading.Thread(target=self.body_drip if i % 2 == 0 else self.half_head, daemon=True)
            thread.start()
            self.threads.append(thread)

    def body_drip(self) -> None:
        while self.running:
            with socket.create_connection(self.address, timeout=30) as sock:
                sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
                self.drip(sock, 0)

    def half_head(self) -> None:
        while self.running:
            with socket.create_connection(self.address, timeout=30) as sock:
                sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")
                self.drip(sock, 1, send=False)

    def drip(self, sock: socket.socket, kind: int, send: bool = True) -> None:
        """A byte every 0.5 s (or nothing) until the server closes the connection."""
        sock.settimeout(0.5)
        while self.running:
            try:
                if send:
                    sock.sendall(b" ")
                if sock.recv(4096) == b"":
                    self.cut[kind] += 1
                    return
            except TimeoutError:
                continue
            except OSError:
                self.cut[kind] += 1
                return
            self.cut[kind] += 1  # an answer (the 408) came: the server cut it
            return

    def stop(self) -> None:
        self.running = False
        for thread in self.threads:
            thread.join(5)


def phase(url: str, body: bytes, clients: int, requests: int, slow: int = 0) -> dict[str, Any]:
    """`clients` threads sending `requests` requests in all (or until SECONDS), `slow` slow
    clients beside them."""
    latencies: list[float] = []
    errors = [0]
    left = [requests]
    lock = threading.Lock()
    end = time.perf_counter() + SECONDS

    def client() -> None:
        while time.perf_counter() < end:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            seconds = one_request(url, body)
            with lock:
                if seconds is None:
                    errors[0] += 1
                else:
                    latencies.append(seconds)

    slowpokes = SlowClients(url, slow) if slow else None
    if slowpokes:
        time.sleep(1.0)  # the slow clients hold their connections first
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    tic = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - tic
    if slowpokes:
        time.sleep(max(0.0, 11.0 - wall))  # long enough for both deadlines to have cut each slow client once
        slowpokes.stop()
    ok = len(latencies)
    ms = sorted(s * 1000 for s in latencies)
    return {
        "clients": clients,
        "slow": slow,
        "requests": ok + errors[0],
        "answered": ok,
        "errors": errors[0],
        "seconds": wall,
        "requests_per_s": ok / wall if wall else 0.0,
        "images_per_s": ok * IMAGES / wall if wall else 0.0,
        "p50_ms": statistics.median(ms) if ms else None,
        "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else None,
        "slow_cut_body": slowpokes.cut[0] if slowpokes else None,
        "slow_cut_head": slowpokes.cut[1] if slowpokes else None,
    }


def load_rows(url: str, quick: bool) -> list[dict[str, Any]]:
    """The four phases against the server at `url` (also used by hand against another server)."""
    body = request_body()
    for _ in range(3):  # warm-up: the server's first requests import and compile
        one_request(url, body)
    per = 3 if quick else 8  # requests per client at 8 and 64 clients
    plan = [(1, 30 if quick else 100, 0), (8, 8 * per, 0), (64, 64 * per, 0), (64, 64 * per, SLOW)]
    return [phase(url, body, clients, requests, slow) for clients, requests, slow in plan]


def run(ctx: Context) -> dict:
    load = load_average()
    proc, url = start_server()
    try:
        rows = load_rows(url, ctx.quick)
    finally:
        proc.kill()
        proc.wait()
    by = {(r["clients"], r["slow"]): r for r in rows}
    alone, crowd, slowed = by[(1, 0)], by[(64, 0)], by[(64, SLOW)]
    errors = sum(r["errors"] for r in rows)
    reading = (
        f"On loopback with a reward that costs nothing, one client gets {alone['requests_per_s']:.0f} "
        f"requests/s ({alone['images_per_s']:.0f} images/s of {SIDE} px, p99 {alone['p99_ms']:.0f} ms); 64 "
        f"at once get {crowd['requests_per_s']:.0f} requests/s in all, p99 {crowd['p99_ms']:.0f} ms (they "
        f"queue for the server's 4 decoding slots and its one scoring thread, and the clients' threads share "
        f"the machine's {os.cpu_count()} cores with the server), with {crowd['errors']} of "
        f"{crowd['requests']} requests unanswered. With {SLOW} slow clients beside them — half dripping a "
        f"body a byte every 0.5 s, half stopping in the middle of a head — the 64 still get "
        f"{slowed['requests_per_s']:.0f} requests/s (p99 {slowed['p99_ms']:.0f} ms, {slowed['errors']} "
        f"unanswered): the slow clients hold no slot, and the server cut them {slowed['slow_cut_body']} "
        f"times at the body deadline (5 s, 408) and {slowed['slow_cut_head']} times at the head deadline (10 "
        f"s). {errors} request(s) unanswered in all phases." + shared_cpu_note(load)
    )
    return {
        "title": TITLE,
        "timing": f"each phase a bounded count of requests (or {SECONDS:.0f} s), one after another per "
        f"client, {IMAGES} images of {SIDE} px a request, after 3 warm-up requests; latency per "
        f"request from the client",
        "columns": [
            ("clients", "clients"),
            ("slow", "slow clients"),
            ("requests", "requests"),
            ("errors", "unanswered"),
            ("requests_per_s", "requests/s"),
            ("images_per_s", "images/s"),
            ("p50_ms", "p50 ms"),
            ("p99_ms", "p99 ms"),
            ("slow_cut_body", "slow cut at body deadline"),
            ("slow_cut_head", "slow cut at head deadline"),
        ],
        "rows": rows,
        "summary": {
            "errors": errors,
            "load_average": load,
            "requests_per_s": {f"{r['clients']}+{r['slow']}": r["requests_per_s"] for r in rows},
        },
        "reading": reading,
    }
