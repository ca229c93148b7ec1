"""Sequence advantages A_i from group rewards (docs/concepts/algorithms.md#sequence-advantages).

GRPO (arXiv 2402.03300, §4.1.2 "outcome supervision"): A_i = (r_i − mean_g r) / (std_g r + ε).
DAPO (arXiv 2503.14476, Eq. 11 "dynamic sampling"): groups whose rewards are all equal carry no
signal and are dropped.

Layout convention for every function here: a batch of B = P·G rewards is grouped contiguously,
prompt 0's G samples first, i.e. ``rewards.view(P, G)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

Scale = Literal["group", "batch", "none"]


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    """Check shapes and return rewards as float [P, G]."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards.numel() % group_size != 0:
        raise ValueError(f"batch size {rewards.numel()} is not a multiple of group_size {group_size}")
    r = rewards if rewards.is_floating_point() else rewards.float()
    return r.view(-1, group_size)  # [P, G]


def _unbiased_std(x: Tensor, dim: int | None = None) -> Tensor:
    """torch.std (unbiased), but 0 instead of NaN when fewer than two values are given."""
    n = x.numel() if dim is None else x.shape[dim]
    if n < 2:
        return torch.zeros_like(x.mean() if dim is None else x.mean(dim=dim))
    return x.std() if dim is None else x.std(dim=dim)


def group_advantages(rewards: Tensor, group_size: int, scale: Scale = "group", eps: float = 1e-4) -> Tensor:
    """GRPO outcome advantages, A_i = (r_i − mean_g r) / (σ + ε)  (GRPO §4.1.2;
    docs/concepts/algorithms.md#sequence-advantages).

    scale: "group" → σ = unbiased std of the group (GRPO default); "batch" → σ = unbiased std of the
    whole batch; "none" → no division (Dr. GRPO, arXiv 2503.20783). A group of one sample has no
    baseline but itself, so its advantage is 0 (never NaN).
    rewards: [B]; returns float [B].
    """
    r = _grouped(rewards, group_size)  # [P, G]
    centred = r - r.mean(dim=1, keepdim=True)  # [P, G]
    flat = (r.amax(dim=1) == r.amin(dim=1)).unsqueeze(1)  # mean of equal floats may be off by 1 ulp
    centred = torch.where(flat, torch.zeros_like(centred), centred)
    if scale == "group":
        sigma = _unbiased_std(r, dim=1).unsqueeze(1)  # [P, 1]
    elif scale == "batch":
        sigma = _unbiased_std(r)  # []
    elif scale == "none":
        return centred.reshape(-1)
    else:
        raise ValueError(f"unknown advantage scale {scale!r}; expected 'group', 'batch' or 'none'")
    return (centred / (sigma + eps)).reshape(-1)


def decoupled_advantages(
    parts: Tensor, weights: Tensor, group_size: int, eps: float = 1e-4
) -> tuple[Tensor, Tensor]:
    """GDPO's advantages of K rewards (Liu et al., "GDPO: Group reward-Decoupled Normalization Policy
    Optimization for Multi-reward RL Optimization", arXiv 2601.05242, §3; docs/concepts/algorithms.md#gdpo):

        A_k,i = (r_k,i − mean_g r_k) / (std_g r_k + ε)     each reward k within sample i's group g
        A_i   = Σ_k w_k A_k,i                               the weighted sum of the per-reward advantages
        Â_i   = (A_i − mean_B A) / (std_B A + ε)            normalised over the batch of B samples

    (the paper's sum has w_k = 1; its weighted form weights the A_k). Against GRPO's normalisation of
    Σ_k w_k r_k, no reward's scale drowns the others' and distinct combinations of rewards keep distinct
    advantages. A group in which reward k is flat has A_k = 0 there (`group_advantages`); std is unbiased.

    parts: [B, K] (r_k,i), weights: [K]; returns (Â [B], the weighted per-reward terms w_k A_k,i [B, K]).
    """
    if parts.dim() != 2 or weights.dim() != 1 or parts.shape[1] != weights.numel():
        raise ValueError(
            f"parts must be [B, K] and weights [K], got {tuple(parts.shape)} and {tuple(weights.shape)}"
        )
    per_reward = torch.stack(
        [group_advantages(parts[:, k], group_size, "group", eps) for k in range(parts.shape[1])], dim=1
    )  # [B, K]
    terms = per_reward * weights.to(per_reward)  # [B, K]
    total = terms.sum(dim=1)  # [B]
    if (total == total[0]).all():  # flat: no spread to normalise (and no NaN from a 1-sample batch)
        return torch.zeros_like(total), terms
    return (total - total.mean()) / (_unbiased_std(total) + eps), terms


