"""The reward server behind `t2i-gcpo reward-server` (docs/guides/rewards.md#server): any reward the registry
builds — one form, a weighted sum, a user function — served over HTTP by uvicorn (an ASGI server, its h11
protocol) and a Starlette app, in the protocol of t2i_gcpo/rewards/remote.py (its docstring).

What a client can hold, and for how long:

- **a connection**: its request's line and headers must arrive within `HEAD_SECONDS` of its opening (or of its
  last answer), an idle kept-alive connection closes after `KEEP_ALIVE` seconds; at most `CONNECTIONS` at
  once (more are answered 503, which a client retries), `BACKLOG` waiting to be accepted;
- **memory for its body**: the body must arrive whole within `body_timeout` seconds (408 otherwise), and the
  bodies being received hold at most `pending_bytes` together, counted as their bytes arrive (a request that
  would take more is answered 503): a slow client holds what it has sent, no slot;
- **a slot**: a request whose body has arrived takes one of `PENDING` slots to be decoded, waits its turn and
  is scored; the decoded pixels of a request are bounded by `max_pixels` (and each image by `MAX_SIDE` a
  side), read from each PNG's header before anything is decoded. A request whose client has
  hung up is not scored.

A request is checked before anything is scored, and one it cannot take is answered 4xx with one line —
411 without a Content-Length, 413 when it is larger than `max_bytes`, holds more than `max_images` images or
more than `max_pixels` pixels, 408 for a body that does not arrive in time, 400 for a body that is not JSON
(or nests deeper than the tool's reader takes: t2i_gcpo/outdir.py), fields of the wrong kind, prompts or
metadata whose count is not the images', an image that is not a readable PNG (truncated, corrupt, larger than
`MAX_SIDE`) or images of different sizes — and the server goes on serving. A reward that fails on a valid
request (`RewardError`, an exception) is answered 500 with its line. Batches are scored one at a time, in the
order their decoding ends, in one thread (a reward model is not asked to run two batches at once; a user
function need not be thread-safe).

The rewards that read the run's token grid (`shapeworld`) are built once per grid a client sends, the last
`GRIDS` kept (the form's default, built at start-up, is always kept: a spec that cannot be built fails before
the server listens). Text rewards (which need the policy's tokenizer) are not served. The log has one line per
request (none with ``quiet``) and one per client that hung up, never a traceback.

No authentication: the server listens on loopback by default; on another address, keep it on a private
network.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import logging
import socket
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from t2i_gcpo.errors import UserError, one_line, shorten
from t2i_gcpo.rewards.remote import PROTOCOL, SERVICE, jsonable
from t2i_gcpo.version import __version__

MAX_SIDE = 4096  # pixels: a larger image is refused before it is decoded (a PNG bomb)
MAX_PIXELS = 1 << 26  # decoded pixels of one request by default (64 Mpx: 455 images of 384², 4 of 4096²)
PENDING = 4  # requests decoded and held in memory at once (the one being scored included)
GRIDS = 8  # rewards built for clients' grids kept besides the default one
HEAD_SECONDS = 10.0  # a request's line and headers arrive within this
KEEP_ALIVE = 5  # seconds an idle kept-alive connection stays open
CONNECTIONS = 512  # connections at once; more are answered 503
BACKLOG = 2048  # connections the kernel queues before they are accepted (capped by net.core.somaxconn)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Refused(Exception):
    """A request the server does not take: its HTTP status and one line."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


def check_servable(spec: str) -> None:
    """A one-line UserError for a spec the server cannot serve: a text reward (it reads the
    policy's tokenizer)."""
    from t2i_gcpo.rewards.registry import spec_context, spec_outputs

    if "text" in spec_outputs(spec) or "tokenizer" in spec_context(spec):
        raise UserError(f"reward '{shorten(spec)}' scores text; the reward server serves image rewards")


@dataclass
class Batch:
    """A request, read and decoded: images as 8-bit pixels [B, H, W, 3] (floats only when scored)."""

    pixels: Any
    prompts: list[str]
    metadata: list[dict]
    grid: tuple[int, int] | None


