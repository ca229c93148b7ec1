"""One step's training data (`Batch`): its own module so checkpoints can rebuild it (the carry's
allow-list) without importing the trainer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from t2i_gcpo.core.tree import Leaves, Tree
from t2i_gcpo.policies.base import Rollout
from t2i_gcpo.rewards.base import RewardOutput


@dataclass
class Batch:
    """One step's training data after dynamic sampling (B = kept groups × G)."""

    rollout: Rollout  # tokens, mask, recorded log-probs … [B, T]
    advantages: torch.Tensor  # [B] — sequence advantages A_i
    reward: RewardOutput  # scores [B] and per-sample details
    outputs: Any  # what the rollout decoded to: images [B, 3, H, W] in [0, 1], or B strings
    # the continuations sampled from each row's branch points and their rewards, for a scheme that needs
    # "branches" (train/branches.py); None otherwise
    tree: Tree | None = None
    # tree groups (a scheme that needs "leaves"): each row's root and branch point in its group's prefix tree
    leaves: Leaves | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tree, dict):  # a carry saved before the Tree record (a dict of its three fields)
            self.tree = Tree(**self.tree)

    def select(self, index: torch.Tensor) -> Batch:
        ids = index.tolist()
        outputs = self.outputs[index] if torch.is_tensor(self.outputs) else [self.outputs[i] for i in ids]
        tree = None if self.tree is None else self.tree.select(index)
        leaves = None if self.leaves is None else self.leaves.select(index)
        return Batch(
            self.rollout.select(index),
            self.advantages[index],
            self.reward.select(index),
            outputs,
            tree,
            leaves,
        )

    @staticmethod
    def concat(batches: list[Batch]) -> Batch | None:
        if not batches:
            return None
        outs = [b.outputs for b in batches]
        trees, leaves = [b.tree for b in batches], [b.leaves for b in batches]
        for parts in (trees, leaves):
            if any(x is None for x in parts) and not all(x is None for x in parts):
                raise ValueError("cannot concatenate batches with and without branch continuations")
        return Batch(
            Rollout.concat([b.rollout for b in batches]),
            torch.cat([b.advantages for b in batches]),
            RewardOutput.concat([b.reward for b in batches]),
            torch.cat(outs) if torch.is_tensor(outs[0]) else [o for x in outs for o in x],
            None if trees[0] is None else Tree.concat(trees),
            None if leaves[0] is None else Leaves.concat(leaves),
        )
