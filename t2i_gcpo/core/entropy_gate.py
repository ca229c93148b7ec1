"""Entropy gating in the manner of EG-GRPO (arXiv 2604.02355; docs/concepts/tree_credit.md#entropy-gating):
no credit on the most certain tokens, a bounded bonus on the least certain ones.

The paper's text was not at hand when this was written; this implements the issue's stated intent.
Per token, with H its policy entropy and q_lo ≤ q_hi two quantiles of the valid entropies (of the sample,
or of the whole batch),

    w = 0        if H < q_lo   (strictly below: equal entropies are never gated),
    w = 1 + β    if H > q_hi   (strictly above),
    w = 1        otherwise,

so 0 ≤ w ≤ 1 + β ≤ 2 (β ∈ [0, 1]). The token advantage is A_i · w, as for every credit weight.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Scope = Literal["sample", "batch"]


def row_quantiles(x: Tensor, mask: Tensor, q: float) -> Tensor:
    """The q-quantile of each row's valid entries, linearly interpolated as ``torch.quantile`` does
    (position q·(N − 1) among the N sorted values). x, mask: [B, T] → float64 [B] (NaN for an empty row)."""
    m = mask.bool()
    s = torch.where(m, x.double(), torch.full_like(x, torch.inf, dtype=torch.float64)).sort(dim=1).values
    n = m.sum(dim=1)  # [B]
    pos = q * (n - 1).clamp_min(0).double()
    lo, hi = pos.floor().long(), pos.ceil().long()
    a, b = s.gather(1, lo[:, None])[:, 0], s.gather(1, hi[:, None])[:, 0]
    out = torch.where(lo == hi, a, a + (pos - lo) * (b - a))  # no inf − inf when both ends coincide
    return torch.where(n > 0, out, torch.full_like(out, torch.nan))


@torch.no_grad()
def entropy_gate_weights(
    entropy: Tensor,
    mask: Tensor,
    low_quantile: float = 0.2,
    high_quantile: float = 0.8,
    bonus: float = 0.5,
    scope: Scope = "sample",
    preserve_mass: bool = False,
) -> Tensor:
    """EG-GRPO-style gate weights (docs/concepts/tree_credit.md#entropy-gating) — see the module docstring.

    entropy, mask: [B, T]; low_quantile ≤ high_quantile in [0, 1]; bonus β in [0, 1]; scope: quantiles of
    each sample's valid entropies ("sample") or of all valid entropies in the batch ("batch").
    Mass: Σ_t m·w = N_i − n_low + β·n_high (n_low, n_high: the tokens gated and boosted), so the gate
    changes a sample's total credit; preserve_mass=True rescales each row to Σ_t m·w = N_i (the weight
    on a boosted token is then (1 + β)·N_i / (N_i − n_low + β·n_high)). The highest-entropy token is never
    gated, so a non-empty row always keeps positive mass. Returns float32 [B, T], 0 on padding.
    """
    if entropy.shape != mask.shape or mask.dim() != 2:
        raise ValueError(f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} must both be [B, T]")
    if not 0 <= low_quantile <= high_quantile <= 1:
        raise ValueError(f"need 0 <= low_quantile <= high_quantile <= 1, got {low_quantile}, {high_quantile}")
    if not 0 <= bonus <= 1:
        raise ValueError(f"bonus must lie in [0, 1], got {bonus}")
    m = mask.bool()
    h = entropy.double()
    if scope == "sample":
        q_lo, q_hi = row_quantiles(h, m, low_quantile)[:, None], row_quantiles(h, m, high_quantile)[:, None]
    elif scope == "batch":
        flat_h, flat_m = h.reshape(1, -1), m.reshape(1, -1)
        q_lo, q_hi = row_quantiles(flat_h, flat_m, low_quantile), row_quantiles(flat_h, flat_m, high_quantile)
    else:
        raise ValueError(f"unknown scope {scope!r}; expected 'sample' or 'batch'")
    w = torch.ones_like(h)
    w = torch.where(h < q_lo, torch.zeros_like(w), w)
    w = torch.where(h > q_hi, torch.full_like(w, 1 + bonus), w)
    w = torch.where(m, w, torch.zeros_like(w))
    if preserve_mass:
        n = m.sum(dim=1, keepdim=True).double()
        w = w * n / w.sum(dim=1, keepdim=True).clamp_min(1e-12)
    return w.float()
