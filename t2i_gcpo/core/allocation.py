"""Prompt-level budget allocation (docs/concepts/algorithms.md#budget-allocation): where a step's samples go.

- ``max_variance_subset`` — PODS (arXiv 2504.13818): of the n samples drawn for a prompt, train on the m whose
  rewards have the largest variance; that subset is the i largest and m − i smallest rewards for some i.
- ``spread_probability`` — the chance that a group of n samples of a prompt with success rate p holds both
  outcomes, 1 − pⁿ − (1 − p)ⁿ: a group without spread gives no gradient (Knapsack RL, arXiv 2509.25849).
- ``allocate`` — extra samples, in units, to the prompts where one more unit raises that chance most
  (a greedy knapsack over concave values), under a fixed total.
- ``success_estimate`` — a prompt's success rate from its history and the current round, Beta(1, 1) prior.
"""

from __future__ import annotations

import torch
from torch import Tensor


def max_variance_subset(rewards: Tensor, m: int) -> Tensor:
    """Indices [m] (ascending) of the m of `rewards` [n] with the largest variance: the i largest and the
    m − i smallest rewards for the i that maximises it (ties: the smallest such i; within equal rewards,
    the earlier sample)."""
    n = rewards.numel()
    if rewards.dim() != 1 or not 1 <= m <= n:
        raise ValueError(f"need rewards [n] and 1 <= m <= n, got {tuple(rewards.shape)} and m = {m}")
    order = torch.sort(rewards.double(), stable=True).indices  # ascending, ties by position
    best, best_var = None, -1.0
    for i in range(m + 1):  # i from the top, m − i from the bottom
        pick = torch.cat([order[: m - i], order[n - i :]]) if i else order[:m]
        var = float(rewards.double()[pick].var(unbiased=False)) if m > 1 else 0.0
        if var > best_var + 1e-12:
            best, best_var = pick, var
    return best.sort().values


def spread_probability(p: Tensor, n: Tensor) -> Tensor:
    """1 − pⁿ − (1 − p)ⁿ: a group of n samples holds both outcomes (n = 0: no group, 0)."""
    p, n = p.double(), n.double()
    return torch.where(n > 0, 1 - p**n - (1 - p) ** n, torch.zeros_like(p))


def allocate(p: Tensor, base: int, units: int, unit: int, most: int | None = None) -> Tensor:
    """Extra units [P] long for prompts of success rates `p` [P], each already holding `base` samples:
    `units` units of `unit` samples each go, one at a time, to the prompt whose spread probability one more
    unit raises most (ties: the lower index); `most`: at most this many units per prompt."""
    if units < 0 or unit < 1 or base < 0:
        raise ValueError(f"need units >= 0, unit >= 1, base >= 0; got {units}, {unit}, {base}")
    extra = torch.zeros(p.numel(), dtype=torch.long)
    for _ in range(units):
        n = base + extra * unit
        gain = spread_probability(p, n + unit) - spread_probability(p, n)
        if most is not None:
            gain = torch.where(extra >= most, torch.full_like(gain, -1.0), gain)
        j = int(torch.argmax(gain))
        if gain[j] < 0:  # every prompt at its limit
            break
        extra[j] += 1
    return extra


def success_estimate(
    history_sum: Tensor, history_count: Tensor, now_sum: Tensor, now_count: Tensor
) -> Tensor:
    """Posterior mean success rate [P] of each prompt, Beta(1, 1) prior, from its earlier rewards (sum and
    count) and the current round's; rewards in [0, 1] count as fractional successes."""
    return (1 + history_sum.double() + now_sum.double()) / (2 + history_count.double() + now_count.double())
