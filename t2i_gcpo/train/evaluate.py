"""Held-out evaluation of a policy with any reward that reports GenEval-style details
(``strict`` and ``tag`` per sample, optionally ``partial``): per-tag strict score, overall as the
unweighted mean of the tag scores (GenEval's convention), and the mean partial score."""

from __future__ import annotations

from typing import Any

import torch


def evaluate_policy(
    policy: Any,
    reward: Any,
    metadata: list[dict],
    images_per_prompt: int = 4,
    cfg_scale: float = 3.0,
    temperature: float = 1.0,
    seed: int = 0,
    batch_prompts: int = 16,
    accelerator: Any = None,
    progress: bool = False,
) -> dict:
    """Sample `images_per_prompt` images per prompt, score them; prompts are split across processes."""
    rank = accelerator.process_index if accelerator else 0
    world = accelerator.num_processes if accelerator else 1
    mine = list(range(rank, len(metadata), world))
    rows: list[tuple[str, float, float]] = []  # (tag, strict, partial)
    chunks = [mine[i : i + batch_prompts] for i in range(0, len(mine), batch_prompts)]
    if progress:
        from tqdm import tqdm

        chunks = tqdm(chunks, desc="eval", unit="batch")
    was_training = policy.training
    policy.eval()
    for chunk in chunks:
        meta = [metadata[i] for i in chunk]
        g = torch.Generator().manual_seed(seed * 1_000_003 + chunk[0])
        with torch.no_grad():
            ro = policy.rollout(
                [m["prompt"] for m in meta], images_per_prompt, cfg_scale, temperature, generator=g
            )
            images = policy.decode(ro)
        out = reward(images, ro.prompts, [m for m in meta for _ in range(images_per_prompt)])
        for d, s in zip(out.details, out.scores.tolist()):
            rows.append((d.get("tag", "all"), float(d.get("strict", s)), float(d.get("partial", s))))
    policy.train(was_training)
    if world > 1:
        from accelerate.utils import gather_object

        rows = gather_object(rows)
    by_tag: dict[str, list[float]] = {}
    for tag, strict, _ in rows:
        by_tag.setdefault(tag, []).append(strict)
    strict = {k: sum(v) / len(v) for k, v in sorted(by_tag.items())}
    return {
        "strict": strict,
        "overall": sum(strict.values()) / max(len(strict), 1),
        "partial": sum(r[2] for r in rows) / max(len(rows), 1),
        "n_images": len(rows),
    }
