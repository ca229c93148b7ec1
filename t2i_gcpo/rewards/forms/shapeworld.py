"""The ShapeWorld reward: GenEval's rules (docs/evaluation/geneval.md) on the ShapeWorld detector's output.

Per image: detect objects from pixels (t2i_gcpo.worlds.shapeworld.detect), then score the prompt's
GenEval metadata twice — the strict GenEval verdict (`evaluate_detections`: top-count per class,
thresholds 0.3 / 0.9) and the flow_grpo-style partial credit (`reward_detections`,
docs/evaluation/geneval.md#geneval-as-a-reward). The scalar reward is the partial credit by default, or the
strict verdict as 0/1 with `mode="strict"`. The partial credit follows
docs/evaluation/geneval.md#geneval-as-a-reward in [0, 1] (`variant="spec"`, the default) or flow_grpo's code
exactly (`variant="flow_grpo"`: over-counts go negative, a failed position scores 0 then 1); the reward spec
`shapeworld:flow_grpo` picks the latter (t2i_gcpo/rewards/registry.py).

The module imports numpy, torch and the world's detector where they are used: the registration below is
read by ``--help`` without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.registry import Option, register_reward

if TYPE_CHECKING:
    import numpy as np
    import torch


@register_reward(
    "shapeworld",
    scores="image",
    doc="GenEval's rules on the ShapeWorld detector's output: partial credit in [0, 1], or flow_grpo's",
    weights="none: the embedded world's exact detector",
    source="GenEval's rules and flow_grpo's partial credit: docs/evaluation/geneval.md#geneval-as-a-reward",
    licence="Apache-2.0 (this package)",
    example="shapeworld:flow_grpo",
)
def load(
    *,
    variant: Annotated[
        Literal["spec", "flow_grpo"],
        Option(
            "partial credit: 'spec' (in [0, 1]) or 'flow_grpo' (its code term for term; write "
            "the flag flow_grpo)"
        ),
    ] = "spec",
    grid: tuple[int, int] = (8, 8),
) -> ShapeWorldReward:
    return ShapeWorldReward(grid=grid, variant=variant)


def to_uint8_images(images: torch.Tensor | np.ndarray) -> np.ndarray:
    """float [B, 3, H, W] in [0, 1] (NaN → background gray) → uint8 [B, H, W, 3]."""
    import torch

    x = torch.as_tensor(images).detach().float().cpu()
    if x.ndim != 4 or x.shape[1] != 3:
        raise ValueError(f"expected images [B, 3, H, W], got shape {tuple(x.shape)}")
    x = torch.nan_to_num(x, nan=0.6, posinf=1.0, neginf=0.0).clamp(0, 1)
    return (x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


class ShapeWorldReward:
    """r_i = partial credit (docs/evaluation/geneval.md#geneval-as-a-reward) (default) or strict GenEval
    correctness of image i.

    details[i]: {"strict": bool (GenEval verdict), "partial": float (in `variant`),
    "strict_exact": bool (the exact-count verdict), "tag", "reason", "detections": [{"cls", "color", "box",
    "score"}], "object_grid": bool [rows, cols] — tokens (≥ 25 % covered) on detected objects of a prompt
    class, above the prompt's detection threshold}.
    """

    name = "shapeworld"

    def __init__(
        self,
        mode: Literal["partial", "strict"] = "partial",
        grid: tuple[int, int] = (8, 8),
        variant: Literal["spec", "flow_grpo"] = "spec",
    ) -> None:
        from t2i_gcpo.scoring.geneval_rules import check_score_and_variant

        check_score_and_variant("ShapeWorld", "mode", mode, variant)
        self.mode = mode
        self.variant = variant
        self.grid = (int(grid[0]), int(grid[1]))

    @property
    def bounds(self) -> tuple[float, float] | None:
        """The range every score lies in (rewards.combine.reward_bounds;
        geneval_rules.partial_credit_bounds)."""
        from t2i_gcpo.scoring.geneval_rules import partial_credit_bounds

        return partial_credit_bounds(self.mode, self.variant)

    def score_image(self, image: np.ndarray, metadata: dict) -> dict:
        """Details of one uint8 [H, W, 3] image against GenEval metadata (see the class doc)."""
        from t2i_gcpo.scoring.geneval_rules import default_threshold, evaluate_detections, reward_detections
        from t2i_gcpo.worlds.shapeworld.detect import detect
        from t2i_gcpo.worlds.shapeworld.render import token_grid_mask

        detections = detect(image)
        strict = evaluate_detections(metadata, detections)
        flow = reward_detections(metadata, detections, variant=self.variant)
        classes = {c["class"] for c in metadata.get("include", [])}
        thr = default_threshold(metadata)
        kept = [d for d in detections if d.cls in classes and d.score > thr]
        return {
            "strict": bool(strict.correct),
            "partial": float(flow.partial),
            "strict_exact": bool(flow.correct),
            "tag": metadata.get("tag", "untagged"),
            "reason": strict.reason,
            "detections": [
                {
                    "cls": d.cls,
                    "color": d.color,
                    "box": tuple(round(v, 2) for v in d.box),
                    "score": round(d.score, 4),
                }
                for d in detections
            ],
            "object_grid": token_grid_mask([d.mask for d in kept], self.grid),
        }

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        import torch

        from t2i_gcpo.worlds.shapeworld.parse import parse_prompt

        pixels = to_uint8_images(images)  # [B, H, W, 3]
        if len(prompts) != len(pixels) or (metadata and len(metadata) != len(pixels)):
            raise ValueError(f"{len(pixels)} images but {len(prompts)} prompts and {len(metadata)} metadata")
        details = []
        for i, image in enumerate(pixels):
            meta = metadata[i] if metadata else {}
            if not meta.get("include"):  # no metadata: the prompt text must be a GenEval template
                meta = parse_prompt(prompts[i])
            details.append(self.score_image(image, meta))
        key = "partial" if self.mode == "partial" else "strict"
        scores = torch.tensor([float(d[key]) for d in details], dtype=torch.float32)  # [B]
        return RewardOutput(scores=scores, details=details)
