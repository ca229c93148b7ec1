"""Credit from the values of prefixes (docs/concepts/tree_credit.md): token advantages that add information
by scoring continuations of a sample's prefixes, or by reading the group as a prefix tree.

- ``segment_advantages`` — VinePPO (arXiv 2410.01679, Monte-Carlo values of intermediate states) and SPO
  (arXiv 2505.23564, segment advantages): V(prefix) = mean reward of the continuations sampled from it, and
  the tokens between two branch points get V(after) − V(before)
  (docs/concepts/tree_credit.md#segment-advantages).
- ``prefix_values`` — the same values per token (V of the prefix a token was decided under), for value
  maps (docs/concepts/tree_credit.md#value-maps).
- ``tempo_advantages`` — TEMPO's tree term (arXiv 2509.18314, Prefix-to-Tree): samples of a group that share
  leading tokens form the nodes of a tree, V(node) = mean reward of the samples below it, and a token gets
  V(child) − V(parent), which is 0 wherever its node does not branch (docs/concepts/tree_credit.md#tempo).

The advantages are linear in the rewards, so ``scale="group"`` (dividing by a std σ of the prompt's rewards)
is the same as computing them on the standardised rewards (r − μ)/σ, as GRPO does. Groups are contiguous rows
(``rewards.view(P, G)``), as everywhere in core/.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

from t2i_gcpo.core.tree import Tree

Scale = Literal["none", "group", "roots"]


def _groups(rewards: Tensor, group_size: int) -> Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [B], got {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"batch size {rewards.numel()} is not a multiple of group_size {group_size}")
    return rewards.double().view(-1, group_size)  # [P, G]


def _scaled(adv: Tensor, pooled: Tensor, exists: Tensor, flat: Tensor, scale: Scale, eps: float) -> Tensor:
    """adv [P, G, T] → 0 in flat groups, divided by the unbiased std of the pooled rewards when scale="group".
    pooled: [P, n] rewards, exists: [P, n] bool (which of them exist); flat: [P] bool."""
    adv = torch.where(
        flat[:, None, None], torch.zeros_like(adv), adv
    )  # a mean of equal floats may be 1 ulp off
    if scale == "none":
        return adv
    if scale == "roots":  # the std of the group's own samples (pooled[:, :G]), as DAPO's advantage divides by
        G = adv.shape[1]
        pooled, exists = pooled[:, :G], exists[:, :G]
    elif scale != "group":
        raise ValueError(f"unknown scale {scale!r}; expected 'none', 'group' or 'roots'")
    n = exists.sum(dim=1).double()  # [P]
    x = torch.where(exists, pooled, 0.0)  # unused slots may hold NaN
    mean = x.sum(dim=1) / n
    var = torch.where(exists, (x - mean[:, None]) ** 2, 0.0).sum(dim=1) / (n - 1).clamp_min(1)
    return adv / (var.sqrt() + eps)[:, None, None]


def _continuations(tree: Tree) -> Tensor:
    """Which continuations count [B, K, M] bool: those that exist, at the used points only."""
    return tree.exists.bool() & (tree.points >= 0)[:, :, None]


@torch.no_grad()
def segment_values(rewards: Tensor, group_size: int, tree: Tree, include_root: bool = True) -> Tensor:
    """The value of every prefix of every sample, V [B, K + 2] float64
    (docs/concepts/tree_credit.md#segment-advantages).

    V[:, 0] = V(prefix_0) = the mean reward of the sample's group (the prompt's value, estimated by its G
    samples, the sample itself included, as GRPO's baseline); V[:, k] (1 ≤ k ≤ K_i) = the mean reward of
    the continuations from branch point t_k (and of the sample itself when include_root: it is one
    continuation of each of its own prefixes); V[:, k] for k > K_i = r_i, the value of the full sample.
    tree: the samples' branch points t_1 < … < t_{K_i} (then −1) and their continuations' rewards (`Tree`).
    """
    r = _groups(rewards, group_size).reshape(-1)  # [B]
    points = tree.points
    if len(tree) != r.numel():
        raise ValueError(f"the tree has {len(tree)} rows, the rewards {r.numel()}")
    cm = _continuations(tree)  # [B, K, M]
    used = points >= 0  # [B, K]
    if (used[:, 1:] & ~used[:, :-1]).any():
        raise ValueError("branch points must come first in each row, padding (−1) after them")
    if (used[:, 1:] & (points[:, 1:] <= points[:, :-1])).any() or (used & (points == 0)).any():
        raise ValueError("branch points must be increasing and > 0 (step 0 is the root)")
    total = torch.where(cm, tree.rewards.double(), 0.0).sum(dim=2)  # [B, K]; unused slots may hold NaN
    count = cm.sum(dim=2).double()
    if include_root:
        total, count = total + r[:, None], count + 1
    if (used & (count == 0)).any():
        raise ValueError(
            "a branch point has no continuations (and include_root is off): its value is undefined"
        )
    v = torch.where(used, total / count.clamp_min(1), r[:, None])  # past the last point: V(full) = r
    v0 = r.view(-1, group_size).mean(dim=1).repeat_interleave(group_size)  # [B]
    return torch.cat([v0[:, None], v, r[:, None]], dim=1)  # [B, K + 2]


def token_segments(points: Tensor, mask: Tensor, step: Tensor | None) -> tuple[Tensor, Tensor]:
    """(valid [B, T] bool, the segment k of every token [B, T]: how many of its sample's branch points lie at
    or before the step it was decided at; `step` None: its position). Checks the shapes, and that no point
    lies after its sample's last step."""
    if mask.dim() != 2 or mask.shape[0] != points.shape[0]:
        raise ValueError(f"mask must be [B, T] with B = {points.shape[0]}, got {tuple(mask.shape)}")
    m = mask.bool()
    B, T = m.shape
    d = torch.arange(T, device=m.device).expand(B, T) if step is None else step.long()  # decision step [B, T]
    if d.shape != m.shape:
        raise ValueError(f"step {tuple(d.shape)} does not match mask [B, T] = {tuple(m.shape)}")
    used = points >= 0
    last = torch.where(m, d, torch.full_like(d, -1)).amax(dim=1)  # each sample's last step [B]
    if (used & (points > last[:, None])).any():
        raise ValueError("a branch point lies after its sample's last step (nothing left to continue)")
    return m, (used[:, None, :] & (points[:, None, :] <= d[:, :, None])).sum(dim=2)


@torch.no_grad()
def segment_advantages(
    rewards: Tensor,
    group_size: int,
    tree: Tree,
    mask: Tensor,
    step: Tensor | None = None,
    include_root: bool = True,
    scale: Scale = "none",
    eps: float = 1e-4,
) -> Tensor:
    """Segment advantages (VinePPO/SPO; docs/concepts/tree_credit.md#segment-advantages): every valid token
    decided in [t_k, t_{k+1}) gets A = V(prefix_{k+1}) − V(prefix_k), with t_0 = 0, t_{K_i+1} = the end and
    V(prefix_{K_i+1}) = r_i, the values of ``segment_values``. Summed over a sample's segments (one token per
    segment) the advantages telescope to r_i − V(prefix_0).

    rewards: [B] root rewards, group_size G; tree: the branch points (core/branch_points.py) and the
    continuations' rewards (`Tree`, see ``segment_values``); mask: [B, T]; step: [B, T] the step at which
    each token was decided (None: its position), in the units of the points. No point may lie after the
    sample's last step. scale: "none" (raw values, VinePPO's and SPO's estimator), "group" (divided by
    σ + eps, σ the unbiased std of all the rewards scored for the prompt: its G samples and all their
    continuations) or "roots" (σ of its G samples alone, the divisor of DAPO's advantage). A group whose
    rewards are all equal gets 0. Returns float32 [B, T], 0 on padding.
    """
    m, seg = token_segments(tree.points, mask, step)
    B, T = m.shape
    v = segment_values(rewards, group_size, tree, include_root)  # [B, K + 2]
    adv = torch.gather(v, 1, seg + 1) - torch.gather(v, 1, seg)  # [B, T]

    # every reward scored for the prompt: its G samples, then all their continuations  [P, G + G·K·M]
    G = group_size
    cm = _continuations(tree)
    pooled = torch.cat([rewards.double().view(-1, G), tree.rewards.double().reshape(B // G, -1)], dim=1)
    exists = torch.cat(
        [torch.ones(B // G, G, dtype=torch.bool, device=m.device), cm.reshape(B // G, -1)], dim=1
    )
    lo = torch.where(exists, pooled, torch.full_like(pooled, torch.inf)).amin(dim=1)
    hi = torch.where(exists, pooled, torch.full_like(pooled, -torch.inf)).amax(dim=1)
    adv = _scaled(adv.view(-1, G, T), pooled, exists, lo == hi, scale, eps).view(B, T)
    return torch.where(m, adv, torch.zeros_like(adv)).float()


@torch.no_grad()
def tempo_values(tokens: Tensor, mask: Tensor, rewards: Tensor, group_size: int) -> Tensor:
    """V [B, T + 1] float64: V[i, d] = mean reward of the samples of i's group that share i's first d
    positions (docs/concepts/tree_credit.md#tempo). Two samples share position t when both are valid there
    with equal tokens, or both are padding there; so V[i, 0] is the group mean and V[i, T] the mean over
    i's exact duplicates (same tokens, same length), which is r_i when i has none."""
    r = _groups(rewards, group_size)  # [P, G]
    if tokens.shape != mask.shape or tokens.dim() != 2 or tokens.shape[0] != r.numel():
        raise ValueError(
            f"tokens {tuple(tokens.shape)} and mask {tuple(mask.shape)} must both be [B, T], B = {r.numel()}"
        )
    m = mask.bool()
    if (m[:, 1:] & ~m[:, :-1]).any():
        raise ValueError("tempo needs prefix masks (valid tokens first, then padding), in decision order")
    P, G, T = r.shape[0], group_size, m.shape[1]
    y, m = tokens.view(P, G, T), m.view(P, G, T)
    same = ((y[:, :, None] == y[:, None, :]) & m[:, :, None] & m[:, None, :]) | (
        ~m[:, :, None] & ~m[:, None, :]
    )
    shared = torch.cat(
        [torch.ones_like(same[..., :1]), same.long().cumprod(dim=3).bool()], dim=3
    )  # [P, G, G, T+1]
    below = shared.double()
    v = (below * r[:, None, :, None]).sum(dim=2) / below.sum(dim=2)  # [P, G, T + 1]; i shares with itself
    return v.view(P * G, T + 1)


@torch.no_grad()
def tempo_advantages(
    tokens: Tensor, mask: Tensor, rewards: Tensor, group_size: int, scale: Scale = "none", eps: float = 1e-4
) -> Tensor:
    """TEMPO's branch-gated tree term δ (arXiv 2509.18314; docs/concepts/tree_credit.md#tempo): token t of
    sample i gets δ_it = V(node after t) − V(node before t), the values of ``tempo_values``. It is 0 where the
    node does not branch (every sample below it continues with the same token). The last valid token also
    decides where the sample ends: its "after" node is the full sample's (V[i, T]). Over a sample's valid
    tokens δ sums to V[i, T] − mean_g r. TEMPO's advantage is A_i + δ_it (A_i: the GRPO advantage); this
    returns δ alone, so the caller composes it.

    tokens, mask: [B, T] in decision order, prefix masks; rewards: [B]. scale: "none" or "group" (divided by
    the unbiased std of the group's rewards + eps). A group whose rewards are all equal gets 0.
    Returns float32 [B, T], 0 on padding.
    """
    v = tempo_values(tokens, mask, rewards, group_size)  # [B, T + 1]
    m = mask.bool()
    B, T = m.shape
    after = v[:, 1:].clone()  # [B, T]
    is_last = m & ~torch.cat([m[:, 1:], torch.zeros_like(m[:, :1])], dim=1)
    after = torch.where(is_last, v[:, T : T + 1].expand(B, T), after)
    delta = after - v[:, :T]
    r = _groups(rewards, group_size)
    flat = r.amax(dim=1) == r.amin(dim=1)
    delta = _scaled(delta.view(-1, group_size, T), r, torch.ones_like(r, dtype=torch.bool), flat, scale, eps)
    return torch.where(m, delta.view(B, T), torch.zeros(B, T, dtype=delta.dtype, device=m.device)).float()


class PrefixValues(NamedTuple):
    """`prefix_values`' result: per token, and per sample along its branch points."""

    token: Tensor  # [B, T] float64: V of the prefix each valid token was decided under; NaN on padding
    path: (
        Tensor  # [B, K + 2] float64: V_0 (the group mean), V_1 … V_K, then V_{K+1} = r_i (``segment_values``)
    )


@torch.no_grad()
def prefix_values(
    rewards: Tensor,
    group_size: int,
    tree: Tree,
    mask: Tensor,
    step: Tensor | None = None,
    include_root: bool = True,
) -> PrefixValues:
    """The value map of every sample (docs/concepts/tree_credit.md#value-maps): a valid token decided at a
    step in [t_k, t_{k+1}) gets V_k, the value of the prefix it was sampled under (t_0 = 0, so the tokens
    before the first branch point get V_0, the group mean); the sample's own reward V_{K+1} = r_i is no
    token's prefix and comes separately, as ``path[:, -1]``. The values are those of ``segment_values`` (same
    arguments, same include_root convention, raw reward units), so a token's segment advantage (scale
    "none") is the next entry of ``path`` minus its value. Returns ``PrefixValues(token, path)``.
    """
    m, seg = token_segments(tree.points, mask, step)
    path = segment_values(rewards, group_size, tree, include_root)  # [B, K + 2]
    token = torch.gather(path, 1, seg)
    return PrefixValues(torch.where(m, token, torch.full_like(token, torch.nan)), path)
