"""The one rollout → decode → score loop, and the one seeding scheme, used by training, held-out
evaluation, credit maps, the GenEval generator and the benchmarks; and the held-out loop every task's
`evaluate` runs (`held_out_rows`).

Seeding: every prompt's group gets its own generator, seeded by (run seed, purpose, key), where the
key names the prompt's slot (a training step's slot, a held-out prompt's index, …). A sample then
depends on nothing else: not on its batch-mates, the batch size, a resampling round's size or the
number of processes.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from t2i_gcpo.policies.base import Decoded, Policy, PromptRecord, Rollout, SamplingParams
from t2i_gcpo.rewards.base import Reward, RewardOutput
from t2i_gcpo.rewards.combine import call_reward


def seed_for(seed: int, purpose: str, *keys: int) -> int:
    """A 63-bit seed from (seed, purpose, keys): independent streams for different purposes and slots."""
    words = [seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, zlib.crc32(purpose.encode())]
    words += [k & 0xFFFFFFFF for k in keys]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0] >> np.uint64(1))


def group_generators(seed: int, purpose: str, keys: Iterable[int | tuple[int, ...]]) -> list[torch.Generator]:
    """One CPU generator per group, keyed by its slot."""
    gens = []
    for key in keys:
        parts = key if isinstance(key, tuple) else (key,)
        gens.append(torch.Generator().manual_seed(seed_for(seed, purpose, *parts)))
    return gens


@dataclass
class Scored:
    """A rollout, what it decodes to and its reward."""

    rollout: Rollout
    outputs: Decoded  # images [B, 3, H, W] in [0, 1], or B strings
    reward: RewardOutput  # scores [B], details [B]
    seconds: dict[str, float] = field(default_factory=dict)  # "rollout", "reward" (decode + score)


def sampler_precision(policy: Policy, sampling: SamplingParams) -> contextlib.AbstractContextManager:
    """The context a rollout runs in: bfloat16 autocast for `sampling.autocast == "bf16"`, else none."""
    if sampling.autocast == "none":
        return contextlib.nullcontext()
    if sampling.autocast != "bf16":
        raise ValueError(f"sampling.autocast must be 'none' or 'bf16', got {sampling.autocast!r}")
    return torch.autocast(policy.device.type, dtype=torch.bfloat16)


@torch.no_grad()
def sample_and_decode(
    policy: Policy,
    prompts: Sequence[PromptRecord],
    group_size: int,
    sampling: SamplingParams,
    generators: Sequence[torch.Generator],
) -> tuple[Rollout, Decoded]:
    """Sample a group per prompt and decode it: (rollout, images [B, 3, H, W] on the CPU or B strings)."""
    with sampler_precision(policy, sampling):
        ro = policy.rollout(list(prompts), group_size, sampling, generators)
    out = policy.decode(ro)
    return ro, out.cpu() if torch.is_tensor(out) else out


@torch.no_grad()
def sample_and_score(
    policy: Policy,
    reward: Reward,
    prompts: Sequence[PromptRecord],
    group_size: int,
    sampling: SamplingParams,
    generators: Sequence[torch.Generator],
) -> Scored:
    """Sample a group per prompt, decode, and score (a failing or NaN reward raises RewardError)."""
    tic = time.perf_counter()
    with sampler_precision(policy, sampling):
        ro = policy.rollout(list(prompts), group_size, sampling, generators)
    mid = time.perf_counter()
    outputs = policy.decode(ro)  # decode counts as reward time (it only serves the reward)
    reward_out = call_reward(reward, outputs, ro.texts, [p.meta for p in ro.prompts])
    return Scored(ro, outputs, reward_out, {"rollout": mid - tic, "reward": time.perf_counter() - mid})


def item_keys(prompt_indices: Iterable[int]) -> list[str]:
    """The key of each held-out sample, "PPPPP/SSSS" (its prompt's index, its index among that prompt's
    samples), from the prompt index of each row in the order `held_out_rows` returns them (a prompt's samples
    together, in their order): the same prompt and sample index get the same key at every step of a run and
    in every run, so two evaluations pair item by item (eval/records/paired.py)."""
    seen: dict[int, int] = {}
    keys = []
    for p in prompt_indices:
        j = seen.get(p, 0)
        seen[p] = j + 1
        keys.append(f"{p:05d}/{j:04d}")
    return keys


def item_rows(
    keys: Sequence[str], categories: Sequence[str], scores: Sequence[float], **fields: Sequence[Any]
) -> list[dict[str, Any]]:
    """Held-out result rows ``{"key", "category", "score", **fields}``, one per sample: what a task's
    `evaluate` returns as "rows" and a run writes to eval/step_NNNNNN.jsonl
    (eval/records/paired.py reads them)."""
    out = []
    for i, (k, c, s) in enumerate(zip(keys, categories, scores)):
        out.append({"key": k, "category": c, "score": float(s), **{f: v[i] for f, v in fields.items()}})
    return out


@torch.no_grad()
def held_out_rows(
    policy: Policy,
    reward: Any,
    prompts: Sequence[PromptRecord],
    samples_per_prompt: int,
    sampling: SamplingParams,
    seed: int,
    rows_of: Callable[[list[int], Scored], list[Any]],
    accelerator: Any = None,
    progress: bool = False,
    prompts_per_batch: int = 16,
) -> list[Any]:
    """The held-out loop of every task's `evaluate`: this process's share of the prompts (every
    world-th from its rank), `prompts_per_batch` at a time, prompt i's group drawn from its own
    generator (seed, "eval", i), the policy in eval mode meanwhile. `rows_of(chunk, scored)` turns a
    chunk's prompt indices and its scored samples into result rows; returns every process's rows.
    A prompt's samples depend neither on `prompts_per_batch` nor on the number of processes."""
    rank = accelerator.process_index if accelerator else 0
    world = accelerator.num_processes if accelerator else 1
    mine = list(range(rank, len(prompts), world))
    chunks = [mine[i : i + prompts_per_batch] for i in range(0, len(mine), prompts_per_batch)]
    if progress:
        from tqdm import tqdm

        chunks = tqdm(chunks, desc="eval", unit="batch")
    rows: list[Any] = []
    was_training = getattr(policy, "training", False)
    if isinstance(policy, torch.nn.Module):
        policy.eval()
    try:
        for chunk in chunks:
            scored = sample_and_score(
                policy,
                reward,
                [prompts[i] for i in chunk],
                samples_per_prompt,
                sampling,
                group_generators(seed, "eval", chunk),
            )
            rows += rows_of(chunk, scored)
    finally:
        if isinstance(policy, torch.nn.Module):
            policy.train(was_training)
    if world > 1:
        from accelerate.utils import gather_object

        rows = gather_object(rows)
    return rows
