"""Pieces every masked-image-token adapter shares (masked.py, showo.py; amused.py and meissonic.py through
muse_common.py): the mask schedule, the MaskGIT sampler with per-prompt noise, the two log-prob estimators of
a sample, and the `Policy` members the families have alike (`MaskedPolicyMembers`).

A masked generator decodes T tokens in S steps, revealing a share of the masked positions at each
(by confidence, or a random subset whose order does not depend on the weights). `trajectory` replays
the recorded reveal order and scores each token at its reveal step, reproducing the recorded log-probs;
`remask` scores the final tokens under K seeded re-masks (MaskGRPO). Adapters provide
``hidden_fn(canvas, rows, null)`` and ``head(h)``. Details: docs/concepts/adapters.md#masked-sampling.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import (
    STEP_PREDICTIONS,
    STEP_REWARDS,
    Branches,
    Context,
    LogprobsForward,
    PromptRecord,
    Rollout,
    SamplingParams,
)
from t2i_gcpo.policies.branching import branched
from t2i_gcpo.policies.sampling import GUIDANCE, ChunkedDists, chunked_logprobs, group_uniforms, sample_step

MASK_SCHEDULES = ("cosine", "linear")
GUIDANCE_SCHEDULES = ("constant", "linear")
ESTIMATORS = ("trajectory", "remask")
REVEAL_ORDERS = ("confidence", "random")
HiddenFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Head = Callable[[torch.Tensor], torch.Tensor]


# ---------------------------------------------------------------------------- schedules


def mask_ratio(progress: torch.Tensor, schedule: str = "cosine") -> torch.Tensor:
    """γ(r): the fraction of tokens still masked at progress r ∈ [0, 1] (float32, as diffusers)."""
    r = progress.float()
    if schedule == "cosine":
        return torch.cos(r * math.pi / 2)
    if schedule == "linear":
        return 1 - r
    raise ValueError(f"unknown mask schedule {schedule!r}; expected one of {MASK_SCHEDULES}")


def mask_progress(ratio: torch.Tensor, schedule: str = "cosine") -> torch.Tensor:
    """γ⁻¹: the progress r ∈ [0, 1] at which a fraction `ratio` of the tokens is still masked."""
    m = ratio.float().clamp(0, 1)
    if schedule == "cosine":
        return torch.acos(m) * 2 / math.pi
    if schedule == "linear":
        return 1 - m
    raise ValueError(f"unknown mask schedule {schedule!r}; expected one of {MASK_SCHEDULES}")


def reveal_counts(num_tokens: int, steps: int, schedule: str = "cosine") -> list[int]:
    """Tokens revealed at each of `steps` steps (sum = `num_tokens`), as ``AmusedScheduler.step``
    counts them: after step s, ⌊T·γ((s+1)/S)⌋ stay masked, at least 1 and at most (masked − 1)
    before the last step."""
    if steps < 1:
        raise UserError(f"a masked model needs at least 1 decoding step, got {steps}")
    unknown, counts = num_tokens, []
    for s in range(steps):
        if s == steps - 1:
            keep = 0
        else:
            ratio = (torch.tensor([[s]]) + 1) / steps  # float32, like the scheduler's step_idx
            keep = int((num_tokens * mask_ratio(ratio, schedule)).floor().item())
            keep = max(1, min(unknown - 1, keep))
        counts.append(unknown - keep)
        unknown = keep
    return counts


def step_progress(steps: int) -> torch.Tensor:
    """p_k = k / (S − 1) for k = 0 … S − 1 ([1.] for one step): where step k sits in the decoding."""
    return torch.linspace(0, 1, steps) if steps > 1 else torch.ones(1)


def guidance_scales(scale: float, schedule: str, progress: torch.Tensor) -> torch.Tensor:
    """The guidance scale at each progress value: ``constant`` s; ``linear`` 1 + (s − 1)·p."""
    if schedule == "constant":
        return torch.full_like(progress.float(), float(scale))
    if schedule == "linear":
        return 1 + (float(scale) - 1) * progress.float()
    raise UserError(
        f"unknown guidance schedule {schedule!r}; expected one of {', '.join(GUIDANCE_SCHEDULES)}"
    )


def step_predictions(
    sampling: SamplingParams, rows: int, steps: int, num_tokens: int, mask_id: int, device: torch.device
) -> torch.Tensor | None:
    """The buffer [B, S, T] long the sampler fills with x̂_s where `sampling.record_predictions`, else None."""
    if not sampling.record_predictions:
        return None
    return torch.full((rows, steps, num_tokens), mask_id, dtype=torch.long, device=device)


def gumbel(u: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise from uniforms, clamped as diffusers' ``gumbel_noise``."""
    return -torch.log((-torch.log(u.clamp(1e-20))).clamp(1e-20))


