"""The RL loop: rollout → decode → reward → advantages → credit → clipped loss → optimizer step.

`train_step` is the algorithm and reads top to bottom; `Trainer` holds the boilerplate
(accelerate, prompts, logging, checkpoints, resume, Ctrl-C and SIGTERM) and stays out of its way.
"""

from __future__ import annotations

import copy
import json
import math
import signal
import time
from pathlib import Path
from typing import Any

import torch

from t2i_gcpo import metrics as M
from t2i_gcpo.config import TrainConfig, save_config, to_dict
from t2i_gcpo.core.advantages import dynamic_sampling_filter, group_advantages
from t2i_gcpo.core.losses import aggregation_denominator, policy_loss, rollout_mismatch, tis_weights
from t2i_gcpo.core.schemes import get_scheme
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import PromptRecord, Rollout, SamplingParams
from t2i_gcpo.tasks.loop import group_generators, sample_and_score
from t2i_gcpo.train.batch import Batch
from t2i_gcpo.train.checkpoint import (
    atomic_write_text,
    checkpoint_dir,
    latest_checkpoint,
    load_carry,
    load_optimizer,
    load_scheduler,
    load_trainer_state,
    mark_finished,
    save_checkpoint,
)
from t2i_gcpo.train.credit import TRAIN_CONTEXT, compute_weights, reads_recorded_contrast
from t2i_gcpo.train.data import PromptStream
from t2i_gcpo.train.distributed import (
    check_launch,
    full_optimizer_state_dict,
    full_state_dict,
    gather_params,
    global_denominator,
    load_full_optimizer_state_dict,
    param_checksum,
    unwrap,
)
from t2i_gcpo.train.schedule import build_scheduler, current_lr, restore_scheduler
from t2i_gcpo.train.tracking import finish_trackers, log_metrics, resolve_report_to, start_trackers

# ============================================================================ algorithm logic


