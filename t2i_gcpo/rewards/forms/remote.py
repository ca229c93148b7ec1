"""``remote:URL``: a reward scored by a reward server (`t2i-gcpo reward-server`) over HTTP; the client, its
protocol and its checks are t2i_gcpo/rewards/remote.py (docs/guides/rewards.md#server)."""

from __future__ import annotations

from typing import Annotated

from t2i_gcpo.rewards.registry import Arg, Option, register_reward
from t2i_gcpo.rewards.remote import RemoteReward, check_server


@register_reward(
    "remote",
    scores="image",
    doc="a reward served by `t2i-gcpo reward-server` (any spec: a model on its own GPU or machine) over HTTP",
    weights="none here: the server holds them",
    source="this package's reward server (t2i_gcpo/rewards/server.py)",
    licence="the served reward's",
    example="remote:http://127.0.0.1:8100",
    check=check_server,
)
def load(
    url: Annotated[str, Arg("the reward server's address, http://HOST:PORT", kind="url", metavar="URL")],
    *,
    timeout: Annotated[
        float,
        Option(
            "seconds one request may take, whole (connecting, sending, scoring, reading)",
            low=0,
            low_open=True,
        ),
    ] = 300.0,
    retries: Annotated[
        int, Option("tries after the first for a request without an answer", low=0, high=100)
    ] = 2,
    backoff: Annotated[float, Option("seconds before the first retry (doubling)", low=0)] = 2.0,
    batch_size: Annotated[
        int | None, Option("images per request (null: as many as the server takes)", low=1)
    ] = None,
    concurrency: Annotated[int, Option("requests in flight at most", low=1, high=64)] = 2,
    proxy: Annotated[
        str | None,
        Option(
            "an HTTP proxy to send the requests through, http://HOST:PORT (null: none; the environment's "
            "HTTP_PROXY is not read)"
        ),
    ] = None,
    max_answer_mb: Annotated[
        float, Option("megabytes an answer may hold", low=0, low_open=True, high=4096)
    ] = 64.0,
    serves: Annotated[
        str | None, Option("the spec the server must serve (a run records it when it starts)")
    ] = None,
    version: Annotated[str | None, Option("the server's version when the run started (recorded)")] = None,
    grid: tuple[int, int] | None = None,
) -> RemoteReward:
    return RemoteReward(
        url,
        timeout=timeout,
        retries=retries,
        backoff=backoff,
        batch_size=batch_size,
        concurrency=concurrency,
        proxy=proxy,
        max_answer_mb=max_answer_mb,
        serves=serves,
        version=version,
        grid=grid,
    )
