"""The HTTP client of the rewards that call a server (`remote:`, `judge:`; docs/guides/rewards.md#server),
which trusts nothing it is answered.

- **A whole-request deadline.** Connecting, the TLS handshake, sending and reading the answer share one
  deadline (`timeout` seconds from the start): every socket operation waits at most for the time left, so a
  server that answers a byte a second is cut at the deadline, not at `timeout` per read.
- **An answer size bound.** An answer larger than `max_bytes` (declared, or as it arrives) is refused
  (`AnswerTooLarge`); the head (status line and headers) is bounded by `HEAD_BYTES`.
- **No redirects.** A 3xx is returned as an answer and never followed: credentials (an ``Authorization``
  header) go to the URL's origin and nowhere else. `redirect_line` says where it pointed.
- **No proxy unless one is named.** The environment's ``HTTP(S)_PROXY`` are not read; `proxy` (an explicit
  option of the reward) sends the request through that proxy (absolute-form for http, a CONNECT tunnel for
  https).
- **One request per connection** (``Connection: close``), HTTP/1.1 framed by h11 (Content-Length, chunked or
  close-delimited answers).

`request` returns any complete answer (`Answer`, whatever its status: the caller reads it); it raises
`NoAnswer` when there is none (no connection, a reset, the deadline, an answer that is not HTTP: worth
another try) and `AnswerTooLarge`. `parse_answer` reads an answer's JSON into a typed schema (pydantic) with
the depth bound of the tool's file reader (t2i_gcpo/outdir.py), naming the first field that is wrong. Name
resolution (getaddrinfo) is the system's and is not bounded by the deadline: give an address where it matters.
"""

from __future__ import annotations

import functools
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

from t2i_gcpo.errors import UserError, shorten
from t2i_gcpo.version import __version__

HEAD_BYTES = 64 << 10  # the status line and headers of an answer
CHUNK = 64 << 10  # bytes per socket read or write
USER_AGENT = f"t2i-gcpo/{__version__}"


class NoAnswer(Exception):
    """No complete HTTP answer: connection refused or reset, the deadline, a malformed answer."""


class AnswerTooLarge(Exception):
    """An answer larger than the caller's bound."""


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    headers: dict[str, str]  # names in lower case
    body: bytes


@dataclass(frozen=True)
class Origin:
    """A URL read for a request: scheme, host, port and the request target (path and query)."""

    scheme: str
    host: str
    port: int
    target: str

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.netloc}{self.target}"

    def same_origin(self, other: Origin) -> bool:
        return (self.scheme, self.host.lower(), self.port) == (other.scheme, other.host.lower(), other.port)


