"""Token credit weights w_it ≥ 0 (docs/concepts/credit.md): uniform, GCPO, DGPO, STAGE.

Every function runs without gradient and returns float weights [B, T]. Padding (m = 0) gets weight 0
and never changes the weights of valid tokens. Every scheme except GCPO's ``normalization="none"`` is
mass-preserving, Σ_t m_it·w_it = N_i, so a sequence's total credit equals GRPO's and only its
distribution over tokens changes. Fully-masked rows are all zeros; a one-token row gets weight 1.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

NORMALIZATIONS = ("hist", "softmax", "mean", "none")


def _check(mask: Tensor, **tensors: Tensor) -> Tensor:
    """Check that mask is [B, T] and each tensor's shape starts with [B, T]; return mask as bool."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got {tuple(mask.shape)}")
    for name, t in tensors.items():
        if t.shape[:2] != mask.shape:
            raise ValueError(f"{name} {tuple(t.shape)} does not match mask [B, T] = {tuple(mask.shape)}")
    return mask.bool()


def _n_softmax(scores: Tensor, m: Tensor) -> Tensor:
    """w = N · softmax(scores) over each row's valid tokens; empty rows → zeros."""
    p = torch.softmax(scores.masked_fill(~m, float("-inf")), dim=1)  # empty rows: NaN, dropped below
    n = m.sum(dim=1, keepdim=True)  # [B, 1]
    return torch.where(m, n * p, torch.zeros_like(p))


def _average_ranks(d: Tensor, m: Tensor) -> Tensor:
    """Rank d ascending 1…N_i among each row's valid tokens; ties share their average rank; padding 0."""
    key = torch.where(m, d, torch.full_like(d, float("-inf"))).contiguous()  # padding sorts first
    sorted_key = key.sort(dim=1).values
    below = torch.searchsorted(sorted_key, key, right=False)  # # entries < d (padding included)
    upto = torch.searchsorted(sorted_key, key, right=True)  # # entries ≤ d
    n_pad = (~m).sum(dim=1, keepdim=True)
    rank = (below + upto + 1).to(d.dtype) / 2 - n_pad  # mean of ranks below−n_pad+1 … upto−n_pad
    return torch.where(m, rank, torch.zeros_like(d))


def hist_alpha(x: float = 0.4, y: float = 0.8) -> float:
    """α such that w ∝ p^α puts mass y on the top fraction x of tokens: 1 − (1−x)^(α+1) = y.

    GCPO hist normalisation (docs/concepts/credit.md#gcpo): α = ln(1 − y)/ln(1 − x) − 1; α ≈ 2.151
    for x = 0.4, y = 0.8.
    """
    if not (0 < x < 1 and x <= y < 1):
        raise ValueError(f"need 0 < top_fraction <= top_mass < 1, got x={x}, y={y}")
    return math.log(1 - y) / math.log(1 - x) - 1


@torch.no_grad()
def normalize_credit(
    d: Tensor,
    mask: Tensor,
    normalization: str = "hist",
    top_fraction: float = 0.4,
    top_mass: float = 0.8,
    tau: float = 1.0,
) -> Tensor:
    """Turn per-token scores d ≥ 0 [B, T] into weights over each sequence's valid tokens
    (docs/concepts/credit.md#gcpo).

    hist: p = rank(d)/N (ascending, ties averaged so equal scores get equal weight and a constant
    row is uniform), w = N·p^α/Σp^α.  softmax: N·softmax(d/τ).  mean: d/mean(d), ones where
    mean(d) = 0.  none: d (not mass-preserving).
    """
    m = _check(mask, d=d)
    d = torch.where(m, d.float(), torch.zeros_like(d, dtype=torch.float32))  # [B, T]
    n = m.sum(dim=1, keepdim=True).float()  # [B, 1]
    if normalization == "hist":
        alpha = hist_alpha(top_fraction, top_mass)
        pa = torch.where(m, (_average_ranks(d, m) / n.clamp_min(1)) ** alpha, torch.zeros_like(d))
        return n * pa / pa.sum(dim=1, keepdim=True).clamp_min(1e-30)
    if normalization == "softmax":
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        return _n_softmax(d / tau, m)
    if normalization == "mean":
        mean = d.sum(dim=1, keepdim=True) / n.clamp_min(1)
        w = torch.where(mean > 0, d / mean.clamp_min(1e-30), torch.ones_like(d))
        return torch.where(m, w, torch.zeros_like(d))
    if normalization == "none":
        return d
    raise ValueError(f"unknown normalization {normalization!r}; expected one of {NORMALIZATIONS}")


