"""A reward scored by a reward server (`t2i-gcpo reward-server`, t2i_gcpo/rewards/server.py) over HTTP:
``remote:http://HOST:PORT`` (docs/guides/rewards.md#server).

The protocol is JSON over HTTP/1.1:

- ``GET /health`` → the server's reward spec, its package version, the reward's name, the (name, weight) of
  each term of a sum (`terms`), its score bounds, the run context it reads (``grid``) and its limits
  (images, bytes and decoded pixels per request, the largest side of an image);
- ``POST /score`` with ``{"images": [PNG, base64], "prompts": [...], "metadata": [{...}], "context":
  {"grid": [rows, cols]}}`` → ``{"scores": [...], "details": [{...}], "terms": [[...], ...]}`` in the order
  sent (``terms``, for a sum only: each sample's score under each term of /health's ``terms``); a request the
  server refuses answers 4xx, a reward that fails on the server 500, each with ``{"error": "one line"}``.

`PROTOCOL` is 1: ``max_pixels`` and ``max_side`` were added to ``/health`` without changing it (a client of
before reads past them; this client against a server of before splits by images and bytes alone).

Images travel as 8-bit PNG, made as `rewards._common.images_to_pil` makes them (the model rewards and the
ShapeWorld detector read 8-bit images anyway: their scores do not change; a user function reading the
floats sees them rounded to 1/255).

The client trusts nothing it is answered (t2i_gcpo/rewards/http_client.py): one deadline per request
(`timeout`, the whole request, not each read), answers of at most `max_answer_mb`, no redirect followed, no
proxy but the one `proxy` names. ``/health`` is read into `Health` and an answer into `ScoreAnswer`: exactly
one finite score per image sent, within the bounds the server declared, one object of details per image, each
holding a finite score per declared term of a sum; anything else is one line naming the field.

At start-up (the registry's check, before the model loads, and again when the reward is built) the client
asks ``/health``, with the same bounded tries; a server that is not there, answers a malformed ``/health``,
or serves another spec than the one a resumed run recorded (`serves`), is one line, before a run folder
exists. A call splits its images into requests of at most `batch_size` images (the server's limit by
default), fewer where the server's pixel or byte limit says so, at most `concurrency` in flight; a request
that gets no answer (no connection, a reset, the deadline, HTTP 502/503/504) is sent again up to `retries`
times, `backoff` seconds apart, doubling; one the server refuses (4xx, a redirect) or fails (500) is not, nor
a malformed answer. Then a `RewardError` naming the reward, the server and the last failure: never a silent 0.
"""

from __future__ import annotations

import base64
import io
import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from t2i_gcpo.errors import RewardError, UserError, shorten
from t2i_gcpo.rewards import http_client
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.version import __version__

if TYPE_CHECKING:
    import torch

PROTOCOL = 1  # the version of the protocol above; a server of another answers with another
SERVICE = "t2i-gcpo reward server"
RETRY_STATUS = (502, 503, 504)  # a proxy or a server that is restarting or busy: the request is sent again
HEALTH_BYTES = 1 << 20  # a /health answer is a few hundred bytes


# ----------------------------------------------------------------------------- the protocol's types
def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value  # a JSON array read as a fixed-size tuple


Finite = Annotated[float, Field(allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1, max_length=200)]


class Health(BaseModel):
    """A ``GET /health`` answer (read strictly: no number as text, no boolean as a number; fields it does not
    know are ignored, so that a later server may add some)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    service: str
    protocol: int
    version: Annotated[str, Field(min_length=1, max_length=100)]
    spec: Annotated[str, Field(min_length=1, max_length=20_000)]
    name: Name
    terms: (
        Annotated[list[Annotated[tuple[Name, Finite], BeforeValidator(_as_tuple)]], Field(max_length=256)]
        | None
    ) = None
    bounds: Annotated[tuple[Finite, Finite], BeforeValidator(_as_tuple)] | None = None
    context: Annotated[list[Annotated[str, Field(max_length=100)]], Field(max_length=16)] = []
    max_images: Annotated[int, Field(ge=1, le=1 << 20)]
    max_bytes: Annotated[int, Field(ge=1)] | None = None
    # added without a protocol change: None from an older server
    max_pixels: Annotated[int, Field(ge=1)] | None = None
    max_side: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Health:
        if self.bounds is not None and self.bounds[0] > self.bounds[1]:
            raise ValueError(f"'bounds' [{self.bounds[0]:g}, {self.bounds[1]:g}] has its low above its high")
        names = [n for n, _ in self.terms or []]
        if len(set(names)) != len(names):
            raise ValueError(f"'terms' names a term twice ({names})")
        return self


class ScoreAnswer(BaseModel):
    """A ``POST /score`` answer's types; `check_answer` checks it against the request and the health."""

    model_config = ConfigDict(extra="ignore")

    scores: list[Finite]
    details: list[dict[str, Any]]
    terms: list[list[Finite]] | None = None  # a sum's: each image's score under each term of /health's terms


