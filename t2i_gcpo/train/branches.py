"""Continuations for a scheme that needs "branches" (docs/concepts/tree_credit.md#running-tree-credit):
pick each sample's branch points by the run's `branching.rule`, sample `branching.continuations` from each
through `Policy.branch`, decode and score them with the run's reward, and keep their rewards per point (a
`Tree`).

A continuation's generator is keyed (seed, "branch", slot, root, t, c) (policies/branching.continuation_keys):
continuations are pure functions of the run's seed and the group's prompt slot, so a resumed run draws
the same ones.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from t2i_gcpo.config import BranchingConfig
from t2i_gcpo.core.branch_points import at_boundaries, every_k, row_starts, spread, top_entropy
from t2i_gcpo.core.credit import chunked_entropy
from t2i_gcpo.core.tree import Leaves, Tree
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import Rollout, SamplingParams
from t2i_gcpo.policies.branching import continuation_keys, decision_steps
from t2i_gcpo.rewards.combine import call_reward
from t2i_gcpo.tasks.loop import group_generators, sampler_precision


@dataclass
class Grown:
    """The continuations' rewards per branch point (a `Batch.tree`) and what they cost."""

    tree: Tree
    samples: int  # continuations sampled and scored
    tokens: int  # tokens they sampled (positions, or masked reveals, from their point on)
    seconds: dict[str, float] = field(default_factory=dict)  # "rollout", "reward"
    root: torch.Tensor | None = None  # [N] the row each continuation continues (None: none sampled)
    terms: torch.Tensor | None = None  # [N, K] each continuation's score under each term (K = 1: one reward)
    tree_of: Any = None  # continuation values [N] → their Tree (the same points), e.g. GDPO's r̂


def sequential(ro: Rollout) -> bool:
    """Whether each token's step is its position (AR images, text): a step is then a token."""
    pos = torch.arange(ro.tokens.shape[1], device=ro.step.device).expand_as(ro.step)
    return bool(((ro.step == pos) | (ro.mask == 0)).all())


def step_entropy(policy: Any, ro: Rollout, context: str) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, S] the highest token entropy among the tokens decided at each step, [B, S] bool: steps that
    exist), S = the most decision steps of any row; the policy's distributions, no gradient."""
    m = ro.mask > 0
    with torch.no_grad():
        _, dists = policy(ro, context=context, dists=True)
        entropy = chunked_entropy(dists, ro.mask.shape, ro.mask.device)
    n = decision_steps(ro).to(m.device)  # [B]
    S = int(n.max())
    key = ro.step.long().clamp(0, S - 1)
    per_step = torch.full((len(ro), S), -torch.inf, device=m.device)
    per_step = per_step.scatter_reduce(1, key, torch.where(m, entropy, -torch.inf), "amax")
    exists = torch.arange(S, device=m.device)[None] < n[:, None]
    return torch.where(exists, per_step, 0.0), exists


def line_starts(policy: Any, ro: Rollout) -> torch.Tensor:
    """[B, T] bool: text positions that follow a token containing a line break."""
    cache: dict[int, bool] = {}
    tok = ro.tokens.tolist()
    breaks = [[cache.setdefault(t, "\n" in policy.tokenizer.decode([t])) for t in row] for row in tok]
    after = torch.tensor(breaks, dtype=torch.bool, device=ro.mask.device)
    return torch.cat([torch.zeros_like(after[:, :1]), after[:, :-1]], dim=1)


def no_point(k: int, steps: int) -> UserError:
    """every_k with k ≥ the samples' decision steps: no branch point anywhere, tree credit a silent no-op."""
    return UserError(
        f"branching.k={k} puts no branch point in samples of at most {steps} decision steps: set "
        f"branching.k below {steps} (e.g. --set branching.k={max(1, steps // 4)})"
    )


def decision_steps_of(policy: Any, sampling: SamplingParams) -> int | None:
    """The most decision steps a sample of `policy` makes under `sampling`: AR images every token, masked
    models their reveal steps, text its longest completion (max_new_tokens); None where unknown."""
    if policy.output == "text":
        steps = sampling.max_new_tokens or policy.default_sampling().max_new_tokens
    elif policy.capabilities.reveal_order:  # masked: decision steps are reveal steps
        steps = sampling.steps if sampling.steps is not None else policy.default_sampling().steps
    else:
        grid = policy.layout.grid
        steps = grid[0] * grid[1] if grid else None
    return int(steps) if steps else None