@torch.no_grad()
def uniform_weights(mask: Tensor) -> Tensor:
    """GRPO / DAPO credit: w = 1 on every valid token. mask: [B, T]."""
    return _check(mask).float()


@torch.no_grad()
def gcpo_divergence(logp_pos: Tensor, logp_neg: Tensor) -> Tensor:
    """GCPO per-token contrast (docs/concepts/credit.md#gcpo): Δ = clamp(log π(y|c⁻) − log π(y|c⁺), −20, 20),
    d = clamp(exp(Δ) − Δ − 1, 0, 10) — the k3 estimate at the sampled token. Δ undefined (both −inf) → d = 0.
    """
    if logp_pos.shape != logp_neg.shape:
        raise ValueError(f"logp_pos {tuple(logp_pos.shape)} and logp_neg {tuple(logp_neg.shape)} differ")
    delta = (logp_neg.float() - logp_pos.float()).nan_to_num(nan=0.0).clamp(-20, 20)
    return (delta.exp() - delta - 1).clamp(0, 10)


@torch.no_grad()
def gcpo_weights(
    logp_pos: Tensor,
    logp_neg: Tensor,
    mask: Tensor,
    normalization: str = "hist",
    top_fraction: float = 0.4,
    top_mass: float = 0.8,
    tau: float = 1.0,
) -> Tensor:
    """GCPO credit (arXiv 2605.29198; docs/concepts/credit.md#gcpo): d from the positive/negative-context
    log-probs of the sampled tokens, normalised per sequence (default "hist", the official
    scheme). Inputs [B, T]."""
    _check(mask, logp_pos=logp_pos, logp_neg=logp_neg)
    d = gcpo_divergence(logp_pos, logp_neg)  # [B, T]
    return normalize_credit(d, mask, normalization, top_fraction, top_mass, tau)


@torch.no_grad()
def hellinger_sq(logits_p: Tensor, logits_q: Tensor) -> Tensor:
    """Squared Hellinger distance per position, H² = 1 − Σ_a sqrt(p_a q_a) = ½ Σ_a (√p_a − √q_a)².

    The second form is used (no cancellation: exactly 0 when p = q), clamped to [0, 1].
    logits: [..., V]; returns [...].
    """
    if logits_p.shape != logits_q.shape or logits_p.dim() < 1:
        raise ValueError(f"logits shapes differ: {tuple(logits_p.shape)} vs {tuple(logits_q.shape)}")
    sqrt_p = torch.exp(0.5 * F.log_softmax(logits_p.float(), dim=-1))
    sqrt_q = torch.exp(0.5 * F.log_softmax(logits_q.float(), dim=-1))
    return (0.5 * (sqrt_p - sqrt_q).square().sum(dim=-1)).clamp(0, 1)


@torch.no_grad()
def dgpo_scores(
    logits_policy: Tensor, logits_ref: Tensor, kappa: float = 1.0, squared: bool = False
) -> Tensor:
    """DGPO per-token score s_t = h_t · g_t (docs/concepts/credit.md#dgpo) for any leading shape:
    logits [..., V] → [...].

    h = Hellinger distance between π_θ and π_ref (H² if ``squared``), g = (Entropy(π_θ)/ln|V|)^κ.
    Positions are independent, so callers may pass the sequence in chunks to bound memory.
    """
    V = logits_policy.shape[-1]
    if V < 2 or kappa < 0:
        raise ValueError(f"need |V| >= 2 and kappa >= 0; got V={V}, kappa={kappa}")
    h2 = hellinger_sq(logits_policy, logits_ref)
    h = h2 if squared else h2.sqrt()
    entropy = token_entropy(logits_policy)
    return h * (entropy / math.log(V)).clamp(0, 1) ** kappa


@torch.no_grad()
def dgpo_weights_from_scores(scores: Tensor, mask: Tensor, tau: float = 0.5) -> Tensor:
    """DGPO weights w = N·softmax(s/τ) over each sequence's valid tokens. scores, mask: [B, T]."""
    m = _check(mask, scores=scores)
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    return _n_softmax(scores.float() / tau, m)  # padding scores (junk logits) are dropped there