def split_url(url: str, what: str, example: str = "http://127.0.0.1:8100") -> SplitResult:
    """`url` split, checked to be an http(s) URL with a host and without credentials or a fragment; a one-line
    UserError naming `what` (the reward) otherwise."""
    text = url.strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise UserError(f"{what}: {shorten(text)!r} is not a URL ({e}; e.g. {example})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in text):
        raise UserError(f"{what}: {shorten(text)!r} is not an http(s) URL (e.g. {example})")
    if parts.username is not None or parts.password is not None:
        raise UserError(
            f"{what}: the URL holds credentials (user:password@), which a run records in its config: "
            "remove them (a judge's key goes in the environment variable api_key_env)"
        )
    if parts.fragment:
        raise UserError(f"{what}: the URL {shorten(text)!r} has a fragment (#…); remove it")
    if port == 0:
        raise UserError(f"{what}: the URL {shorten(text)!r} has port 0")
    return parts


def origin_of(parts: SplitResult) -> Origin:
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return Origin(parts.scheme, parts.hostname or "", port, target)


def check_proxy(proxy: str | None, what: str) -> None:
    """A proxy given to a reward is an http:// URL of a host and port, nothing more; else a
    one-line UserError."""
    if proxy is None:
        return
    parts = split_url(proxy, f"{what}: proxy", "http://proxy.internal:3128")
    if parts.scheme != "http" or parts.path not in ("", "/") or parts.query:
        raise UserError(f"{what}: proxy {shorten(proxy)!r} must be http://HOST:PORT (a plain HTTP proxy)")


def tls_context() -> ssl.SSLContext:
    """The TLS context of https requests: the system's trusted certificates, hostnames checked."""
    return ssl.create_default_context()


class Deadline:
    """Seconds left before a request's deadline; `left` raises NoAnswer when there are none."""

    def __init__(self, seconds: float):
        self.seconds, self.end = float(seconds), time.monotonic() + float(seconds)

    def left(self) -> float:
        remaining = self.end - time.monotonic()
        if remaining <= 0:
            raise NoAnswer(f"no complete answer within the deadline ({self.seconds:g} s)")
        return remaining


def _send(sock: socket.socket, data: bytes, deadline: Deadline) -> None:
    view = memoryview(data)
    while view:
        sock.settimeout(deadline.left())
        try:
            sent = sock.send(view[:CHUNK])
        except TimeoutError:
            raise NoAnswer(f"no complete answer within the deadline ({deadline.seconds:g} s)") from None
        view = view[sent:]


def _recv(sock: socket.socket, deadline: Deadline) -> bytes:
    sock.settimeout(deadline.left())
    try:
        return sock.recv(CHUNK)
    except TimeoutError:
        raise NoAnswer(f"no complete answer within the deadline ({deadline.seconds:g} s)") from None


def _connect(host: str, port: int, deadline: Deadline) -> socket.socket:
    try:
        sock = socket.create_connection((host, port), timeout=deadline.left())
    except TimeoutError:
        raise NoAnswer(
            f"no connection to {host}:{port} within the deadline ({deadline.seconds:g} s)"
        ) from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _wrap_tls(sock: socket.socket, host: str, deadline: Deadline) -> socket.socket:
    sock.settimeout(deadline.left())  # the handshake's timeout is its total (CPython's ssl module)
    try:
        return tls_context().wrap_socket(sock, server_hostname=host)
    except TimeoutError:
        sock.close()
        raise NoAnswer(f"no TLS handshake within the deadline ({deadline.seconds:g} s)") from None
    except ssl.SSLError as e:
        sock.close()
        raise NoAnswer(f"TLS: {e.reason or e}") from None


def _tunnel(sock: socket.socket, origin: Origin, deadline: Deadline) -> None:
    """CONNECT `origin` through the proxy `sock` is connected to; NoAnswer unless the proxy says 2xx."""
    import h11

    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEAD_BYTES)
    authority = f"[{origin.host}]:{origin.port}" if ":" in origin.host else f"{origin.host}:{origin.port}"
    head = conn.send(
        h11.Request(
            method="CONNECT", target=authority, headers=[("Host", authority), ("User-Agent", USER_AGENT)]
        )
    )
    _send(sock, head + conn.send(h11.EndOfMessage()), deadline)
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as e:
            raise NoAnswer(f"the proxy's answer to CONNECT is not HTTP ({e})") from None
        if event is h11.NEED_DATA:
            conn.receive_data(_recv(sock, deadline))
        elif isinstance(event, h11.Response):
            if not 200 <= event.status_code < 300:
                raise NoAnswer(f"the proxy refused CONNECT {authority} (HTTP {event.status_code})")
            return
        elif isinstance(event, h11.ConnectionClosed):
            raise NoAnswer("the proxy closed the connection before answering CONNECT")


def request(
    url: str,
    *,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float,
    max_bytes: int,
    proxy: str | None = None,
) -> Answer:
    """One HTTP request to `url` (module docstring): its complete answer, whatever its status; NoAnswer or
    AnswerTooLarge otherwise. `url` and `proxy` are checked by the caller (`split_url`, `check_proxy`)."""
    import h11

    origin = origin_of(urlsplit(url))
    deadline = Deadline(timeout)
    fields = [
        ("Host", origin.netloc),
        ("User-Agent", USER_AGENT),
        ("Accept-Encoding", "identity"),
        ("Connection", "close"),
    ]
    fields += list((headers or {}).items())
    if body is not None:
        fields.append(("Content-Length", str(len(body))))
    target = origin.target
    try:
        if proxy is None:
            sock = _connect(origin.host, origin.port, deadline)
        else:
            via = origin_of(urlsplit(proxy))
            sock = _connect(via.host, via.port, deadline)
            if origin.scheme == "https":
                try:
                    _tunnel(sock, origin, deadline)
                except BaseException:
                    sock.close()
                    raise
            else:
                target = origin.url  # absolute-form: the proxy forwards it
        if origin.scheme == "https":
            sock = _wrap_tls(sock, origin.host, deadline)
    except OSError as e:
        raise NoAnswer(f"{type(e).__name__}: {e.strerror or e}") from None
    try:
        return _exchange(sock, h11, method, target, fields, body, deadline, max_bytes)
    finally:
        sock.close()


