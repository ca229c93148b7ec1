"""The RL loop: rollout → decode → reward → advantages → credit → clipped loss → optimizer step.

`train_step` is the algorithm and reads top to bottom; `Trainer` holds the boilerplate
(accelerate, prompts, logging, checkpoints, resume, Ctrl-C) and stays out of its way.
"""

from __future__ import annotations

import copy
import json
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from t2i_gcpo.config import TrainConfig, save_config
from t2i_gcpo.core.advantages import dynamic_sampling_filter, group_advantages
from t2i_gcpo.core.credit import dgpo_weights, gcpo_weights, stage_weights, uniform_weights
from t2i_gcpo.core.losses import policy_loss
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import Rollout
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.combine import call_reward
from t2i_gcpo.train import metrics as M
from t2i_gcpo.train.checkpoint import latest_checkpoint, load_optimizer, load_trainer_state, save_checkpoint
from t2i_gcpo.train.data import PromptStream
from t2i_gcpo.viz.lift import credit_lift, mean_credit_lift


@dataclass
class Batch:
    """One step's training data after dynamic sampling (B = kept groups × G)."""

    rollout: Rollout  # tokens / recorded log-probs, [B, T]
    advantages: torch.Tensor  # [B] — sequence advantages A_i
    reward: RewardOutput  # scores [B] and per-sample details
    metadata: list[dict]  # [B] GenEval metadata
    images: torch.Tensor  # [B, 3, H, W] in [0, 1]


# ============================================================================ algorithm logic


def token_credit(
    cfg: TrainConfig, batch: Batch, policy: Any, logits: torch.Tensor | None, ref: Any
) -> torch.Tensor:
    """Token weights w [B, T] of the configured scheme (SPEC §4), without gradient."""
    ro, c = batch.rollout, cfg.credit
    if c.scheme == "uniform":
        return uniform_weights(ro.mask)
    if c.scheme == "gcpo":
        if c.gcpo.recompute:  # official code: both contexts re-scored by the current policy
            with torch.no_grad():
                logp_pos, logp_neg = policy(ro, context="cond"), policy(ro, context="uncond")
        else:  # equal to the above with one update epoch, and free: the sampler recorded them
            logp_pos, logp_neg = ro.logp_cond, ro.logp_uncond
        g = c.gcpo
        return gcpo_weights(logp_pos, logp_neg, ro.mask, g.normalization, g.top_fraction, g.top_mass, g.tau)
    if c.scheme == "dgpo":
        with torch.no_grad():
            if c.dgpo.reference == "initial":
                _, ref_logits = ref(ro, context=cfg.rollout.train_logp, full_dist=True)
            else:  # the rollout policy: its logits were stored before the first update epoch
                ref_logits = ro.extras["rollout_logits"]
        return dgpo_weights(logits.detach(), ref_logits, ro.mask, c.dgpo.tau, c.dgpo.kappa, c.dgpo.squared)
    if c.scheme == "stage":  # needs whole groups: computed on the full batch before minibatching
        return ro.extras["stage_weights"]
    raise UserError(f"unknown credit scheme {c.scheme}")


