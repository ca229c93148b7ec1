"""GenEval-style score of a policy on ShapeWorld prompts (SPEC §6, §8): per-tag strict and partial
accuracy over `images_per_prompt` samples per prompt; overall = unweighted mean of the tag scores."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from t2i_gcpo.worlds.shapeworld.constants import TAGS


@torch.no_grad()
def evaluate_policy(
    policy: Any,
    metadata_list: list[dict],
    images_per_prompt: int = 4,
    cfg_scale: float | None = None,
    temperature: float = 1.0,
    seed: int = 0,
    prompts_per_batch: int = 16,
    progress: bool = False,
) -> dict[str, Any]:
    """Sample `images_per_prompt` images for each metadata's prompt and score them with
    `ShapeWorldReward` (strict GenEval rule and §8.2 partial credit).

    `cfg_scale` defaults to the policy's ``config.default_cfg_scale``. Returns
    ``{"per_tag": {tag: {"strict", "partial", "images"}}, "strict", "partial", "cfg_scale", "images"}``
    with "strict"/"partial" the unweighted means over the tags present.
    """
    from tqdm.auto import tqdm

    from t2i_gcpo.rewards.shapeworld import ShapeWorldReward

    if cfg_scale is None:
        cfg_scale = float(policy.config.default_cfg_scale)
    reward = ShapeWorldReward(grid=tuple(policy.grid_shape))
    gen = torch.Generator().manual_seed(seed)
    strict: dict[str, list[float]] = defaultdict(list)
    partial: dict[str, list[float]] = defaultdict(list)
    for start in tqdm(range(0, len(metadata_list), prompts_per_batch), desc="eval", disable=not progress):
        chunk = metadata_list[start : start + prompts_per_batch]
        prompts = [m["prompt"] for m in chunk]
        rollout = policy.rollout(prompts, images_per_prompt, cfg_scale, temperature, generator=gen)
        images = policy.decode(rollout)  # [B, 3, H, W]
        meta = [m for m in chunk for _ in range(images_per_prompt)]
        out = reward(images, rollout.prompts, meta)
        for m, det in zip(meta, out.details):
            tag = m.get("tag", "untagged")
            strict[tag].append(float(det["strict"]))
            partial[tag].append(float(det["partial"]))
    order = [t for t in TAGS if t in strict] + sorted(t for t in strict if t not in TAGS)
    per_tag = {
        t: {
            "strict": sum(strict[t]) / len(strict[t]),
            "partial": sum(partial[t]) / len(partial[t]),
            "images": len(strict[t]),
        }
        for t in order
    }
    return {
        "per_tag": per_tag,
        "strict": sum(v["strict"] for v in per_tag.values()) / max(len(per_tag), 1),
        "partial": sum(v["partial"] for v in per_tag.values()) / max(len(per_tag), 1),
        "cfg_scale": cfg_scale,
        "images": sum(v["images"] for v in per_tag.values()),
    }


def format_table(result: dict[str, Any]) -> str:
    """A plain-text per-tag table of an `evaluate_policy` result."""
    lines = [f"{'tag':<14} {'strict':>7} {'partial':>8} {'images':>7}"]
    for tag, v in result["per_tag"].items():
        lines.append(f"{tag:<14} {v['strict']:>7.3f} {v['partial']:>8.3f} {v['images']:>7d}")
    lines.append(f"{'overall':<14} {result['strict']:>7.3f} {result['partial']:>8.3f} {result['images']:>7d}")
    return "\n".join(lines)
