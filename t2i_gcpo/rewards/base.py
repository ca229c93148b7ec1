"""The reward protocol shared by every reward (ShapeWorld, GenEval, CLIPScore, user callables)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the reward files import this module without torch (`--help` lists them)
    import torch


@dataclass
class RewardOutput:
    scores: torch.Tensor  # [B] float — the scalar reward r_i of each sample
    details: list[dict[str, Any]] = field(
        default_factory=list
    )  # [B] — per-sample info (strict, tag, objects…)


class Reward(Protocol):
    """Optional beyond this: ``bounds``, the (low, high) every score lies in where it is known
    (rewards.combine.reward_bounds; the run report clips the reward's ± std band to it), and
    ``check_prompts(prompts, metadata)`` (rewards.combine.check_prompts)."""

    name: str

    def __call__(self, images: Any, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        """Score samples. `images`: float tensor [B, 3, H, W] in [0, 1] (or texts for the text path);
        `metadata`: GenEval metadata per sample (empty dicts where there is none)."""
        ...