def decoupled_rewards(parts: Tensor, weights: Tensor, groups: Tensor, eps: float = 1e-4) -> Tensor:
    """GDPO's per-reward normalisation (arXiv 2601.05242, §3) of the rewards a credit scheme reads,
    continuations included (docs/concepts/algorithms.md#gdpo-and-credit-schemes):

        r̂_j = Σ_k w_k (r_k,j − mean_g r_k) / (std_g r_k + ε)

    the mean and the unbiased std over every row j of group g — a group's samples and every continuation or
    leaf scored from them —, so that a scheme's values (means of r̂ over continuations) and their differences
    are each reward's, in its own spread, weighted. A reward flat in a group contributes 0 there (GDPO's
    A_k = 0). Rows need not be contiguous: `groups` names each row's group.

    parts: [N, K] (r_k,j), weights: [K], groups: [N] long; returns r̂ [N] float64.
    """
    shapes_fit = parts.dim() == 2 and weights.dim() == 1 and parts.shape[1] == weights.numel()
    if not shapes_fit or groups.shape != parts.shape[:1]:
        raise ValueError(
            f"parts must be [N, K], weights [K] and groups [N], got {tuple(parts.shape)}, "
            f"{tuple(weights.shape)} and {tuple(groups.shape)}"
        )
    r = parts.double()
    out = torch.zeros(len(r), dtype=torch.float64, device=r.device)
    for g in groups.unique().tolist():
        rows = (groups == g).nonzero().flatten()
        x = r[rows]  # [n, K]
        centred = x - x.mean(dim=0, keepdim=True)
        flat = x.amax(dim=0) == x.amin(dim=0)  # [K]
        sigma = _unbiased_std(x, dim=0) if len(x) > 1 else torch.zeros(x.shape[1], dtype=x.dtype)
        normed = torch.where(flat, torch.zeros_like(centred), centred / (sigma + eps))
        out[rows] = normed @ weights.to(normed)
    return out


def zero_std_groups(rewards: Tensor, group_size: int, tol: float = 0.0) -> Tensor:
    """True for each group whose rewards are all equal (max − min ≤ tol): no learning signal.

    rewards: [B]; returns bool [P].
    """
    r = _grouped(rewards, group_size)  # [P, G]
    return (r.amax(dim=1) - r.amin(dim=1)) <= tol


def dynamic_sampling_filter(rewards: Tensor, group_size: int, tol: float = 0.0) -> tuple[Tensor, float]:
    """DAPO dynamic sampling (arXiv 2503.14476, Eq. 11: keep groups with 0 < #correct < G).

    Generalised to any reward: keep a group iff its rewards are not all equal.
    Returns (keep_rows: bool [B], zero_std_ratio: fraction of groups dropped, 0 for an empty batch).
    """
    flat = zero_std_groups(rewards, group_size, tol)  # [P]
    keep_rows = (~flat).repeat_interleave(group_size)  # [B]
    ratio = float(flat.float().mean()) if flat.numel() else 0.0
    return keep_rows, ratio


class PerPromptStatTracker:
    """Running per-prompt reward statistics (the flow_grpo option of
    docs/concepts/algorithms.md#sequence-advantages, not the default).

    Each prompt string keeps the rewards seen for it (the last ``history`` of them, or all when
    ``history`` is None); a new reward's advantage is (r − mean) / (std + eps) over that history,
    the batch's own rewards included. std is unbiased, and 0 while a prompt has a single reward.
    """

    def __init__(self, history: int | None = None, eps: float = 1e-4) -> None:
        if history is not None and history < 1:
            raise ValueError(f"history must be >= 1 or None, got {history}")
        self.history = history
        self.eps = eps
        self._rewards: dict[str, list[float]] = {}

    def update(self, prompts: Sequence[str], rewards: Tensor) -> Tensor:
        """Record the rewards, then return their advantages. prompts: B strings; rewards: [B]."""
        if rewards.dim() != 1 or rewards.numel() != len(prompts):
            raise ValueError(
                f"need one reward per prompt: {len(prompts)} prompts, rewards {tuple(rewards.shape)}"
            )
        values = rewards.detach().float().cpu()
        for prompt, r in zip(prompts, values.tolist()):
            seen = self._rewards.setdefault(prompt, [])
            seen.append(r)
            if self.history is not None:
                del seen[: -self.history]
        adv = torch.empty_like(values)
        for i, (prompt, r) in enumerate(zip(prompts, values)):
            seen = torch.tensor(self._rewards[prompt])
            adv[i] = (r - seen.mean()) / (_unbiased_std(seen) + self.eps)
        return adv.to(rewards.device)

    def stats(self) -> dict[str, float]:
        """Number of prompts tracked and mean history length (for logging)."""
        n = len(self._rewards)
        mean_len = sum(len(v) for v in self._rewards.values()) / n if n else 0.0
        return {"prompts": float(n), "mean_history": mean_len}

    def clear(self) -> None:
        self._rewards.clear()
