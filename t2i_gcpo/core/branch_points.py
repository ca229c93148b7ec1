"""Where to branch a sample (docs/concepts/tree_credit.md#branch-points): the named rules that pick the steps
from which extra continuations are sampled (VinePPO, arXiv 2410.01679; SPO, arXiv 2505.23564).

A branch point t means "keep the sample's first t decisions, sample the rest again"; a continuation from t
re-decides step t onwards. Step 0 (the empty prefix, i.e. the prompt) is never returned: its value is the
group's mean reward, which the group already gives. Every rule returns the points as a padded tensor
``[B, K]`` long, each row sorted ascending, unused slots −1 (K = the most points any row has; K = 0 when no
row has any).
"""

from __future__ import annotations

import torch
from torch import Tensor

PAD = -1  # an unused branch-point slot


def _padded(rows: list[Tensor], device: torch.device) -> Tensor:
    """Stack 1-D long tensors of different lengths into [B, K], padding with PAD."""
    K = max((r.numel() for r in rows), default=0)
    out = torch.full((len(rows), K), PAD, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r
    return out


def _check_mask(mask: Tensor, **others: Tensor) -> Tensor:
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got {tuple(mask.shape)}")
    for name, t in others.items():
        if t.shape != mask.shape:
            raise ValueError(f"{name} {tuple(t.shape)} does not match mask [B, T] = {tuple(mask.shape)}")
    return mask.bool()


def every_k(n_steps: Tensor, k: int) -> Tensor:
    """Branch every k steps: t = k, 2k, 3k, … < n_i, per sample.

    n_steps: [B] the number of decision steps of each sample (AR and text: its valid tokens; masked
    images: its reveal steps). Returns [B, K] long, sorted, padded with −1.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n_steps.dim() != 1:
        raise ValueError(f"n_steps must be [B], got {tuple(n_steps.shape)}")
    n = n_steps.long()
    K = int((n.clamp_min(1) - 1).max()) // k if n.numel() else 0  # most points any row has
    t = torch.arange(1, K + 1, device=n.device) * k  # [K]
    pts = t.expand(n.numel(), K)
    return torch.where(pts < n[:, None], pts, torch.full_like(pts, PAD))


def spread(n_steps: Tensor, k: int) -> Tensor:
    """Exactly k points per sample, evenly over its decision steps: t_j = ⌊j·n_i / (k + 1)⌋, j = 1 … k.

    Distinct and ≥ 1 when n_i > k; a sample of n_i ≤ k steps repeats points, some of them 0 (a continuation
    from the prompt: a fresh sample). Every sample gets k, so every tree group has the same number of leaves
    (docs/concepts/tree_credit.md#tree-groups). Returns [B, k] long, sorted, not padded.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n_steps.dim() != 1:
        raise ValueError(f"n_steps must be [B], got {tuple(n_steps.shape)}")
    j = torch.arange(1, k + 1, device=n_steps.device)
    return (j[None] * n_steps.long()[:, None]) // (k + 1)


def top_entropy(entropy: Tensor, mask: Tensor, k: int) -> Tensor:
    """Branch before the k highest-entropy valid positions of each sample (position 0 excluded).

    A continuation from t re-draws token t, so branching at the most uncertain positions lets the
    continuations re-decide them. Ties go to the lower position; a row with fewer than k valid positions
    after position 0 gets all of them. entropy, mask: [B, T]. Returns [B, K ≤ k] long, sorted, padded with −1.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    m = _check_mask(mask, entropy=entropy).clone()
    m[:, 0] = False  # the empty prefix is the root, not a branch point
    key = torch.where(
        m,
        entropy.double().nan_to_num(0.0, 0.0, 0.0),
        torch.full_like(entropy, -torch.inf, dtype=torch.float64),
    )
    order = key.sort(dim=1, descending=True, stable=True).indices[:, :k]  # [B, min(k, T)]
    take = torch.gather(m, 1, order)
    return _padded([o[t].sort().values for o, t in zip(order, take)], entropy.device)


def at_boundaries(boundary: Tensor, mask: Tensor) -> Tensor:
    """Branch at task boundaries: every valid position t > 0 with boundary[t] True (text: the first
    token of a line; ShapeWorld AR: the first token of a row of the token grid).

    boundary, mask: [B, T] bool. Returns [B, K] long, sorted, padded with −1.
    """
    m = _check_mask(mask, boundary=boundary)
    hit = boundary.bool() & m
    hit[:, 0] = False
    pos = torch.arange(m.shape[1], device=m.device)
    return _padded([pos[h] for h in hit], m.device)


def row_starts(mask: Tensor, cols: int) -> Tensor:
    """The boundary mask of a raster token grid with ``cols`` columns: True at the first token of each row."""
    if cols < 1:
        raise ValueError(f"cols must be >= 1, got {cols}")
    pos = torch.arange(mask.shape[-1], device=mask.device)
    return (pos % cols == 0).expand(mask.shape).clone()