def check_answer(answer: ScoreAnswer, n: int, info: Health) -> None:
    """`answer` holds `n` scores within `info`'s bounds, `n` details, and for a sum `n` rows of a finite score
    per declared term; ValueError naming the first field that does not."""
    if len(answer.scores) != n:
        raise ValueError(f"'scores' holds {len(answer.scores)} scores for the {n} images sent")
    if len(answer.details) != n:
        raise ValueError(f"'details' holds {len(answer.details)} entries for the {n} images sent")
    if info.bounds is not None:
        low, high = info.bounds
        slack = 1e-5 * max(1.0, abs(low), abs(high))  # float32 sums on the server, float64 bounds
        for i, score in enumerate(answer.scores):
            if not low - slack <= score <= high + slack:
                raise ValueError(
                    f"'scores.{i}' is {score:g}, outside the bounds the server declares [{low:g}, {high:g}]"
                )
    if info.terms:
        names = [name for name, _ in info.terms]
        if answer.terms is None:
            raise ValueError(f"'terms' is missing: the server declares a sum of {', '.join(names)}")
        if len(answer.terms) != n:
            raise ValueError(f"'terms' holds {len(answer.terms)} rows for the {n} images sent")
        for i, row in enumerate(answer.terms):
            if len(row) != len(names):
                raise ValueError(
                    f"'terms.{i}' holds {len(row)} scores for the {len(names)} declared terms "
                    f"({', '.join(names)})"
                )


def base_url(url: str) -> str:
    """The server's address, http(s)://HOST:PORT with nothing after it; a one-line UserError otherwise."""
    url = url.strip().rstrip("/")
    parts = http_client.split_url(url, "reward 'remote'")
    if parts.path or parts.query:
        raise UserError(f"reward 'remote': {url!r} is not a server address (e.g. http://127.0.0.1:8100)")
    return url


def encode_images(images: torch.Tensor) -> list[str]:
    """[B, 3, H, W] in [0, 1] → B base64 PNGs of their 8-bit pixels (fast compression:
    lossless all the same)."""
    from t2i_gcpo.rewards._common import images_to_pil

    out = []
    for image in images_to_pil(images):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", compress_level=1)
        out.append(base64.b64encode(buffer.getvalue()).decode("ascii"))
    return out


def jsonable(value: Any) -> Any:
    """`value` as plain JSON data: tensors and arrays as (nested) lists, their scalars as numbers, tuples as
    lists, keys as strings; anything else as its text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        return jsonable(value.tolist())
    return str(value)


def error_of(raw: bytes) -> str:
    """The one-line reason of a server's error answer (its ``error``), else the start of the answer."""
    try:
        return shorten(str(json.loads(raw)["error"]), 300)
    except (ValueError, KeyError, TypeError, RecursionError):
        return shorten(raw.decode("utf-8", "replace").strip() or "(no reason given)", 120)


class Failed(Exception):
    """A request without a usable answer: `status` the HTTP status of a refusal (0: no answer
    after the tries)."""

    def __init__(self, why: str, status: int = 0):
        super().__init__(why)
        self.why, self.status = why, status