def _exchange(
    sock: socket.socket,
    h11: Any,
    method: str,
    target: str,
    fields: list[tuple[str, str]],
    body: bytes | None,
    deadline: Deadline,
    max_bytes: int,
) -> Answer:
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEAD_BYTES)
    try:
        _send(sock, conn.send(h11.Request(method=method, target=target, headers=fields)), deadline)
        if body:
            _send(sock, conn.send(h11.Data(data=body)), deadline)
        _send(sock, conn.send(h11.EndOfMessage()), deadline)
        sent_error = None
    except OSError as e:  # a server may answer (a 413) and close before it has read the whole body
        sent_error = e
    status, reason, answer_headers, parts, size = 0, "", {}, [], 0
    try:
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as e:
                raise NoAnswer(f"the answer is not HTTP/1.x ({shorten(str(e), 80)})") from None
            if event is h11.NEED_DATA:
                data = _recv(sock, deadline)
                if not data and status == 0:
                    raise NoAnswer("the server closed the connection without an answer")
                conn.receive_data(data)
            elif isinstance(event, h11.Response):
                status, reason = event.status_code, event.reason.decode("latin-1")
                answer_headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
                declared = answer_headers.get("content-length", "")
                if declared.isdigit() and int(declared) > max_bytes:
                    raise AnswerTooLarge(f"an answer of {int(declared)} bytes, more than {max_bytes}")
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > max_bytes:
                    raise AnswerTooLarge(f"an answer of more than {max_bytes} bytes")
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return Answer(status, reason, answer_headers, b"".join(parts))
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                raise NoAnswer("the server closed the connection before its answer was complete")
            # an InformationalResponse (100 Continue) is skipped
    except (OSError, NoAnswer) as e:
        # nothing came back after a failed send: the failure to name is the sending's
        failure = sent_error if sent_error is not None and status == 0 else e
        if isinstance(failure, NoAnswer):
            raise failure from None
        raise NoAnswer(f"{type(failure).__name__}: {failure.strerror or failure}") from None


def redirect_line(url: str, answer: Answer) -> str:
    """What a 3xx answer to `url` says, for an error line: where it points, and that it was not followed."""
    location = answer.headers.get("location", "")
    if not location:
        return f"HTTP {answer.status} without a Location"
    from urllib.parse import urljoin

    there = urljoin(url, location)
    try:
        same = origin_of(urlsplit(url)).same_origin(origin_of(urlsplit(there)))
    except ValueError:
        same = False
    where = "on the same server: give that URL instead" if same else "another server"
    return f"HTTP {answer.status}, a redirect to {shorten(there, 120)} ({where}; redirects are not followed)"


@functools.cache
def _adapter(schema: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(schema)


def parse_answer(raw: bytes, schema: Any) -> Any:
    """`raw` (an answer's body) as JSON of `schema` (a pydantic model or type), with the file reader's depth
    bound; ValueError naming the first field that is wrong otherwise."""
    from pydantic import ValidationError

    from t2i_gcpo.outdir import parse_json

    try:
        value = parse_json(raw.decode("utf-8"), "")
    except UnicodeDecodeError:
        raise ValueError("the answer is not UTF-8 text") from None
    except UserError as e:
        raise ValueError(f"the answer is {e}") from None
    try:
        return _adapter(schema).validate_python(value, strict=True)
    except ValidationError as e:
        error = e.errors(include_url=False)[0]
        field = ".".join(str(p) for p in error["loc"])
        at = f"'{field}'" if field else "the answer"
        raise ValueError(
            f"{at}: {error['msg'][:1].lower()}{error['msg'][1:]}, got {shorten(repr(error['input']), 60)}"
        ) from None