def update(cfg: TrainConfig, batch: Batch, policy: Any, ref: Any, optimizer: Any, accelerator: Any,
           loss_scale: float = 1.0) -> dict:  # fmt: skip
    """Clipped policy-gradient update(s) on one batch; returns the step's loss/credit statistics.

    `loss_scale` 0 lets a process without data join the other processes' gradient all-reduce."""
    ctx, loss_cfg = cfg.rollout.train_logp, cfg.loss
    need_ref_logp = loss_cfg.beta > 0
    stats: dict[str, list[float]] = {}
    rows = torch.arange(len(batch.rollout))
    if cfg.credit.scheme == "stage":
        emb = unwrap(policy).code_embeddings(batch.rollout)
        batch.rollout.extras["stage_weights"] = stage_weights(
            emb, batch.advantages, cfg.rollout.group_size, batch.rollout.mask
        )
    if cfg.credit.scheme == "dgpo" and cfg.credit.dgpo.reference == "rollout":
        with torch.no_grad():
            batch.rollout.extras["rollout_logits"] = policy(batch.rollout, context=ctx, full_dist=True)[1]
    for _epoch in range(cfg.optim.update_epochs):
        chunks = torch.tensor_split(rows, cfg.optim.minibatches)
        optimizer.zero_grad(set_to_none=True)
        for i, idx in enumerate(chunks):
            mb = Batch(batch.rollout.select(idx), batch.advantages[idx], batch.reward, [], batch.images)
            ro = mb.rollout
            sync = i == len(chunks) - 1
            with accelerator.no_sync(policy) if not sync and accelerator.num_processes > 1 else _null():
                logp, logits = policy(ro, context=ctx, full_dist=True)  # [B, T], [B, T, V]
                weights = token_credit(cfg, mb, policy, logits, ref)  # [B, T]
                logp_ref = None
                if need_ref_logp:
                    with torch.no_grad():
                        logp_ref = ref(ro, context=ctx)
                loss, st = policy_loss(
                    logp, ro.recorded_logp(ctx), mb.advantages, ro.mask,
                    weights=weights, eps_low=loss_cfg.eps_low, eps_high=loss_cfg.eps_high,
                    dual_clip=loss_cfg.dual_clip, aggregation=loss_cfg.aggregation,
                    logp_ref=logp_ref, beta=loss_cfg.beta, kl_reweight=loss_cfg.kl_reweight,
                )  # fmt: skip
                accelerator.backward(loss * (loss_scale / len(chunks)))
            st.update(credit_stats(weights, ro.mask))
            if "object_grid" in ro.extras:
                lift = mean_credit_lift(credit_lift(weights, ro.extras["object_grid"], ro.mask))
                if math.isfinite(lift):
                    st[M.CREDIT_LIFT] = lift
            st[M.ENTROPY] = token_entropy(logits.detach(), ro.mask)
            for k, v in st.items():
                stats.setdefault(k, []).append(float(v))
        grad_norm = accelerator.clip_grad_norm_(policy.parameters(), cfg.optim.grad_clip or float("inf"))
        stats.setdefault(M.GRAD_NORM, []).append(float(grad_norm))
        optimizer.step()
    return {k: sum(v) / len(v) for k, v in stats.items()}


