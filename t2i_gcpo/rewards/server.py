"""The reward server behind `t2i-gcpo reward-server` (docs/guides/rewards.md#server): any reward the registry
builds — one form, a weighted sum, a user function — served over HTTP by the standard library's
`ThreadingHTTPServer`, in the protocol of t2i_gcpo/rewards/remote.py (its docstring).

A request is checked before anything is scored, and one it cannot take is answered 4xx with one line —
411 without a Content-Length, 413 when it is larger than `max_bytes` or holds more than `max_images`
images, 400 for a body that is not JSON, fields of the wrong kind, prompts or metadata whose count is
not the images', an image that is not a readable PNG (truncated, corrupt, larger than `MAX_SIDE`) or
images of different sizes — and the server goes on serving. A reward that fails on a valid request
(`RewardError`, an exception) is answered 500 with its line. Batches are decoded in the request threads
(`PENDING` requests at most at once: memory) and scored one at a time, in the order they arrive (a reward model is not asked to run two batches at
once; a user function need not be thread-safe).

The rewards that read the run's token grid (`shapeworld`) are built once per grid a client sends (the
first, the form's default, at start-up: a spec that cannot be built fails before the server listens).
Text rewards (which need the policy's tokenizer) are not served.

No authentication: the server listens on loopback by default; on another address, keep it on a private
network.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from t2i_gcpo.errors import UserError, one_line, shorten
from t2i_gcpo.rewards.remote import PROTOCOL, SERVICE, jsonable
from t2i_gcpo.version import __version__

MAX_SIDE = 4096  # pixels: a larger image is refused before it is decoded (a PNG bomb)
PENDING = 4  # requests decoded and held in memory at once
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class Refused(Exception):
    """A request the server does not take: its HTTP status and one line."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


def check_servable(spec: str) -> None:
    """A one-line UserError for a spec the server cannot serve: a text reward (it reads the policy's tokenizer)."""
    from t2i_gcpo.rewards.registry import spec_context, spec_outputs

    if "text" in spec_outputs(spec) or "tokenizer" in spec_context(spec):
        raise UserError(f"reward '{shorten(spec)}' scores text; the reward server serves image rewards")


class RewardService:
    """The served reward and its limits: `health`, and `score` of one request's body."""

    def __init__(
        self, spec: str, device: str | None = None, max_images: int = 512, max_bytes: int = 256 << 20
    ):
        from t2i_gcpo.rewards.registry import build_reward, canonical_reward, spec_context

        check_servable(spec)
        self.spec = canonical_reward(spec)
        self.device = device
        self.reads_grid = "grid" in spec_context(self.spec)
        self.max_images, self.max_bytes = int(max_images), int(max_bytes)
        self.rewards: dict[Any, Any] = {None: build_reward(self.spec, device=device, output="image")}
        self.build_lock, self.score_lock = threading.Lock(), threading.Lock()
        # requests decoded and held at once (each up to max_bytes): the others wait their turn
        self.slots = threading.BoundedSemaphore(PENDING)
        self.scored = 0  # batches scored (the log line counts them)

    def health(self) -> dict[str, Any]:
        from t2i_gcpo.rewards.combine import reward_bounds, reward_name, reward_terms

        reward = self.rewards[None]
        return {"service": SERVICE, "protocol": PROTOCOL, "version": __version__, "spec": self.spec,
                "name": reward_name(reward), "terms": reward_terms(reward), "bounds": reward_bounds(reward),
                "context": ["grid"] if self.reads_grid else [], "max_images": self.max_images,
                "max_bytes": self.max_bytes}  # fmt: skip

    def reward_for(self, context: dict) -> Any:
        """The reward built for this request's context (its grid, where the spec reads one)."""
        from t2i_gcpo.rewards.registry import build_reward

        grid = context.get("grid")
        if not self.reads_grid or grid is None:
            return self.rewards[None]
        key = tuple(grid)
        with self.build_lock:
            if key not in self.rewards:
                self.rewards[key] = build_reward(self.spec, device=self.device, grid=key, output="image")
            return self.rewards[key]

    def score(self, body: bytes) -> dict[str, Any]:
        """The answer to one ``POST /score`` body; `Refused` for a request it does not take."""
        import torch

        from t2i_gcpo.rewards.combine import call_reward

        images, prompts, metadata, context = self.read(body)
        reward = self.reward_for(context)
        with self.score_lock, torch.no_grad():
            out = call_reward(reward, images, prompts, metadata)
            self.scored += 1
        answer = {"scores": out.scores.tolist(), "details": jsonable(out.details)}
        if out.terms is not None:  # a sum: each sample's score under each term, in /health's order
            answer["terms"] = out.terms.tolist()
        return answer

    def read(self, body: bytes) -> tuple[Any, list[str], list[dict], dict]:
        """(images [B, 3, H, W] in [0, 1], prompts, metadata, context) of a request body, checked."""
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise Refused(400, f"the body is not JSON ({shorten(str(e), 80)})") from None
        if not isinstance(data, dict):
            raise Refused(400, f"the body must be a JSON object, got {type(data).__name__}")
        images, prompts = data.get("images"), data.get("prompts")
        metadata, context = data.get("metadata"), data.get("context") or {}
        if not isinstance(images, list) or not all(isinstance(x, str) for x in images):
            raise Refused(400, "'images' must be a list of base64 PNG strings")
        if len(images) > self.max_images:
            raise Refused(413, f"{len(images)} images in one request, more than this server takes "
                               f"({self.max_images}): send at most that many at a time")  # fmt: skip
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
        if not isinstance(context, dict):
            raise Refused(400, "'context' must be an object")
        grid = context.get("grid")
        if grid is not None and not (isinstance(grid, list) and len(grid) == 2 and
                                     all(isinstance(g, int) and 0 < g <= 1024 for g in grid)):  # fmt: skip
            raise Refused(400, "'context.grid' must be [rows, cols], two integers in [1, 1024]")
        return decode_images(images), prompts, metadata, context


