"""Branched rollouts (docs/concepts/tree_credit.md#branched-rollouts): from a rollout already sampled and
branch points per row, sample `n` continuations per (row, point), for every family.

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

What is shared, per family:
- ShapeWorld AR prior (`ARPolicy`): one teacher-forced prefill of [prompt; root tokens] per ROOT (both
  CFG halves, all roots in one batch) fills a fused KV cache; the continuations from t copy its first
  P + t slots (index copies, no recompute) and decode T − t tokens, batched over every (root, c) that
  branches at the same t. Cost: one prefill (≈ one forward over the roots' sequences, cheap next to
  the T sequential steps of their sampling) plus T − t single-token steps per continuation (the first
  re-feeds the prefix's last token to get position t's logits; a fresh sample takes a prefill and
  T − 1). The rollout's own cache is not
  kept: adapters do not return it (a hook returning the final `FusedLlamaDecoder` would save the
  prefill).
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
rows (the rollout's own limit, so branching fits where sampling fits; the ShapeWorld priors have none).
The fused text path's one prefill still holds every root's context: the roots of one rollout batch.

Run it under the rollout's precision context (tasks/loop.sampler_precision) to sample as the rollout did.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from t2i_gcpo.policies.base import Branches, Rollout
from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder
from t2i_gcpo.policies.maskgen import maskgit_continue, step_progress
from t2i_gcpo.policies.sampling import sample_step

CONTEXTS = ("pos", "neg", "guided")


def decision_steps(rollout: Rollout) -> Tensor:
    """[B] the number of decision steps of each sample (AR / text: its valid tokens; masked: its reveal
    steps): a branch point t must satisfy 0 ≤ t < this (core/branch_points.every_k's n_steps)."""
    valid = rollout.mask > 0
    if rollout.state.get("estimator") == "remask":  # the loss mask hides tokens, not decisions
        valid = torch.ones_like(valid)
    return torch.where(valid, rollout.step, -1).amax(dim=1) + 1


def continuation_keys(slots: Sequence[int | tuple[int, ...]], group_size: int, points: Tensor,
                      n: int) -> list[tuple[int, ...]]:  # fmt: skip
    """The generator keys of the continuations, in `Branches` row order: (*slot, g, t, c) for root g of the
    group in prompt slot `slot`, branch point t, continuation c (tasks/loop.group_generators takes them)."""
    keys = []
    for b, row in enumerate(points.tolist()):
        slot = slots[b // group_size]
        base = slot if isinstance(slot, tuple) else (slot,)
        keys += [(*base, b % group_size, t, c) for t in row if t >= 0 for c in range(n)]
    return keys


def branch_rollout(policy, rollout: Rollout, points: Tensor, n: int,
                   generators: Sequence[torch.Generator]) -> Branches:  # fmt: skip
    """`n` continuations of every root row from each of its branch points, through the policy's declared
    capability (`Policy.branch`; `PolicyCapabilities.branching`).

    points: [B, K] long, each row's points then −1 (core/branch_points.py; 0 ≤ t < `decision_steps`);
    generators: one per continuation, in `Branches` row order (keys: `continuation_keys`)."""
    if not policy.capabilities.branching:
        raise TypeError(f"{type(policy).__name__} has no branched rollouts")
    return policy.branch(rollout, points, n, generators)


ContinueFn = Callable[..., Rollout]  # (policy, rollout, root [N], point [N], generators, n) → [N] rows


@torch.no_grad()
def branches(policy, rollout: Rollout, points: Tensor, n: int, generators: Sequence[torch.Generator],
             continue_from: ContinueFn) -> Branches:  # fmt: skip
    """What every family's `Policy.branch` does: check the points, lay out the continuations (root by root,
    point by point, n each) and sample them with the family's `continue_from` (`continue_ar`,
    `continue_text`, `continue_janus`, `continue_masked` below)."""
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
    ro = continue_from(policy, rollout, root, point, generators, n)
    return Branches(dataclasses.replace(ro, group_size=n), root, point, slot, n)


class Branching:
    """What an adapter that declares `capabilities.branching` mixes in: `Policy.branch` through its
    family's continuation function (`continue_from = staticmethod(continue_ar)`, …)."""

    continue_from: ContinueFn

    def branch(
        self, rollout: Rollout, points: Tensor, n: int, generators: Sequence[torch.Generator]
    ) -> Branches:
        """`n` continuations of every row of `rollout` from each of its branch points
        (docs/concepts/tree_credit.md#branched-rollouts)."""
        return branches(self, rollout, points, n, generators, self.continue_from)


# ---------------------------------------------------------------------------- shared pieces


def _uniforms(generators: Sequence[torch.Generator], shape: tuple[int, ...], device) -> Tensor:
    """[N, *shape]: continuation j's from generators[j] (on the CPU, as policies/sampling.group_uniforms)."""
    return torch.stack([torch.rand(shape, generator=g) for g in generators]).to(device)


def _fork(decoder: FusedLlamaDecoder, rows: Tensor) -> FusedLlamaDecoder:
    """A decoder sharing `decoder`'s weights whose cache rows are copies of `rows` of its cache."""
    fork = copy.copy(decoder)
    fork.keys, fork.values = decoder.keys[:, rows], decoder.values[:, rows]  # advanced indexing copies
    return fork


def _assemble(rollout: Rollout, root: Tensor, point: Tensor, new: dict[str, Tensor], tokens: Tensor,
              valid: Tensor, step: Tensor | None = None) -> Rollout:  # fmt: skip
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


def _passes(point: Tensor, policy, n: int = 1) -> list[tuple[int, Tensor]]:
    """(t, continuation rows) per sampling pass: the rows branching at each point t, in slices of at most
    the adapter's `max_rollout_batch` (whole runs of `n`, at least one run), so continuations are sampled
    in passes no larger than the rollout's. Each continuation's draws come from its own generator: the
    slicing changes no sample."""
    limit = getattr(policy, "max_rollout_batch", None)
    out = []
    for t in point.unique().tolist():
        rows = (point == t).nonzero(as_tuple=True)[0]
        size = len(rows) if not limit else max(n, limit // n * n)
        out += [(t, part) for part in rows.split(size)]
    return out


@contextlib.contextmanager
def _eval(module: torch.nn.Module) -> Iterator[None]:
    was = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was)


# ---------------------------------------------------------------------------- AR images


def continue_ar(policy, rollout: Rollout, root: Tensor, point: Tensor,
                generators: Sequence[torch.Generator], n: int) -> Rollout:  # fmt: skip
    """ShapeWorld AR prior: one prefill per root, its cache rows copied to the continuations (module doc)."""
    dev, T, P, sampling = policy.device, policy.num_tokens, policy.prefix_len, rollout.sampling
    roots = root.unique()  # sorted
    R = len(roots)
    pid = rollout.state["prompt_ids"].to(dev)[roots]
    tok = rollout.tokens.to(dev)[roots]
    t_max = int(point.max())
    null = torch.arange(2 * R, device=dev) >= R
    # [2R, P + t_max]: cond rows then null rows, each its prefix and the root's first t_max tokens
    seq = torch.cat(
        [policy.prefix(torch.cat([pid, pid]), null), (tok[:, :t_max] + policy.image_offset).repeat(2, 1)], 1
    )
    decoder = FusedLlamaDecoder(policy.llama, 2 * R, P + T - 1)
    decoder.forward(seq, 0)
    which = torch.searchsorted(roots, root).to(dev)  # continuation → root index in `roots`
    uniforms = _uniforms(generators, (T,), dev)
    N = len(root)
    tokens = torch.zeros(N, T, dtype=torch.long, device=dev)
    logps = torch.zeros(3, N, T, device=dev)
    for t in point.unique().tolist():
        rows = (point == t).nonzero(as_tuple=True)[0].to(dev)
        r = which[rows]
        cache = _fork(decoder, torch.cat([r, r + R]))
        # logits of position t: re-feed the prefix's last input (token t − 1, or <boi>) at its own slot
        logits = policy.head(cache.forward(seq[torch.cat([r, r + R]), P + t - 1 : P + t], P + t - 1))
        for j in range(t, T):
            lc, lu = logits.chunk(2)
            tj, lp = sample_step(lc, lu, sampling, uniforms[rows, j], policy.guidance)
            tokens[rows, j] = tj
            logps[:, rows, j] = torch.stack([lp["pos"], lp["neg"], lp["guided"]])
            if j + 1 < T:
                logits = policy.decode_one_token(tj, cache, P + j)
    new = dict(zip(CONTEXTS, logps))
    return _assemble(rollout, root, point, new, tokens, torch.ones(N, T, device=dev))


# ---------------------------------------------------------------------------- text


def continue_text(policy, rollout: Rollout, root: Tensor, point: Tensor,
                  generators: Sequence[torch.Generator], n: int) -> Rollout:  # fmt: skip
    """Text: a fused prefill per root shared by its continuations, or (other architectures) the prefix
    re-run for every continuation through the adapter's own loop (module doc)."""
    sampling, steps, dev = rollout.sampling, rollout.max_len, policy.device
    guided = sampling.guidance_scale != 1.0
    uniforms = _uniforms(generators, (steps,), dev)
    N = len(root)
    tokens = torch.full((N, steps), policy.pad_id, dtype=torch.long, device=dev)
    valid = torch.zeros(N, steps, device=dev)
    logps = torch.zeros(3, N, steps, device=dev)
    pos_ids, neg_ids = rollout.state["prompt_ids"], rollout.state["negative_ids"]
    root_tok = rollout.tokens.to(dev)
    with _eval(policy):
        if policy.samples_fused:
            _text_fused(policy, rollout, root, point, uniforms, tokens, valid, logps)
        else:
            for t, rows in _passes(point, policy):
                prefix = [list(pos_ids[b]) + root_tok[b, :t].tolist() for b in root[rows].tolist()]
                neg = [list(neg_ids[b]) + root_tok[b, :t].tolist() for b in root[rows].tolist()]
                out = policy.decode_n_tokens(
                    prefix, sampling, uniforms[rows.to(dev), t:], neg if guided else None
                )
                tokens[rows, t:], valid[rows, t:] = out[0], out[1]
                logps[:, rows, t:] = torch.stack(out[2:])
    new = {"pos": logps[0], "guided": logps[2], **({"neg": logps[1]} if guided else {})}
    ro = _assemble(rollout, root, point, new, tokens, valid)
    width = int(ro.mask.sum(0).nonzero().max()) + 1  # the longest continuation, as TextPolicy.rollout trims
    ro = dataclasses.replace(ro, tokens=ro.tokens[:, :width], mask=ro.mask[:, :width], step=ro.step[:, :width],
                             logp={c: v[:, :width] for c, v in ro.logp.items()})  # fmt: skip
    if "neg" in rollout.logp and not guided:  # as the rollout: c⁻ scored by teacher forcing
        with _eval(policy):
            ro.logp["neg"] = policy.logprobs(ro, "neg")
    return ro


def _text_fused(policy, rollout: Rollout, root: Tensor, point: Tensor, uniforms: Tensor,
                tokens: Tensor, valid: Tensor, logps: Tensor) -> None:  # fmt: skip
    """Fill tokens / valid / logps [3, N, steps] from positions ≥ point: every root's contexts (c⁺, and c⁻
    when guided) are left-padded to one width W, its tokens follow, so position t sits at cache slot
    W + t in every row and the continuations of one t step together."""
    sampling, steps, dev = rollout.sampling, rollout.max_len, policy.device
    guided = sampling.guidance_scale != 1.0
    roots = root.unique()
    R, t_max = len(roots), int(point.max())
    ctx = [list(rollout.state["prompt_ids"][b]) for b in roots.tolist()]
    if guided:
        ctx += [list(rollout.state["negative_ids"][b]) for b in roots.tolist()]
    ids, ctx_mask = policy.pad_left(ctx)  # [R', W]
    W = ids.shape[1]
    root_tok = rollout.tokens.to(dev)[roots][:, :t_max]
    root_tok = root_tok.repeat(2, 1) if guided else root_tok
    seq = torch.cat([ids, root_tok], dim=1)  # [R', W + t_max]
    full_mask = torch.cat([ctx_mask, ctx_mask.new_ones(len(ctx), steps)], dim=1).bool()  # [R', W + steps]
    positions = (full_mask.long().cumsum(-1) - 1).clamp(min=0)
    decoder = FusedLlamaDecoder(policy.model.base_model, len(ctx), W + steps)
    decoder.forward(seq, 0, positions=positions[:, : seq.shape[1]], key_mask=full_mask[:, : seq.shape[1]])
    which = torch.searchsorted(roots, root).to(dev)
    eos = torch.as_tensor(policy.eos_ids, dtype=torch.long, device=dev)
    for t, rows in _passes(point, policy):
        rows = rows.to(dev)
        r = which[rows]
        src = torch.cat([r, r + R]) if guided else r
        cache = _fork(decoder, src)
        mask, pos = full_mask[src], positions[src]
        slot = W + t - 1  # re-feed the prefix's last input to get position t's logits
        logits = policy._head(cache.forward(seq[src, slot : slot + 1], slot, positions=pos[:, slot : slot + 1],
                                            key_mask=mask[:, : slot + 1]))  # fmt: skip
        done = torch.zeros(len(rows), dtype=torch.bool, device=dev)
        for j in range(t, steps):
            pl, nl = logits.chunk(2) if guided else (logits, None)
            tj, lp = sample_step(pl, nl, sampling, uniforms[rows, j], policy.guidance)
            live = ~done
            tokens[rows, j] = torch.where(live, tj, policy.pad_id)
            valid[rows, j] = live.float()
            for k, c in enumerate(CONTEXTS):
                if c in lp:
                    logps[k, rows, j] = torch.where(live, lp[c], 0.0)
            done = done | torch.isin(tj, eos)
            if bool(done.all()) or j + 1 == steps:
                break
            feed = tokens[rows, j].repeat(2) if guided else tokens[rows, j]
            s = W + j
            logits = policy._head(cache.forward(feed[:, None], s, positions=pos[:, s : s + 1],
                                                key_mask=mask[:, : s + 1]))  # fmt: skip


# ---------------------------------------------------------------------------- Janus


def continue_janus(policy, rollout: Rollout, root: Tensor, point: Tensor,
                   generators: Sequence[torch.Generator], n: int) -> Rollout:  # fmt: skip
    """Janus: one StaticCache prefill per (root, point), repeated across its n continuations (module doc)."""
    from transformers import StaticCache

    sampling, dev, T = rollout.sampling, policy.device, policy.num_image_tokens
    uniforms = _uniforms(generators, (T,), dev)
    N = len(root)
    tokens = torch.zeros(N, T, dtype=torch.long, device=dev)
    logps = torch.zeros(3, N, T, device=dev)
    root_tok = rollout.tokens.to(dev)
    with _eval(policy):
        for t, rows in _passes(point, policy, n):
            heads = rows[::n]  # one per (root, point): rows come in runs of n
            ids, mask = policy.pad_left([rollout.state["prompt_ids"][b] for b in root[heads].tolist()])
            m, L = ids.shape
            ids2, mask2 = torch.cat([ids, policy.null_ids(ids)]), mask.repeat(2, 1)
            prefix_tok = root_tok[root[heads].to(dev), :t].repeat(2, 1)
            embeds = policy.model.get_input_embeddings()(ids2)
            if t:
                embeds = torch.cat([embeds, policy._image_embeds(prefix_tok)], dim=1)
            full_mask = torch.cat([mask2, mask2.new_ones(2 * m, T)], dim=1)
            pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
            cache = StaticCache(config=policy.model.config.text_config, max_cache_len=L + T)
            hidden = policy._lm(embeds, full_mask[:, : L + t], pos[:, : L + t], cache)[:, -1]
            _repeat_rows(cache, n)  # [cond roots; null roots] → each root's row n times
            logits = policy._head(hidden).repeat_interleave(n, dim=0)
            full_mask, pos = full_mask.repeat_interleave(n, dim=0), pos.repeat_interleave(n, dim=0)
            rd = rows.to(dev)
            for j in range(t, T):
                cond, uncond = logits.chunk(2)
                tj, lp = sample_step(cond, uncond, sampling, uniforms[rd, j], policy.guidance)
                tokens[rd, j] = tj
                logps[:, rd, j] = torch.stack([lp["pos"], lp["neg"], lp["guided"]])
                if j + 1 < T:
                    logits = policy._decode_one_token(torch.cat([tj, tj]), full_mask[:, : L + j + 1],
                                                      pos[:, L + j], cache)  # fmt: skip
    new = dict(zip(CONTEXTS, logps))
    return _assemble(rollout, root, point, new, tokens, torch.ones(N, T, device=dev))


def _repeat_rows(cache, n: int) -> None:
    """Each row of a filled transformers StaticCache n times in a row (transformers 5's StaticLayer has
    no batch_repeat_interleave of its own; its write position is one counter for all rows)."""
    for layer in cache.layers:
        layer.keys = layer.keys.repeat_interleave(n, dim=0)
        layer.values = layer.values.repeat_interleave(n, dim=0)
        layer.batch_size = layer.keys.shape[0]


# ---------------------------------------------------------------------------- masked images


def _masked_parts(policy, rollout: Rollout, root: Tensor):
    """(hidden_fn over the continuations' rows, mask id, reveal counts, choice temperatures, scales, order),
    from the adapter's `reveal_plan` (ShapeWorld masked prior, aMUSEd)."""
    sampling = rollout.sampling
    steps = policy.resolve_steps(sampling)
    scales = policy._scale_fn(sampling)(step_progress(steps))
    hidden_fn, counts, order = policy.reveal_plan(rollout, root.to(policy.device), steps)
    return hidden_fn, policy.mask_id, counts, policy.choice_temperatures(steps), scales, order


def continue_masked(policy, rollout: Rollout, root: Tensor, point: Tensor,
                    generators: Sequence[torch.Generator], n: int) -> Rollout:  # fmt: skip
    """Masked images: each continuation re-runs the reveal schedule from its step on the root's canvas."""
    dev, T = policy.device, policy.num_tokens
    hidden_fn, mask_id, counts, temps, scales, order = _masked_parts(policy, rollout, root)
    S = len(counts)
    uniforms = _uniforms(generators, (S, T, 2), dev)
    base = rollout.select(root)
    recorded = base.state.get("sampled_logp", base.logp)  # remask roots: the sampler's own log-probs
    r_tok, r_step = base.tokens.to(dev), base.step.to(dev)
    r_lp = torch.stack([recorded[c].to(dev) for c in CONTEXTS])
    tokens, step, logps = r_tok.clone(), r_step.clone(), r_lp.clone()
    for s in point.unique().tolist():
        rows = (point == s).nonzero(as_tuple=True)[0].to(dev)
        kept = r_step[rows] < s

        def group_fn(canvas: Tensor, rr: Tensor, null: Tensor, rows: Tensor = rows) -> Tensor:
            return hidden_fn(canvas, rows[rr], null)  # group row → continuation row

        out = maskgit_continue(
            group_fn, policy.head,
            torch.where(kept, r_tok[rows], mask_id), torch.where(kept, r_step[rows], -1),
            torch.where(kept, r_lp[:, rows], 0.0), s, counts, rollout.sampling, uniforms[rows], temps,
            scales, policy.guidance, order,
        )  # fmt: skip
        tokens[rows], step[rows], logps[:, rows] = out
    state = {k: v for k, v in base.state.items() if k not in ("remask", "remask_t", "sampled_logp")}
    return dataclasses.replace(
        base, tokens=tokens, step=step, mask=torch.ones_like(tokens, dtype=torch.float),
        logp=dict(zip(CONTEXTS, logps)), state={**state, "estimator": "trajectory"},
    )  # fmt: skip
