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
    # the rewards of continuations sampled from each row's branch points (a scheme that needs "branches",
    # train/branches.py): points [B, K] long (−1 padding), rewards [B, K, M] float64, exists [B, K, M] bool
    tree: dict[str, torch.Tensor] | None = None

    def select(self, index: torch.Tensor) -> Batch:
        ids = index.tolist()
        outputs = self.outputs[index] if torch.is_tensor(self.outputs) else [self.outputs[i] for i in ids]
        details = [self.reward.details[i] for i in ids] if self.reward.details else []
        tree = select_tree(self.tree, index)
        return Batch(self.rollout.select(index), self.advantages[index],
                     RewardOutput(self.reward.scores[index], details), outputs, tree)  # fmt: skip

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
            concat_trees([b.tree for b in batches]),
        )  # fmt: skip


PADDING = {"points": -1, "rewards": float("nan"), "exists": False}  # an unused branch-point slot


def concat_trees(trees: list[dict[str, torch.Tensor] | None]) -> dict[str, torch.Tensor] | None:
    """Batches' trees row after row, the point axis K padded to the widest (None: no batch has one)."""
    if all(t is None for t in trees):
        return None
    if any(t is None for t in trees):
        raise ValueError("cannot concatenate batches with and without branch continuations")
    K = max(t["points"].shape[1] for t in trees)
    out = {}
    for name, fill in PADDING.items():
        parts = []
        for t in trees:
            x = t[name]
            pad = torch.full((x.shape[0], K - x.shape[1], *x.shape[2:]), fill, dtype=x.dtype, device=x.device)
            parts.append(torch.cat([x, pad], dim=1))
        out[name] = torch.cat(parts)
    return out


def select_tree(tree: dict[str, torch.Tensor] | None, index: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """Rows `index` of a `Batch.tree`."""
    return None if tree is None else {k: v[index.to(v.device)] for k, v in tree.items()}