class Client:
    """Requests to a reward server with bounded tries (module docstring), and its checked ``/health``."""

    def __init__(
        self,
        url: str,
        timeout: float = 300.0,
        retries: int = 2,
        backoff: float = 2.0,
        proxy: str | None = None,
        max_answer_mb: float = 64.0,
    ):
        self.url, self.timeout = base_url(url), float(timeout)
        self.retries, self.backoff = int(retries), float(backoff)
        http_client.check_proxy(proxy, "reward 'remote'")
        self.proxy, self.max_answer = proxy, int(max_answer_mb * (1 << 20))

    def send(self, path: str, body: bytes | None, timeout: float, max_bytes: int | None = None) -> bytes:
        """The body of the server's 200 answer to `path` (POST `body`, or GET), tried up to 1 + retries times
        while there is none (module docstring); `Failed` otherwise."""
        wait, last = self.backoff, ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(wait)
                wait *= 2
            try:
                answer = http_client.request(
                    self.url + path,
                    method="GET" if body is None else "POST",
                    body=body,
                    timeout=timeout,
                    headers={"Content-Type": "application/json"},
                    max_bytes=max_bytes or self.max_answer,
                    proxy=self.proxy,
                )
            except http_client.NoAnswer as e:
                last = str(e)
                continue
            except http_client.AnswerTooLarge as e:
                raise Failed(f"{e} (max_answer_mb={self.max_answer / (1 << 20):g})", 200) from None
            if answer.status == 200:
                return answer.body
            if 300 <= answer.status < 400:
                raise Failed(http_client.redirect_line(self.url + path, answer), answer.status)
            if answer.status not in RETRY_STATUS:
                raise Failed(error_of(answer.body), answer.status)
            last = f"HTTP {answer.status}: {error_of(answer.body)}"
        raise Failed(last)

    def health(self, serves: str | None = None) -> Health:
        """The server's ``/health`` answer, checked (and that it serves `serves`, where given); a one-line
        UserError when there is none or it is malformed."""
        try:
            raw = self.send("/health", None, min(self.timeout, 10.0), HEALTH_BYTES)
        except Failed as e:
            if e.status == 200 or 300 <= e.status < 400:
                raise UserError(
                    f"reward 'remote': the server at {self.url} answered /health with {shorten(e.why, 200)}"
                ) from None
            port = self.url.rsplit(":", 1)[-1] if re.search(r":\d+$", self.url) else "N"
            why = f"HTTP {e.status}: {e.why}" if e.status else f"{e.why}, {self.retries + 1} tries"
            raise UserError(
                f"reward 'remote': no reward server answers at {self.url} ({shorten(why, 200)}); start "
                f"one with: t2i-gcpo reward-server --reward SPEC --port {port}"
            ) from None
        try:
            head = json.loads(raw)
        except (ValueError, RecursionError):
            head = None
        if not isinstance(head, dict) or head.get("service") != SERVICE:
            raise UserError(
                f"reward 'remote': {self.url} is not a t2i-gcpo reward server (its /health answered "
                f"{shorten(raw.decode('utf-8', 'replace'), 60)!r})"
            )
        protocol = head.get("protocol")
        if protocol != PROTOCOL or isinstance(protocol, bool):
            raise UserError(
                f"reward 'remote': the server at {self.url} speaks protocol {shorten(repr(protocol), 20)} "
                f"(t2i-gcpo {shorten(str(head.get('version')), 40)}), this client {PROTOCOL} "
                f"(t2i-gcpo {__version__})"
            )
        try:
            info = http_client.parse_answer(raw, Health)
        except ValueError as e:
            raise UserError(
                f"reward 'remote': the reward server at {self.url} answered /health with a malformed "
                f"field: {e}"
            ) from None
        if serves is not None and serves != info.spec:
            raise UserError(
                f"reward 'remote': the server at {self.url} serves '{shorten(info.spec, 120)}', but this "
                f"run was trained with '{shorten(serves, 120)}': serve that spec there (t2i-gcpo "
                f"reward-server --reward …)"
            )
        return info


def client_of(term: Any) -> Client:
    """The `Client` of a read ``remote:`` term (rewards.registry.Term)."""

    def option(name: str) -> Any:
        return term.options.get(name, term.form.all_options[name].default)

    return Client(
        term.args[0],
        option("timeout"),
        option("retries"),
        option("backoff"),
        option("proxy"),
        option("max_answer_mb"),
    )


def check_server(term: Any) -> None:
    """Before the policy loads (rewards.registry.check_reward_spec): a server answers at the term's URL with a
    well-formed /health, and serves what a resumed run recorded."""
    client_of(term).health(term.options.get("serves"))