def train_step(t: Trainer, step: int) -> dict:
    """One RL step. Reads top to bottom; every call goes into core/, policies/ or rewards/."""
    cfg = t.cfg
    G = cfg.rollout.group_size
    timings = {M.TIME_ROLLOUT: 0.0, M.TIME_REWARD: 0.0}
    kept: list[Batch] = []
    all_scores, all_details, groups_seen, groups_empty = [], [], 0, 0
    missing = t.local_prompts  # groups this process still needs
    for round_ in range(1 + (cfg.advantage.max_resample if cfg.advantage.dynamic_sampling else 0)):
        # 1. rollout: P prompts (this process's share; a resampling round draws only the groups still
        #    missing), G samples each, recorded cond/uncond/cfg log-probs
        meta = t.prompts_for(step, round_, missing)
        tic = time.perf_counter()
        with torch.no_grad():
            ro = unwrap(t.policy).rollout(
                [m["prompt"] for m in meta], G, cfg.rollout.cfg_scale,
                cfg.rollout.temperature, cfg.rollout.top_k, generator=t.generator(step, round_),
            )  # fmt: skip
        timings[M.TIME_ROLLOUT] += time.perf_counter() - tic
        # 2. decode and score
        tic = time.perf_counter()
        meta_rows = [m for m in meta for _ in range(G)]
        with torch.no_grad():
            images = unwrap(t.policy).decode(ro)
        reward = call_reward(t.reward, images, ro.prompts, meta_rows)  # NaN/raise → RewardError
        attach_object_grids(ro, reward)
        timings[M.TIME_REWARD] += time.perf_counter() - tic
        all_scores.append(reward.scores)
        all_details += reward.details
        # 3. group advantages; DAPO dynamic sampling keeps only groups with signal
        adv = group_advantages(reward.scores, G, scale=cfg.advantage.scale, eps=cfg.advantage.eps)
        keep = torch.ones(len(ro), dtype=torch.bool)
        if cfg.advantage.dynamic_sampling:
            keep, _ = dynamic_sampling_filter(reward.scores, G)
        groups_seen += len(meta)
        groups_empty += len(meta) - int(keep.sum()) // G
        idx = keep.nonzero().flatten()
        if len(idx):
            details = [reward.details[i] for i in idx.tolist()] if reward.details else []
            kept.append(Batch(ro.select(idx), adv[idx], RewardOutput(reward.scores[idx], details),
                              [meta_rows[i] for i in idx.tolist()], images[idx]))  # fmt: skip
        missing = t.local_prompts - sum(len(b.rollout) for b in kept) // G
        if missing <= 0:
            break
    batch = concat_batches(kept)  # ≤ P groups: each round drew only the missing ones
    # 4. credit → loss → optimizer. A process whose groups all lacked signal joins the others'
    #    all-reduce with a zero loss; if no process has data, the step makes no update.
    tic = time.perf_counter()
    stats, loss_scale = {}, 1.0
    if t.any_process(batch is not None):
        if batch is None:
            batch, loss_scale = Batch(ro.select(torch.arange(G)), torch.zeros(G), RewardOutput(reward.scores[:G]),
                                      meta_rows[:G], images[:G]), 0.0  # fmt: skip
        stats = update(cfg, batch, t.policy, t.ref, t.optimizer, t.accelerator, loss_scale)
    timings[M.TIME_UPDATE] = time.perf_counter() - tic
    scores = torch.cat(all_scores)
    out = {M.REWARD_MEAN: scores.mean().item(), M.REWARD_STD: scores.std().item() if len(scores) > 1 else 0.0,
           M.ZERO_STD_RATIO: groups_empty / max(groups_seen, 1), M.GROUPS_KEPT: len(batch.rollout) // G if batch and loss_scale else 0,
           **strict_stats(all_details), **stats, **timings}  # fmt: skip
    if batch and loss_scale and cfg.sample_every and step % cfg.sample_every == 0:
        t.last_batch = batch
    return out


# ============================================================================ helpers


class _null:
    def __enter__(self) -> None: ...
    def __exit__(self, *a: Any) -> None: ...


def unwrap(model: Any) -> Any:
    return getattr(model, "module", model)


def concat_batches(batches: list[Batch]) -> Batch | None:
    if not batches:
        return None
    if len(batches) == 1:
        return batches[0]
    ro = batches[0].rollout
    ros = [x.rollout for x in batches]
    extras = {}
    for k, v in ro.extras.items():
        if isinstance(v, torch.Tensor) and all(k in r.extras for r in ros):
            extras[k] = torch.cat([r.extras[k] for r in ros])
        elif isinstance(v, list):
            extras[k] = [e for r in ros for e in r.extras[k]]
        else:
            extras[k] = v
    merged = Rollout(
        **{f: torch.cat([getattr(r, f) for r in ros]) for f in ("tokens", "mask", "logp_cond", "logp_uncond", "logp_cfg")},
        prompts=[p for r in ros for p in r.prompts], cfg_scale=ro.cfg_scale, temperature=ro.temperature, extras=extras,
    )  # fmt: skip
    return Batch(
        merged,
        torch.cat([x.advantages for x in batches]),
        RewardOutput(
            torch.cat([x.reward.scores for x in batches]), [d for x in batches for d in x.reward.details]
        ),
        [m for x in batches for m in x.metadata],
        torch.cat([x.images for x in batches]),
    )


def attach_object_grids(ro: Rollout, reward: RewardOutput) -> None:
    """Tokens covering prompt objects ([B, T] bool, from the reward's details) for credit lift."""
    if reward.details and all("object_grid" in d for d in reward.details):
        grids = [torch.as_tensor(d["object_grid"]).reshape(-1) for d in reward.details]
        if all(g.numel() == ro.tokens.shape[1] for g in grids):
            ro.extras["object_grid"] = torch.stack(grids).bool()


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