def check_reveal_order(order: str) -> str:
    if order not in REVEAL_ORDERS:
        raise UserError(f"unknown reveal order {order!r}; expected one of {', '.join(REVEAL_ORDERS)}")
    return order


def check_estimator(estimator: str, remask_count: int) -> None:
    if estimator not in ESTIMATORS:
        raise UserError(f"unknown log-prob estimator {estimator!r}; expected one of {', '.join(ESTIMATORS)}")
    if estimator == "remask" and remask_count < 1:
        raise UserError(f"the remask estimator needs at least 1 re-mask, got {remask_count}")


# ---------------------------------------------------------------------------- the sampler


@torch.no_grad()
def maskgit_generate(
    hidden_fn: HiddenFn,
    head: Head,
    num_tokens: int,
    mask_id: int,
    counts: Sequence[int],
    sampling: SamplingParams,
    uniforms: torch.Tensor,
    choice_temperatures: torch.Tensor,
    scales: torch.Tensor,
    guidance: str,
    device: torch.device,
    reveal_order: str = "confidence",
    predictions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Parallel decoding with CFG (one doubled batch [cond; null] per step), revealing the most
    confident masked positions or (``reveal_order="random"``) a uniformly random subset of them.

    uniforms [B, S, T, 2] (token draw, Gumbel noise); choice_temperatures and scales [S] →
    tokens [B, T] long, step [B, T] long (the step that revealed each token), log-probs [3, B, T]
    (pos, neg, guided) of each token under the distributions of its reveal step. `predictions` [B, S, T]
    long, when given, receives each step's full prediction x̂_s (`maskgit_continue`)."""
    b = uniforms.shape[0]
    tokens = torch.full((b, num_tokens), mask_id, dtype=torch.long, device=device)  # the canvas
    step = torch.full((b, num_tokens), -1, dtype=torch.long, device=device)
    logps = torch.zeros(3, b, num_tokens, device=device)
    tokens, step, logps = maskgit_continue(
        hidden_fn,
        head,
        tokens,
        step,
        logps,
        0,
        counts,
        sampling,
        uniforms,
        choice_temperatures,
        scales,
        guidance,
        reveal_order,
        predictions,
    )
    if bool((step < 0).any()):
        raise RuntimeError("masked sampler left tokens unrevealed")  # the schedule reveals all T
    return tokens, step, logps


def sampled_rollout(
    tokens: torch.Tensor,
    step: torch.Tensor,
    logps: torch.Tensor,
    prompts: Sequence[PromptRecord],
    group_size: int,
    sampling: SamplingParams,
    state: dict[str, Any],
    predictions: torch.Tensor | None,
) -> Rollout:
    """The `Rollout` of `maskgit_generate`'s samples: tokens and reveal steps [B, T] (every token valid),
    their log-probs [3, B, T] (pos, neg, guided), prompt i's record in its G rows, the adapter's `state` (its
    prompt ids and ``"estimator"``) and, where recorded, the step predictions (`STEP_PREDICTIONS`)."""
    ro = Rollout(
        tokens=tokens,
        mask=torch.ones_like(tokens, dtype=torch.float),
        step=step,
        logp={"pos": logps[0], "neg": logps[1], "guided": logps[2]},
        prompts=[p for p in prompts for _ in range(group_size)],
        group_size=group_size,
        sampling=sampling,
        state=state,
    )
    if predictions is not None:
        ro.state[STEP_PREDICTIONS] = predictions
    return ro


def maskgit_continue(
    hidden_fn: HiddenFn,
    head: Head,
    tokens: torch.Tensor,
    step: torch.Tensor,
    logps: torch.Tensor,
    start: int,
    counts: Sequence[int],
    sampling: SamplingParams,
    uniforms: torch.Tensor,
    choice_temperatures: torch.Tensor,
    scales: torch.Tensor,
    guidance: str,
    reveal_order: str = "confidence",
    predictions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decoding loop from reveal step `start` on: tokens [N, T] (mask id where unrevealed), step
    [N, T] (−1 where unrevealed) and logps [3, N, T] hold the canvas after step start − 1 (an empty
    canvas for start = 0: `maskgit_generate`; a root's canvas for a branched rollout, `maskgit_branch`);
    uniforms [N, S, T, 2]. → (tokens, step, logps) after the last step.

    `predictions` [N, S, T] long, when given, is filled with x̂_s for s ≥ `start`: the canvas after step s
    with every still-masked position holding the token step s sampled there (the step's candidates, of
    which it revealed the most confident) — the model's full prediction at step s
    (docs/concepts/tree_credit.md#stepwise-rewards). x̂_s holds every token revealed up to step s, and
    x̂_{S−1} is the sample itself. A step that reveals nothing repeats x̂_{s−1}. Recording draws nothing
    and changes nothing else."""
    random_order = check_reveal_order(reveal_order) == "random"
    b, t_len = tokens.shape
    device = tokens.device
    rows = torch.arange(b, device=device)
    null = torch.arange(2 * b, device=device) >= b
    tokens, step, logps = tokens.clone(), step.clone(), logps.clone()
    uniforms = uniforms.to(device)
    for s in range(start, len(counts)):
        n_reveal = counts[s]
        if n_reveal == 0:
            if predictions is not None and s > start:
                predictions[:, s] = predictions[:, s - 1]
            continue
        unknown = step < 0  # [N, T]
        h = hidden_fn(torch.cat([tokens, tokens]), torch.cat([rows, rows]), null)  # [2N, T, D]
        hc, hu = h.chunk(2)
        where = unknown.nonzero(as_tuple=True)  # every row has the same number of masked positions
        sp = dataclasses.replace(sampling, guidance_scale=float(scales[s]))
        tok, lp = sample_step(head(hc[where]), head(hu[where]), sp, uniforms[:, s, :, 0][where], guidance)
        conf = torch.full((b, t_len), float("-inf"), device=device)
        noise = gumbel(uniforms[:, s, :, 1][where])
        conf[where] = noise if random_order else lp["guided"] + float(choice_temperatures[s]) * noise
        pick = conf.topk(n_reveal, dim=-1).indices  # [N, n]
        reveal = torch.zeros_like(unknown).scatter_(1, pick, True) & unknown
        cand = tokens.clone()
        cand[where] = tok
        if predictions is not None:
            predictions[:, s] = cand
        tokens = torch.where(reveal, cand, tokens)
        step = torch.where(reveal, torch.full_like(step, s), step)
        for i, c in enumerate(("pos", "neg", "guided")):
            full = torch.zeros(b, t_len, device=device)
            full[where] = lp[c]
            logps[i] = torch.where(reveal, full, logps[i])
    return tokens, step, logps


def maskgit_branch(
    rollout: Rollout,
    root: torch.Tensor,
    point: torch.Tensor,
    uniforms: torch.Tensor,
    hidden_fn: HiddenFn,
    head: Head,
    mask_id: int,
    counts: Sequence[int],
    choice_temperatures: torch.Tensor,
    scales: torch.Tensor,
    guidance: str,
    reveal_order: str,
) -> Rollout:
    """Continuations of rows `root` of a masked rollout (docs/concepts/tree_credit.md#branched-rollouts):
    continuation j starts on its root's canvas after reveal step point[j] − 1 and re-runs steps point[j] …
    S − 1 with its uniforms [N, S, T, 2] (`maskgit_continue`). `hidden_fn` runs over the continuations' rows.
    A root sampled under the remask estimator gives its sampler's log-probs (``state["sampled_logp"]``); the
    continuations are trajectory rollouts."""
    dev = uniforms.device
    base = rollout.select(root)
    recorded = base.state.get("sampled_logp", base.logp)
    r_tok, r_step = base.tokens.to(dev), base.step.to(dev)
    r_lp = torch.stack([recorded[c].to(dev) for c in ("pos", "neg", "guided")])
    tokens, step, logps = r_tok.clone(), r_step.clone(), r_lp.clone()
    for s in point.unique().tolist():
        rows = (point == s).nonzero(as_tuple=True)[0].to(dev)
        kept = r_step[rows] < s

        def group_fn(canvas: torch.Tensor, rr: torch.Tensor, null: torch.Tensor, rows=rows) -> torch.Tensor:
            return hidden_fn(canvas, rows[rr], null)  # group row → continuation row

        out = maskgit_continue(
            group_fn,
            head,
            torch.where(kept, r_tok[rows], mask_id),
            torch.where(kept, r_step[rows], -1),
            torch.where(kept, r_lp[:, rows], 0.0),
            s,
            counts,
            rollout.sampling,
            uniforms[rows],
            choice_temperatures,
            scales,
            guidance,
            reveal_order,
        )
        tokens[rows], step[rows], logps[:, rows] = out
    dropped = ("remask", "remask_t", "sampled_logp", STEP_PREDICTIONS, STEP_REWARDS)  # the root's, not theirs
    state = {k: v for k, v in base.state.items() if k not in dropped}
    return dataclasses.replace(
        base,
        tokens=tokens,
        step=step,
        mask=torch.ones_like(tokens, dtype=torch.float),
        logp=dict(zip(("pos", "neg", "guided"), logps)),
        state={**state, "estimator": "trajectory"},
    )


# ---------------------------------------------------------------------------- estimators


def _pack(h: torch.Tensor, rows: int, scale: torch.Tensor) -> torch.Tensor:
    """[2N, T, D] (cond rows, null rows) and per-token scales [N, T] → [N, T, 2D + 1]."""
    hc, hu = h[:rows], h[rows:]
    return torch.cat([hc, hu, scale.to(h)[..., None]], dim=-1)


def context_hidden(
    hidden_fn: HiddenFn,
    canvas: torch.Tensor,
    rows: torch.Tensor,
    context: Context,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Hidden states of `canvas` [N, T] under `context`: [N, T, D] for pos / neg; for guided the cond
    and null states with the per-token scale packed as [N, T, 2D + 1] (one doubled forward)."""
    n = canvas.shape[0]
    if context in ("pos", "neg"):
        return hidden_fn(canvas, rows, torch.full((n,), context == "neg", device=canvas.device))
    if context != "guided":
        raise ValueError(f"context must be pos, neg or guided, not {context!r}")
    null = torch.arange(2 * n, device=canvas.device) >= n
    return _pack(hidden_fn(torch.cat([canvas, canvas]), torch.cat([rows, rows]), null), n, scale)


def make_to_logits(
    head: Head, context: Context, guidance: str, temperature: float, dim: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Hidden chunk [B, t, D] (or packed [B, t, 2D + 1]) → temperature-scaled logits [B, t, K]."""
    if context != "guided":
        return lambda h: head(h) / temperature
    mix = GUIDANCE[guidance]

    def to_logits(h: torch.Tensor) -> torch.Tensor:
        c, u, s = h[..., :dim], h[..., dim : 2 * dim], h[..., 2 * dim :]
        return mix(head(c), head(u), s) / temperature

    return to_logits


def trajectory_hidden(
    hidden_fn: HiddenFn,
    tokens: torch.Tensor,
    step: torch.Tensor,
    mask_id: int,
    context: Context,
    step_scales: torch.Tensor,
    replay_rows: int,
) -> torch.Tensor:
    """Hidden states [B, T, D′] with token t taken from the replay of the step that revealed it: the
    canvas of step s holds the tokens revealed before s, the rest masked. Steps are stacked along
    the batch, ``replay_rows`` rows per forward (at least one step per forward)."""
    b = tokens.shape[0]
    present = step.unique().tolist()  # steps that revealed something
    per = max(1, replay_rows // (b * (2 if context == "guided" else 1)))
    out = None
    rows = torch.arange(b, device=tokens.device)
    for i in range(0, len(present), per):
        group = present[i : i + per]
        canvas = torch.cat([torch.where(step < s, tokens, mask_id) for s in group])  # [n·B, T]
        scale = step_scales.to(tokens.device)[step].float() if context == "guided" else None
        h = context_hidden(
            hidden_fn,
            canvas,
            rows.repeat(len(group)),
            context,
            None if scale is None else scale.repeat(len(group), 1),
        )
        h = h.view(len(group), b, *h.shape[1:])  # [n, B, T, D′]
        if out is None:
            out = h.new_zeros(h.shape[1:])
        for j, s in enumerate(group):
            out = torch.where((step == s)[..., None], h[j], out)
    return out


def draw_remasks(uniforms: torch.Tensor, schedule: str = "cosine") -> tuple[torch.Tensor, torch.Tensor]:
    """uniforms [B, K, T + 1] → (masks bool [B, K, T], times t_k [B, K]): re-mask k masks
    clamp(round(γ(t_k)·T), 1, T) uniformly chosen positions, t_k = (k + u_k)/K."""
    b, k, t1 = uniforms.shape
    t_len = t1 - 1
    times = (torch.arange(k, dtype=torch.float32)[None] + uniforms[..., -1].float().cpu()) / k  # [B, K]
    n = (mask_ratio(times, schedule) * t_len).round().clamp(1, t_len).long()  # [B, K]
    rank = uniforms[..., :t_len].float().cpu().argsort(-1).argsort(-1)  # a random permutation per (b, k)
    return (rank < n[..., None]).to(uniforms.device), times.to(uniforms.device)


def remask_scored(mask: torch.Tensor, remasks: torch.Tensor) -> torch.Tensor:
    """[B, T] float: the valid tokens (`mask`) that at least one re-mask [B, K, T] masked — the only
    ones the remask estimator scores (`Rollout.scored`)."""
    return mask * remasks.any(1).to(mask)


def masked_logprobs(
    hidden_fn: HiddenFn,
    head: Head,
    rollout: Rollout,
    context: Context,
    dists: bool,
    mask_id: int,
    vocab: int,
    dim: int,
    guidance: str,
    step_scales: torch.Tensor,
    scale_fn: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device,
    replay_rows: int = 512,
) -> tuple[torch.Tensor, ChunkedDists | None]:
    """(log softmax(ℓ/T) of the rollout's tokens [B, T] under `context`, with gradient, by the estimator
    recorded in the rollout (``state["estimator"]``); with `dists` the full distributions
    (`ChunkedDists`, no gradient), else None). `step_scales` [S]: the sampler's guidance scale per
    step; `scale_fn(progress)`: the scale at a re-mask's progress."""
    tokens = rollout.tokens.to(device)
    temperature = rollout.sampling.temperature
    to_logits = make_to_logits(head, context, guidance, temperature, dim)
    if rollout.state.get("estimator", "trajectory") == "trajectory":
        step = rollout.step.to(device)
        hidden = trajectory_hidden(hidden_fn, tokens, step, mask_id, context, step_scales, replay_rows)
        logp = chunked_logprobs(hidden, to_logits, tokens, vocab)
        return logp, ChunkedDists(hidden, to_logits, vocab) if dists else None
    masks = rollout.state["remask"].to(device)  # [B, K, T]
    times = rollout.state["remask_t"].to(device)  # [B, K]
    rows = torch.arange(tokens.shape[0], device=device)
    total = torch.zeros(tokens.shape, device=device)
    chosen = None  # hidden of the first re-mask that masked each token (for dists)
    for k in reversed(range(masks.shape[1])):
        m = masks[:, k]  # [B, T]
        canvas = torch.where(m, mask_id, tokens)
        scale = scale_fn(times[:, k])[:, None].expand_as(tokens).float()
        h = context_hidden(hidden_fn, canvas, rows, context, scale)
        lp = chunked_logprobs(h, to_logits, tokens, vocab)
        total = total + torch.where(m, lp, torch.zeros_like(lp))
        if dists:
            hd = h.detach()
            chosen = hd if chosen is None else torch.where(m[..., None], hd, chosen)
    count = masks.sum(1)  # [B, T]
    logp = torch.where(count > 0, total / count.clamp_min(1), torch.zeros_like(total))
    return logp, ChunkedDists(chosen, to_logits, vocab) if dists else None


@torch.no_grad()
def remask_record(
    hidden_fn: HiddenFn,
    head: Head,
    tokens: torch.Tensor,
    masks: torch.Tensor,
    times: torch.Tensor,
    mask_id: int,
    vocab: int,
    dim: int,
    guidance: str,
    temperature: float,
    scale_fn: Callable[[torch.Tensor], torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The remask estimator's log-probs {pos, neg, guided} [B, T] of sampled tokens under the rollout
    policy (the ratio's old log-probs), from one doubled forward per re-mask."""
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    total = {c: torch.zeros(tokens.shape, device=tokens.device) for c in ("pos", "neg", "guided")}
    for k in range(masks.shape[1]):
        m = masks[:, k]
        scale = scale_fn(times[:, k])[:, None].expand_as(tokens).float()
        h = context_hidden(hidden_fn, torch.where(m, mask_id, tokens), rows, "guided", scale)
        for c in total:
            to_logits = make_to_logits(head, "guided", guidance, temperature, dim)
            if c != "guided":
                part = slice(0, dim) if c == "pos" else slice(dim, 2 * dim)
                to_logits = lambda x, part=part: head(x[..., part]) / temperature  # noqa: E731
            lp = chunked_logprobs(h, to_logits, tokens, vocab)
            total[c] += torch.where(m, lp, torch.zeros_like(lp))
    count = masks.sum(1)
    return {c: torch.where(count > 0, v / count.clamp_min(1), torch.zeros_like(v)) for c, v in total.items()}


def record_remasks(
    rollout: Rollout,
    generators: Sequence[torch.Generator],
    remask_count: int,
    mask_schedule: str,
    hidden_fn: HiddenFn,
    head: Head,
    mask_id: int,
    vocab: int,
    dim: int,
    guidance: str,
    scale_fn: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """Make a freshly sampled rollout one of the remask estimator: K = `remask_count` re-masks of each sample
    drawn from its prompt's generator after the sampler's draws (`draw_remasks`), kept in its state with the
    sampler's own log-probs (``sampled_logp``, what its continuations start from); its log-probs become those
    under the re-masks (`remask_record`) and `Rollout.scored` the tokens they mask."""
    tokens = rollout.tokens
    u = group_uniforms(generators, rollout.group_size, (remask_count, tokens.shape[1] + 1), tokens.device)
    masks, times = draw_remasks(u, mask_schedule)
    rollout.state.update(remask=masks, remask_t=times, sampled_logp=rollout.logp)
    temperature = rollout.sampling.temperature
    rollout.logp = remask_record(
        hidden_fn, head, tokens, masks, times, mask_id, vocab, dim, guidance, temperature, scale_fn
    )
    rollout.scored = remask_scored(rollout.mask, masks)


# ---------------------------------------------------------------------------- a masked family's members


class MaskedPolicyMembers(LogprobsForward):
    """The `Policy` members every masked family (masked.py, showo.py, muse_common.py's) has alike, from the
    two it writes itself: ``_logprobs(rollout, context, dists)`` (its `masked_logprobs`) and
    ``_continue(rollout, root, point, generators, n)`` (its `maskgit_branch`). Listed before
    ``nn.Module`` among its bases."""

    def set_estimator(self, estimator: str, remask_count: int = 2) -> None:
        """``trajectory`` or ``remask`` (with K = `remask_count` re-masks) for the next rollouts."""
        check_estimator(estimator, remask_count)
        self.estimator, self.remask_count = estimator, int(remask_count)

    def logprobs(self, rollout: Rollout, context: Context = "pos") -> torch.Tensor:
        """log softmax(ℓ/T) of the sampled tokens [B, T] by the rollout's estimator, with gradient, in chunks
        over T (0 where the remask estimator scores nothing: outside `rollout.loss_mask`)."""
        return self._logprobs(rollout, context, dists=False)[0]

    def logprobs_and_dists(
        self, rollout: Rollout, context: Context = "pos"
    ) -> tuple[torch.Tensor, ChunkedDists]:
        """`logprobs` and the full distributions of the same forward (`ChunkedDists`, no gradient)."""
        logp, dists = self._logprobs(rollout, context, dists=True)
        assert dists is not None
        return logp, dists

    def branch(
        self, rollout: Rollout, points: torch.Tensor, n: int, generators: Sequence[torch.Generator]
    ) -> Branches:
        """`n` continuations of every sample from each of its branch points (reveal steps): each re-runs the
        reveal schedule from its step on the root's canvas
        (docs/concepts/tree_credit.md#branched-rollouts)."""
        return branched(rollout, points, n, generators, self._continue)
