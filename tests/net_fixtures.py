"""Loopback servers and clients for the tests of the network surfaces (tests/rewards/test_http_client.py,
test_remote_untrusted.py, test_judge_untrusted.py, test_server_hostile.py): a fake server whose every answer
a test writes (slow, huge, redirecting, malformed), a fake proxy (absolute-form and CONNECT), a TLS
certificate made with openssl, the real reward server with small deadlines, and raw sockets for hostile
clients."""

from __future__ import annotations

import base64
import http.client
import io
import json
import select
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class Seen:
    """A request a fake server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    """What a fake server answers: `body` (bytes, or data sent as JSON), or with `drip` every byte of the
    whole answer (head included) that many seconds apart, or with `stream` that many bytes of a chunked body
    (or until the client hangs up)."""

    status: int = 200
    body: Any = b""
    headers: dict[str, str] = field(default_factory=dict)
    drip: float = 0.0
    stream: int = 0


class FakeServer:
    """A loopback HTTP(S) server whose answers `respond(seen) -> Reply` writes; records what it was sent
    (`seen`) and how many bytes of streamed answers went out (`sent`). CONNECT requests are tunnelled to their
    target (a proxy) when `tunnel` is set."""

    def __init__(
        self, respond: Callable[[Seen], Reply], tls: tuple[str, str] | None = None, tunnel: bool = False
    ):
        self.respond, self.seen, self.sent, self.tunnelled = respond, [], 0, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def handle_one(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                fake.seen.append(seen)
                reply = fake.respond(seen)
                try:
                    fake.write(self, reply)
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
                    pass
                self.close_connection = True

            do_GET = do_POST = handle_one

            def do_CONNECT(self) -> None:
                if not tunnel:
                    return self.handle_one()
                host, port = self.path.rsplit(":", 1)
                fake.tunnelled.append(self.path)
                upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
                self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self.wfile.flush()
                relay(self.connection, upstream)
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def write(self, handler: BaseHTTPRequestHandler, reply: Reply) -> None:
        body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
        head = f"HTTP/1.1 {reply.status} {http.client.responses.get(reply.status, 'X')}\r\n"
        headers = {"Content-Type": "application/json", "Connection": "close", **reply.headers}
        if reply.stream:
            headers["Transfer-Encoding"] = "chunked"
        else:
            headers.setdefault("Content-Length", str(len(body)))
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        out = handler.wfile
        if reply.drip:
            for byte in head.encode() + body:
                out.write(bytes([byte]))
                out.flush()
                time.sleep(reply.drip)
            return
        out.write(head.encode())
        if not reply.stream:
            out.write(body)
            out.flush()
            return
        chunk = b"[" * (64 << 10)
        while self.sent < reply.stream:
            out.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            out.flush()
            self.sent += len(chunk)
        out.write(b"0\r\n\r\n")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def relay(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways between two sockets until one closes (a CONNECT tunnel)."""
    try:
        while True:
            ready, _, _ = select.select([a, b], [], [], 5)
            if not ready:
                return
            for src in ready:
                data = src.recv(65536)
                if not data:
                    return
                (b if src is a else a).sendall(data)
    except OSError:
        return
    finally:
        b.close()


@contextmanager
def fake_server(respond: Callable[[Seen], Reply], **kwargs: Any) -> Iterator[FakeServer]:
    server = FakeServer(respond, **kwargs)
    try:
        yield server
    finally:
        server.close()


def self_signed(folder: Path) -> tuple[str, str] | None:
    """(certificate, key) for 127.0.0.1, made with openssl; None where openssl is not installed."""
    if shutil.which("openssl") is None:
        return None
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


# ----------------------------------------------------------------------------- reward-server answers
def health(**fields: Any) -> dict:
    """A well-formed /health answer of a reward server, with `fields` changed."""
    from t2i_gcpo.rewards.remote import PROTOCOL, SERVICE

    info = {
        "service": SERVICE,
        "protocol": PROTOCOL,
        "version": "0.1.0",
        "spec": "fake",
        "name": "fake",
        "terms": None,
        "bounds": [0.0, 1.0],
        "context": [],
        "max_images": 64,
        "max_bytes": 1 << 24,
    }
    info.update(fields)
    return info


def reward_server(health_answer: Any, score: Callable[[Seen], Reply]) -> Callable[[Seen], Reply]:
    """A fake reward server's `respond`: `health_answer` to /health, `score(seen)` to /score."""

    def respond(seen: Seen) -> Reply:
        if "/health" in seen.path:
            return health_answer if isinstance(health_answer, Reply) else Reply(body=health_answer)
        return score(seen)

    return respond


def scores_for(seen: Seen, value: float = 0.5) -> Reply:
    """A well-formed /score answer: `value` for every image sent."""
    n = len(seen.json()["images"])
    return Reply(body={"scores": [value] * n, "details": [{} for _ in range(n)]})


# --------------------------------------------------------------------------- the real server, hostile clients
BRIGHTNESS = f"{Path(__file__).resolve().parent / 'net_rewards.py'}:brightness"


@contextmanager
def real_server(spec: str = BRIGHTNESS, **options: Any) -> Iterator[tuple[str, Any, Any]]:
    """The reward server (t2i_gcpo/rewards/server.py) on a free loopback port in a thread: (URL,
    service, server)."""
    from t2i_gcpo.rewards.server import RewardService, make_server

    service = RewardService(spec, device="cpu", **options)
    server = make_server(service, "127.0.0.1", 0, quiet=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", service, server
    finally:
        server.shutdown()
        server.server_close()


def png(size: int | tuple[int, int] = 16, colour: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    from PIL import Image

    width, height = (size, size) if isinstance(size, int) else size
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def score_body(n: int = 2, size: int = 16, **extra: Any) -> bytes:
    return json.dumps(
        {"images": [b64(png(size))] * n, "prompts": ["a photo of a circle"] * n, **extra}
    ).encode()


def post(
    url: str, body: bytes | None, headers: dict | None = None, path: str = "/score", timeout: float = 10
) -> tuple[int, dict]:
    """(status, JSON answer) of one POST to the real server."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.putrequest("POST", path)
        for key, value in (
            headers if headers is not None else {"Content-Length": str(len(body or b""))}
        ).items():
            conn.putheader(key, value)
        conn.endheaders()
        if body:
            conn.send(body)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def still_serving(url: str) -> bool:
    """The server scores a good request (after a hostile client)."""
    status, answer = post(url, score_body(2))
    return status == 200 and len(answer["scores"]) == 2


def raw_client(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(whether the server closed `sock` within `seconds`, what it sent before)."""
    sock.settimeout(0.1)
    got, end = b"", time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return True, got
        if not data:
            return True, got
        got += data
    return False, got