class RewardService:
    """The served reward and its limits: `health`, `read` of one request's body, `score_batch` of it."""

    def __init__(
        self,
        spec: str,
        device: str | None = None,
        max_images: int = 512,
        max_bytes: int = 256 << 20,
        max_pixels: int = MAX_PIXELS,
        body_timeout: float = 60.0,
        pending_bytes: int | None = None,
    ):
        from t2i_gcpo.rewards.registry import build_reward, canonical_reward, spec_context

        check_servable(spec)
        self.spec = canonical_reward(spec)
        self.device = device
        self.reads_grid = "grid" in spec_context(self.spec)
        self.max_images, self.max_bytes, self.max_pixels = int(max_images), int(max_bytes), int(max_pixels)
        self.body_timeout = float(body_timeout)
        # request bodies held while they arrive and until they are decoded, all clients together
        self.pending_bytes = int(pending_bytes or PENDING * self.max_bytes)
        self.default = build_reward(self.spec, device=device, output="image")
        self.rewards: OrderedDict[tuple[int, int], Any] = OrderedDict()  # grid → reward, the last GRIDS used
        self.build_lock, self.score_lock = threading.Lock(), threading.Lock()
        self.scored = 0  # batches scored

    def health(self) -> dict[str, Any]:
        from t2i_gcpo.rewards.combine import reward_bounds, reward_name, reward_terms

        reward = self.default
        return {
            "service": SERVICE,
            "protocol": PROTOCOL,
            "version": __version__,
            "spec": self.spec,
            "name": reward_name(reward),
            "terms": reward_terms(reward),
            "bounds": reward_bounds(reward),
            "context": ["grid"] if self.reads_grid else [],
            "max_images": self.max_images,
            "max_bytes": self.max_bytes,
            "max_pixels": self.max_pixels,
            "max_side": MAX_SIDE,
        }

    def reward_for(self, grid: tuple[int, int] | None) -> Any:
        """The reward built for a request's grid (where the spec reads one): the last `GRIDS` are kept."""
        from t2i_gcpo.rewards.registry import build_reward

        if not self.reads_grid or grid is None:
            return self.default
        with self.build_lock:
            if grid in self.rewards:
                self.rewards.move_to_end(grid)
            else:
                self.rewards[grid] = build_reward(self.spec, device=self.device, grid=grid, output="image")
                while len(self.rewards) > GRIDS:
                    self.rewards.popitem(last=False)
            return self.rewards[grid]

    def score(self, body: bytes) -> dict[str, Any]:
        """The answer to one ``POST /score`` body (`read`, then `score_batch`); `Refused` for one
        it does not take."""
        return self.score_batch(self.read(body))

    def score_batch(self, batch: Batch) -> dict[str, Any]:
        import torch

        from t2i_gcpo.rewards.combine import call_reward

        reward = self.reward_for(batch.grid)
        with self.score_lock, torch.no_grad():
            images = torch.from_numpy(batch.pixels).permute(0, 3, 1, 2).float() / 255
            out = call_reward(reward, images, batch.prompts, batch.metadata)
            self.scored += 1
        answer = {"scores": out.scores.tolist(), "details": jsonable(out.details)}
        if out.terms is not None:  # a sum: each sample's score under each term, in /health's order
            answer["terms"] = out.terms.tolist()
        return answer

    def read(self, body: bytes) -> Batch:
        """A request body, checked and its images decoded; `Refused` naming what is wrong."""
        from t2i_gcpo.outdir import parse_json

        try:
            data = parse_json(body.decode("utf-8"), "the body")
        except UnicodeDecodeError:
            raise Refused(400, "the body is not UTF-8 JSON") from None
        except UserError as e:
            raise Refused(400, str(e)) from None
        if not isinstance(data, dict):
            raise Refused(400, f"the body must be a JSON object, got {type(data).__name__}")
        images, prompts = data.get("images"), data.get("prompts")
        metadata, context = data.get("metadata"), data.get("context")
        if not isinstance(images, list) or not all(isinstance(x, str) for x in images):
            raise Refused(400, "'images' must be a list of base64 PNG strings")
        if len(images) > self.max_images:
            raise Refused(
                413,
                f"{len(images)} images in one request, more than this server takes "
                f"({self.max_images}): send at most that many at a time",
            )
        if not images:
            raise Refused(400, "no images to score")
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise Refused(400, "'prompts' must be a list of strings")
        if len(prompts) != len(images):
            raise Refused(400, f"{len(images)} images but {len(prompts)} prompts: one prompt per image")
        if metadata is None:
            metadata = [{} for _ in images]
        if not isinstance(metadata, list) or not all(isinstance(m, dict) for m in metadata):
            raise Refused(400, "'metadata' must be a list of objects, one per image")
        if len(metadata) != len(images):
            raise Refused(400, f"{len(images)} images but {len(metadata)} metadata entries: one per image")
        if context is None:
            context = {}
        if not isinstance(context, dict):
            raise Refused(400, "'context' must be an object")
        grid = context.get("grid")
        if grid is not None and not (
            isinstance(grid, list) and len(grid) == 2 and all(type(g) is int and 0 < g <= 1024 for g in grid)
        ):
            raise Refused(400, "'context.grid' must be [rows, cols], two integers in [1, 1024]")
        pixels = decode_images(images, self.max_pixels)
        return Batch(pixels, prompts, metadata, tuple(grid) if grid is not None else None)