def update(cfg: TrainConfig, batch: Batch, policy: Any, ref: Any, credit_ref: Any, optimizer: Any,
           accelerator: Any, loss_scale: float = 1.0, stale_rows: int = 0) -> tuple[dict, torch.Tensor]:  # fmt: skip
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
    previous step and sampled by older weights)."""
    ctx, loss_cfg = TRAIN_CONTEXT[cfg.rollout.train_logp], cfg.loss
    ro = batch.rollout
    adv = batch.advantages.to(ro.mask.device)  # rewards and advantages are computed on the CPU
    chunks = torch.tensor_split(torch.arange(len(ro)), cfg.optim.minibatches)
    stats: dict[str, list[float]] = {}
    weights = torch.zeros_like(ro.mask)
    recompute = cfg.rollout.old_logprobs == "recompute"
    logp_old = None  # [B, T]: recomputed π_old, when later epochs need it fixed
    if recompute and cfg.optim.update_epochs > 1:
        logp_old = recompute_old_logprobs(cfg, ro, chunks, policy, accelerator, ctx)
    fresh = (torch.arange(len(ro)) >= stale_rows).to(ro.mask)  # [B]: rows sampled by these weights
    k3_sum, n_fresh, max_abs = 0.0, 0.0, 0.0
    for _epoch in range(cfg.optim.update_epochs):
        finite_loss = True
        whole = None  # weights of the whole batch, when it is split
        if len(chunks) > 1:
            whole = compute_weights(cfg.credit, ro, adv, policy, credit_ref, ctx)
        denom = None
        if len(chunks) > 1:
            denom = aggregation_denominator(loss_cfg.aggregation, ro.loss_mask, whole)
        optimizer.zero_grad(set_to_none=True)
        for i, idx in enumerate(chunks):
            mb, mb_adv = ro.select(idx), adv[idx]
            sync = i == len(chunks) - 1
            with accelerator.no_sync(policy) if not sync and accelerator.num_processes > 1 else _null():
                with precision(cfg, accelerator):
                    logp, dists = policy(mb, context=ctx, dists=True)  # [B, T] with gradient; lazy full dists
                recorded = mb.logp[ctx]  # [B, T] π_rollout
                if _epoch == 0:  # weights unchanged since sampling: any gap is numerics
                    on = mb.loss_mask * fresh[idx, None]
                    k3, gap = rollout_mismatch(logp, recorded, on)
                    k3_sum, n_fresh = k3_sum + float(k3) * float(on.sum()), n_fresh + float(on.sum())
                    max_abs = max(max_abs, float(gap))
                old = recorded
                if recompute:  # one epoch: this forward is π_old itself
                    old = logp_old[idx] if logp_old is not None else logp.detach()
                is_w = tis_weights(old, recorded, loss_cfg.tis_cap) if loss_cfg.tis_cap else None
                w = (
                    whole[idx]
                    if whole is not None
                    else compute_weights(cfg.credit, mb, mb_adv, policy, credit_ref, ctx, dists)
                )
                if i == 0 and accelerator.num_processes > 1:  # the global batch's normaliser
                    local = (
                        aggregation_denominator(loss_cfg.aggregation, mb.loss_mask, w)
                        if denom is None
                        else denom
                    )
                    denom = global_denominator(local, accelerator, active=loss_scale != 0)
                logp_ref = None
                if loss_cfg.beta > 0:
                    with torch.no_grad(), precision(cfg, accelerator):
                        logp_ref = ref(mb, context=ctx)
                loss, st = policy_loss(
                    logp, old, mb_adv, mb.loss_mask,
                    weights=w, eps_low=loss_cfg.eps_low, eps_high=loss_cfg.eps_high,
                    dual_clip=loss_cfg.dual_clip, aggregation=loss_cfg.aggregation,
                    logp_ref=logp_ref, beta=loss_cfg.beta, kl_reweight=loss_cfg.kl_reweight,
                    max_len=ro.max_len, denom=denom, is_weights=is_w,
                )  # fmt: skip
                if is_w is not None:
                    st.update(tis_stats(is_w, old, recorded, mb.loss_mask))
                # before backward: FSDP reshards weights there
                st[M.ENTROPY] = token_entropy(dists, mb.loss_mask)
                finite_loss = finite_loss and bool(torch.isfinite(loss))
                accelerator.backward(loss * loss_scale)
            weights[idx] = w.to(weights)
            st.update(credit_stats(w, mb.loss_mask))
            for k, v in st.items():
                stats.setdefault(k, []).append(float(v))
        grad_norm = accelerator.clip_grad_norm_(policy.parameters(), cfg.optim.grad_clip or float("inf"))
        stats.setdefault(M.GRAD_NORM, []).append(float(grad_norm))
        # the NaN guard: a non-finite loss or gradient never reaches the weights, non-finite weights
        # never reach a checkpoint (the run stops; Trainer.fit names the last good checkpoint)
        refuse_non_finite(
            {"loss": not finite_loss, "gradient norm": not math.isfinite(float(grad_norm))}, accelerator
        )
        optimizer.step()
        gather_params(policy)  # FSDP: the updated weights, whole for what follows (no-op otherwise)
        refuse_non_finite({"updated weights": not weights_finite(policy)}, accelerator)
    losses = {M.LOSS_POLICY, M.LOSS_KL}  # minibatch shares of one loss: summed; the rest averaged
    out = {
        k: (sum(v) / cfg.optim.update_epochs if k in losses else sum(v) / len(v)) for k, v in stats.items()
    }
    if n_fresh:
        out[M.MISMATCH_K3.format(context=ctx)] = k3_sum / n_fresh
        out[M.MISMATCH_MAX.format(context=ctx)] = max_abs
    return out, weights


def recompute_old_logprobs(cfg: TrainConfig, ro: Rollout, chunks: Any, policy: Any, accelerator: Any,
                           ctx: str) -> torch.Tensor:  # fmt: skip
    """π_old [B, T] of the trained context: a teacher-forced no-grad forward of the weights that sampled,
    minibatch by minibatch in the update's precision (the same numbers its first pass computes)."""
    out = torch.zeros_like(ro.mask, dtype=torch.float32)
    with torch.no_grad(), precision(cfg, accelerator):
        for idx in chunks:
            out[idx] = unwrap(policy)(ro.select(idx), context=ctx).float()
    return out


