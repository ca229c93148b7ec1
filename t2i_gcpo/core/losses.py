"""Policy loss: clipped surrogate, aggregation modes and the k3 KL term
(docs/concepts/algorithms.md#policy-loss).

Symbols: ρ_it = π_θ(y_it)/π_old(y_it), Â_it token advantage, m_it ∈ {0,1} valid-token mask,
w_it credit weights (core/credit.py). The surrogate and aggregation are separate named functions so
a method is a choice along each axis, not a new loss.
"""

from __future__ import annotations

import torch
from torch import Tensor

AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm", "weighted-token-mean")


def _same_shape(**tensors: Tensor) -> torch.Size:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(tensors.values())).shape
    if len(first) != 2 or any(t.shape != first for t in tensors.values()):
        raise ValueError(f"expected 2-D tensors of one shape [B, T], got {shapes}")
    return first


def clipped_surrogate(
    ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float, dual_clip: float | None = None
) -> Tensor:
    """Per-token PPO loss L = −min(ρÂ, clip(ρ, 1−ε_low, 1+ε_high)Â)  (PPO Eq. 7; DAPO Eq. 10 clip-higher).

    dual_clip c (> 1; Ye et al. 2020, "Mastering complex control in MOBA games", Eq. 5): for Â < 0 the
    loss is additionally bounded, L = min(L, −c·Â), so a huge ratio on a bad token cannot blow up.
    ratio, adv: [B, T]; returns [B, T].
    """
    _same_shape(ratio=ratio, adv=adv)
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    loss = -torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)  # [B, T]
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip * adv), loss)
    return loss


def aggregation_denominator(mode: str, mask: Tensor, weights: Tensor | None = None) -> Tensor:
    """The normaliser `aggregate` divides by, computed over a whole batch so that minibatches can share
    it: Σ m (token-mean), #sequences with N_i > 0 (seq-mean-token-mean), B (seq-mean-token-sum-norm),
    Σ m·w (weighted-token-mean). Summing `aggregate(…, denom=…)` over minibatches then equals the
    full-batch value exactly (gradient accumulation invariance)."""
    m = mask.bool()
    if mode == "token-mean":
        return m.sum().float()
    if mode == "seq-mean-token-mean":
        return (m.sum(dim=1) > 0).sum().float()
    if mode == "seq-mean-token-sum-norm":
        return torch.tensor(float(m.shape[0]), device=m.device)
    if mode == "weighted-token-mean":
        if weights is None:
            raise ValueError("'weighted-token-mean' needs weights [B, T]")
        return torch.where(m, weights.float(), 0.0).sum()
    raise ValueError(f"unknown aggregation {mode!r}; expected one of {AGGREGATIONS}")


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    mode: str,
    weights: Tensor | None = None,
    max_len: int | None = None,
    denom: Tensor | float | None = None,
) -> Tensor:
    """Reduce a per-token quantity [B, T] to a scalar over valid tokens
    (docs/concepts/algorithms.md#aggregation).

    - "seq-mean-token-mean" (GRPO Eq. 3): (1/|S|) Σ_{i∈S} (1/N_i) Σ_t m·L, S = sequences with N_i > 0
      (fully-masked sequences are left out of the count, not averaged in as zeros).
    - "token-mean" (DAPO Eq. 12): Σ m·L / Σ m over the whole batch.
    - "seq-mean-token-sum-norm" (Dr. GRPO, arXiv 2503.20783 Eq. 3): (1/B) Σ_i Σ_t m·L / max_len with a
      constant max_len (default T); every row counts in the 1/B, empty ones included, so the
      normaliser is constant.
    - "weighted-token-mean" (official GCPO T2I and STAGE): Σ m·w·L / Σ m·w; ``weights`` required.
    Padding values never leak in (masked with where, so NaN/inf at padding is harmless). When nothing
    is valid the result is 0 and still attached to per_token's graph. ``max_len`` is used only by
    the Dr. GRPO mode; ``weights`` only by the weighted mode (passing them elsewhere is an error).
    ``denom`` replaces the batch's own normaliser (see `aggregation_denominator`): a minibatch then
    contributes its share of the whole batch's value.
    """
    _same_shape(per_token=per_token, mask=mask)
    m = mask.bool()
    zero = per_token.new_zeros(())
    x = torch.where(m, per_token, zero)  # [B, T], padding → 0
    if mode != "weighted-token-mean" and weights is not None:
        raise ValueError(f"weights are only used by 'weighted-token-mean', not {mode!r}")
    if mode == "weighted-token-mean":
        if weights is None:
            raise ValueError("'weighted-token-mean' needs weights [B, T]")
        _same_shape(per_token=per_token, weights=weights)
        x = x * torch.where(m, weights.to(per_token.dtype), zero)  # [B, T]
    elif mode == "seq-mean-token-mean":
        x = x / m.sum(dim=1, keepdim=True).clamp_min(1)  # each sequence's token mean
    elif mode == "seq-mean-token-sum-norm":
        length = per_token.shape[1] if max_len is None else max_len
        if length < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        x = x / length
    elif mode != "token-mean":
        raise ValueError(f"unknown aggregation {mode!r}; expected one of {AGGREGATIONS}")
    total = torch.as_tensor(aggregation_denominator(mode, m, weights) if denom is None else denom).to(x)
    return x.sum() / torch.where(total > 0, total, torch.ones_like(total))


