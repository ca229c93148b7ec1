"""The update on one step's batch: credit weights → clipped policy loss → optimizer step, epoch by
epoch and minibatch by minibatch, with the rollout-mismatch metrics, truncated importance sampling
and a recomputed π_old (docs/mismatch.md#what-the-trainer-does), and the NaN guard."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from t2i_gcpo import metrics as M
from t2i_gcpo.config import TrainConfig
from t2i_gcpo.core.balanced import query_preserved_minibatches, reward_balanced_minibatches
from t2i_gcpo.core.losses import aggregation_denominator, policy_loss, rollout_mismatch, tis_weights
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import Rollout
from t2i_gcpo.policies.decode_loop import weights_changed
from t2i_gcpo.train.batch import Batch
from t2i_gcpo.train.credit import TRAIN_CONTEXT, compute_weights, credit_share, returns_advantages
from t2i_gcpo.train.distributed import gather_params, global_denominator, unwrap


def update(
    cfg: TrainConfig,
    batch: Batch,
    policy: Any,
    ref: Any,
    credit_ref: Any,
    optimizer: Any,
    accelerator: Any,
    loss_scale: float = 1.0,
    stale_rows: int = 0,
) -> tuple[dict, torch.Tensor]:
    """Clipped policy-gradient update(s) on one batch → (loss/credit statistics, weights [B, T]).

    Credit weights come from the scheme's registry entry with exactly the inputs it declares. When the
    batch is split into minibatches, weights and loss normalisers are computed on the whole batch
    first (schemes may need whole groups; the normaliser must be the batch's), so any split gives the
    same gradient. With several processes the normaliser is the global batch's (`global_denominator`),
    so DDP's gradient average equals one process training on the whole global batch. `loss_scale` 0
    lets a process without data join the others' gradient all-reduce.

    π_old is the sampler's recorded log-prob, or (rollout.old_logprobs=recompute) the update's own
    forward under the weights that sampled; the first pass measures how far the recorded ones are from
    it (`mismatch/*`, over rows from row `stale_rows` on: the first rows were carried over from the
    previous step and sampled by older weights).

    A scheme that returns token advantages (vine, tempo) gives the loss's Â [B, T] directly; the weights
    returned and logged are then their `credit_share`. optim.step_per_minibatch steps the optimizer
    after every minibatch instead (its own normaliser), over the split optim.minibatch_split makes."""
    job = UpdateJob(cfg, batch, policy, ref, credit_ref, accelerator, loss_scale, stale_rows)
    chunks = minibatch_rows(cfg, batch.rollout, batch.advantages)
    per_step = cfg.optim.step_per_minibatch and len(chunks) > 1
    job.recompute_old_logprobs(chunks)
    stats: dict[str, list[float]] = {}
    weights = torch.zeros_like(batch.rollout.mask)
    for epoch in range(cfg.optim.update_epochs):
        whole, denom = job.whole_batch_credit(chunks, per_step)
        optimizer.zero_grad(set_to_none=True)
        finite_loss = True
        for i, idx in enumerate(chunks):
            if per_step and i > 0:  # a step per minibatch: each its own gradient and normaliser
                optimizer.zero_grad(set_to_none=True)
                finite_loss, denom = True, None
            with _gradient_sync(policy, accelerator, last=per_step or i == len(chunks) - 1):
                loss, st, shown, denom = job.loss(idx, epoch, whole, denom, global_norm=i == 0 or per_step)
                finite_loss = finite_loss and bool(torch.isfinite(loss))
                accelerator.backward(loss * loss_scale)
            weights[idx] = shown.to(weights)
            for k, v in st.items():
                stats.setdefault(k, []).append(float(v))
            if per_step:
                grad_norm = optimizer_step(cfg, policy, optimizer, accelerator, finite_loss)
                stats.setdefault(M.GRAD_NORM, []).append(grad_norm)
        if not per_step:
            grad_norm = optimizer_step(cfg, policy, optimizer, accelerator, finite_loss)
            stats.setdefault(M.GRAD_NORM, []).append(grad_norm)
    losses_per_epoch = len(chunks) if per_step else 1  # separate steps: their losses are averaged
    return {
        **average(stats, cfg.optim.update_epochs * losses_per_epoch),
        **job.mismatch.metrics(job.ctx),
    }, weights


class UpdateJob:
    """One `update` call's batch and models: the credit of any rows, π_old, and the loss of a minibatch."""

    def __init__(
        self,
        cfg: TrainConfig,
        batch: Batch,
        policy: Any,
        ref: Any,
        credit_ref: Any,
        accelerator: Any,
        loss_scale: float,
        stale_rows: int,
    ) -> None:
        self.cfg, self.batch, self.policy, self.ref, self.credit_ref = cfg, batch, policy, ref, credit_ref
        self.accelerator, self.loss_scale = accelerator, loss_scale
        self.ctx = TRAIN_CONTEXT[cfg.rollout.train_logp]
        self.token_adv = returns_advantages(
            cfg.credit.scheme
        )  # never with weighted-token-mean (config check)
        ro = batch.rollout
        self.advantages = batch.advantages.to(
            ro.mask.device
        )  # rewards and advantages are computed on the CPU
        self.fresh = (torch.arange(len(ro)) >= stale_rows).to(ro.mask)  # [B]: rows sampled by these weights
        self.logp_old: torch.Tensor | None = None  # [B, T]: recomputed π_old, when later epochs need it fixed
        self.mismatch = MismatchMeter()

    def recompute_old_logprobs(self, chunks: list[torch.Tensor]) -> None:
        """rollout.old_logprobs=recompute over several epochs: π_old fixed before the first update."""
        if self.cfg.rollout.old_logprobs == "recompute" and self.cfg.optim.update_epochs > 1:
            self.logp_old = recompute_old_logprobs(
                self.cfg, self.batch.rollout, chunks, self.policy, self.accelerator, self.ctx
            )

    def credit(
        self, idx: torch.Tensor | None = None, dists: Any = None, rows: Rollout | None = None
    ) -> torch.Tensor:
        """The scheme's output — weights w [b, T], or token advantages — for rows `idx` (None: the batch);
        `rows`: the rollout's rows `idx` when already selected, `dists` their distributions."""
        batch = self.batch
        rewards = batch.reward.scores if batch.reward is not None else None  # for schemes needing rewards
        tree, leaves, adv = batch.tree, batch.leaves, self.advantages
        if idx is not None:
            rows = rows if rows is not None else batch.rollout.select(idx)
            rewards, adv = None if rewards is None else rewards[idx], adv[idx]
            tree, leaves = (None if x is None else x.select(idx) for x in (tree, leaves))
        return compute_weights(
            self.cfg.credit,
            batch.rollout if idx is None else rows,
            adv,
            self.policy,
            self.credit_ref,
            self.ctx,
            dists,
            rewards=rewards,
            tree=tree,
            leaves=leaves,
        )

    def whole_batch_credit(self, chunks: list[torch.Tensor], per_step: bool) -> tuple[Any, Any]:
        """(weights of the whole batch, its loss normaliser) when it is split into minibatches (schemes may
        need whole groups; the normaliser is the batch's unless each minibatch steps); else (None, None)."""
        if len(chunks) == 1:
            return None, None
        whole = self.credit()
        if per_step:
            return whole, None
        mask = self.batch.rollout.loss_mask
        return whole, aggregation_denominator(
            self.cfg.loss.aggregation, mask, None if self.token_adv else whole
        )

    def loss(
        self, idx: torch.Tensor, epoch: int, whole: Any, denom: Any, global_norm: bool
    ) -> tuple[torch.Tensor, dict, torch.Tensor, Any]:
        """Rows `idx`: the forward with gradient, π_old, credit, normaliser and clipped loss → (loss, its
        statistics, the credit shown as weights [b, T], the normaliser used). `global_norm`: this minibatch
        sets the normaliser of the global batch (several processes)."""
        cfg, accelerator = self.cfg, self.accelerator
        mb = self.batch.rollout.select(idx)
        with precision(cfg, accelerator):
            logp, dists = self.policy(
                mb, context=self.ctx, dists=True
            )  # [b, T] with gradient; lazy full dists
        recorded = mb.logp[self.ctx]  # [b, T] π_rollout
        if epoch == 0:  # weights unchanged since sampling: any gap is numerics
            self.mismatch.add(logp, recorded, mb.loss_mask * self.fresh[idx, None])
        old = recorded
        if cfg.rollout.old_logprobs == "recompute":  # one epoch: this forward is π_old itself
            old = self.logp_old[idx] if self.logp_old is not None else logp.detach()
        out = whole[idx] if whole is not None else self.credit(idx, dists, mb)
        a, w = (out, None) if self.token_adv else (self.advantages[idx], out)  # Â = A_it, or A_i·w_it
        if global_norm and accelerator.num_processes > 1:  # the global batch's normaliser
            local = (
                denom if denom is not None else aggregation_denominator(cfg.loss.aggregation, mb.loss_mask, w)
            )
            denom = global_denominator(local, accelerator, active=self.loss_scale != 0)
        loss, st = minibatch_loss(cfg, mb, a, logp, old, w, denom, self.ref, self.ctx, accelerator)
        st[M.ENTROPY] = token_entropy(dists, mb.loss_mask)  # before backward: FSDP reshards weights there
        shown = credit_share(out, mb.loss_mask) if self.token_adv else w
        st.update(credit_stats(shown, mb.loss_mask))
        return loss, st, shown, denom


def minibatch_rows(cfg: TrainConfig, ro: Rollout, advantages: torch.Tensor) -> list[torch.Tensor]:
    """The minibatches' row indices (optim.minibatch_split): rows in order, whole groups in order
    ("query"), or whole groups balanced by advantage mass ("balanced", core/balanced.py); at most one
    minibatch per group for the last two."""
    m, G, split = cfg.optim.minibatches, ro.group_size, cfg.optim.minibatch_split
    if split == "sequential" or m == 1:
        return list(torch.tensor_split(torch.arange(len(ro)), m))
    n = min(m, len(ro) // G)
    if split == "query":
        return query_preserved_minibatches(len(ro), G, n)
    if split == "balanced":
        return [rows.cpu() for rows in reward_balanced_minibatches(advantages.cpu(), G, n)]
    raise ValueError(f"unknown minibatch split {split!r}")


def minibatch_loss(
    cfg: TrainConfig,
    mb: Rollout,
    adv: torch.Tensor,
    logp: torch.Tensor,
    old: torch.Tensor,
    w: torch.Tensor,
    denom: Any,
    ref: Any,
    ctx: str,
    accelerator: Any,
) -> tuple[torch.Tensor, dict]:
    """The clipped loss of one minibatch (core.losses.policy_loss) with the KL term to the frozen
    reference when loss.beta > 0 and TIS weights min(π_old/π_rollout, C) when loss.tis_cap = C."""
    loss_cfg, recorded = cfg.loss, mb.logp[ctx]
    is_w = tis_weights(old, recorded, loss_cfg.tis_cap) if loss_cfg.tis_cap else None
    logp_ref = None
    if loss_cfg.beta > 0:
        with torch.no_grad(), precision(cfg, accelerator):
            logp_ref = ref(mb, context=ctx)
    loss, st = policy_loss(
        logp,
        old,
        adv,
        mb.loss_mask,
        weights=w,
        eps_low=loss_cfg.eps_low,
        eps_high=loss_cfg.eps_high,
        dual_clip=loss_cfg.dual_clip,
        aggregation=loss_cfg.aggregation,
        logp_ref=logp_ref,
        beta=loss_cfg.beta,
        kl_reweight=loss_cfg.kl_reweight,
        max_len=mb.max_len,
        denom=denom,
        is_weights=is_w,
    )
    if is_w is not None:
        st.update(tis_stats(is_w, old, recorded, mb.loss_mask))
    return loss, st


def optimizer_step(
    cfg: TrainConfig, policy: Any, optimizer: Any, accelerator: Any, finite_loss: bool
) -> float:
    """Clip the gradient, step, and return its norm. The NaN guard: a non-finite loss or gradient never
    reaches the weights, non-finite weights never reach a checkpoint (the run stops; Trainer.fit names
    the last good checkpoint)."""
    grad_norm = float(accelerator.clip_grad_norm_(policy.parameters(), cfg.optim.grad_clip or float("inf")))
    refuse_non_finite({"loss": not finite_loss, "gradient norm": not math.isfinite(grad_norm)}, accelerator)
    optimizer.step()
    optimizer.zero_grad(
        set_to_none=True
    )  # the gradients' memory is free until the next backward (the rollout)
    gather_params(policy)  # FSDP: the updated weights, whole for what follows (no-op otherwise)
    weights_changed(unwrap(policy))  # the kept decode loop refreshes (FSDP2 keeps version counters)
    refuse_non_finite({"updated weights": not weights_finite(policy)}, accelerator)
    return grad_norm


def average(stats: dict[str, list[float]], epochs: int) -> dict[str, float]:
    """Per-minibatch statistics → one number each: loss terms are minibatch shares of one loss (summed,
    averaged over epochs); the rest are averaged."""
    losses = {M.LOSS_POLICY, M.LOSS_KL}
    return {k: (sum(v) / epochs if k in losses else sum(v) / len(v)) for k, v in stats.items()}


class MismatchMeter:
    """Rollout vs update log-probs on the first pass: the token-weighted mean k3 and the largest
    |Δ log p| over the tokens it is given."""

    def __init__(self) -> None:
        self.k3_sum, self.tokens, self.max_abs = 0.0, 0.0, 0.0

    def add(self, logp: torch.Tensor, recorded: torch.Tensor, on: torch.Tensor) -> None:
        k3, gap = rollout_mismatch(logp, recorded, on)
        self.k3_sum, self.tokens = self.k3_sum + float(k3) * float(on.sum()), self.tokens + float(on.sum())
        self.max_abs = max(self.max_abs, float(gap))

    def metrics(self, ctx: str) -> dict[str, float]:
        if not self.tokens:  # every row was carried over (or a zero-loss stand-in)
            return {}
        return {
            M.MISMATCH_K3.format(context=ctx): self.k3_sum / self.tokens,
            M.MISMATCH_MAX.format(context=ctx): self.max_abs,
        }


def recompute_old_logprobs(
    cfg: TrainConfig, ro: Rollout, chunks: Any, policy: Any, accelerator: Any, ctx: str
) -> torch.Tensor:
    """π_old [B, T] of the trained context: a teacher-forced no-grad forward of the weights that sampled,
    minibatch by minibatch in the update's precision (the same numbers its first pass computes)."""
    out = torch.zeros_like(ro.mask, dtype=torch.float32)
    with torch.no_grad(), precision(cfg, accelerator):
        for idx in chunks:
            out[idx] = unwrap(policy)(ro.select(idx), context=ctx).float()
    return out


def precision(cfg: TrainConfig, accelerator: Any) -> Any:
    """optim.autocast=bf16: the update's forward passes under bfloat16 autocast (a no-op otherwise).
    Rollouts follow rollout.autocast (tasks/loop.py `sampler_precision`)."""
    return torch.autocast(accelerator.device.type, dtype=torch.bfloat16, enabled=cfg.optim.autocast == "bf16")


def _gradient_sync(policy: Any, accelerator: Any, last: bool) -> Any:
    """DDP: gradients are all-reduced on the last minibatch's backward only."""
    if last or accelerator.num_processes == 1:
        return contextlib.nullcontext()
    return accelerator.no_sync(policy)


# ============================================================================ the NaN guard


class NonFiniteError(UserError):
    """The loss, the gradient or the weights became NaN or inf: the run stops, its last checkpoint
    (written before) is kept. Not a usage error: exit status 1."""

    exit_code = 1


def refuse_non_finite(bad: dict[str, bool], accelerator: Any) -> None:
    """Raise NonFiniteError naming the first of `bad`'s quantities that is flagged on any process
    (all processes agree, so all stop together)."""
    flags = torch.tensor([float(v) for v in bad.values()], device=accelerator.device)
    if accelerator.num_processes > 1:
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    for name, flag in zip(bad, flags.tolist()):
        if flag:
            raise NonFiniteError(f"the {name} became NaN or inf")


def weights_finite(model: Any) -> bool:
    """Whether every trainable parameter (this process's shard under FSDP) is finite; one sync."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters() if p.requires_grad]
    return bool(torch.stack([p.detach().isfinite().all() for p in local]).all()) if local else True


# ============================================================================ statistics


def credit_stats(weights: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Max weight and normalised entropy of w/N per sequence, averaged (1 = uniform credit)."""
    n = mask.sum(-1).clamp_min(1)
    p = (weights * mask) / n[:, None]
    ent = -(p.clamp_min(1e-12).log() * p).sum(-1) / n.clamp_min(2).log()
    valid = mask.sum(-1) > 1
    return {
        M.CREDIT_WEIGHT_MAX: (weights * mask).max(-1).values[valid].mean().item() if valid.any() else 1.0,
        M.CREDIT_WEIGHT_ENTROPY: ent[valid].mean().item() if valid.any() else 1.0,
    }


def tis_stats(is_w: torch.Tensor, old: torch.Tensor, recorded: torch.Tensor, mask: torch.Tensor) -> dict:
    """Mean TIS weight and the share of tokens whose π_old/π_rollout went past the cap."""
    m = mask.bool()
    n = m.sum().clamp_min(1)
    capped = (old.detach().float() - recorded.float()).exp() > is_w
    return {M.TIS_WEIGHT_MEAN: float(is_w[m].sum() / n), M.TIS_CAPPED: float((capped & m).sum() / n)}


def token_entropy(dists: Any, mask: torch.Tensor) -> float:
    """Mean entropy (nats) over valid tokens of the trained distribution, chunk by chunk."""
    total = 0.0
    for sl, z in dists:
        logp = torch.log_softmax(z.float(), -1)
        ent = -(logp.exp() * logp).sum(-1)  # [B, t]
        total += float((ent * mask[:, sl].to(ent)).sum())
    return total / max(float(mask.sum()), 1.0)