def train_step(t: Trainer, step: int) -> dict:
    """One RL step. Reads top to bottom; every call goes into core/, tasks/, policies/ or rewards/."""
    cfg = t.cfg
    G, P = cfg.rollout.group_size, t.local_prompts
    timings = {M.TIME_ROLLOUT: 0.0, M.TIME_REWARD: 0.0}
    kept: list[Batch] = [t.carry] if t.carry is not None else []  # the last step's surplus first
    carried, t.carry = groups_in(kept), None
    all_scores, all_details, groups_seen, groups_empty = [], [], 0, 0
    budget = t.draw_budget  # groups this process may still draw this step
    for round_ in range(t.rounds):
        missing = P - groups_in(kept)  # groups this process still needs
        if missing <= 0 or budget <= 0:
            break
        # 1. rollout → decode → reward: this process's missing groups, over-sampled by the expected
        #    share without signal (one batched round usually fills the step); each group seeded by its
        #    stream slot
        slots, prompts = t.prompts_for(step, round_, min(t.groups_to_draw(missing), budget))
        budget -= len(prompts)
        scored = sample_and_score(unwrap(t.policy), t.reward, prompts, G, t.sampling,
                                  group_generators(cfg.seed, "train", slots))  # fmt: skip
        timings[M.TIME_ROLLOUT] += scored.seconds["rollout"]
        timings[M.TIME_REWARD] += scored.seconds["reward"]
        reward = scored.reward  # NaN/raise → RewardError
        all_scores.append(reward.scores)
        all_details += reward.details
        # 2. group advantages; DAPO dynamic sampling keeps only groups with signal
        adv = group_advantages(reward.scores, G, scale=cfg.advantage.scale, eps=cfg.advantage.eps)
        keep = torch.ones(len(adv), dtype=torch.bool)
        if cfg.advantage.dynamic_sampling:
            keep, _ = dynamic_sampling_filter(reward.scores, G)
        groups_seen += len(prompts)
        groups_empty += len(prompts) - int(keep.sum()) // G
        idx = keep.nonzero().flatten()
        if len(idx):
            kept.append(Batch(scored.rollout, adv, reward, scored.outputs).select(idx))
    batch = Batch.concat(kept)
    if batch is not None and groups_in([batch]) > P:  # the surplus of an over-sampled round
        rows = torch.arange(len(batch.rollout))
        if cfg.advantage.carry_over:
            t.carry = batch.select(rows[P * G : (P + P // 2) * G]) if P // 2 else None
        batch = batch.select(rows[: P * G])
    # 3. credit → loss → optimizer. A process whose groups all lacked signal joins the others'
    #    all-reduce with a zero loss; if no process has data, the step makes no update.
    tic = time.perf_counter()
    stats, loss_scale = {}, 1.0
    if t.any_process(batch is not None):
        if batch is None:
            batch = Batch(scored.rollout, torch.zeros(len(adv)), reward, scored.outputs).select(
                torch.arange(G)
            )
            loss_scale = 0.0
        t.refresh_credit_reference()
        stats, weights = update(cfg, batch, t.policy, t.ref, t.credit_ref, t.optimizer, t.accelerator,
                                loss_scale, stale_rows=carried * G if loss_scale else len(batch.rollout))  # fmt: skip
        if loss_scale:
            stats.update(t.task.credit_metrics(weights.cpu(), batch.rollout.to("cpu"), batch.reward.details))
    timings[M.TIME_UPDATE] = time.perf_counter() - tic
    scores = torch.cat(all_scores)
    out = {M.REWARD_MEAN: scores.mean().item(), M.REWARD_STD: scores.std().item() if len(scores) > 1 else 0.0,
           M.ZERO_STD_RATIO: groups_empty / max(groups_seen, 1), M.GROUPS_KEPT: len(batch.rollout) // G if batch and loss_scale else 0,
           M.GROUPS_DRAWN: groups_seen, M.GROUPS_CARRIED: carried,
           **t.task.step_metrics(all_details), **stats, **timings}  # fmt: skip
    if batch and loss_scale and cfg.sample_every and step % cfg.sample_every == 0:
        t.last_batch = batch
    return out


# ============================================================================ helpers


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


def resolve_autocast(cfg: TrainConfig, device_type: str, policy: Any) -> None:
    """rollout.autocast / optim.autocast 'auto' → 'bf16' where `device_type` multiplies bf16 natively,
    else 'none'; the rollout only for a policy whose sampler declares bf16 support
    (`capabilities.bf16_sampling`: the ShapeWorld priors, the fused text decoder). In place: the run's
    config.yaml then says what ran, and a resumed run keeps it."""
    from t2i_gcpo.hardware import native_bf16

    native = native_bf16(device_type)
    if cfg.rollout.autocast == "auto":
        sampler = unwrap(policy).capabilities.bf16_sampling
        cfg.rollout.autocast = "bf16" if native and sampler else "none"
    if cfg.optim.autocast == "auto":
        cfg.optim.autocast = "bf16" if native else "none"


def sampling_params(cfg: TrainConfig) -> SamplingParams:
    """How the run samples (rollouts and held-out evaluation); rollout.cfg_scale already resolved."""
    return SamplingParams(
        temperature=cfg.rollout.temperature, top_k=cfg.rollout.top_k, top_p=cfg.rollout.top_p,
        guidance_scale=float(cfg.rollout.cfg_scale), steps=cfg.rollout.steps,
        guidance_schedule=cfg.rollout.guidance_schedule, max_new_tokens=cfg.rollout.max_new_tokens,
        reveal_order=cfg.rollout.reveal_order, score_negative=reads_recorded_contrast(cfg.credit),
        autocast=cfg.rollout.autocast,
    )  # fmt: skip


def precision(cfg: TrainConfig, accelerator: Any) -> Any:
    """optim.autocast=bf16: the update's forward passes under bfloat16 autocast (a no-op otherwise).
    Rollouts follow rollout.autocast (tasks/loop.py `sampler_precision`)."""
    return torch.autocast(accelerator.device.type, dtype=torch.bfloat16, enabled=cfg.optim.autocast == "bf16")


def groups_in(batches: list[Batch]) -> int:
    return sum(len(b.rollout) // b.rollout.group_size for b in batches)


class _null:
    def __enter__(self) -> None: ...
    def __exit__(self, *a: Any) -> None: ...


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


# ============================================================================ boilerplate: setup, logging, checkpoints


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C; schedulers, `docker stop`, systemd, `kill`


class Interrupted(KeyboardInterrupt):
    """A stop signal (SIGINT or SIGTERM); `signum` gives the exit status 128 + signum."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__()
        self.signum = signum


class StopRequested(Interrupted):
    """A stop signal honoured at a step boundary: every process stops there together, after the
    checkpoint."""


class Trainer:
    def __init__(self, cfg: TrainConfig, run_dir: Path | None, prompts: list[PromptRecord], policy: Any, reward: Any,
                 task: Any, eval_prompts: list[PromptRecord] | None = None, resume: bool = False):  # fmt: skip
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs, DistributedType, broadcast_object_list

        resolve_autocast(cfg, "cuda" if torch.cuda.is_available() else "cpu", policy)  # before config.yaml
        trackers = resolve_report_to(cfg.report_to)  # a missing tracker package fails before any work
        self.cfg, self.reward, self.task, self.eval_prompts = cfg, reward, task, eval_prompts
        self.sampling = sampling_params(cfg)
        if cfg.rollout.reveal_order and policy.capabilities.reveal_order:
            # a masked model trained under an order keeps it as its default: its checkpoints then sample
            # (`eval`, `sample`, `credit-map`) the way they were trained
            policy.keep_reveal_order(cfg.rollout.reveal_order)
        check_launch()  # before accelerate: it would import DeepSpeed for a DeepSpeed launch
        self.accelerator = Accelerator(
            cpu=not torch.cuda.is_available(),
            kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
            log_with=trackers or None,
            project_dir=".",  # TensorBoard's folder is set once the run directory is known (start_trackers)
        )
        acc = self.accelerator
        check_launch(acc)  # the strategy asked for is the one accelerate gave
        n_proc = acc.num_processes
        if cfg.rollout.prompts_per_step % n_proc:  # before the run directory is created
            raise UserError(
                f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} must be divisible by the {n_proc} processes"
            )
        self.fsdp = acc.distributed_type == DistributedType.FSDP
        if self.fsdp and not acc.is_fsdp2:
            raise UserError("FSDP needs fsdp_version: 2 in the accelerate config (FSDP1 is not supported)")
        self.lock = None  # a default run directory's lock (an --out one is taken in train.run.prepare)
        if run_dir is None:  # one default name, created (exclusively) by the main process
            run_dir = Path()
            if acc.is_main_process:
                from t2i_gcpo.outdir import lock_output

                run_dir = claim_run_dir(Path("runs") / f"{cfg.algo}-{time.strftime('%Y%m%d-%H%M%S')}")
                self.lock = lock_output(run_dir)
        self.run_dir = run_dir = (
            Path(broadcast_object_list([str(run_dir)])[0]) if acc.num_processes > 1 else run_dir
        )
        cfg.out = str(run_dir)
        if acc.is_main_process and not resume:
            prepare_run_dir(cfg, run_dir)
        acc.wait_for_everyone()
        self.local_prompts = cfg.rollout.prompts_per_step // n_proc
        # dynamic sampling: rounds per step, and how many groups a step may draw (a round's slots are
        # `blocks` blocks of P, so an over-sampled round never reuses another round's slots). The slot
        # layout is the same without dynamic sampling: runs with one seed draw their step's first
        # groups from the same slots (prompts and sampling seeds) whatever the algorithm
        dyn = cfg.advantage
        self.rounds = 1 + (dyn.max_resample if dyn.dynamic_sampling else 0)
        self.blocks = math.ceil(dyn.draw_budget)
        self.draw_budget = (
            int(dyn.draw_budget * self.local_prompts) if dyn.dynamic_sampling else self.local_prompts
        )
        self.zero_std_estimate: float | None = None  # r̂: running share of groups without signal
        self.carry: Batch | None = None  # groups with signal drawn beyond P, trained at the next step
        self.stream = PromptStream(prompts, cfg.seed)
        torch.manual_seed(cfg.seed)
        # references: the frozen initial policy (KL term, or a credit scheme comparing to it), or a
        # snapshot of the policy that sampled each step (credit.reference=rollout)
        compares = "ref_dists" in get_scheme(cfg.credit.scheme).needs
        needs_ref = cfg.loss.beta > 0 or (compares and cfg.credit.reference == "initial")
        self.ref = copy.deepcopy(policy).eval().requires_grad_(False) if needs_ref else None
        self.rollout_ref = None
        if compares and cfg.credit.reference == "rollout":
            self.rollout_ref = copy.deepcopy(policy).eval().requires_grad_(False)
        self.credit_ref = self.rollout_ref if self.rollout_ref is not None else self.ref
        policy.keep_full_precision()  # run checkpoints must be lossless: resume is exact
        self.start_step, self.ckpt = 0, None
        if resume:
            policy = self._load_resume(policy)
        params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = optimizer = torch.optim.AdamW(
            params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay
        )
        # stepped once per training step, by the loop (not prepared: accelerate would step it once per process)
        self.scheduler = build_scheduler(cfg.optim, optimizer, cfg.steps)
        if resume and self.ckpt is not None and not self.fsdp:
            load_optimizer(self.ckpt, self.optimizer.load_state_dict)
        # FSDP: the prepared model is sharded in place; the main process keeps a CPU copy to write checkpoints
        self.save_copy = copy.deepcopy(policy).cpu() if self.fsdp and acc.is_main_process else None
        self.policy, self.optimizer = acc.prepare(policy, self.optimizer)
        if self.fsdp:
            # weights gathered once per step (distributed.gather_params) and kept whole through rollout,
            # forward and backward; FSDP shards gradients and optimizer states
            self.policy.set_reshard_after_forward(False)
            if resume and self.ckpt is not None:
                load_optimizer(
                    self.ckpt,
                    lambda state: load_full_optimizer_state_dict(self.policy, self.optimizer, state),
                )
            gather_params(self.policy)
        if resume:
            saved = load_scheduler(self.ckpt) if self.ckpt is not None else None
            restore_scheduler(self.scheduler, saved, self.start_step)
            if acc.is_main_process:  # everything loaded: only now change the run directory
                continue_run_dir(run_dir, self.start_step, cfg.steps)
            acc.wait_for_everyone()
        for frozen in (self.ref, self.rollout_ref):
            if frozen is not None:
                frozen.to(acc.device)
        self.last_batch: Batch | None = None
        self.stop_requested = 0  # the stop signal received (0: none)
        self.final_phase = False  # in the final evaluation: a stop signal ends it at once
        start_trackers(acc, trackers, run_dir, to_dict(cfg), self.start_step, resume=resume)

    # -- prompts and seeds: pure functions of (seed, step, round, rank) so resume is exact
    def prompts_for(self, step: int, round_: int, count: int) -> tuple[list[int], list[PromptRecord]]:
        """This process's first `count` prompts for (step, round), with their positions in the prompt
        stream. A round owns `blocks` blocks of P slots; process k takes slots k·p … k·p + p − 1 of each
        block in turn (p = P / processes), so a slot is the same whatever the number of processes."""
        acc, P, p = self.accelerator, self.cfg.rollout.prompts_per_step, self.local_prompts
        if count > self.blocks * p:
            raise ValueError(f"a round holds at most {self.blocks * p} groups per process, asked for {count}")
        base = (step * (1 + self.cfg.advantage.max_resample) + round_) * self.blocks * P
        slots = [base + (j // p) * P + acc.process_index * p + j % p for j in range(count)]
        return slots, [self.stream.take(slot, 1)[0] for slot in slots]

    def groups_to_draw(self, missing: int) -> int:
        """Groups to sample for `missing` groups with signal: missing / (1 − r̂), r̂ the running share
        of groups without signal (no over-sampling before the first step has measured it)."""
        r = self.zero_std_estimate
        if not self.cfg.advantage.dynamic_sampling or r is None:
            return missing
        return math.ceil(missing / max(1.0 - r, 0.05) - 1e-9)

    def observe_zero_std(self, ratio: float) -> None:
        """Update r̂ from a step's measured share (averaged over processes, so every rank agrees)."""
        r = self.zero_std_estimate
        self.zero_std_estimate = ratio if r is None else 0.8 * r + 0.2 * ratio

    def refresh_credit_reference(self) -> None:
        """credit.reference=rollout: snapshot the weights that sampled this step (no cached logits)."""
        if self.rollout_ref is not None:
            self.rollout_ref.load_state_dict(full_state_dict(self.policy, everywhere=True))

    def any_process(self, flag: bool) -> bool:
        t = torch.tensor([float(flag)], device=self.accelerator.device)  # NCCL reduces GPU tensors only
        if self.accelerator.num_processes > 1:
            torch.distributed.all_reduce(t)
        return bool(t.item() > 0)

    # -- the loop
    def fit(self) -> dict:
        from tqdm import tqdm

        cfg, acc = self.cfg, self.accelerator
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        bar = tqdm(total=cfg.steps, initial=self.start_step, desc=f"{cfg.algo}", disable=not acc.is_main_process,
                   dynamic_ncols=True)  # fmt: skip
        step = self.start_step
        if cfg.eval_every > 0 and self.start_step == 0 and cfg.steps > 0 and self.eval_prompts:
            base, headline = self.evaluate()
            self._log(0, base, append_only=True)  # the base model: curves start at step 0
            self._announce(0, headline, bar)
        try:
            for step in range(self.start_step + 1, cfg.steps + 1):
                tic = time.perf_counter()
                lr = current_lr(self.scheduler)  # the lr this step's update used
                row = train_step(self, step)
                self.scheduler.step()  # once per training step, with or without an update
                row[M.TIME_STEP] = time.perf_counter() - tic
                row[M.LR] = lr
                row = self._gather(row)
                if cfg.advantage.dynamic_sampling:
                    self.observe_zero_std(row[M.ZERO_STD_RATIO])
                if cfg.eval_every > 0 and step % cfg.eval_every == 0 and step != cfg.steps:
                    metrics, headline = self.evaluate()
                    row.update(metrics)
                    self._announce(step, headline, bar)
                self._log(step, row)
                bar.update(1)
                shown = {"reward": f"{row[M.REWARD_MEAN]:.3f}"}
                for key, name in ((M.STRICT, "strict"), (M.ACCURACY, "acc")):  # the task's step score
                    if key in row:
                        shown[name] = f"{row[key]:.2f}"
                bar.set_postfix(shown)
                stop = self._stop()  # one all-reduce: every process gets the same answer
                if step % cfg.save_every == 0 or step == cfg.steps or stop:
                    self.save(step)
                if stop:
                    raise StopRequested(self.stop_requested)
            self._check_replicas()
            # the final evaluation: a stop signal ends it at once (the last checkpoint is saved; a
            # resume evaluates again), with the same line and the report as far as it goes
            self.final_phase = True
            if self.stop_requested:  # a stop signal after the last step's save: no final evaluation
                raise StopRequested(self.stop_requested)
            final = {}
            if cfg.eval_every >= 0 and self.eval_prompts:
                final, headline = self.evaluate()
                self._log(cfg.steps, final, append_only=True)
                self._announce(cfg.steps, headline, bar)
                if acc.is_main_process:
                    (self.run_dir / "eval.json").write_text(json.dumps(final, indent=1))
            self._report()
            if acc.is_main_process:
                ckpt = checkpoint_dir(self.run_dir, cfg.steps)
                if (ckpt / "trainer_state.json").is_file():  # resuming this run now has nothing to do
                    mark_finished(ckpt)
                bar.write(f"run directory: {self.run_dir} (open report.html)")
        except NonFiniteError as e:
            bar.close()
            kept = "no checkpoint was written before it"
            ckpt = latest_checkpoint(self.run_dir)
            if ckpt is not None:
                saved = load_trainer_state(ckpt)["step"]
                kept = (
                    f"the last good checkpoint (step {saved}) is kept in {self.run_dir}; resuming repeats the "
                    f"same steps: end the run there with --resume {self.run_dir} --steps N ({saved} ≤ N < {step})"
                )
            raise NonFiniteError(
                f"step {step}: {e}, stopped before the update was applied or saved; {kept}; or start over "
                "with other settings (e.g. a lower optim.lr)"
            ) from None
        except KeyboardInterrupt as interrupt:
            for sig in STOP_SIGNALS:  # stopping: a late Ctrl-C must not cut the line or the report short
                signal.signal(sig, signal.SIG_IGN)
            bar.close()
            if acc.is_main_process:
                print(self._interrupted_line(), flush=True)
            if self.final_phase:
                self._report_as_far_as_possible()
            if isinstance(interrupt, StopRequested):  # not after a second Ctrl-C: it may land in a collective
                self._shutdown()
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            bar.close()
        self._shutdown()
        return final

    def _interrupted_line(self) -> str:
        """What a stopped run says: where it stopped and the command that continues it."""
        resume = f"t2i-gcpo train --resume {self.run_dir}"
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            return f"interrupted before the first checkpoint; start it again from step 0 with: {resume}"
        where = " during the final evaluation" if self.final_phase else ""
        return f"interrupted{where}: checkpoint at step {load_trainer_state(ckpt)['step']}; continue with: {resume}"

    def _report_as_far_as_possible(self) -> None:
        """report.html from what the run logged so far (stopped in its final evaluation)."""
        try:
            self._report()
        except Exception as e:  # the report is a convenience: its failure must not hide the resume line
            if self.accelerator.is_main_process:
                print(f"note: report.html not written: {e}")

    def _shutdown(self) -> None:
        """End a run every process reached together: close the trackers and wait until all ranks are
        done, so none leaves (train.distributed.leave_process_group) while another still needs it."""
        finish_trackers(self.accelerator)
        self.accelerator.wait_for_everyone()

    def _announce(self, step: int, headline: str, bar: Any) -> None:
        """One console line per held-out evaluation, above the progress bar."""
        if self.accelerator.is_main_process:
            bar.write(f"step {step}: {headline}")

    def evaluate(self) -> tuple[dict, str]:
        """The task's held-out score of the current policy: (metrics to log, the line to print)."""
        cfg = self.cfg
        res = self.task.evaluate(unwrap(self.policy), self.reward, self.eval_prompts, cfg.eval_images_per_prompt,
                                 self.sampling, seed=cfg.seed, accelerator=self.accelerator)  # fmt: skip
        return res["metrics"], res["headline"]

    def _check_replicas(self) -> None:
        """Write run_dir/processes.json: how many processes trained and each one's parameter checksum
        (they must agree: DDP keeps replicas identical; FSDP: each process's checksum of the gathered
        weights)."""
        acc = self.accelerator
        total = param_checksum(self.policy)
        sums = acc.gather(total.reshape(1).to(acc.device)).tolist()
        if acc.is_main_process:
            info = {
                "num_processes": acc.num_processes,
                "distributed_type": str(acc.distributed_type.value),
                "param_checksums": sums,
                "replicas_equal": len(set(sums)) == 1,
            }
            (self.run_dir / "processes.json").write_text(json.dumps(info, indent=1))
            if not info["replicas_equal"]:
                raise RuntimeError(f"parameters differ across processes: {sums}")

    def _on_signal(self, signum: int, _frame: Any) -> None:
        """Ctrl-C or SIGTERM: finish the step, save, stop. A second one stops at once."""
        if self.stop_requested or self.final_phase:
            raise Interrupted(signum)
        self.stop_requested = signum
        if self.accelerator.is_main_process:
            name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            print(f"\n{name}: finishing this step, saving a checkpoint …", flush=True)

    def _stop(self) -> bool:
        return self.any_process(bool(self.stop_requested))

    def _gather(self, row: dict) -> dict:
        """Average per-process metrics, each key over the processes that report it (their prompt tags
        can differ: `strict/<tag>` exists only where the tag was drawn). Unweighted: exact for means over
        equal shares (reward/mean without dynamic sampling), approximate otherwise."""
        from accelerate.utils import gather_object

        if self.accelerator.num_processes == 1:
            return row
        rows = gather_object([{k: float(v) for k, v in row.items()}])  # one dict per process
        keys = sorted(set().union(*rows))
        return {k: sum(r[k] for r in rows if k in r) / sum(k in r for r in rows) for k in keys}

    def _log(self, step: int, row: dict, append_only: bool = False) -> None:
        if not self.accelerator.is_main_process:
            return
        row = {M.STEP: step, **{k: (v if math.isfinite(v) else None) for k, v in row.items()}}
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        log_metrics(self.accelerator, row, step)
        if (
            not append_only
            and self.cfg.sample_every
            and step % self.cfg.sample_every == 0
            and self.last_batch
        ):
            self._draw(step, self.last_batch)
            self._report()

    def _draw(self, step: int, batch: Batch) -> None:
        from t2i_gcpo.train.visuals import save_credit_maps, save_sample_grid, save_text_heatmap

        if not torch.is_tensor(batch.outputs):  # text: a token heatmap page instead of image grids
            save_text_heatmap(self.run_dir / "credit_maps" / f"step_{step:06d}.html", batch, unwrap(self.policy),
                              self.credit_ref, self.cfg, step, self.task)  # fmt: skip
            return
        save_sample_grid(
            self.run_dir / "samples" / f"step_{step:06d}.png", batch, self.cfg.rollout.group_size
        )
        save_credit_maps(self.run_dir / "credit_maps" / f"step_{step:06d}.png", batch, unwrap(self.policy),
                         self.credit_ref, self.cfg, step)  # fmt: skip

    def _report(self) -> None:
        if self.accelerator.is_main_process:
            from t2i_gcpo.viz.report import write_run_report

            write_run_report(self.run_dir)

    def save(self, step: int) -> None:
        acc = self.accelerator
        acc.wait_for_everyone()
        carry = [self.carry]  # one entry per process
        if acc.num_processes > 1:
            from accelerate.utils import gather_object

            carry = gather_object(carry)
        policy, optimizer_state = unwrap(self.policy), None
        if self.fsdp:  # gather the shards (every process), write them from the main process's copy
            weights = full_state_dict(self.policy)
            optimizer_state = full_optimizer_state_dict(self.policy, self.optimizer)
            if acc.is_main_process:
                self.save_copy.load_state_dict(weights)
                policy = self.save_copy
        if acc.is_main_process:
            if optimizer_state is None:
                optimizer_state = self.optimizer.state_dict()
            state = {"algo": self.cfg.algo, "zero_std_estimate": self.zero_std_estimate}
            save_checkpoint(self.run_dir, step, policy, optimizer_state, state,
                            carry=carry if any(c is not None for c in carry) else None,
                            scheduler_state=self.scheduler.state_dict())  # fmt: skip
        acc.wait_for_everyone()

    def _load_resume(self, policy: Any) -> Any:
        from t2i_gcpo.policies.registry import load_policy

        self.ckpt = latest_checkpoint(self.run_dir)
        if self.ckpt is None:  # stopped before its first save: the run starts again from its config
            return policy
        state = load_trainer_state(self.ckpt)
        self.start_step = state["step"]
        self.zero_std_estimate = state.get("zero_std_estimate")
        carry = load_carry(self.ckpt, self.accelerator.device)
        if carry is not None and len(carry) == self.accelerator.num_processes:
            self.carry = carry[self.accelerator.process_index]
        elif carry is not None and self.accelerator.is_main_process:  # another process count: drop it
            print(
                f"note: {len(carry)} processes carried groups into step {self.start_step + 1}; dropped them"
            )
        if self.start_step > self.cfg.steps:
            raise UserError(
                f"cannot resume: {self.run_dir} has trained {self.start_step} steps, more than steps={self.cfg.steps}"
            )
        resumed = load_policy(str(self.ckpt / "model"), self.cfg.model_options)
        policy.load_state_dict(resumed.state_dict())
        return policy


def claim_run_dir(base: Path) -> Path:
    """Create `base`, or `base-2`, `base-3` … if it exists, exclusively: two runs started in the same
    second never share a directory."""
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise UserError(f"cannot create a run directory next to {base}: too many runs share its name")


def prepare_run_dir(cfg: TrainConfig, run_dir: Path) -> None:
    """Mark `run_dir` as a run (outdir.is_run_dir) and save its config: from here on `--resume` continues
    it, from its latest checkpoint or, before the first one, from the beginning."""
    from t2i_gcpo.outdir import RUN_MARKER

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_MARKER).write_text("written by t2i-gcpo train: this folder is a run (config.yaml)\n")
    save_config(cfg, run_dir / "config.yaml")


def continue_run_dir(run_dir: Path, start_step: int, steps: int) -> None:
    """Before a resumed run trains from `start_step` to `steps`: record `steps` in its saved config (a
    later plain --resume continues to the same total), drop metric rows the run will write again, and
    drop eval.json when the run goes past the end it described."""
    import yaml

    saved = run_dir / "config.yaml"
    data = yaml.safe_load(saved.read_text())
    if data.get("steps") != steps:
        data["steps"] = steps
        atomic_write_text(saved, yaml.safe_dump(data, sort_keys=False))
    if start_step == 0:  # no checkpoint yet: the run starts again, base evaluation included
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    else:
        truncate_metrics(run_dir / "metrics.jsonl", start_step, redo_final=start_step == steps)
    if start_step < steps:
        (run_dir / "eval.json").unlink(missing_ok=True)


def _is_eval_only(row: dict) -> bool:
    """A held-out evaluation row of its own (step 0's base model, or a run's final one)."""
    return all(k == M.STEP or k.startswith("eval/") for k in row)


def truncate_metrics(path: Path, step: int, redo_final: bool = False) -> None:
    """Drop metric rows written after the checkpoint being resumed (they will be recomputed), and with
    `redo_final` the final evaluation row at `step` too (the run is about to write it again). A
    half-written last line (a crash mid-write) is dropped; damage anywhere else is a `UserError`."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    kept = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            row_step = row[M.STEP]
            if not isinstance(row_step, int):
                raise TypeError(row_step)
        except (ValueError, KeyError, TypeError):
            if i == len(lines) - 1:
                continue  # cut short by a crash while it was written: it will be written again
            raise UserError(f"{path}:{i + 1}: not a metrics row (damaged file?)") from None
        if row_step < step or (row_step == step and not (redo_final and _is_eval_only(row))):
            kept.append(line)
    atomic_write_text(path, "".join(ln + "\n" for ln in kept))