def png_size(raw: bytes) -> tuple[int, int] | None:
    """(width, height) in a PNG's header (its first chunk, IHDR), read without decoding; None for a file that
    does not start as a PNG."""
    if len(raw) < 24 or raw[:8] != PNG_SIGNATURE or raw[12:16] != b"IHDR":
        return None
    return int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")


def decode_images(images: list[str], max_pixels: int = MAX_PIXELS) -> Any:
    """Base64 PNGs → uint8 [B, H, W, 3]; `Refused` naming the first that is not one, or 413 when their headers
    add up to more than `max_pixels` (checked for all before any is decoded)."""
    import numpy as np
    from PIL import Image

    raws, sizes, total = [], [], 0
    for i, text in enumerate(images):
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise Refused(400, f"image {i} is not base64") from None
        size = png_size(raw)
        if size is None:
            if raw[:3] == b"\xff\xd8\xff":
                raise Refused(400, f"image {i} is a JPEG, not a PNG")
            raise Refused(400, f"image {i} is not a readable PNG (no PNG header)")
        width, height = size
        if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
            raise Refused(400, f"image {i} is {width}×{height}, larger than {MAX_SIDE} px (or empty)")
        if sizes and size != sizes[0]:
            raise Refused(
                400,
                f"image {i} is {width}×{height}, image 0 {sizes[0][0]}×{sizes[0][1]}: one size per request",
            )
        total += width * height
        if total > max_pixels:
            raise Refused(
                413,
                f"the images hold more than {max_pixels} pixels ({len(images)} of {width}×{height}), "
                "more than this server decodes in one request: send fewer at a time",
            )
        raws.append(raw)
        sizes.append(size)
    arrays = []
    for i, raw in enumerate(raws):
        try:
            with Image.open(io.BytesIO(raw)) as image:
                if image.format != "PNG" or image.size != sizes[i]:
                    raise Refused(400, f"image {i} is not a readable PNG (its header and content disagree)")
                image.load()
                arrays.append(np.asarray(image.convert("RGB")))
        except Refused:
            raise
        except Exception as e:  # PIL's errors for a truncated or corrupt file are of several kinds
            raise Refused(
                400, f"image {i} is not a readable PNG ({type(e).__name__}: {shorten(str(e), 80)})"
            ) from None
    return np.stack(arrays)


