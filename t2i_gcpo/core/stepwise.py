"""Stepwise rewards for masked generators (docs/concepts/tree_credit.md#stepwise-rewards), after
Stepwise-Flow-GRPO (arXiv 2603.28718): score the model's full prediction after every decoding step and credit
each step with the reward it gained.

A masked generator predicts every token at every reveal step; x̂_s is the canvas after step s with the still-
masked positions filled by step s's prediction (x̂_{S−1} is the sample). With r_{i,s} = r(x̂_s) of sample i,

    g_{i,s} = r_{i,s} − r_{i,s−1},    r_{i,−1} = mean_j r_{j,0}  (over i's group),

the gain of step s, and the tokens revealed at step s get the gain standardised across the group at that step,

    A_{i,s} = (g_{i,s} − mean_j g_{j,s}) / (σ + ε).

The empty canvas before step 0 is one state for the whole group, so r_{i,−1} is one number per group; any such
constant cancels in the centring. The centred gains telescope: Σ_s (g_{i,s} − mean_j g_{j,s}) = r_i − mean_j
r_j, GRPO's centred reward, so with σ = the std of the group's final rewards (``normalisation="group"``) a
sample's step advantages sum to its GRPO advantage A_i.

Groups are contiguous rows (``rewards.view(P, G)``), as everywhere in core/.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Normalisation = Literal["step", "group", "none"]


def _checked(step_rewards: Tensor, group_size: int) -> Tensor:
    """step_rewards [B, S] as float64 [P, G, S]."""
    if step_rewards.dim() != 2 or group_size < 1 or step_rewards.shape[0] % group_size:
        raise ValueError(
            f"step_rewards must be [B, S] with B a multiple of group_size {group_size}, "
            f"got {tuple(step_rewards.shape)}"
        )
    B, S = step_rewards.shape
    return step_rewards.double().view(B // group_size, group_size, S)


def step_gains(step_rewards: Tensor, group_size: int) -> Tensor:
    """g [B, S]: g_{i,s} = r_{i,s} − r_{i,s−1}, r_{i,−1} the mean over i's group of r_{j,0}."""
    r = _checked(step_rewards, group_size)  # [P, G, S]
    before = torch.cat([r[:, :, :1].mean(dim=1, keepdim=True).expand_as(r[:, :, :1]), r[:, :, :-1]], dim=2)
    return (r - before).view(step_rewards.shape)


def _std(x: Tensor, dim: int) -> Tensor:
    """Unbiased std along `dim` (keepdim), 0 where fewer than two values (as core/advantages.py)."""
    if x.shape[dim] < 2:
        return torch.zeros_like(x.mean(dim=dim, keepdim=True))
    return x.std(dim=dim, keepdim=True)


@torch.no_grad()
def stepwise_advantages(
    step_rewards: Tensor,
    group_size: int,
    step: Tensor,
    mask: Tensor,
    normalisation: Normalisation = "step",
    eps: float = 1e-4,
) -> Tensor:
    """Token advantages Â [B, T]: every valid token gets A_{i,s} of the step s that revealed it.

    step_rewards [B, S]: r(x̂_s) of every sample and reveal step (NaN: not scored — the zero-loss stand-in
    group of a process without signal; every token of a group holding a NaN gets 0); step [B, T] long (the
    reveal step of each token, 0 … S − 1); mask [B, T].
    normalisation: σ is ``"step"`` the unbiased std of the group's gains at step s (each step standardised
    across the group), ``"group"`` the unbiased std of the group's final rewards r_{j,S−1} (the step
    advantages of a sample then sum to its GRPO advantage; a group whose final rewards are all equal gets 0
    everywhere, as GRPO gives it, not gains divided by ε), ``"none"`` no division (centred gains). A step
    whose gains are all equal across the group gets 0."""
    if mask.shape != step.shape or mask.dim() != 2 or mask.shape[0] != step_rewards.shape[0]:
        raise ValueError(
            f"mask {tuple(mask.shape)} and step {tuple(step.shape)} must be [B, T] with B = "
            f"{step_rewards.shape[0]}"
        )
    B, S = step_rewards.shape
    if bool(((step < 0) | (step >= S))[mask.bool()].any()):
        raise ValueError(f"a valid token's reveal step lies outside 0 … {S - 1}")
    # a group with an unscored row (NaN) has no baseline: all of its tokens get 0
    scored = ~torch.isnan(step_rewards).view(-1, group_size * S).any(dim=1).repeat_interleave(
        group_size
    )  # [B]
    g = step_gains(torch.nan_to_num(step_rewards), group_size).view(-1, group_size, S)  # [P, G, S]
    centred = g - g.mean(dim=1, keepdim=True)
    if normalisation == "step":
        centred = centred / (_std(g, dim=1) + eps)
    elif normalisation == "group":
        final = torch.nan_to_num(step_rewards.double()).view(-1, group_size, S)[:, :, -1:]  # [P, G, 1]
        same = final.amax(dim=1, keepdim=True) == final.amin(dim=1, keepdim=True)  # σ = 0: no signal, as GRPO
        centred = torch.where(same, torch.zeros_like(centred), centred / (_std(final, dim=1) + eps))
    elif normalisation != "none":
        raise ValueError(f"unknown normalisation {normalisation!r}; expected 'step', 'group' or 'none'")
    flat = g.amax(dim=1, keepdim=True) == g.amin(dim=1, keepdim=True)  # the mean of equal floats may be off
    adv = torch.where(flat, torch.zeros_like(centred), centred).view(B, S).float()
    out = torch.gather(adv.to(mask.device), 1, step.long().clamp(0, S - 1))  # [B, T]
    keep = mask.bool() & scored.to(mask.device)[:, None]
    return torch.where(keep, out, torch.zeros_like(out))