def check_spacing(policy: Any, branching: BranchingConfig, sampling: SamplingParams) -> None:
    """Before a run: images decide a fixed number of steps (AR: every token; masked: the reveal steps), so
    every_k's spacing can be checked without sampling (text is checked on its first
    samples, `pick_points`)."""
    if branching.rule != "every_k" or policy.output == "text":
        return
    steps = decision_steps_of(policy, sampling)
    if steps is not None and steps <= branching.k:
        raise no_point(branching.k, steps)


def pick_points(
    policy: Any, ro: Rollout, rule: str, k: int, context: str, strict: bool = True
) -> torch.Tensor:
    """[B, K] branch points of `rule` (core/branch_points.py), in decision steps, −1 padding. `strict`:
    every_k whose spacing puts no point in any sample is an error (a run's first samples), else
    no points (K = 0)."""
    if rule == "every_k":
        steps = decision_steps(ro)
        if int(steps.max()) <= k:  # a silent no-op otherwise: vine would train as plain group credit
            if strict:
                raise no_point(k, int(steps.max()))
            return torch.zeros(len(ro), 0, dtype=torch.long, device=steps.device)
        return every_k(steps, k)
    if rule == "entropy":
        entropy, exists = step_entropy(policy, ro, context)
        return top_entropy(entropy, exists, k)
    if rule == "boundary":
        if not sequential(ro):  # refused before the run (train/plan.check_model)
            raise ValueError("branching.rule=boundary needs tokens decided in order (AR images, text)")
        layout = policy.layout
        if layout.kind == "grid":
            boundary = row_starts(ro.mask, layout.grid[1])
        else:
            boundary = line_starts(policy, ro)
        return at_boundaries(boundary, ro.mask > 0)
    raise ValueError(f"unknown branch rule {rule!r}")


def grow(
    policy: Any,
    reward: Any,
    ro: Rollout,
    slots: list[int],
    branching: BranchingConfig,
    seed: int,
    sampling: SamplingParams,
    context: str,
    strict: bool = True,
) -> Grown:
    """Branch every row of `ro` (whole groups, the group of slot `slots[i]` in rows i·G … i·G + G − 1)
    at the points of `branching.rule`, sample `branching.continuations` from each, score them. `strict`:
    see `pick_points`."""
    n = branching.continuations
    tic = time.perf_counter()
    points = pick_points(policy, ro, branching.rule, branching.k, context, strict).cpu()
    if not (points >= 0).any():
        return Grown(Tree.empty(len(ro), n), 0, 0, {"rollout": time.perf_counter() - tic, "reward": 0.0})
    keys = continuation_keys(slots, ro.group_size, points, n)
    with sampler_precision(policy, sampling):
        br = policy.branch(ro, points, n, group_generators(seed, "branch", keys))
    mid = time.perf_counter()
    cont = br.rollout
    outputs = policy.decode(cont)
    scored = call_reward(reward, outputs, cont.texts, [p.meta for p in cont.prompts])
    fresh = (cont.step >= br.point.to(cont.step.device)[:, None]) & (cont.mask > 0)
    return Grown(
        br.tree(points, scored.scores),
        len(cont),
        int(fresh.sum()),
        {"rollout": mid - tic, "reward": time.perf_counter() - mid},
        br.root.cpu(),
        per_term_scores(reward, scored),
        lambda values: br.tree(points, values),
    )


def per_term_scores(reward: Any, out: Any) -> torch.Tensor:
    """[N, K]: each sample's score under each term of `reward` (a weighted sum), or [N, 1] its score."""
    from t2i_gcpo.rewards.combine import reward_terms
    from t2i_gcpo.train.scoring import term_scores

    parts = term_scores(reward_terms(reward), out)
    return out.scores.reshape(-1, 1).float() if parts is None else parts