# ----------------------------------------------------------------------------- the HTTP side
def error(status: int, message: str, close: bool = False) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(
        {"error": one_line(message)}, status_code=status, headers={"Connection": "close"} if close else None
    )


class Log:
    """One line per request on stderr (none when quiet), one per client that hung up; never a traceback."""

    def __init__(self, quiet: bool):
        self.quiet = quiet

    def __call__(self, request: Any, status: int, what: str, always: bool = False) -> None:
        if self.quiet and not always:
            return
        client = f"{request.client.host}:{request.client.port}" if request.client else "-"
        stamp = time.strftime("%d/%b/%Y %H:%M:%S")
        sys.stderr.write(f"{stamp} {client} {request.method} {request.url.path} {status} {one_line(what)}\n")


class StderrLines(logging.StreamHandler):
    """uvicorn's log records as one line each on the `sys.stderr` of the moment (an exception it logs by its
    type and message: the app answers and logs the reward's failures itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%d/%b/%Y %H:%M:%S"))

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass

    def format(self, record: logging.LogRecord) -> str:
        error = record.exc_info[1] if record.exc_info else None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        line = super().format(record).rstrip()
        return one_line(f"{line}: {type(error).__name__}: {error}" if error is not None else line)


def make_app(service: RewardService, quiet: bool = False) -> Any:
    """The Starlette app serving `service` (module docstring)."""
    import anyio
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    log = Log(quiet)
    held = {"bytes": 0}  # request bodies in memory (one event loop: no lock)
    slots = asyncio.Semaphore(PENDING)  # requests decoded and held (bound to the server's loop on first use)
    scorer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-score")
    decoder = ThreadPoolExecutor(max_workers=PENDING, thread_name_prefix="reward-decode")

    async def health(request: Request) -> Any:
        log(request, 200, "health")
        return JSONResponse(service.health())

    async def receive(request: Request, length: int, mine: list[int]) -> bytes:
        """The body, as it arrives within the deadline, counted against `pending_bytes`."""
        body = bytearray()
        try:
            with anyio.fail_after(service.body_timeout):
                async for chunk in request.stream():
                    if held["bytes"] + len(chunk) > service.pending_bytes:
                        raise Refused(
                            503,
                            f"the server holds {held['bytes'] >> 20} MB of requests already: "
                            "send again shortly",
                        )
                    held["bytes"] += len(chunk)
                    mine[0] += len(chunk)
                    body += chunk
                    if len(body) > length:
                        raise Refused(400, f"the body is longer than its Content-Length ({length})")
        except TimeoutError:
            raise Refused(
                408,
                f"the body did not arrive within {service.body_timeout:g} s ({len(body)} of {length} bytes)",
            ) from None
        return bytes(body)

    async def score(request: Request) -> Any:
        tic, mine = time.perf_counter(), [0]
        loop = asyncio.get_running_loop()
        try:
            length = request.headers.get("content-length")
            if request.headers.get("transfer-encoding") or length is None:
                raise Refused(411, "a request needs a Content-Length (no chunked bodies)")
            if not length.isdigit():
                raise Refused(400, f"Content-Length {shorten(length, 30)!r} is not a number")
            n = int(length)
            if n > service.max_bytes:
                raise Refused(
                    413,
                    f"a request of {n} bytes, more than this server takes ({service.max_bytes}): "
                    "send fewer images at a time",
                )
            body = await receive(request, n, mine)
            async with slots:  # decoded and scored holding one of PENDING slots
                if await request.is_disconnected():
                    log(request, 499, "the client hung up while its request waited: not scored", always=True)
                    return error(499, "hung up")
                batch = await loop.run_in_executor(decoder, service.read, body)
                del body
                held["bytes"] -= mine[0]
                mine[0] = 0
                if await request.is_disconnected():
                    log(request, 499, "the client hung up while its request waited: not scored", always=True)
                    return error(499, "hung up")
                payload = await loop.run_in_executor(scorer, service.score_batch, batch)
        except Refused as e:
            log(request, e.status, str(e))
            # closed after: an unread body must not be taken for the next request
            return error(e.status, str(e), close=True)
        except ClientDisconnect:
            log(request, 499, f"the client hung up before its body arrived ({mine[0]} bytes)", always=True)
            return error(499, "hung up")
        except UserError as e:  # RewardError: the reward failed on these samples
            log(request, 500, str(e))
            return error(500, str(e))
        except Exception as e:  # anything else in the reward: the server stays up
            log(request, 500, f"{type(e).__name__}: {e}")
            return error(500, f"{type(e).__name__}: {e}")
        finally:
            held["bytes"] -= mine[0]
        log(request, 200, f"scored {len(payload['scores'])} image(s) in {time.perf_counter() - tic:.2f} s")
        return JSONResponse(payload)

    async def not_found(request: Request, exc: Exception) -> Any:
        status = getattr(exc, "status_code", 404)
        log(request, status, "no such path or method")
        return error(
            status, f"no {request.method} {shorten(request.url.path, 100)}: GET /health or POST /score"
        )

    routes = [Route(path, health, methods=["GET"]) for path in ("/health", "/health/")]
    routes += [Route(path, score, methods=["POST"]) for path in ("/score", "/score/")]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    app.router.redirect_slashes = False
    app.state.executors = (scorer, decoder)
    return app


def protocol_class() -> type:
    """uvicorn's h11 protocol with a deadline on each request's line and headers (`HEAD_SECONDS`): uvicorn
    bounds the time between requests (timeout_keep_alive) and the head's size, not the
    time a head may take."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadDeadline(H11Protocol):
        head_timer: asyncio.TimerHandle | None = None

        def arm(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
            self.head_timer = self.loop.call_later(HEAD_SECONDS, self.head_late)

        def head_late(self) -> None:
            self.head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():  # no complete head yet
                self.transport.close()

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self.arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None
            super().connection_lost(exc)

    return HeadDeadline


class RewardServer:
    """`service` served on (host, port) (port 0: a free one), listening from construction: `serve_forever()`
    serves until `shutdown()` (from another thread) or Ctrl-C; `server_close()` releases the port."""

    def __init__(
        self, service: RewardService, host: str = "127.0.0.1", port: int = 8100, quiet: bool = False
    ):
        import uvicorn

        self.service = service
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(BACKLOG)
        except OSError as e:
            self.socket.close()
            raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        self.server_address = self.socket.getsockname()[:2]
        self.app = make_app(service, quiet)
        # uvicorn's own warnings (a malformed request): one line each
        logger = logging.getLogger("uvicorn.error")
        if not any(isinstance(h, StderrLines) for h in logger.handlers):
            logger.addHandler(StderrLines())
        logger.setLevel(logging.WARNING)
        logger.propagate = False
        config = uvicorn.Config(
            self.app,
            loop="asyncio",
            http=protocol_class(),
            lifespan="off",
            log_config=None,
            access_log=False,
            backlog=BACKLOG,
            limit_concurrency=CONNECTIONS,
            timeout_keep_alive=KEEP_ALIVE,
            timeout_graceful_shutdown=3,
            server_header=False,
            headers=[("server", f"t2i-gcpo/{__version__}")],
        )
        self.uvicorn = uvicorn.Server(config)
        self.stopped = threading.Event()

    def serve_forever(self) -> None:
        try:
            self.uvicorn.run(sockets=[self.socket])
        finally:
            self.stopped.set()

    def shutdown(self) -> None:
        self.uvicorn.should_exit = True
        self.stopped.wait(15)

    def server_close(self) -> None:
        self.socket.close()
        for executor in self.app.state.executors:
            executor.shutdown(wait=False, cancel_futures=True)


def make_server(
    service: RewardService, host: str = "127.0.0.1", port: int = 8100, quiet: bool = False
) -> RewardServer:
    """The HTTP server of `service` on (host, port), listening (port 0: a free one);
    serve_forever() serves."""
    return RewardServer(service, host, port, quiet)
