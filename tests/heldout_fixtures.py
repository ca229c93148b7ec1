"""A reward for tests/train/test_heldout_change.py whose strict verdict splits a random prior's samples."""

from __future__ import annotations

import torch

from t2i_gcpo.rewards.base import RewardOutput


def red_over_green(images, prompts, metadata):
    """Mean red minus mean green; strict: above −0.0745, about the median of the tiny random prior's images
    (tests/tiny_models.tiny_policy_dir, which draws them greenish: −0.078 to −0.071), so a couple of steps
    flip some of them."""
    img = torch.as_tensor(images)
    score = img[:, 0].mean((1, 2)) - img[:, 1].mean((1, 2))
    return RewardOutput(
        score, [{"strict": bool(s > -0.0745), "tag": m.get("tag", "all")} for s, m in zip(score, metadata)]
    )