@torch.no_grad()
def dgpo_weights(
    logits_policy: Tensor,
    logits_ref: Tensor,
    mask: Tensor,
    tau: float = 0.5,
    kappa: float = 1.0,
    squared: bool = False,
) -> Tensor:
    """DGPO credit (arXiv 2605.03327; docs/concepts/credit.md#dgpo, reconstructed): s_t = h_t · g_t with h =
    Hellinger distance (H² if ``squared``) between π_θ and π_ref and g =
    (Entropy(π_θ)/ln|V|)^κ; w = N·softmax(s/τ).

    logits: [B, T, V]. Rows are processed one at a time to bound memory at [T, V].
    """
    m = _check(mask, logits_policy=logits_policy, logits_ref=logits_ref)
    if logits_policy.dim() != 3 or logits_policy.shape != logits_ref.shape:
        raise ValueError(
            f"need logits [B, T, V] of one shape, got {tuple(logits_policy.shape)}, {tuple(logits_ref.shape)}"
        )
    if tau <= 0:
        raise ValueError(f"need tau > 0, got tau={tau}")
    scores = torch.zeros(m.shape, dtype=torch.float32, device=m.device)  # s [B, T]
    for b in range(m.shape[0]):
        scores[b] = dgpo_scores(logits_policy[b], logits_ref[b], kappa, squared)
    return dgpo_weights_from_scores(scores, m, tau)


@torch.no_grad()
def stage_weights(code_embeddings: Tensor, advantages: Tensor, group_size: int, mask: Tensor) -> Tensor:
    """STAGE similarity credit (docs/concepts/credit.md#stage): a token that looks like the same position in
    opposite-sign group members (A_i·A_j ≤ 0, j ≠ i, j valid there) is not what made the difference.

    sim_it = mean_j cos(e_it, e_jt); raw w_it = clamp((1 − sim_it)/2, 0, 1). A position with no such j
    (e.g. a group of one) gets the neutral raw value 0.5 (= orthogonal). The raw form gives the shape;
    the result is rescaled to Σ_t m·w = N_i like every scheme here (a row whose raw weights are all 0,
    i.e. identical to its opposites everywhere, becomes uniform). STAGE's own "normalise by Σw" is the
    loss's "weighted-token-mean" aggregation.
    code_embeddings: [B, T, D] (VQ codebook vectors of the sampled tokens); advantages: [B].
    """
    m = _check(mask, code_embeddings=code_embeddings)
    B, T = m.shape
    if code_embeddings.dim() != 3 or advantages.shape != (B,):
        raise ValueError(
            f"need code_embeddings [B, T, D] and advantages [B]; got "
            f"{tuple(code_embeddings.shape)}, {tuple(advantages.shape)}"
        )
    if group_size < 1 or B % group_size:
        raise ValueError(f"batch size {B} is not a multiple of group_size {group_size}")
    G = group_size
    e = F.normalize(code_embeddings.float(), dim=-1).view(B // G, G, T, -1)  # [P, G, T, D]
    sim = torch.einsum("pitd,pjtd->pijt", e, e)  # cos(e_it, e_jt) [P, G, G, T]
    A = advantages.float().view(-1, G)  # [P, G]
    opposite = (A[:, :, None] * A[:, None, :] <= 0) & ~torch.eye(G, dtype=torch.bool, device=A.device)
    pairs = opposite[..., None] & m.view(-1, 1, G, T)  # [P, G(i), G(j), T]
    count = pairs.sum(dim=2)  # [P, G, T]
    sim_mean = torch.where(pairs, sim, torch.zeros_like(sim)).sum(dim=2) / count.clamp_min(1)
    raw = ((1 - sim_mean) / 2).clamp(0, 1)
    raw = torch.where(raw < 1e-6, torch.zeros_like(raw), raw)  # cos of identical vectors is 1 ± 1e-7
    raw = torch.where(count > 0, raw, torch.full_like(raw, 0.5))
    raw = torch.where(m, raw.view(B, T), torch.zeros(B, T, device=m.device))
    total = raw.sum(dim=1, keepdim=True)  # [B, 1]
    n = m.sum(dim=1, keepdim=True)
    return torch.where(total > 0, n * raw / total.clamp_min(1e-30), m.float())


def token_entropy(logits: Tensor) -> Tensor:
    """H = −Σ_v p log p (nats) of softmax(logits [..., V]), in float32 at least → [...]."""
    return torch.special.entr(F.softmax(logits.float(), dim=-1)).sum(dim=-1)


@torch.no_grad()
def chunked_entropy(chunks, shape: torch.Size, device: torch.device) -> Tensor:
    """Entropies [B, T] of a policy's chunked distributions ((token slice, logits [B, t, V]) pairs, as
    `CreditInputs.dists()` yields them); one chunk of probabilities in memory at a time."""
    entropy = torch.zeros(shape, dtype=torch.float32, device=device)
    for sl, logits in chunks:
        entropy[:, sl] = token_entropy(logits).to(device)
    return entropy
