"""Branched rollouts (docs/concepts/tree_credit.md#branched-rollouts): the pieces every family's
`Policy.branch` shares — from a rollout already sampled and branch points per row, `n` continuations per
(row, point). Each family's sampling from a prefix lives in its adapter (`ARPolicy.branch`, `TextPolicy`,
`JanusPolicy`, and `MaskedPolicy` / `AmusedPolicy` through policies/maskgen.maskgit_branch); this module
lays the continuations out (`branched`), seeds them (`continuation_keys`, `continuation_uniforms`), slices
them into sampling passes (`passes`) and assembles them into a `Rollout` (`assemble`).

A branch point t keeps the first t decisions of a root sample and re-decides the rest: AR images and text
re-draw tokens t, t+1, … (t a token position); masked images re-run the reveal schedule from step t (t a
reveal step, the canvas holding the tokens revealed at steps < t). A continuation is exactly what the
policy samples from that prefix with the continuation's uniforms, its recorded log-probs are those of
the sampler (teacher forcing gives the same), and its prefix positions carry the root's tokens and
log-probs, so each continuation is a whole sample a reward can score.

Seeding: continuation c from point t of root row g of the prompt in slot s draws its uniforms — one
rollout row's worth, of which positions (steps) ≥ t are used — from its own generator, keyed
(s, g, t, c) by `continuation_keys`. It then depends on nothing else: not on the other rows, points or
continuations, nor on how they are batched. With t = 0 and the generator of a group-of-one rollout it
is that rollout's sample.

What is shared from the root's sampling, per family:
- ShapeWorld AR prior (`ARPolicy`): the rollout's own fused KV cache where it was kept
  (`SamplingParams.keep_cache`, the same weights): the continuations from t copy their root's rows of it
  (index copies, no recompute) and decode T − t tokens, batched over every (root, c) that branches at the
  same t (the first step re-feeds the prefix's last token to get position t's logits). Otherwise one
  teacher-forced prefill of [prompt; root tokens] per ROOT (both CFG halves, all roots in one batch) fills
  such a cache first.
- Text (`TextPolicy`) on a plain Llama (the fused sampler): the same, with left-padded contexts (per-row
  positions, padding masked); guided sampling prefills both contexts. Other architectures (transformers'
  StaticCache) re-run the prefix for every continuation, one batched prefill per point.
- Janus (`JanusPolicy`): one prefill of [prompt; root tokens < t] per (root, point) into transformers'
  StaticCache, repeated across the point's n continuations (`batch_repeat_interleave`).
- Masked images (`MaskedPolicy`, `AmusedPolicy`): nothing to cache (bidirectional, every step re-reads
  the canvas): the continuation from step s starts on the root's canvas after step s − 1 and runs steps
  s … S − 1, S − s forwards of the doubled batch. A root sampled under the remask estimator gives its
  sampler's log-probs (``state["sampled_logp"]``); the continuations are trajectory rollouts.

Text and Janus sample a point's continuations in passes of at most the adapter's `max_rollout_batch`
rows (`passes`) (the rollout's own limit, so branching fits where sampling fits; the ShapeWorld priors have
none). The fused text path's one prefill still holds every root's context: the roots of one rollout batch.

Run it under the rollout's precision context (tasks/loop.sampler_precision) to sample as the rollout did.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from t2i_gcpo.policies.base import Branches, Rollout

CONTEXTS = ("pos", "neg", "guided")


def decision_steps(rollout: Rollout) -> Tensor:
    """[B] the number of decision steps of each sample (AR / text: its valid tokens; masked: its reveal
    steps): a branch point t must satisfy 0 ≤ t < this (core/branch_points.every_k's n_steps)."""
    valid = rollout.mask > 0
    if rollout.state.get("estimator") == "remask":  # the loss mask hides tokens, not decisions
        valid = torch.ones_like(valid)
    return torch.where(valid, rollout.step, -1).amax(dim=1) + 1


def continuation_keys(
    slots: Sequence[int | tuple[int, ...]], group_size: int, points: Tensor, n: int
) -> list[tuple[int, ...]]:
    """The generator keys of the continuations, in `Branches` row order: (*slot, g, t, c) for root g of the
    group in prompt slot `slot`, branch point t, continuation c (tasks/loop.group_generators takes them)."""
    keys = []
    for b, row in enumerate(points.tolist()):
        slot = slots[b // group_size]
        base = slot if isinstance(slot, tuple) else (slot,)
        keys += [(*base, b % group_size, t, c) for t in row if t >= 0 for c in range(n)]
    return keys


def branch_rollout(
    policy, rollout: Rollout, points: Tensor, n: int, generators: Sequence[torch.Generator]
) -> Branches:
    """`n` continuations of every root row from each of its branch points, through the policy's declared
    capability (`Policy.branch`; `PolicyCapabilities.branching`; TypeError for a family without it)."""
    if not policy.capabilities.branching:
        raise TypeError(f"{type(policy).__name__} has no branched rollouts")
    return policy.branch(rollout, points, n, generators)


# (rollout, root [N], point [N], generators, n) → the N continuations as rows of a Rollout
ContinueFn = Callable[[Rollout, Tensor, Tensor, Sequence[torch.Generator], int], Rollout]


@torch.no_grad()
def branched(
    rollout: Rollout, points: Tensor, n: int, generators: Sequence[torch.Generator], continue_from: ContinueFn
) -> Branches:
    """What every family's `Policy.branch` does: check the points, lay out the continuations (root by root,
    point by point, n each) and sample them with the family's `continue_from`.

    points: [B, K] long, each row's points then −1 (core/branch_points.py; 0 ≤ t < `decision_steps`);
    generators: one per continuation, in `Branches` row order (keys: `continuation_keys`)."""
    B = len(rollout)
    if points.dim() != 2 or points.shape[0] != B:
        raise ValueError(f"points must be [B, K] with B = {B}, got {tuple(points.shape)}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    points = points.long().cpu()
    used = points >= 0
    limit = decision_steps(rollout).cpu()
    if (used & (points >= limit[:, None])).any():
        raise ValueError("a branch point lies at or after its sample's last decision step")
    root, slot = used.nonzero(as_tuple=True)  # row-major: root by root, slot by slot
    root, slot = root.repeat_interleave(n), slot.repeat_interleave(n)
    point = points[root, slot]
    if len(generators) != len(root):
        raise ValueError(f"need one generator per continuation ({len(root)}), got {len(generators)}")
    ro = continue_from(rollout, root, point, generators, n)
    return Branches(dataclasses.replace(ro, group_size=n), root, point, slot, n)


def continuation_uniforms(generators: Sequence[torch.Generator], shape: tuple[int, ...], device) -> Tensor:
    """[N, *shape]: continuation j's from generators[j] (on the CPU, as policies/sampling.group_uniforms)."""
    return torch.stack([torch.rand(shape, generator=g) for g in generators]).to(device)


def assemble(
    rollout: Rollout,
    root: Tensor,
    point: Tensor,
    new: dict[str, Tensor],
    tokens: Tensor,
    valid: Tensor,
    step: Tensor | None = None,
) -> Rollout:
    """The continuations as a Rollout: the roots' rows with positions ≥ point (AR / text; masked: where
    `step` ≥ point) replaced by the new tokens / mask / log-probs (`new`: context → [N, T'])."""
    base = rollout.select(root)
    T = max(tokens.shape[1], base.tokens.shape[1])
    pad = lambda x: torch.nn.functional.pad(x, (0, T - x.shape[1]))  # noqa: E731
    dev = tokens.device
    if step is None:
        fresh = torch.arange(T, device=dev)[None] >= point.to(dev)[:, None]
    else:
        fresh = pad(step) >= point.to(dev)[:, None]
    logp = {}
    for c, old in base.logp.items():
        if c in new:
            logp[c] = torch.where(fresh, pad(new[c]), pad(old.to(dev)))
    changes = dict(
        tokens=torch.where(fresh, pad(tokens), pad(base.tokens.to(dev))),
        mask=torch.where(fresh, pad(valid), pad(base.mask.to(dev))),
        step=torch.arange(T, device=dev).expand(len(root), -1) if step is None else pad(step),
        logp=logp,
    )
    return dataclasses.replace(base, **changes)


def passes(point: Tensor, limit: int | None, n: int = 1) -> list[tuple[int, Tensor]]:
    """(t, continuation rows) per sampling pass: the rows branching at each point t, in slices of at most
    `limit` rows (the adapter's `max_rollout_batch`; whole runs of `n`, at least one run; None: no limit),
    so continuations are sampled in passes no larger than the rollout's. Each continuation's draws come
    from its own generator: the slicing changes no sample."""
    out = []
    for t in point.unique().tolist():
        rows = (point == t).nonzero(as_tuple=True)[0]
        size = len(rows) if not limit else max(n, limit // n * n)
        out += [(t, part) for part in rows.split(size)]
    return out
