"""Held-out evaluation of a policy with any reward that reports GenEval-style details
(``strict`` and ``tag`` per sample, optionally ``partial``): per-tag strict and partial scores,
overall as the unweighted mean of the tag scores (GenEval's convention)."""

from __future__ import annotations

from typing import Any

import torch

TAG_ORDER = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


@torch.no_grad()
def evaluate_policy(
    policy: Any,
    reward: Any,
    metadata: list[dict],
    images_per_prompt: int = 4,
    cfg_scale: float = 3.0,
    temperature: float = 1.0,
    seed: int = 0,
    prompts_per_batch: int = 16,
    accelerator: Any = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Sample `images_per_prompt` images per prompt and score them; prompts are split across processes.

    Returns ``{"per_tag": {tag: {"strict", "partial", "images"}}, "strict", "partial", "images"}``.
    Each batch's sampling seed depends only on (seed, its first prompt), so results do not depend on
    the number of processes.
    """
    rank = accelerator.process_index if accelerator else 0
    world = accelerator.num_processes if accelerator else 1
    mine = list(range(rank, len(metadata), world))
    chunks = [mine[i : i + prompts_per_batch] for i in range(0, len(mine), prompts_per_batch)]
    if progress:
        from tqdm import tqdm

        chunks = tqdm(chunks, desc="eval", unit="batch")
    rows: list[tuple[str, float, float]] = []  # (tag, strict, partial) per image
    was_training = getattr(policy, "training", False)
    if isinstance(policy, torch.nn.Module):
        policy.eval()
    for chunk in chunks:
        meta = [metadata[i] for i in chunk]
        g = torch.Generator(device=getattr(policy, "device", "cpu")).manual_seed(seed * 1_000_003 + chunk[0])
        ro = policy.rollout(
            [m["prompt"] for m in meta], images_per_prompt, cfg_scale, temperature, generator=g
        )
        out = reward(policy.decode(ro), ro.prompts, [m for m in meta for _ in range(images_per_prompt)])
        for d, s, m in zip(
            out.details, out.scores.tolist(), [m for m in meta for _ in range(images_per_prompt)]
        ):
            rows.append((m.get("tag", "all"), float(d.get("strict", s)), float(d.get("partial", s))))
    if isinstance(policy, torch.nn.Module):
        policy.train(was_training)
    if world > 1:
        from accelerate.utils import gather_object

        rows = gather_object(rows)
    tags = [t for t in TAG_ORDER if any(r[0] == t for r in rows)] + sorted(
        {r[0] for r in rows} - set(TAG_ORDER)
    )
    per_tag = {}
    for t in tags:
        mine_t = [r for r in rows if r[0] == t]
        per_tag[t] = {
            "strict": sum(r[1] for r in mine_t) / len(mine_t),
            "partial": sum(r[2] for r in mine_t) / len(mine_t),
            "images": len(mine_t),
        }
    n = max(len(per_tag), 1)
    return {
        "per_tag": per_tag,
        "strict": sum(v["strict"] for v in per_tag.values()) / n,
        "partial": sum(v["partial"] for v in per_tag.values()) / n,
        "images": len(rows),
    }


def format_table(result: dict[str, Any]) -> str:
    """A plain-text per-tag table of an `evaluate_policy` result."""
    lines = [f"{'tag':<14} {'strict':>7} {'partial':>8} {'images':>7}"]
    for tag, r in result["per_tag"].items():
        lines.append(f"{tag:<14} {r['strict']:>7.3f} {r['partial']:>8.3f} {r['images']:>7d}")
    lines.append(f"{'overall':<14} {result['strict']:>7.3f} {result['partial']:>8.3f} {result['images']:>7d}")
    return "\n".join(lines)