def token_entropy(logits: torch.Tensor, mask: torch.Tensor) -> float:
    logp = torch.log_softmax(logits.float(), -1)
    ent = -(logp.exp() * logp).sum(-1)
    return ((ent * mask).sum() / mask.sum().clamp_min(1)).item()


def strict_stats(details: list[dict]) -> dict[str, float]:
    by_tag: dict[str, list[float]] = {}
    partial = [d["partial"] for d in details if "partial" in d]
    for d in details:
        if "strict" in d and "tag" in d:
            by_tag.setdefault(d["tag"], []).append(float(d["strict"]))
    out = {M.STRICT_TAG.format(tag=k): sum(v) / len(v) for k, v in sorted(by_tag.items())}
    if by_tag:
        flat = [x for v in by_tag.values() for x in v]
        out[M.STRICT] = sum(flat) / len(flat)
    if partial:
        out[M.PARTIAL] = sum(partial) / len(partial)
    return out


# ============================================================================ boilerplate: setup, logging, checkpoints


class StopRequested(KeyboardInterrupt):
    """Ctrl-C honoured at a step boundary: every process stops there together, after the checkpoint."""


class Trainer:
    def __init__(self, cfg: TrainConfig, run_dir: Path | None, metadata: list[dict], policy: Any, reward: Any,
                 eval_metadata: list[dict] | None = None, resume: bool = False):  # fmt: skip
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs, broadcast_object_list

        self.cfg, self.reward, self.eval_metadata = cfg, reward, eval_metadata
        self.accelerator = Accelerator(
            cpu=not torch.cuda.is_available(),
            kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
        )
        acc = self.accelerator
        if run_dir is None:  # one default name, chosen by the main process
            run_dir = Path("runs") / f"{cfg.algo}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.run_dir = run_dir = (
            Path(broadcast_object_list([str(run_dir)])[0]) if acc.num_processes > 1 else run_dir
        )
        cfg.out = str(run_dir)
        if acc.is_main_process and not resume:
            prepare_run_dir(cfg, run_dir)
        acc.wait_for_everyone()
        n_proc = acc.num_processes
        if cfg.rollout.prompts_per_step % n_proc:
            raise UserError(
                f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} must be divisible by the {n_proc} processes"
            )
        self.local_prompts = cfg.rollout.prompts_per_step // n_proc
        self.stream = PromptStream(metadata, cfg.seed)
        torch.manual_seed(cfg.seed)
        needs_ref = cfg.loss.beta > 0 or (
            cfg.credit.scheme == "dgpo" and cfg.credit.dgpo.reference == "initial"
        )
        self.ref = copy.deepcopy(policy).eval().requires_grad_(False) if needs_ref else None
        if hasattr(getattr(policy, "config", None), "storage_dtype"):
            policy.config.storage_dtype = "float32"  # run checkpoints must be lossless: resume is exact
        self.start_step = 0
        if resume:
            policy = self._load_resume(policy)
        params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        if resume:
            load_optimizer(self.ckpt, self.optimizer)
        self.policy, self.optimizer = acc.prepare(policy, self.optimizer)
        if self.ref is not None:
            self.ref.to(acc.device)
        self.last_batch: Batch | None = None
        self.stop_requested = False
        self.writer = None
        if acc.is_main_process:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(
                str(run_dir / "tb"), purge_step=self.start_step + 1 if resume else None
            )

    # -- prompts and seeds: pure functions of (seed, step, round, rank) so resume is exact
    def prompts_for(self, step: int, round_: int, count: int) -> list[dict]:
        """The first `count` prompts of this process's slot for (step, round) in the prompt stream."""
        acc, P = self.accelerator, self.cfg.rollout.prompts_per_step
        base = (step * (1 + self.cfg.advantage.max_resample) + round_) * P
        return self.stream.take(base + acc.process_index * self.local_prompts, min(count, self.local_prompts))

    def generator(self, step: int, round_: int) -> torch.Generator:
        g = torch.Generator(device=self.accelerator.device)
        g.manual_seed(hash((self.cfg.seed, step, round_, self.accelerator.process_index)) % (2**63))
        return g

    def any_process(self, flag: bool) -> bool:
        t = torch.tensor([float(flag)])
        if self.accelerator.num_processes > 1:
            torch.distributed.all_reduce(t)
        return bool(t.item() > 0)

    # -- the loop
    def fit(self) -> dict:
        from tqdm import tqdm

        cfg, acc = self.cfg, self.accelerator
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        bar = tqdm(total=cfg.steps, initial=self.start_step, desc=f"{cfg.algo}", disable=not acc.is_main_process,
                   dynamic_ncols=True)  # fmt: skip
        step = self.start_step
        if cfg.eval_every > 0 and self.start_step == 0 and self.eval_metadata:
            base = self.evaluate()
            self._log(0, base, append_only=True)  # the base model: curves start at step 0
            self._announce(0, base, bar)
        try:
            for step in range(self.start_step + 1, cfg.steps + 1):
                tic = time.perf_counter()
                row = train_step(self, step)
                row[M.TIME_STEP] = time.perf_counter() - tic
                row = self._gather(row)
                if cfg.eval_every > 0 and step % cfg.eval_every == 0 and step != cfg.steps:
                    row.update(self.evaluate())
                    self._announce(step, row, bar)
                self._log(step, row)
                bar.update(1)
                bar.set_postfix(
                    reward=f"{row[M.REWARD_MEAN]:.3f}", strict=f"{row.get(M.STRICT, float('nan')):.2f}"
                )
                stop = self._stop()  # one all-reduce: every process gets the same answer
                if step % cfg.save_every == 0 or step == cfg.steps or stop:
                    self.save(step)
                if stop:
                    raise StopRequested
        except KeyboardInterrupt as interrupt:
            bar.close()
            if acc.is_main_process:
                print(
                    f"interrupted: checkpoint at step {self._saved_step()}; continue with: t2i-gcpo train --resume {self.run_dir}"
                )
            if isinstance(interrupt, StopRequested):  # not after a second Ctrl-C: it may land in a collective
                self._shutdown()
            raise
        finally:
            signal.signal(signal.SIGINT, previous)
            bar.close()
        self._check_replicas()
        final = {}
        if cfg.eval_every >= 0 and self.eval_metadata:
            final = self.evaluate()
            self._log(cfg.steps, final, append_only=True)
            self._announce(cfg.steps, final, bar)
            if acc.is_main_process:
                (self.run_dir / "eval.json").write_text(json.dumps(final, indent=1))
        self._report()
        if acc.is_main_process:
            bar.write(f"run directory: {self.run_dir} (open report.html)")
        self._shutdown()
        return final

    def _shutdown(self) -> None:
        """End a run every process reached together: flush TensorBoard and wait until all ranks are
        done, so none leaves (train.run.leave_process_group) while another still needs it."""
        if self.writer is not None:
            self.writer.close()
        self.accelerator.wait_for_everyone()

    def _announce(self, step: int, row: dict, bar: Any) -> None:
        """One console line per held-out evaluation, above the progress bar."""
        if self.accelerator.is_main_process:
            bar.write(f"step {step}: held-out strict {row[M.EVAL_STRICT]:.3f}")

    def evaluate(self) -> dict:
        from t2i_gcpo.train.evaluate import evaluate_policy

        cfg = self.cfg
        res = evaluate_policy(
            unwrap(self.policy), self.reward, self.eval_metadata, cfg.eval_images_per_prompt,
            cfg.rollout.cfg_scale, cfg.rollout.temperature, seed=cfg.seed, accelerator=self.accelerator,
        )  # fmt: skip
        out = {M.EVAL_STRICT_TAG.format(tag=k): v["strict"] for k, v in res["per_tag"].items()}
        out[M.EVAL_STRICT] = res["strict"]
        out[M.EVAL_PARTIAL] = res["partial"]
        return out

    def _check_replicas(self) -> None:
        """Write run_dir/processes.json: how many processes trained and each one's parameter checksum
        (they must agree: DDP keeps replicas identical)."""
        acc = self.accelerator
        total = torch.stack([p.detach().double().sum() for p in unwrap(self.policy).parameters()]).sum()
        sums = acc.gather(total.reshape(1).to(acc.device)).tolist()
        if acc.is_main_process:
            info = {
                "num_processes": acc.num_processes,
                "param_checksums": sums,
                "replicas_equal": len(set(sums)) == 1,
            }
            (self.run_dir / "processes.json").write_text(json.dumps(info, indent=1))
            if not info["replicas_equal"]:
                raise RuntimeError(f"parameters differ across processes: {sums}")

    def _on_sigint(self, *_: Any) -> None:
        if self.stop_requested:  # second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.stop_requested = True
        if self.accelerator.is_main_process:
            print("\nCtrl-C: finishing this step, saving a checkpoint …", flush=True)

    def _stop(self) -> bool:
        return self.any_process(self.stop_requested)

    def _gather(self, row: dict) -> dict:
        """Average per-process metrics (every process logs the same keys in the same order)."""
        acc = self.accelerator
        if acc.num_processes == 1:
            return row
        keys = sorted(row)
        vals = torch.tensor([float(row[k]) for k in keys], dtype=torch.float64)
        lengths = acc.gather(torch.tensor([len(keys)]))
        if len(set(lengths.tolist())) != 1:  # tag sets differ between ranks: log rank 0's view
            return row
        vals = acc.reduce(vals, reduction="mean")
        return dict(zip(keys, vals.tolist()))

    def _log(self, step: int, row: dict, append_only: bool = False) -> None:
        if not self.accelerator.is_main_process:
            return
        row = {M.STEP: step, **{k: (v if math.isfinite(v) else None) for k, v in row.items()}}
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        for k, v in row.items():
            if k != M.STEP and v is not None:
                self.writer.add_scalar(k, v, step)
        self.writer.flush()
        if (
            not append_only
            and self.cfg.sample_every
            and step % self.cfg.sample_every == 0
            and self.last_batch
        ):
            self._draw(step, self.last_batch)
            self._report()

    def _draw(self, step: int, batch: Batch) -> None:
        from t2i_gcpo.train.visuals import save_credit_maps, save_sample_grid

        save_sample_grid(
            self.run_dir / "samples" / f"step_{step:06d}.png", batch, self.cfg.rollout.group_size
        )
        save_credit_maps(self.run_dir / "credit_maps" / f"step_{step:06d}.png", batch, self, step)

    def _report(self) -> None:
        if self.accelerator.is_main_process:
            from t2i_gcpo.viz.report import write_run_report

            write_run_report(self.run_dir)

    def save(self, step: int) -> None:
        acc = self.accelerator
        acc.wait_for_everyone()
        if acc.is_main_process:
            save_checkpoint(self.run_dir, step, unwrap(self.policy), self.optimizer, {"algo": self.cfg.algo})
        acc.wait_for_everyone()

    def _saved_step(self) -> int:
        ckpt = latest_checkpoint(self.run_dir)
        return load_trainer_state(ckpt)["step"] if ckpt else 0

    def _load_resume(self, policy: Any) -> Any:
        from t2i_gcpo.policies.registry import load_policy

        self.ckpt = latest_checkpoint(self.run_dir)
        if self.ckpt is None:
            raise UserError(f"{self.run_dir} has no checkpoint to resume from")
        self.start_step = load_trainer_state(self.ckpt)["step"]
        prefix = "janus:" if self.cfg.model.startswith("janus:") else ""
        resumed = load_policy(prefix + str(self.ckpt / "model"), self.cfg.model_options)
        policy.load_state_dict(resumed.state_dict())
        truncate_metrics(self.run_dir / "metrics.jsonl", self.start_step)
        return policy


def truncate_metrics(path: Path, step: int) -> None:
    """Drop metric rows written after the checkpoint being resumed (they will be recomputed)."""
    if not path.is_file():
        return
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)[M.STEP] <= step]
    path.write_text("".join(ln + "\n" for ln in lines))


def prepare_run_dir(cfg: TrainConfig, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
