"""Critical-token credit (docs/concepts/credit.md#critical-token): Group Critical-token Policy Optimization
(zghhui/GCPO, ICLR 2026). The maths; the scheme is registered in core/schemes/critical.py.

Not this package's GCPO (Guidance Contrastive Policy Optimization, arXiv 2605.29198): the two methods
share an acronym, so this one is called ``critical`` everywhere (scheme name, config section, files).

Per sample i, over its N_i valid tokens (m = 1), the critical set S_i is the union of

1. the first k₁ tokens in decision order (by ``step``, ties by position; AR images: raster order);
2. the k₂ tokens with the largest entropy gradient over the token grid,
   |H_t − mean_{s ∈ nb(t), m_s = 1} H_s|, nb = the 4-neighbourhood on the (rows, cols) grid, or
   t ± 1 for a sequence (layout None);
3. the k₃ tokens least similar to the same position in the other members of their group:
   lowest mean_{j ≠ i, m_jt = 1} cos(e_it, e_jt) over the feature vectors e (VQ code embeddings);

with k = max(1, round(fraction · N_i)) per criterion (positions with no valid other group member count
as similarity 1 and are never selected by criterion 3), and w = N_i / |S_i| on S_i, 0 elsewhere, so
Σ_t m·w = N_i (mass-preserving, like every scheme here; the original's loss on the critical set alone is
this up to the per-sequence scale). Not implemented: the original's extra token reweighting by a running
mean of clamp(exp(log π_θ − log π_ref), ±0.5) — an option left out on purpose.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from t2i_gcpo.core.credit import _check

_COS_GRID = 1e9  # cosines are rounded to 1e-9 so that numerically equal ones tie (and break by position)


def _counts(n: Tensor, fraction: float) -> Tensor:
    """k = max(1, round(fraction · N_i)) per row (round half to even, as torch.round), at most N_i;
    fraction 0 disables the criterion (k = 0). n: [B] long → [B] long."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"fractions must lie in [0, 1], got {fraction}")
    if fraction == 0:
        return torch.zeros_like(n)
    k = torch.round(n.double() * fraction).long().clamp_min(1)
    return torch.minimum(k, n)


def _first_k(key: Tensor, m: Tensor, k: Tensor, descending: bool) -> Tensor:
    """Select, per row, the k_i valid entries with the smallest (or largest) key; ties go to the lower
    position (stable sort). key: [B, T] finite float; m: [B, T] bool; k: [B] long → [B, T] bool."""
    fill = float("-inf") if descending else float("inf")  # padding sorts last
    order = torch.where(m, key, torch.full_like(key, fill)).sort(dim=1, descending=descending, stable=True)[1]
    T = key.shape[1]
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(T, device=key.device).expand_as(order))
    return m & (rank < k[:, None])


@torch.no_grad()
def entropy_gradient(entropy: Tensor, mask: Tensor, layout: tuple[int, int] | None = None) -> Tensor:
    """|H_t − mean of H over t's valid neighbours| [B, T] (docs/concepts/credit.md#critical-token,
    criterion 2); padding → 0.

    Neighbours: up/down/left/right on the (rows, cols) grid (rows·cols must equal T), or t − 1 and t + 1
    for a sequence (layout None). Only valid neighbours count; a token with none gets 0. Computed in float64
    so that equal entropies give exactly 0.
    """
    m = _check(mask, entropy=entropy)
    B, T = m.shape
    h = entropy.double().nan_to_num(0.0, 0.0, 0.0)  # [B, T]
    h = torch.where(m, h, torch.zeros_like(h))  # padding (junk logits) never counts as a neighbour
    mf = m.double()
    if layout is None:
        h, mf = h.view(B, 1, T), mf.view(B, 1, T)  # a sequence is a one-row grid
    else:
        rows, cols = layout
        if rows * cols != T:
            raise ValueError(f"layout {layout} has {rows * cols} cells, but T = {T}")
        h, mf = h.view(B, rows, cols), mf.view(B, rows, cols)
    total = torch.zeros_like(h)  # Σ H_s over valid neighbours [B, R, C]
    count = torch.zeros_like(h)
    total[:, 1:, :] += h[:, :-1, :]  # up
    count[:, 1:, :] += mf[:, :-1, :]
    total[:, :-1, :] += h[:, 1:, :]  # down
    count[:, :-1, :] += mf[:, 1:, :]
    total[:, :, 1:] += h[:, :, :-1]  # left
    count[:, :, 1:] += mf[:, :, :-1]
    total[:, :, :-1] += h[:, :, 1:]  # right
    count[:, :, :-1] += mf[:, :, 1:]
    grad = torch.where(count > 0, (h - total / count.clamp_min(1)).abs(), torch.zeros_like(h)).view(B, T)
    return torch.where(m, grad, torch.zeros_like(grad))


