"""One step's training data (`Batch`): its own module so checkpoints can rebuild it (the carry's
allow-list) without importing the trainer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from t2i_gcpo.policies.base import Rollout
from t2i_gcpo.rewards.base import RewardOutput


@dataclass
class Batch:
    """One step's training data after dynamic sampling (B = kept groups × G)."""

    rollout: Rollout  # tokens, mask, recorded log-probs … [B, T]
    advantages: torch.Tensor  # [B] — sequence advantages A_i
    reward: RewardOutput  # scores [B] and per-sample details
    outputs: Any  # what the rollout decoded to: images [B, 3, H, W] in [0, 1], or B strings

    def select(self, index: torch.Tensor) -> Batch:
        ids = index.tolist()
        outputs = self.outputs[index] if torch.is_tensor(self.outputs) else [self.outputs[i] for i in ids]
        details = [self.reward.details[i] for i in ids] if self.reward.details else []
        return Batch(self.rollout.select(index), self.advantages[index],
                     RewardOutput(self.reward.scores[index], details), outputs)  # fmt: skip

    @staticmethod
    def concat(batches: list[Batch]) -> Batch | None:
        if not batches:
            return None
        outs = [b.outputs for b in batches]
        return Batch(
            Rollout.concat([b.rollout for b in batches]),
            torch.cat([b.advantages for b in batches]),
            RewardOutput(torch.cat([b.reward.scores for b in batches]), [d for b in batches for d in b.reward.details]),
            torch.cat(outs) if torch.is_tensor(outs[0]) else [o for x in outs for o in x],
        )  # fmt: skip