def decode_images(images: list[str]) -> Any:
    """Base64 PNGs → float [B, 3, H, W] in [0, 1]; `Refused` (400) naming the first that is not one."""
    import numpy as np
    import torch
    from PIL import Image

    arrays = []
    for i, text in enumerate(images):
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise Refused(400, f"image {i} is not base64") from None
        try:
            with Image.open(io.BytesIO(raw)) as image:
                if image.format != "PNG":
                    raise Refused(400, f"image {i} is {image.format or 'not an image'}, not a PNG")
                if max(image.size) > MAX_SIDE:
                    raise Refused(
                        400, f"image {i} is {image.size[0]}×{image.size[1]}, larger than {MAX_SIDE} px"
                    )
                image.load()
                arrays.append(np.asarray(image.convert("RGB")))
        except Refused:
            raise
        except Exception as e:  # PIL's errors for a truncated or corrupt file are of several kinds
            raise Refused(
                400, f"image {i} is not a readable PNG ({type(e).__name__}: {shorten(str(e), 80)})"
            ) from None
        if arrays[-1].shape != arrays[0].shape:
            raise Refused(400, f"image {i} is {arrays[-1].shape[1]}×{arrays[-1].shape[0]}, image 0 "
                               f"{arrays[0].shape[1]}×{arrays[0].shape[0]}: one size per request")  # fmt: skip
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255


def make_handler(service: RewardService, quiet: bool = False) -> type:
    """The request handler class serving `service`."""

    class Handler(BaseHTTPRequestHandler):
        server_version = f"t2i-gcpo/{__version__}"
        timeout = 300  # seconds a client may take to send its request

        def log_message(self, format: str, *args: Any) -> None:
            if not quiet:
                sys.stderr.write(f"{self.log_date_time_string()} {format % args}\n")

        def answer(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/health":
                self.answer(200, service.health())
            else:
                self.answer(404, {"error": f"no {self.path}: GET /health or POST /score"})

        def do_POST(self) -> None:
            tic = time.perf_counter()
            try:
                if self.path.rstrip("/") != "/score":
                    raise Refused(404, f"no {self.path}: GET /health or POST /score")
                length = self.headers.get("Content-Length")
                if length is None:
                    raise Refused(411, "a request needs a Content-Length")
                try:
                    n = int(length)
                except ValueError:
                    raise Refused(400, f"Content-Length {length!r} is not a number") from None
                if n > service.max_bytes or n < 0:
                    raise Refused(413, f"a request of {n} bytes, more than this server takes ({service.max_bytes}): "
                                       "send fewer images at a time")  # fmt: skip
                with service.slots:  # the body is read, decoded and scored holding one of PENDING slots
                    payload = service.score(self.rfile.read(n))
            except Refused as e:
                self.close_connection = True  # an unread body must not be taken for the next request
                self.answer(e.status, {"error": one_line(str(e))})
                return
            except UserError as e:  # RewardError: the reward failed on these samples
                self.answer(500, {"error": one_line(str(e))})
                return
            except Exception as e:  # anything else in the reward: the server stays up
                self.answer(500, {"error": one_line(f"{type(e).__name__}: {e}")})
                return
            self.answer(200, payload)
            if not quiet:
                n = len(payload["scores"])
                sys.stderr.write(
                    f"{self.log_date_time_string()} scored {n} image(s) in {time.perf_counter() - tic:.2f} s\n"
                )

    return Handler


def make_server(
    service: RewardService, host: str = "127.0.0.1", port: int = 8100, quiet: bool = False
) -> ThreadingHTTPServer:
    """The HTTP server of `service` on (host, port), listening (port 0: a free one); serve_forever() serves."""
    try:
        server = ThreadingHTTPServer((host, port), make_handler(service, quiet))
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    server.daemon_threads = True
    return server
