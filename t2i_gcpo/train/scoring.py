"""Scoring a step's rounds (docs/guides/rewards.md#at-scale): sampling overlapped with scoring, the sequence
advantages of a round (GRPO's normalisation of the summed reward, or GDPO's per reward), and the per-term
metrics of a weighted sum.

Chunks (reward_options.chunk): a round's prompts are split into chunks of whole groups, sampled and decoded
one after the other (as model_options.max_rollout_batch splits a Janus or text rollout). Without overlap each
chunk is scored when it is sampled; with overlap (reward_options.overlap) it is handed to the scorer — a
thread for a reward in this process, several for a remote: reward's requests in flight
(`requests_in_flight`) — while the next one samples. Either way the chunks' rollouts, images and rewards are
put back together in order, and the same rollout calls run: overlap changes when a chunk is scored, never
what is computed. A group's samples come from its own generator, so a chunk samples what the whole batch
would have (its recorded log-probs may round differently where a kernel is chosen by batch size); the reward
of a sample depends on the sample alone.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from t2i_gcpo import metrics as M
from t2i_gcpo.config import AdvantageConfig, TrainConfig
from t2i_gcpo.core.advantages import decoupled_advantages, group_advantages
from t2i_gcpo.policies.base import Policy, PromptRecord, Rollout, SamplingParams
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.combine import call_reward, requests_in_flight
from t2i_gcpo.tasks.loop import Scored, sample_and_score, sampler_precision


def round_scorer(cfg: TrainConfig) -> Callable[..., Scored]:
    """`tasks.loop.sample_and_score`, or its chunked form at the run's chunk size, overlapped or not
    (module docstring)."""
    options = cfg.reward_options
    if options.overlap:
        chunk = options.chunk or cfg.model_options.max_rollout_batch
        return functools.partial(sample_and_score_chunked, chunk=chunk, overlap=True)
    if options.chunk:
        return functools.partial(sample_and_score_chunked, chunk=options.chunk, overlap=False)
    return sample_and_score


def chunk_groups(chunk: int | None, group_size: int, groups: int) -> int:
    """Groups per chunk: `chunk` samples rounded down to whole groups (at least one), or a quarter of the
    round's `groups` when None."""
    if chunk is None:
        return max(1, math.ceil(groups / 4))
    return max(1, chunk // group_size)


@torch.no_grad()
def _score(reward: Any, outputs: Any, texts: list[str], metadata: list[dict]) -> RewardOutput:
    """A chunk's reward, in the scorer's thread (grad mode is per thread: off there too)."""
    return call_reward(reward, outputs, texts, metadata)


class _Inline:
    """The scorer without overlap: each chunk scored at once, in this thread (a future already done)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        future.set_result(fn(*args))
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


@torch.no_grad()
def sample_and_score_chunked(
    policy: Policy,
    reward: Any,
    prompts: Sequence[PromptRecord],
    group_size: int,
    sampling: SamplingParams,
    generators: Sequence[torch.Generator],
    chunk: int | None = None,
    overlap: bool = True,
) -> Scored:
    """`sample_and_score`, the rollout in chunks of whole groups, each scored while the next samples
    (`overlap`) or when it is sampled.

    Seconds: "rollout" the sampling of every chunk; "reward" their decoding and scoring — with overlap, the
    wait for the scorer after the last chunk (the scoring that sampling did not hide)."""
    per = chunk_groups(chunk, group_size, len(prompts))
    starts = list(range(0, len(prompts), per))
    workers = min(requests_in_flight(reward), len(starts))
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="scorer") if overlap else _Inline()
    rollouts, outputs, futures = [], [], []
    sampled = scoring = 0.0
    try:
        for s in starts:
            tic = time.perf_counter()
            with sampler_precision(policy, sampling):
                ro = policy.rollout(
                    list(prompts[s : s + per]), group_size, sampling, list(generators[s : s + per])
                )
            mid = time.perf_counter()
            out = policy.decode(ro)
            futures.append(pool.submit(_score, reward, out, ro.texts, [p.meta for p in ro.prompts]))
            sampled, scoring = sampled + mid - tic, scoring + time.perf_counter() - mid
            rollouts.append(ro)
            outputs.append(out)
        tic = time.perf_counter()
        scored = [f.result() for f in futures]  # in order; the first failure raises
        scoring += time.perf_counter() - tic
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    joined = torch.cat(outputs) if torch.is_tensor(outputs[0]) else [o for part in outputs for o in part]
    reward_out = RewardOutput.concat(scored)
    return Scored(Rollout.concat(rollouts), joined, reward_out, {"rollout": sampled, "reward": scoring})


# ----------------------------------------------------------------------------- advantages of a round
def term_scores(terms: list[tuple[str, float]] | None, out: RewardOutput) -> torch.Tensor | None:
    """[B, K]: each sample's score under each term of a weighted sum (``out.terms``, its columns in the order
    of `terms`), None for a single reward."""
    if not terms or len(terms) < 2:
        return None
    names = [name for name, _ in terms]
    if out.terms is None or list(out.term_names) != names:
        raise ValueError(f"the reward gave the scores of terms {list(out.term_names)}, expected {names}")
    return out.terms.float()


def sequence_advantages(
    cfg: AdvantageConfig, out: RewardOutput, group_size: int, terms: list[tuple[str, float]] | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(A [B], each term's weighted advantage w_k A_k [B] by name — GDPO only, else empty) of a round's
    rewards: GRPO's normalisation of the total (advantage.reward_norm=sum), or GDPO's per reward
    (per_reward; a single reward counts as one term: core/advantages.decoupled_advantages)."""
    if cfg.reward_norm == "sum":
        return group_advantages(out.scores, group_size, scale=cfg.scale, eps=cfg.eps), {}
    parts = term_scores(terms, out)
    if parts is None:
        parts, terms = out.scores.reshape(-1, 1).float(), [("reward", 1.0)]
    weights = torch.tensor([w for _, w in terms], dtype=torch.float32)
    adv, per_term = decoupled_advantages(parts, weights, group_size, eps=cfg.eps)
    return adv, {name: per_term[:, k] for k, (name, _) in enumerate(terms)}


def term_metrics(
    terms: list[tuple[str, float]] | None,
    scores: torch.Tensor | None,
    advantages: dict[str, list[torch.Tensor]],
) -> dict[str, float]:
    """``reward/<term>/mean`` of each term of a weighted sum over the step's samples (`scores` [N, K], the
    columns in the order of `terms`; None when none was drawn), and under GDPO ``advantage/<term>/mean_abs``
    (metrics.py)."""
    out: dict[str, float] = {}
    if not terms or len(terms) < 2:
        return out
    for k, (name, _) in enumerate(terms):
        if scores is not None and len(scores):
            out[M.REWARD_TERM.format(name=name)] = scores[:, k].double().mean().item()
        if advantages.get(name):
            out[M.ADVANTAGE_TERM.format(name=name)] = torch.cat(advantages[name]).abs().mean().item()
    return out