class RemoteReward:
    """The reward a reward server serves (module docstring), under its name, with its terms and bounds."""

    probe = True  # a dry sample is scored before a run starts (rewards.combine.probes)

    def __init__(
        self,
        url: str,
        timeout: float = 300.0,
        retries: int = 2,
        backoff: float = 2.0,
        batch_size: int | None = None,
        concurrency: int = 2,
        proxy: str | None = None,
        max_answer_mb: float = 64.0,
        serves: str | None = None,
        version: str | None = None,
        grid: tuple[int, int] | None = None,
    ):
        self.client = Client(url, timeout, retries, backoff, proxy, max_answer_mb)
        self.url = self.client.url
        self.in_flight = int(concurrency)  # the overlapped scorer may have this many calls running
        self.info = info = self.client.health(serves)
        self.served, self.server_version = info.spec, info.version
        if version is not None and version != self.server_version:
            print(
                f"note: the reward server at {self.url} runs t2i-gcpo {self.server_version}; this run "
                f"started with {version}",
                file=sys.stderr,
                flush=True,
            )
        self.name = info.name
        self.terms = [(n, w) for n, w in info.terms] if info.terms else None
        self.bounds = info.bounds
        self.limit = info.max_images
        self.batch_size = min(int(batch_size or self.limit), self.limit)
        self.grid = [int(grid[0]), int(grid[1])] if grid is not None and "grid" in info.context else None

    def recorded(self) -> dict[str, str]:
        """What a run records in its spec (rewards.registry.record_reward): the served spec and version."""
        if "'" in self.served and '"' in self.served:  # no quoting holds it: the version alone
            return {"version": self.server_version}
        return {"serves": self.served, "version": self.server_version}

    def where(self, first: int, n: int) -> str:
        return f"reward '{self.name}' (remote {self.url}), samples {first}–{first + n - 1}"

    def body(self, images: list[str], prompts: list[str], metadata: list[dict]) -> bytes:
        data: dict[str, Any] = {"images": images, "prompts": prompts, "metadata": jsonable(metadata)}
        if self.grid is not None:
            data["context"] = {"grid": self.grid}
        return json.dumps(data).encode()

    def requests(
        self, pngs: list[str], prompts: list[str], metadata: list[dict], size: tuple[int, int]
    ) -> list[tuple[int, int, bytes]]:
        """(first sample, count, body) of each request of a call: at most `batch_size` images, at most the
        server's decoded pixels, and bodies of at most its bytes (halved until they fit)."""
        height, width = size
        info, per = self.info, self.batch_size
        if info.max_side is not None and max(height, width) > info.max_side:
            raise RewardError(
                f"{self.where(0, len(pngs))}: images of {width}×{height} px, larger than the server "
                f"takes ({info.max_side} px a side)"
            )
        if info.max_pixels is not None:
            per = min(per, info.max_pixels // (height * width))
            if per < 1:
                raise RewardError(
                    f"{self.where(0, len(pngs))}: one image of {width}×{height} px holds more pixels "
                    f"than the server takes in a request ({info.max_pixels})"
                )
        out: list[tuple[int, int, bytes]] = []
        pending = [(s, min(per, len(pngs) - s)) for s in range(0, len(pngs), per)]
        while pending:
            first, n = pending.pop(0)
            body = self.body(
                pngs[first : first + n], list(prompts[first : first + n]), list(metadata[first : first + n])
            )
            if info.max_bytes is None or len(body) <= info.max_bytes:
                out.append((first, n, body))
            elif n > 1:
                pending[:0] = [(first, n // 2), (first + n // 2, n - n // 2)]
            else:
                raise RewardError(
                    f"{self.where(first, 1)}: one image's request is {len(body)} bytes, more than the "
                    f"server takes ({info.max_bytes}; its --max-mb)"
                )
        return out

    def score_part(self, first: int, n: int, body: bytes) -> ScoreAnswer:
        """The server's checked answer for one request (samples `first` …); a RewardError
        naming them otherwise."""
        tic = time.perf_counter()
        where = self.where(first, n)
        try:
            raw = self.client.send("/score", body, self.client.timeout)
        except Failed as e:
            if e.status:
                what = "refused the request" if e.status < 500 else "failed"
                if e.status == 200 or 300 <= e.status < 400:
                    what = "answered"
                raise RewardError(
                    f"{where}: the server {what} (HTTP {e.status}): {shorten(e.why, 200)}"
                ) from None
            raise RewardError(
                f"{where}: no answer after {self.client.retries + 1} tries in "
                f"{time.perf_counter() - tic:.1f} s: {shorten(e.why, 160)}"
            ) from None
        try:
            answer = http_client.parse_answer(raw, ScoreAnswer)
            check_answer(answer, n, self.info)
        except ValueError as e:
            raise RewardError(
                f"{where}: a malformed answer from the server: {shorten(str(e), 200)}"
            ) from None
        return answer

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        import torch

        metadata = metadata or [{} for _ in prompts]
        parts = self.requests(encode_images(images), prompts, metadata, tuple(images.shape[-2:]))
        pool = ThreadPoolExecutor(max_workers=min(self.in_flight, max(len(parts), 1)))
        try:
            futures = [pool.submit(self.score_part, *part) for part in parts]
            answers = [f.result() for f in futures]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        scores = [x for a in answers for x in a.scores]
        details = [d for a in answers for d in a.details]
        if not self.terms:
            return RewardOutput(scores=torch.tensor(scores, dtype=torch.float32), details=details)
        terms = torch.tensor([row for a in answers for row in a.terms], dtype=torch.float32)
        return RewardOutput(
            torch.tensor(scores, dtype=torch.float32), details, terms, tuple(n for n, _ in self.terms)
        )
