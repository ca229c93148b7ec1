"""The records of branched rollouts, from the adapters (which sample the continuations) through the batch and
the checkpoints to the maths of core/tree_credit.py and core/tree_groups.py:

- `Tree`: the continuations sampled from each sample's branch points and their rewards, the continuations
  scored but not trained on (vine; docs/concepts/tree_credit.md#branched-rollouts);
- `Leaves`: where each row of a tree group sits in its prompt's prefix tree, every leaf a training sample
  (docs/concepts/tree_credit.md#tree-groups).

Rows are samples (B), in the batch's order. A `Tree` row's branch points come first, increasing, then −1 (K
= the most points of any row, 0 when none has any); each point holds up to M continuations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from t2i_gcpo.core.branch_points import PAD


@dataclass
class Tree:
    """Continuations of B samples from their branch points."""

    points: Tensor  # [B, K] long — branch points in decision steps, increasing, then −1 (PAD)
    rewards: Tensor  # [B, K, M] float64 — the continuations' rewards, NaN where none was sampled
    exists: Tensor | None = None  # [B, K, M] bool — which were sampled; None: all M at every used point

    def __post_init__(self) -> None:
        B, K = self.points.shape if self.points.dim() == 2 else (-1, -1)
        if B < 0 or self.rewards.dim() != 3 or tuple(self.rewards.shape[:2]) != (B, K):
            raise ValueError(
                f"a Tree needs points [B, K] and rewards [B, K, M], got {tuple(self.points.shape)} and "
                f"{tuple(self.rewards.shape)}"
            )
        if self.exists is None:
            self.exists = (self.points >= 0)[:, :, None].expand_as(self.rewards).clone()
        if self.exists.shape != self.rewards.shape:
            raise ValueError(
                f"exists {tuple(self.exists.shape)} must match rewards {tuple(self.rewards.shape)}"
            )

    @property
    def continuations(self) -> int:
        """M: the most continuations a point holds."""
        return int(self.rewards.shape[2])

    def __len__(self) -> int:
        return int(self.points.shape[0])

    @staticmethod
    def empty(rows: int, continuations: int) -> Tree:
        """No branch point in any of `rows` samples (K = 0): segment advantages are then r_i − V(prompt)."""
        return Tree(
            torch.zeros(rows, 0, dtype=torch.long),
            torch.zeros(rows, 0, continuations, dtype=torch.float64),
            torch.zeros(rows, 0, continuations, dtype=torch.bool),
        )

    def select(self, index: Tensor | Sequence[int]) -> Tree:
        """Rows `index`."""
        idx = torch.as_tensor(index, dtype=torch.long)
        return Tree(*(x[idx.to(x.device)] for x in (self.points, self.rewards, self.exists)))

    def to(self, device: torch.device | str) -> Tree:
        return Tree(self.points.to(device), self.rewards.to(device), self.exists.to(device))

    @staticmethod
    def concat(trees: Sequence[Tree]) -> Tree:
        """Rows of every tree in order, the point axis K padded to the widest (−1, NaN, False)."""
        if not trees:
            raise ValueError("nothing to concatenate")
        if len({t.continuations for t in trees}) > 1:
            raise ValueError("cannot concatenate trees with different numbers of continuations per point")
        K = max(t.points.shape[1] for t in trees)

        def widen(x: Tensor, fill: float | bool | int) -> Tensor:
            out = torch.full((x.shape[0], K, *x.shape[2:]), fill, dtype=x.dtype, device=x.device)
            out[:, : x.shape[1]] = x
            return out

        return Tree(
            torch.cat([widen(t.points, PAD) for t in trees]),
            torch.cat([widen(t.rewards, float("nan")) for t in trees]),
            torch.cat([widen(t.exists, False) for t in trees]),
        )


@dataclass
class Leaves:
    """The rows of tree groups (groups of G contiguous rows, as everywhere): each row a leaf of its prompt's
    prefix tree — a root, sampled from the prompt, or a continuation of a root of its group from a branch
    point, trained on from that point on."""

    root: Tensor  # [B] long — the index within its group of the root the row continues; a root: its own
    point: Tensor  # [B] long — the decision step the row branched from its root at; a root: −1

    def __post_init__(self) -> None:
        if self.root.dim() != 1 or self.point.shape != self.root.shape:
            raise ValueError(
                f"Leaves need root and point [B], got {tuple(self.root.shape)}, {tuple(self.point.shape)}"
            )

    def __len__(self) -> int:
        return int(self.root.shape[0])

    @property
    def is_root(self) -> Tensor:
        """[B] bool."""
        return self.point < 0

    def select(self, index: Tensor | Sequence[int]) -> Leaves:
        """Rows `index` (whole groups keep every `root` index valid)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        return Leaves(self.root[idx.to(self.root.device)], self.point[idx.to(self.point.device)])

    def to(self, device: torch.device | str) -> Leaves:
        return Leaves(self.root.to(device), self.point.to(device))

    @staticmethod
    def concat(parts: Sequence[Leaves]) -> Leaves:
        return Leaves(torch.cat([p.root for p in parts]), torch.cat([p.point for p in parts]))