def kl_k3(logp: Tensor, logp_ref: Tensor) -> Tensor:
    """k3 estimator of KL(π_θ‖π_ref) per token: exp(q) − q − 1, q = log π_ref − log π_θ.

    (Schulman, "Approximating KL divergence", 2020; GRPO Eq. 4.) Non-negative, unbiased under π_θ.
    """
    if logp.shape != logp_ref.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and logp_ref {tuple(logp_ref.shape)} differ in shape")
    q = logp_ref - logp
    return torch.exp(q) - q - 1


def rollout_mismatch(logp: Tensor, logp_rollout: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """How far the update's log-probs of the sampled tokens are from the ones the sampler recorded, for
    the same weights: (mean k3, max |Δ log p|) over valid tokens.

    k3 = exp(q) − q − 1 with q = log π_rollout − log π_θ (`kl_k3`), an estimate of KL(π_θ‖π_rollout)
    per token; Δ = log π_θ − log π_rollout. Both 0 when nothing is valid. logp, logp_rollout, mask: [B, T].
    """
    _same_shape(logp=logp, logp_rollout=logp_rollout, mask=mask)
    m = mask.bool()
    lp = torch.where(m, logp.detach().double(), 0.0)  # float64: a 1e-7 difference must not round away
    lr = torch.where(m, logp_rollout.detach().double(), 0.0)
    k3 = kl_k3(lp, lr)  # padding: q = 0, k3 = 0
    n = m.sum().clamp_min(1)
    return k3.sum() / n, (lp - lr).abs().max() if m.any() else lp.new_zeros(())


def tis_weights(logp_old: Tensor, logp_rollout: Tensor, cap: float) -> Tensor:
    """Truncated importance-sampling weights min(π_old/π_rollout, C) per token, detached [B, T].

    π_old: the trained policy's own (recomputed) log-prob of the sampled token; π_rollout: the one the
    sampler recorded. Multiplying the surrogate by it corrects for the samples coming from the sampler's
    numerics rather than the trainer's; the cap C bounds the variance (Yao et al. 2025, "Your efficient
    RL framework secretly brings you off-policy RL training", the truncated IS of Ionides 2008)."""
    _same_shape(logp_old=logp_old, logp_rollout=logp_rollout)
    if not cap > 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap}")
    ratio = torch.exp(logp_old.detach().float() - logp_rollout.detach().float())
    return ratio.clamp(max=cap)


def gcpo_kl_reweight(weights: Tensor) -> Tensor:
    """Official GCPO T2I KL reweighting (docs/concepts/credit.md#gcpo): 0.5 + 0.5·clamp(2 − 2w, 0, 1).

    Tokens with little credit (w ≤ 0.5) keep the full KL, high-credit tokens (w ≥ 1) half of it.
    """
    return 0.5 + 0.5 * (2 - 2 * weights).clamp(0, 1)


def policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    weights: Tensor | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    aggregation: str = "token-mean",
    logp_ref: Tensor | None = None,
    beta: float = 0.0,
    kl_reweight: bool = False,
    max_len: int | None = None,
    denom: Tensor | float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped policy-gradient loss with token credit and optional k3 KL
    (docs/concepts/algorithms.md#policy-loss, docs/concepts/credit.md).

    logp, logp_old, mask, weights, logp_ref: [B, T]; advantages: [B] (sequence advantage A_i) or [B, T]
    (token advantages A_it, from a scheme that computes them: docs/concepts/tree_credit.md).
    Token advantage Â_it = A_i·w_it (or A_it·w_it; w = 1 when weights is None), except for
    "weighted-token-mean", where the surrogate uses A_i (A_it) and w is the aggregation weight
    (official GCPO: Σ(ρ A w)/Σ w).
    KL: + β·agg(k3 · r), r = gcpo_kl_reweight(w) if kl_reweight else 1.
    ``max_len``: Dr. GRPO's constant normaliser (the longest output the sampler can produce);
    ``denom``: the whole batch's normaliser when this is one of several minibatches.
    ``is_weights`` [B, T]: per-token importance weights (`tis_weights`) multiplying the surrogate,
    L_it = −w^IS_it · min(ρ Â, clip(ρ) Â); they enter no normaliser.
    Computed in float32 at least. Returns (loss, stats); stats are detached scalars: loss/policy, loss/kl,
    clip_frac (share of valid tokens whose gradient is zeroed by the clip or the dual clip), ratio/mean, and
    kl_k3 (mean k3 over valid tokens) when logp_ref is given.
    """
    B, _ = _same_shape(logp=logp, logp_old=logp_old, mask=mask)
    if advantages.shape != (B,) and advantages.shape != logp.shape:
        raise ValueError(
            f"advantages must be [B]=[{B}] or [B, T]={list(logp.shape)}, got {tuple(advantages.shape)}"
        )
    if weights is not None:
        _same_shape(logp=logp, weights=weights)
    if logp_ref is not None:
        _same_shape(logp=logp, logp_ref=logp_ref)
    if beta != 0 and logp_ref is None:
        raise ValueError("beta != 0 needs logp_ref")
    if kl_reweight and weights is None:
        raise ValueError("kl_reweight needs credit weights")
    m = mask.bool()
    # padding values replaced by 0 up front, so NaN/inf there reaches neither the loss nor its grad
    dtype = torch.promote_types(logp.dtype, torch.float32)  # bf16 log-probs: ratio in fp32
    zero = torch.zeros(logp.shape, dtype=dtype, device=logp.device)
    w = m.to(dtype) if weights is None else torch.where(m, weights.detach().to(dtype), zero)
    lp = torch.where(m, logp.to(dtype), zero)  # [B, T]
    ratio = torch.exp(lp - torch.where(m, logp_old.detach().to(dtype), zero))  # ρ [B, T]; padding ρ = 1
    A = advantages.detach().to(dtype)
    A = A.unsqueeze(1) if A.dim() == 1 else torch.where(m, A, zero)  # [B, 1] or [B, T]
    weighted_mode = aggregation == "weighted-token-mean"
    adv = A.expand_as(lp) if weighted_mode else A * w  # Â [B, T]
    agg_w = w if weighted_mode else None

    per_token = clipped_surrogate(ratio, adv, eps_low, eps_high, dual_clip)  # [B, T]
    if is_weights is not None:
        _same_shape(logp=logp, is_weights=is_weights)
        per_token = per_token * torch.where(m, is_weights.detach().to(dtype), zero)
    loss_pg = aggregate(per_token, m, aggregation, agg_w, max_len, denom)

    # k3 KL to the reference, aggregated like the policy term
    loss_kl = loss_pg.new_zeros(())
    k3 = None
    if logp_ref is not None:
        k3 = kl_k3(lp, torch.where(m, logp_ref.detach().to(dtype), zero))  # [B, T]; padding: q = 0, k3 = 0
        kl_tok = k3 * gcpo_kl_reweight(w) if kl_reweight else k3
        loss_kl = aggregate(kl_tok, m, aggregation, agg_w, max_len, denom)
    loss = loss_pg + beta * loss_kl if beta != 0 else loss_pg

    with torch.no_grad():
        n_valid = m.sum().clamp_min(1)
        clipped = ((adv > 0) & (ratio > 1 + eps_high)) | ((adv < 0) & (ratio < 1 - eps_low))
        if dual_clip is not None:
            clipped |= (adv < 0) & (ratio > dual_clip)  # loss capped at c·|Â|
        stats = {
            "loss/policy": loss_pg.detach(),
            "loss/kl": loss_kl.detach(),
            "clip_frac": (clipped & m).sum() / n_valid,
            "ratio/mean": torch.where(m, ratio, 0.0).sum() / n_valid,
        }
        if k3 is not None:
            stats["kl_k3"] = torch.where(m, k3, 0.0).sum() / n_valid
    return loss, stats
