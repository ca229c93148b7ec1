"""A reward scored by a reward server (`t2i-gcpo reward-server`, t2i_gcpo/rewards/server.py) over HTTP:
``remote:http://HOST:PORT`` (docs/guides/rewards.md#server).

The protocol is JSON over HTTP/1.x, from the standard library on both sides:

- ``GET /health`` → the server's reward spec, its package version, the reward's name, the (name, weight) of
  each term of a sum (`terms`), its score bounds, the run context it reads (``grid``) and its limits
  (images and bytes per request);
- ``POST /score`` with ``{"images": [PNG, base64], "prompts": [...], "metadata": [{...}], "context":
  {"grid": [rows, cols]}}`` → ``{"scores": [...], "details": [{...}], "terms": [[...], ...]}`` in the order
  sent (``terms``, for a sum only: each sample's score under each term of /health's ``terms``); a request the
  server refuses answers 4xx, a reward that fails on the server 500, each with ``{"error": "one line"}``.

Images travel as 8-bit PNG, made as `rewards._common.images_to_pil` makes them (the model rewards and the
ShapeWorld detector read 8-bit images anyway: their scores do not change; a user function reading the
floats sees them rounded to 1/255).

At start-up (the registry's check, before the model loads, and again when the reward is built) the client
asks ``/health``, with the same bounded tries; a server that is not there, or that serves another spec than
the one a resumed run recorded (`serves`), is one line, before a run folder exists. A call splits its images into requests of at most `batch_size` (the
server's limit by default), at most `concurrency` in flight, each with `timeout` seconds; a request that
gets no answer (no connection, a reset, a timeout, HTTP 502/503/504) is sent again up to `retries` times,
`backoff` seconds apart, doubling; one the server refuses (4xx) or fails (500) is not. Then a
`RewardError` naming the reward, the server and the last failure: never a silent 0.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import re
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Annotated, Any

from t2i_gcpo.errors import RewardError, UserError, shorten
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.registry import Arg, Option, register_reward
from t2i_gcpo.version import __version__

if TYPE_CHECKING:
    import torch

PROTOCOL = 1  # the version of the protocol above; a server of another answers with another
SERVICE = "t2i-gcpo reward server"
RETRY_STATUS = (502, 503, 504)  # a proxy or a server that is restarting: the request is sent again
# requests go straight to the server, never through an HTTP proxy of the environment (it would see the images;
# the server belongs on loopback or a private network)
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@register_reward(
    "remote",
    scores="image",
    doc="a reward served by `t2i-gcpo reward-server` (any spec: a model on its own GPU or machine) over HTTP",
    weights="none here: the server holds them",
    source="this package's reward server (t2i_gcpo/rewards/server.py)",
    licence="the served reward's",
    example="remote:http://127.0.0.1:8100",
    check=lambda term: check_server(term),  # defined below
)
def load(
    url: Annotated[str, Arg("the reward server's address, http://HOST:PORT", kind="url", metavar="URL")],
    *,
    timeout: Annotated[float, Option("seconds one request may take", low=0, low_open=True)] = 300.0,
    retries: Annotated[int, Option("tries after the first for a request without an answer", low=0, high=100)] = 2,
    backoff: Annotated[float, Option("seconds before the first retry (doubling)", low=0)] = 2.0,
    batch_size: Annotated[int | None, Option("images per request (null: as many as the server takes)", low=1)] = None,
    concurrency: Annotated[int, Option("requests in flight at most", low=1, high=64)] = 2,
    serves: Annotated[str | None, Option("the spec the server must serve (a run records it when it starts)")] = None,
    version: Annotated[str | None, Option("the server's version when the run started (recorded)")] = None,
    grid: tuple[int, int] | None = None,
) -> RemoteReward:  # fmt: skip
    return RemoteReward(url, timeout=timeout, retries=retries, backoff=backoff, batch_size=batch_size,
                        concurrency=concurrency, serves=serves, version=version, grid=grid)  # fmt: skip


def base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not re.match(r"^https?://[^/\s]+$", url):
        raise UserError(f"reward 'remote': {url!r} is not a server address (e.g. http://127.0.0.1:8100)")
    return url


def encode_images(images: torch.Tensor) -> list[str]:
    """[B, 3, H, W] in [0, 1] → B base64 PNGs of their 8-bit pixels (fast compression: lossless all the same)."""
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
        return str(json.loads(raw)["error"])
    except (ValueError, KeyError, TypeError):
        return shorten(raw.decode("utf-8", "replace").strip() or "(no reason given)", 120)


class Client:
    """Requests to a reward server with bounded tries (module docstring), and its checked ``/health``."""

    def __init__(self, url: str, timeout: float = 300.0, retries: int = 2, backoff: float = 2.0):
        self.url, self.timeout = base_url(url), float(timeout)
        self.retries, self.backoff = int(retries), float(backoff)

    def request(self, path: str, body: bytes | None, timeout: float) -> bytes:
        """One request's answer body; HTTPError for a status ≥ 400, other exceptions for no answer."""
        request = urllib.request.Request(self.url + path, data=body, method="POST" if body is not None else "GET",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with DIRECT.open(request, timeout=timeout) as response:
            return response.read()

    def tries(self, path: str, body: bytes | None, timeout: float) -> tuple[bytes | None, str, int]:
        """(answer or None, the last failure, the HTTP status of a refusal or 0): `request` tried up to
        1 + retries times while it gets no answer (module docstring)."""
        wait, last = self.backoff, ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(wait)
                wait *= 2
            try:
                return self.request(path, body, timeout), "", 0
            except urllib.error.HTTPError as e:
                try:
                    reason = error_of(e.read())
                except (OSError, http.client.HTTPException):
                    reason = str(e.reason)
                if e.code not in RETRY_STATUS:
                    return None, reason, e.code
                last = f"HTTP {e.code}: {reason}"
            except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
                reason = getattr(e, "reason", None) if isinstance(e, urllib.error.URLError) else None
                last = f"{type(reason or e).__name__}: {reason or e}"
        return None, last, 0

    def health(self, serves: str | None = None) -> dict[str, Any]:
        """The server's ``/health`` answer, checked (and that it serves `serves`, where given); a one-line
        UserError when there is none."""
        raw, last, status = self.tries("/health", None, min(self.timeout, 10.0))
        if raw is None:
            port = self.url.rsplit(":", 1)[-1] if re.search(r":\d+$", self.url) else "N"
            why = f"HTTP {status}: {last}" if status else f"{last}, {self.retries + 1} tries"
            raise UserError(
                f"reward 'remote': no reward server answers at {self.url} ({shorten(why, 160)}); start one with: "
                f"t2i-gcpo reward-server --reward SPEC --port {port}"
            )
        try:
            info = json.loads(raw)
            ok = info.get("service") == SERVICE and all(
                k in info for k in ("spec", "version", "name", "max_images")
            )
        except (ValueError, AttributeError):
            info, ok = None, False
        if not ok:
            raise UserError(f"reward 'remote': {self.url} is not a t2i-gcpo reward server (its /health answered "
                            f"{shorten(raw.decode('utf-8', 'replace'), 60)!r})")  # fmt: skip
        if info.get("protocol") != PROTOCOL:
            raise UserError(f"reward 'remote': the server at {self.url} speaks protocol {info.get('protocol')} "
                            f"(t2i-gcpo {info['version']}), this client {PROTOCOL} (t2i-gcpo {__version__})")  # fmt: skip
        if serves is not None and serves != info["spec"]:
            raise UserError(
                f"reward 'remote': the server at {self.url} serves '{shorten(info['spec'], 120)}', but this run was "
                f"trained with '{shorten(serves, 120)}': serve that spec there (t2i-gcpo reward-server --reward …)"
            )
        return info


def check_server(term: Any) -> None:
    """Before the policy loads (rewards.registry.check_reward_spec): a server answers at the term's URL and
    serves what a resumed run recorded."""

    def option(name: str) -> Any:
        return term.options.get(name, term.form.all_options[name].default)

    Client(term.args[0], option("timeout"), option("retries"), option("backoff")).health(option("serves"))


class RemoteReward:
    """The reward a reward server serves (module docstring), under its name, with its terms and bounds."""

    probe = True  # a dry sample is scored before a run starts (rewards.combine.probes)

    def __init__(self, url: str, timeout: float = 300.0, retries: int = 2, backoff: float = 2.0,
                 batch_size: int | None = None, concurrency: int = 2, serves: str | None = None,
                 version: str | None = None, grid: tuple[int, int] | None = None):  # fmt: skip
        self.client = Client(url, timeout, retries, backoff)
        self.url = self.client.url
        self.in_flight = int(concurrency)  # the overlapped scorer may have this many calls running
        info = self.client.health(serves)
        self.served, self.server_version = info["spec"], info["version"]
        if version is not None and version != self.server_version:
            print(f"note: the reward server at {self.url} runs t2i-gcpo {self.server_version}; this run started "
                  f"with {version}", file=sys.stderr, flush=True)  # fmt: skip
        self.name = str(info["name"])
        self.terms = [(str(n), float(w)) for n, w in info["terms"]] if info.get("terms") else None
        self.bounds = tuple(info["bounds"]) if info.get("bounds") else None
        self.limit = int(info["max_images"])
        self.batch_size = min(int(batch_size or self.limit), self.limit)
        self.grid = (
            [int(grid[0]), int(grid[1])] if grid is not None and "grid" in info.get("context", []) else None
        )

    def recorded(self) -> dict[str, str]:
        """What a run records in its spec (rewards.registry.record_reward): the served spec and version."""
        if "'" in self.served and '"' in self.served:  # no quoting holds it: the version alone
            return {"version": self.server_version}
        return {"serves": self.served, "version": self.server_version}

    def score_part(self, first: int, images: list[str], prompts: list[str], metadata: list[dict]) -> dict:
        """The server's answer for one request (samples `first` …); a RewardError naming them otherwise."""
        body = {"images": images, "prompts": prompts, "metadata": jsonable(metadata)}
        if self.grid is not None:
            body["context"] = {"grid": self.grid}
        tic = time.perf_counter()
        raw, last, status = self.client.tries("/score", json.dumps(body).encode(), self.client.timeout)
        where = f"reward '{self.name}' (remote {self.url}), samples {first}–{first + len(images) - 1}"
        if raw is None and status:
            what = "refused the request" if status < 500 else "failed"
            raise RewardError(f"{where}: the server {what} (HTTP {status}): {shorten(last, 200)}")
        if raw is None:
            raise RewardError(f"{where}: no answer after {self.client.retries + 1} tries in "
                              f"{time.perf_counter() - tic:.1f} s: {shorten(last, 160)}")  # fmt: skip
        try:
            answer = json.loads(raw)
            ok = len(answer["scores"]) == len(images) and len(answer["details"]) == len(images)
            if self.terms:  # a sum: one score per term for each sample
                ok = ok and len(answer["terms"]) == len(images)
                ok = ok and all(len(row) == len(self.terms) for row in answer["terms"])
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise RewardError(
                f"{where}: not a reward server's answer: {shorten(raw.decode('utf-8', 'replace'), 60)!r}"
            )
        return answer

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        import torch

        pngs, metadata = encode_images(images), metadata or [{} for _ in prompts]
        starts = list(range(0, len(pngs), self.batch_size))
        pool = ThreadPoolExecutor(max_workers=min(self.in_flight, max(len(starts), 1)))
        try:
            futures = [pool.submit(self.score_part, s, pngs[s : s + self.batch_size], list(prompts[s : s + self.batch_size]),
                                   list(metadata[s : s + self.batch_size])) for s in starts]  # fmt: skip
            answers = [f.result() for f in futures]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        scores = [float(x) for a in answers for x in a["scores"]]
        details = [d for a in answers for d in a["details"]]
        if not self.terms:
            return RewardOutput(scores=torch.tensor(scores, dtype=torch.float32), details=details)
        terms = torch.tensor(
            [[float(x) for x in row] for a in answers for row in a["terms"]], dtype=torch.float32
        )
        return RewardOutput(
            torch.tensor(scores, dtype=torch.float32), details, terms, tuple(n for n, _ in self.terms)
        )
