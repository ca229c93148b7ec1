"""Tree groups (docs/concepts/tree_credit.md#tree-groups): the group is a prefix tree — G₀ roots sampled from
the prompt and continuations of them from shared prefixes — and every leaf is a training sample.

Node values are Monte-Carlo means over the leaves below a node (TreeRL, arXiv 2506.11902): the prompt node's
value V₀ is the mean reward of every leaf of the group; the node (i, t) — root i's first t decisions — has
the mean reward of root i and of its continuations from points ≥ t. A segment of tokens that leads from
node `parent` into node `child` gets TreeRL's global plus local advantage,

    A = (V(child) − V₀) + (V(child) − V(parent)),

uniform along the segment. A root's segments run between the distinct points its continuations branched
at (the last one into the root itself, V = r_i); a continuation's own segment runs from its point into
itself (V = r_c), its parent the node it branched from (the prompt node when t = 0). The tokens before a
continuation's point are its root's: they are trained once, on the root's row, so a continuation's row
scores only its own segment (`own_segment`). TreeRL trains every root-to-leaf path and divides a node's
term by √(leaves below); training each token once is the same tree read without the repeats.

Groups are contiguous rows (``rewards.view(P, G)``), as everywhere in core/.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from t2i_gcpo.core.tree import Leaves


def _checked(rewards: Tensor, group_size: int, leaves: Leaves, mask: Tensor, step: Tensor) -> None:
    B = rewards.numel()
    if rewards.dim() != 1 or group_size < 1 or B % group_size:
        raise ValueError(
            f"rewards must be [B] with B a multiple of group_size {group_size}, got {tuple(rewards.shape)}"
        )
    if len(leaves) != B or mask.shape != step.shape or mask.dim() != 2 or mask.shape[0] != B:
        raise ValueError(
            f"leaves ({len(leaves)} rows), mask {tuple(mask.shape)} and step {tuple(step.shape)} must "
            f"all have B = {B}"
        )
    r = leaves.root.view(-1, group_size)
    if ((r < 0) | (r >= group_size)).any():
        raise ValueError("a row's root must be an index within its group")
    g = torch.arange(group_size, device=r.device).expand_as(r)
    root_rows = leaves.is_root.view(-1, group_size)
    if (root_rows & (r != g)).any():
        raise ValueError("a root's `root` must be its own index within the group")
    if (~torch.gather(root_rows, 1, r)).any():
        raise ValueError("a continuation must continue a root of its group")


def own_segment(leaves: Leaves, mask: Tensor, step: Tensor) -> Tensor:
    """[B, T] bool: the tokens a row is trained on — a root's valid tokens; a continuation's valid tokens
    decided at or after its branch point."""
    return mask.bool() & (step.long() >= leaves.point.clamp_min(0).to(step.device)[:, None])


@torch.no_grad()
def tree_group_advantages(
    rewards: Tensor,
    group_size: int,
    leaves: Leaves,
    mask: Tensor,
    step: Tensor,
    scale: Literal["group", "none"] = "group",
    eps: float = 1e-4,
) -> Tensor:
    """Token advantages [B, T] float32 of tree groups (module doc), 0 outside each row's `own_segment`.

    rewards: [B] every leaf's reward; leaves: each row's root (index within its group) and branch point;
    mask, step: [B, T] (step: the decision step of each token; AR / text: its position). scale "group":
    divided by the unbiased std of the group's leaf rewards + eps; a group whose leaves all score the same
    gets 0 everywhere."""
    _checked(rewards, group_size, leaves, mask, step)
    G, B = group_size, rewards.numel()
    P = B // G
    r = rewards.double().view(P, G)
    dev = r.device
    root = leaves.root.to(dev).view(P, G)
    point = leaves.point.to(dev).view(P, G)
    is_root = point < 0
    d = step.long().to(dev).view(P, G, -1)  # [P, G, T] decision step of each token
    v0 = r.mean(dim=1)  # [P] the prompt node

    # membership [P, G (root i), G (row c)]: c is root i itself, or a continuation of root i
    belongs = (root[:, None, :] == torch.arange(G, device=dev)[None, :, None]) & ~is_root[:, None, :]
    own = torch.eye(G, dtype=torch.bool, device=dev)[None].expand(P, G, G)  # root i's own leaf

    def node_value(i: Tensor, t: Tensor, strict: bool) -> Tensor:
        """V of root i's node after t decisions, per entry of i, t [P, G, T] (i: a root's index, t ≥ 1): the
        mean reward of root i and of its continuations from points > t (`strict`: the node right after step
        t) or ≥ t (the node a continuation from t branched at)."""
        p = torch.arange(P, device=dev)[:, None, None]
        cpt = point[:, None, None, :]  # [P, 1, 1, G]
        later = (cpt > t[..., None]) if strict else (cpt >= t[..., None])
        below = (belongs[p, i] & later) | own[p, i]  # [P, G, T, G]
        return (below.double() * r[:, None, None, :]).sum(-1) / below.sum(-1).double()

    T = d.shape[2]
    i = root[:, :, None].expand(P, G, T)  # the root whose nodes each token's row passes through
    # a root's token at step s: child = the node right after s (its continuations from points > s, and
    # itself: the root's own leaf value r_i when none branch later); parent = the node at the last point
    # ≤ s among its continuations' points (the prompt node when none, or when that point is 0)
    cont_points = torch.where(belongs, point[:, None, :], torch.full_like(point[:, None, :], -1))  # [P, G, G]
    last_point = torch.where(
        cont_points[:, :, None, :] <= d[:, :, :, None],
        cont_points[:, :, None, :],
        torch.full_like(d[..., None], -1),
    ).amax(-1)  # [P, G, T]: per root row
    child_root = node_value(i, d, strict=True)
    parent_root = torch.where(
        last_point >= 1, node_value(i, last_point.clamp_min(1), strict=False), v0[:, None, None]
    )
    # a continuation's own token: child = itself (r_c); parent = the node it branched from
    t_c = point[:, :, None].expand(P, G, T)
    parent_cont = torch.where(t_c >= 1, node_value(i, t_c.clamp_min(1), strict=False), v0[:, None, None])
    child = torch.where(is_root[:, :, None], child_root, r[:, :, None].expand(P, G, T))
    parent = torch.where(is_root[:, :, None], parent_root, parent_cont)
    adv = (child - v0[:, None, None]) + (child - parent)  # [P, G, T]

    flat = r.amax(dim=1) == r.amin(dim=1)
    adv = torch.where(flat[:, None, None], torch.zeros_like(adv), adv)
    if scale == "group":
        adv = adv / (r.std(dim=1, unbiased=True).nan_to_num(0.0) + eps)[:, None, None]
    elif scale != "none":
        raise ValueError(f"unknown scale {scale!r}; expected 'group' or 'none'")
    trained = own_segment(leaves, mask, step).to(dev)
    return torch.where(trained, adv.view(B, T), torch.zeros(B, T, dtype=adv.dtype, device=dev)).float()