def leaf_points(policy: Any, ro: Rollout, branching: BranchingConfig, context: str) -> torch.Tensor:
    """[B, k] the branch points of tree groups: exactly `branching.k` per root, so every group has the same
    number of leaves — `spread` evenly over each sample's decision steps, or (`entropy`) before its k most
    uncertain steps, a short sample's missing points taken from the spread ones."""
    spread_points = spread(decision_steps(ro).cpu(), branching.k)
    if branching.rule == "spread":
        return spread_points
    if branching.rule == "entropy":
        entropy, exists = step_entropy(policy, ro, context)
        top = top_entropy(entropy, exists, branching.k).cpu()
        if top.shape[1] < branching.k:
            top = torch.nn.functional.pad(top, (0, branching.k - top.shape[1]), value=-1)
        return torch.where(top >= 0, top, spread_points).sort(dim=1).values
    raise ValueError(f"tree groups branch with branching.rule=spread or entropy, got {branching.rule!r}")


def leaf_keys(slots: list[int], group_size: int, points: torch.Tensor, n: int) -> list[tuple[int, ...]]:
    """The generator keys of tree-group continuations, in `Branches` row order: (slot, g, j, t, c) for point j
    (its column: a short sample's repeated points get distinct keys) at step t of root g."""
    return [
        (slots[b // group_size], b % group_size, j, t, c)
        for b, row in enumerate(points.tolist())
        for j, t in enumerate(row)
        for c in range(n)
    ]


@dataclass
class LeafGroups:
    """Tree groups: each group's roots, then its continuations (docs/concepts/tree_credit.md#tree-groups)."""

    rollout: Rollout  # [P·G] with G = G₀·(1 + k·n); continuations score their own segment only (`scored`)
    outputs: Any  # what it decoded to
    reward: Any  # RewardOutput of every leaf
    leaves: Leaves
    samples: int  # continuations sampled and scored
    tokens: int  # tokens they sampled (from their point on)
    seconds: dict[str, float] = field(default_factory=dict)


def grow_leaves(
    policy: Any,
    reward: Any,
    roots: Rollout,
    outputs: Any,
    root_reward: Any,
    slots: list[int],
    branching: BranchingConfig,
    seed: int,
    sampling: SamplingParams,
    context: str,
) -> LeafGroups:
    """Branch every root of `roots` (groups of G₀, the group of slot `slots[i]` in rows i·G₀ …) at `k`
    points, sample `continuations` from each, score them, and lay each group out as its roots then its
    continuations — a tree group of G₀·(1 + k·n) leaves, all trained on."""
    from t2i_gcpo.rewards.base import RewardOutput

    if roots.state.get("estimator") == "remask":  # refused when the config is built
        raise ValueError("tree groups train on continuations, which are trajectory samples")
    G0, n = roots.group_size, branching.continuations
    tic = time.perf_counter()
    points = leaf_points(policy, roots, branching, context)  # [B₀, k]
    with sampler_precision(policy, sampling):
        br = policy.branch(roots, points, n, group_generators(seed, "leaf", leaf_keys(slots, G0, points, n)))
    mid = time.perf_counter()
    cont = br.rollout
    cont_out = policy.decode(cont)
    cont_reward = call_reward(reward, cont_out, cont.texts, [p.meta for p in cont.prompts])
    end = time.perf_counter()
    own = (cont.step >= br.point.to(cont.step.device)[:, None]) & (cont.mask > 0)
    cont = dataclasses.replace(cont, scored=own.to(cont.mask.dtype), group_size=G0)
    # per group: its G₀ roots, then the k·n continuations of each of them (Branches order: root by root)
    P, per_root = len(roots) // G0, points.shape[1] * n
    order = torch.cat(
        [
            torch.cat(
                [
                    torch.arange(p * G0, (p + 1) * G0),
                    len(roots) + torch.arange(p * G0 * per_root, (p + 1) * G0 * per_root),
                ]
            )
            for p in range(P)
        ]
    )
    both = Rollout.concat([roots, cont]).select(order)
    both = dataclasses.replace(both, group_size=G0 * (1 + per_root))
    root_index = torch.cat([torch.arange(len(roots)), br.root.cpu()]) % G0
    point = torch.cat([torch.full((len(roots),), -1), br.point.cpu()])
    if torch.is_tensor(outputs):
        outs = torch.cat([outputs, cont_out.to(outputs.device)])[order.to(outputs.device)]
    else:
        outs = [(list(outputs) + list(cont_out))[i] for i in order.tolist()]
    reward = RewardOutput.concat([root_reward, cont_reward]).select(order)
    return LeafGroups(
        both,
        outs,
        reward,
        Leaves(root_index[order], point[order]),
        len(cont),
        int(own.sum()),
        {"rollout": mid - tic, "reward": end - mid},
    )
