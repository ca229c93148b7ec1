"""Credit lift: does a credit scheme put its weight on the tokens that draw the prompt's objects?

See docs/worlds/shapeworld.md#credit-lift. For sample i with valid tokens V_i (mask), object tokens O_i ⊆ V_i
(token-grid cells that cover a prompt object) and weights w_it ≥ 0:

    lift_i = (Σ_{t∈O_i} w_it / Σ_{t∈V_i} w_it) / (|O_i| / |V_i|)

= share of credit on object tokens ÷ share of such tokens. Uniform credit gives exactly 1.0; > 1
means the scheme concentrates credit on the objects; the maximum, all credit on object tokens, is
|V_i| / |O_i|.

Undefined samples are returned as nan — no object token (O_i = ∅), only object tokens (O_i = V_i,
the ratio is 1 whatever the weights), or no credit at all (Σ w = 0) — and `mean_credit_lift`
ignores them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from t2i_gcpo.errors import UserError
from t2i_gcpo.stats import mean_ci95


def _flat(x: Any, name: str) -> np.ndarray:
    """[B, rows, cols] or [B, T] (numpy or torch) -> numpy [B, T]."""
    if hasattr(x, "detach"):  # torch.Tensor
        x = x.detach().cpu()
        x = (x.float() if x.is_floating_point() else x).numpy()  # bf16 has no numpy dtype
    a = np.asarray(x)
    if a.ndim not in (2, 3):
        raise UserError(f"{name} must be [B, T] or [B, rows, cols], got shape {tuple(a.shape)}")
    return a.reshape(a.shape[0], -1)


def credit_lift(weights: Any, object_grids: Any, mask: Any = None) -> np.ndarray:
    """Credit lift per sample (docs/worlds/shapeworld.md#credit-lift), float64 [B]; nan where undefined
    (see module docstring).

    Args:
        weights: token weights w ≥ 0, [B, T] or [B, rows, cols] (numpy or torch).
        object_grids: bool, same shape: True where the token covers a prompt object.
        mask: optional bool, same shape: valid tokens (default: all valid).
    """
    w = _flat(weights, "weights").astype(np.float64)  # [B, T]
    obj = _flat(object_grids, "object_grids").astype(bool)  # [B, T]
    valid = np.ones_like(obj) if mask is None else _flat(mask, "mask").astype(bool)
    if obj.shape != w.shape or valid.shape != w.shape:
        raise UserError(
            f"credit_lift: weights {w.shape}, object_grids {obj.shape} and mask {valid.shape} must match"
        )
    if np.any(w[valid] < 0) or not np.all(np.isfinite(w[valid])):
        raise UserError("credit_lift: weights must be finite and ≥ 0 on valid tokens")
    obj = obj & valid
    n_valid = valid.sum(axis=1).astype(np.float64)  # |V_i|
    n_obj = obj.sum(axis=1).astype(np.float64)  # |O_i|
    credit_all = np.where(valid, w, 0.0).sum(axis=1)  # Σ_V w
    credit_obj = np.where(obj, w, 0.0).sum(axis=1)  # Σ_O w
    defined = (n_obj > 0) & (n_obj < n_valid) & (credit_all > 0)
    lift = np.full(w.shape[0], np.nan)
    d = defined
    lift[d] = (credit_obj[d] / credit_all[d]) / (n_obj[d] / n_valid[d])
    return lift


def mean_credit_lift(lifts: Iterable[float] | np.ndarray) -> float:
    """Mean of the defined (non-nan) lifts; nan if there is none."""
    a = np.asarray(list(lifts) if not isinstance(lifts, np.ndarray) else lifts, dtype=np.float64).ravel()
    a = a[~np.isnan(a)]
    return float(a.mean()) if a.size else float("nan")


def lift_table(rows: Mapping[str, Iterable[float]]) -> str:
    """A plain-text table, one line per scheme: mean lift, Student-t 95 % interval, n (defined
    samples) and how many nan samples were left out."""
    header = f"{'scheme':<16} {'mean':>7} {'95% interval':>19} {'n':>6} {'nan':>5}"
    lines = [header, "-" * len(header)]
    for scheme, vals in rows.items():
        vals = list(vals)
        m, lo, hi, n = mean_ci95(vals)
        ci = "–" if math.isnan(lo) else f"[{lo:.3f}, {hi:.3f}]"
        mean = "–" if math.isnan(m) else f"{m:.3f}"
        lines.append(f"{scheme:<16} {mean:>7} {ci:>19} {n:>6} {len(vals) - n:>5}")
    return "\n".join(lines)