@torch.no_grad()
def group_similarity(features: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """Mean cosine similarity of e_it to e_jt over the other members j of i's group that are valid at t
    [B, T] (docs/concepts/credit.md#critical-token, criterion 3). Groups are rows g·G … g·G + G − 1. A
    position with no such j (a group of one, or all others padded there) gets 1, so this criterion never
    selects it. Padding → 1. Cosines are computed in float64 and rounded to 1e-9 so that equal ones tie; a
    zero vector has cosine 0.
    """
    m = _check(mask, features=features)
    B, T = m.shape
    if features.dim() != 3:
        raise ValueError(f"features must be [B, T, D], got {tuple(features.shape)}")
    if group_size < 1 or B % group_size:
        raise ValueError(f"batch size {B} is not a multiple of group_size {group_size}")
    G = group_size
    e = F.normalize(features.double().nan_to_num(0.0, 0.0, 0.0), dim=-1)  # unit vectors [B, T, D]
    e = e.view(B // G, G, T, -1)  # [P, G, T, D]
    sim = torch.einsum("pitd,pjtd->pijt", e, e)  # cos(e_it, e_jt) [P, G, G, T]
    sim = torch.round(sim * _COS_GRID) / _COS_GRID
    others = ~torch.eye(G, dtype=torch.bool, device=m.device)  # j ≠ i [G, G]
    pairs = others[None, :, :, None] & m.view(-1, 1, G, T)  # [P, G(i), G(j), T]
    count = pairs.sum(dim=2)  # [P, G, T]
    mean = torch.where(pairs, sim, torch.zeros_like(sim)).sum(dim=2) / count.clamp_min(1)
    mean = torch.where(count > 0, mean, torch.ones_like(mean)).view(B, T)
    return torch.where(m, mean, torch.ones_like(mean))


@torch.no_grad()
def critical_weights(
    entropy: Tensor,
    features: Tensor,
    step: Tensor | None,
    mask: Tensor,
    group_size: int,
    layout: tuple[int, int] | None = None,
    first_fraction: float = 0.1,
    entropy_fraction: float = 0.1,
    similarity_fraction: float = 0.1,
) -> Tensor:
    """Critical-token credit (zghhui/GCPO, ICLR 2026; docs/concepts/credit.md#critical-token) — see
    the module docstring.

    entropy: [B, T] policy entropy per position; features: [B, T, D]; step: [B, T] decision step (None:
    position); mask: [B, T]; group_size G divides B; layout: (rows, cols) with rows·cols = T, or None.
    Each criterion takes k = max(1, round(fraction · N_i)) tokens, at most N_i (round half to even; fraction
    0 switches the criterion off; at least one must be > 0); ties go to the lower position. Criterion 3
    only takes tokens with similarity < 1: a position with no valid other group member (similarity 1 by
    definition) or identical to all of them is never selected, so it may take fewer than k. w = N_i/|S_i|
    on the union S_i, 0 elsewhere; if S_i is empty (possible only when criterion 3 is the only one on)
    the row is uniform, w = 1. Fully-masked rows are all zeros.
    Returns float32 [B, T], no gradient.
    """
    m = _check(mask, entropy=entropy, features=features)
    B, T = m.shape
    if step is not None and step.shape != m.shape:
        raise ValueError(f"step {tuple(step.shape)} does not match mask [B, T] = {tuple(m.shape)}")
    if first_fraction == entropy_fraction == similarity_fraction == 0:
        raise ValueError("at least one of first_fraction, entropy_fraction, similarity_fraction must be > 0")
    n = m.sum(dim=1)  # N_i [B]
    pos = torch.arange(T, device=m.device).expand(B, T)
    order = pos if step is None else step.to(m.device).long() * T + pos  # decision order, ties by position

    first = _first_k(order.double(), m, _counts(n, first_fraction), descending=False)
    grad = entropy_gradient(entropy, m, layout)
    sharp = _first_k(grad, m, _counts(n, entropy_fraction), descending=True)
    sim = group_similarity(features, m, group_size)
    unlike = _first_k(sim, m & (sim < 1), _counts(n, similarity_fraction), descending=False)

    critical = first | sharp | unlike  # [B, T], only valid tokens
    size = critical.sum(dim=1, keepdim=True)  # |S_i| [B, 1]
    critical = torch.where(size > 0, critical, m)  # empty set (only criterion 3 on, nothing unlike): uniform
    size = critical.sum(dim=1, keepdim=True)
    w = n[:, None].float() / size.clamp_min(1).float()
    return torch.where(critical, w.expand(B, T), torch.zeros(B, T, device=m.device))
