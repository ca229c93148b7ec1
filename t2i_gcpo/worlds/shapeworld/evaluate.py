"""GenEval-style score of a policy on ShapeWorld prompts (SPEC §6, §8): the generic held-out
evaluator with the ShapeWorld reward and the checkpoint's own CFG scale."""

from __future__ import annotations

from typing import Any

from t2i_gcpo.train.evaluate import evaluate_policy as _evaluate
from t2i_gcpo.train.evaluate import format_table

__all__ = ["evaluate_policy", "format_table"]


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
    """Per-tag strict (GenEval rule) and partial (§8.2) scores with `ShapeWorldReward`; `cfg_scale`
    defaults to the policy's ``config.default_cfg_scale``. Adds ``cfg_scale`` to the result."""
    from t2i_gcpo.rewards.shapeworld import ShapeWorldReward

    if cfg_scale is None:
        cfg_scale = float(policy.config.default_cfg_scale)
    reward = ShapeWorldReward(grid=tuple(policy.grid_shape))
    result = _evaluate(policy, reward, metadata_list, images_per_prompt, cfg_scale, temperature, seed,
                       prompts_per_batch, progress=progress)  # fmt: skip
    return {**result, "cfg_scale": cfg_scale}
