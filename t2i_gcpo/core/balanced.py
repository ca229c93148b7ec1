"""Query-preserved, reward-balanced minibatches (arXiv 2605.08666, "the cancellation hypothesis";
docs/concepts/tree_credit.md#balanced-minibatches).

The paper argues that uniform GRPO already assigns token credit because opposite-advantage samples of
the same prompt cancel on the tokens they share — which only happens when they are in the same update.
Its two interventions, as implemented here (the paper's exact procedure was not at hand; this follows
its stated intent): **query-preserved** minibatches keep every group (all samples of one prompt) whole
inside one minibatch; **reward-balanced** minibatches additionally assign the groups so that each
minibatch's positive and negative advantage mass are as close to equal as a greedy pass gets them.

A partition is a list of row-index tensors (long, ascending), each a union of whole groups; groups are
contiguous rows (``advantages.view(P, G, …)``), as everywhere in core/.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check(n_rows: int, group_size: int, n_minibatches: int) -> int:
    if group_size < 1 or n_rows % group_size:
        raise ValueError(f"batch size {n_rows} is not a multiple of group_size {group_size}")
    P = n_rows // group_size
    if not 1 <= n_minibatches <= max(P, 1):
        raise ValueError(f"n_minibatches must lie in [1, {P}] (the number of groups), got {n_minibatches}")
    return P


def _rows(groups: list[int], group_size: int, device: torch.device) -> Tensor:
    g = torch.tensor(sorted(groups), dtype=torch.long, device=device)
    return (g[:, None] * group_size + torch.arange(group_size, device=device)).reshape(-1)


def advantage_mass(advantages: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(positive, negative) advantage mass per row, both ≥ 0: Σ_t m·max(A, 0) and Σ_t m·max(−A, 0).
    advantages: [B] (sequence) or [B, T] (token, with mask [B, T]) → two float64 [B]."""
    a = advantages.double()
    if a.dim() == 1:
        a = a[:, None]
    elif mask is not None:
        if mask.shape != a.shape:
            raise ValueError(f"mask {tuple(mask.shape)} does not match advantages {tuple(a.shape)}")
        a = torch.where(mask.bool(), a, torch.zeros_like(a))
    return a.clamp_min(0).sum(dim=1), (-a).clamp_min(0).sum(dim=1)


def query_preserved_minibatches(
    n_rows: int, group_size: int, n_minibatches: int, generator: torch.Generator | None = None
) -> list[Tensor]:
    """Split the P groups into n_minibatches of whole groups (sizes differ by at most one group), in
    order, or in a random order drawn from ``generator``. Returns row indices per minibatch."""
    P = _check(n_rows, group_size, n_minibatches)
    order = torch.arange(P) if generator is None else torch.randperm(P, generator=generator)
    return [
        _rows(chunk.tolist(), group_size, torch.device("cpu")) for chunk in order.tensor_split(n_minibatches)
    ]


def reward_balanced_minibatches(
    advantages: Tensor, group_size: int, n_minibatches: int, mask: Tensor | None = None
) -> list[Tensor]:
    """Whole groups, assigned so that each minibatch's net advantage mass (positive − negative) is near 0.

    Greedy: groups in order of decreasing |net mass| (then decreasing positive mass, then index); each goes
    to the minibatch, among those with room, that leaves its |net| smallest (ties: the smaller positive mass,
    then the lower index). Minibatch m holds ⌈P/n⌉ groups for m < P mod n, else ⌊P/n⌋. Deterministic.
    advantages: [B] or [B, T] (with mask). Returns row indices per minibatch, on advantages' device.
    """
    P = _check(advantages.shape[0], group_size, n_minibatches)
    pos, neg = advantage_mass(advantages, mask)
    # rounded to 1e-9 so that a centred group's net of ±1e-17 ties with 0 instead of steering the order
    g_pos = [round(x, 9) for x in pos.view(P, group_size).sum(dim=1).tolist()]
    g_net = [round(x, 9) for x in (pos - neg).view(P, group_size).sum(dim=1).tolist()]
    room = [P // n_minibatches + (m < P % n_minibatches) for m in range(n_minibatches)]
    net, mass = [0.0] * n_minibatches, [0.0] * n_minibatches
    members: list[list[int]] = [[] for _ in range(n_minibatches)]
    for g in sorted(range(P), key=lambda g: (-abs(g_net[g]), -g_pos[g], g)):
        best = min(
            (m for m in range(n_minibatches) if room[m] > 0),
            key=lambda m: (abs(net[m] + g_net[g]), mass[m], m),
        )
        members[best].append(g)
        room[best] -= 1
        net[best] += g_net[g]
        mass[best] += g_pos[g]
    return [_rows(groups, group_size, advantages.device) for groups in members]


def minibatch_balance(advantages: Tensor, batches: list[Tensor], mask: Tensor | None = None) -> Tensor:
    """Per minibatch: (positive mass, negative mass, net = positive − negative) → float64 [n, 3]."""
    pos, neg = advantage_mass(advantages, mask)
    return torch.stack([torch.stack([pos[b].sum(), neg[b].sum(), (pos[b] - neg[b]).sum()]) for b in batches])
