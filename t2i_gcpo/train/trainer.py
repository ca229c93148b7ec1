"""The RL loop (docs/concepts/algorithms.md#one-step): collect → credit → clipped loss → optimizer step →
metrics, step after step.

`Trainer.train_step` is the algorithm and reads top to bottom: the batch collector (train/collect.py)
draws the step's groups, the update (train/update.py) trains on them. The rest of `Trainer` is the
boilerplate (accelerate, logging, checkpoints, resume, Ctrl-C and SIGTERM), set apart below.
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
from t2i_gcpo.config import TrainConfig, to_dict
from t2i_gcpo.core.schemes import get_scheme
from t2i_gcpo.errors import RewardError, UserError
from t2i_gcpo.outdir import append_text, sync_file, write_file
from t2i_gcpo.policies.base import Policy, PromptRecord
from t2i_gcpo.rewards.base import Reward
from t2i_gcpo.tasks.base import Task
from t2i_gcpo.train.batch import Batch
from t2i_gcpo.train.checkpoint import (
    CheckpointError,
    checkpoint_dir,
    collector_checkpoint,
    latest_checkpoint,
    load_collector_state,
    load_optimizer,
    load_scheduler,
    load_trainer_state,
    mark_finished,
    save_checkpoint,
)
from t2i_gcpo.train.collect import BatchCollector
from t2i_gcpo.train.data import PromptStream
from t2i_gcpo.train.distributed import (
    any_process,
    average_over_processes,
    broadcast_from_main,
    check_launch,
    full_optimizer_state_dict,
    full_state_dict,
    gather_objects,
    gather_params,
    load_full_optimizer_state_dict,
    param_checksum,
    unwrap,
)
from t2i_gcpo.train.run_dir import claim_default_run_dir, continue_run_dir, prepare_run_dir, resume_command
from t2i_gcpo.train.run_settings import resolve_autocast, sampling_params
from t2i_gcpo.train.schedule import build_scheduler, current_lr, restore_scheduler, step_schedule
from t2i_gcpo.train.tracking import finish_trackers, log_metrics, start_trackers, tracker_names
from t2i_gcpo.train.update import NonFiniteError
from t2i_gcpo.train.update import update as update_policy

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
    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path | None,
        prompts: list[PromptRecord],
        policy: Policy,
        reward: Reward,
        task: Task,
        eval_prompts: list[PromptRecord] | None = None,
        resume: bool = False,
        eval_suite: Any = None,
    ):
        """A run of `cfg` whose plan was checked (train/run.prepare → train/plan.plan_run: the trackers
        start, the scheme fits the model, a step's cost is bounded) before anything is written. `eval_suite`
        (train/eval_suite.SuiteEvaluation): a benchmark suite that scores the held-out prompts instead of the
        task."""
        resolve_autocast(cfg, "cuda" if torch.cuda.is_available() else "cpu", policy)  # before config.yaml
        trackers = tracker_names(cfg.report_to)  # each checked to start by the plan
        self.cfg, self.reward, self.task, self.eval_prompts = cfg, reward, task, eval_prompts
        self.eval_suite = eval_suite
        self.sampling = sampling_params(cfg)
        if cfg.rollout.reveal_order and policy.capabilities.reveal_order:
            # a masked model trained under an order keeps it as its default: its checkpoints then sample
            # (`eval`, `sample`, `credit-map`) the way they were trained
            policy.keep_reveal_order(cfg.rollout.reveal_order)
        self.accelerator = acc = self._setup_accelerator(trackers)
        # before the run directory is created: P must split evenly over the processes
        self.collector = BatchCollector(
            cfg, PromptStream(prompts, cfg.seed), acc.process_index, acc.num_processes
        )
        self.run_dir = self._setup_run_dir(run_dir, resume)
        torch.manual_seed(cfg.seed)
        self._setup_references(policy)
        policy.keep_full_precision()  # run checkpoints must be lossless: resume is exact
        self.start_step, self.ckpt = 0, None
        if resume:
            policy = self._load_resume(policy)
        self._setup_optimizer(policy, resume)
        if resume:
            saved = (
                load_scheduler(self.ckpt, cfg.optim.lr, self.start_step) if self.ckpt is not None else None
            )
            restore_scheduler(self.scheduler, saved, self.start_step)
            if acc.is_main_process:  # everything loaded: only now change the run directory
                row = load_trainer_state(self.ckpt).get("metrics_row") if self.ckpt is not None else None
                continue_run_dir(self.run_dir, self.start_step, cfg.steps, row)
            acc.wait_for_everyone()
        for frozen in (self.ref, self.rollout_ref):
            if frozen is not None:
                frozen.to(acc.device)
        self.last_batch: Batch | None = None
        self.eval_base: list[dict] | None = None  # the held-out items of step 0 (`_base_rows`)
        self.stop_requested = 0  # the stop signal received (0: none)
        self.final_phase = False  # in the final evaluation: a stop signal ends it at once
        self.logged_rows = 0  # metrics rows written; the report is redrawn only when there are new ones
        self.step_row: dict | None = None  # the last training step's metrics row
        self.reported_rows = -1
        start_trackers(acc, trackers, self.run_dir, to_dict(cfg), self.start_step, resume=resume)

    # ======================================================================== algorithm logic

    def train_step(self, step: int) -> dict:
        """One RL step: collect → credit → loss → optimizer step → metrics. Every call goes into core/,
        tasks/, policies/ or rewards/ through train/collect.py and train/update.py."""
        cfg = self.cfg
        # 1. rollout → decode → reward → group advantages, round by round until this process holds P
        #    groups with signal (dynamic sampling, draw budget, carry-over of the surplus)
        got = self.collector.collect(step, unwrap(self.policy), self.reward, self.sampling)
        # 2. credit → loss → optimizer step. A process whose groups all lacked signal joins the others'
        #    gradient all-reduce with a zero loss on a stand-in group; if no process has data, the step
        #    makes no update
        tic = time.perf_counter()
        stats: dict[str, float] = {}
        if any_process(got.batch is not None, self.accelerator):
            self.refresh_credit_reference()
            if got.batch is not None:
                stats, weights = self.update(got.batch, stale_rows=got.carried * got.batch.rollout.group_size)
                ro = got.batch.rollout.to("cpu")
                stats.update(self.task.credit_metrics(weights.cpu(), ro, got.batch.reward.details))
            else:
                stand_in = got.stand_in()  # no row counts as fresh: no mismatch metrics
                stats, _ = self.update(stand_in, loss_scale=0.0, stale_rows=len(stand_in.rollout))
        seconds = {**got.seconds, M.TIME_UPDATE: time.perf_counter() - tic}
        # 3. metrics; the batch the next sample grid and credit maps are drawn from
        if got.batch is not None and cfg.sample_every and step % cfg.sample_every == 0:
            self.last_batch = got.batch
        return {**got.metrics(), **self.task.step_metrics(got.details), **stats, **seconds}

    def update(self, batch: Batch, loss_scale: float = 1.0, stale_rows: int = 0) -> tuple[dict, torch.Tensor]:
        """train/update.py `update` with this run's policy, references, optimizer and processes."""
        return update_policy(
            self.cfg,
            batch,
            self.policy,
            self.ref,
            self.credit_ref,
            self.optimizer,
            self.accelerator,
            loss_scale,
            stale_rows,
        )

    def refresh_credit_reference(self) -> None:
        """credit.reference=rollout: snapshot the weights that sampled this step (no cached logits)."""
        if self.rollout_ref is not None:
            self.rollout_ref.load_state_dict(full_state_dict(self.policy, everywhere=True))

    # ======================================================================== boilerplate: setup

    def _setup_accelerator(self, trackers: list[str]) -> Any:
        """accelerate's Accelerator, after refusing launches it would not honour (DeepSpeed, FSDP it did
        not set up, FSDP1)."""
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs, DistributedType

        check_launch()  # before accelerate: it would import DeepSpeed for a DeepSpeed launch
        acc = Accelerator(
            cpu=not torch.cuda.is_available(),
            kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
            log_with=trackers or None,
            project_dir=".",  # TensorBoard's folder is set once the run directory is known (start_trackers)
        )
        check_launch(acc)  # the strategy asked for is the one accelerate gave
        self.fsdp = acc.distributed_type == DistributedType.FSDP
        if self.fsdp and not acc.is_fsdp2:
            raise UserError("FSDP needs fsdp_version: 2 in the accelerate config (FSDP1 is not supported)")
        return acc

    def _setup_run_dir(self, run_dir: Path | None, resume: bool) -> Path:
        """The run directory every process writes to: `run_dir`, or a default name claimed (and
        locked) by the main process; a new run's is marked as a run with its config."""
        acc = self.accelerator
        self.lock = None  # a default run directory's lock (an --out one is taken in train.run.prepare)
        if run_dir is None:  # one default name, created (exclusively) by the main process
            run_dir = Path()
            if acc.is_main_process:
                run_dir, self.lock = claim_default_run_dir(self.cfg.algo)
            run_dir = Path(broadcast_from_main(str(run_dir), acc))
        self.cfg.out = str(run_dir)
        if acc.is_main_process and not resume:
            prepare_run_dir(self.cfg, run_dir)
        acc.wait_for_everyone()
        return run_dir

    def _setup_references(self, policy: Any) -> None:
        """Frozen copies of the policy: the initial one (KL term, or a credit scheme comparing to it),
        or a snapshot of the policy that sampled each step (credit.reference=rollout)."""
        cfg = self.cfg
        compares = "ref_dists" in get_scheme(cfg.credit.scheme).needs
        needs_ref = cfg.loss.beta > 0 or (compares and cfg.credit.reference == "initial")
        self.ref = copy.deepcopy(policy).eval().requires_grad_(False) if needs_ref else None
        self.rollout_ref = None
        if compares and cfg.credit.reference == "rollout":
            self.rollout_ref = copy.deepcopy(policy).eval().requires_grad_(False)
        if cfg.loss.reference_dtype == "bfloat16":  # half the memory (loss.reference_dtype)
            for frozen in (self.ref, self.rollout_ref):
                if frozen is not None:
                    frozen.to(torch.bfloat16)
        self.credit_ref = self.rollout_ref if self.rollout_ref is not None else self.ref

    def _setup_optimizer(self, policy: Any, resume: bool) -> None:
        """AdamW over the trainable parameters and the lr scheduler, the optimizer state of the
        checkpoint being resumed, then accelerate's wrapping (DDP, or FSDP2 sharding in place)."""
        cfg, acc = self.cfg, self.accelerator
        params = [p for p in policy.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        # stepped once per training step, by the loop (not prepared: accelerate would step
        # it once per process)
        self.scheduler = build_scheduler(cfg.optim, optimizer, cfg.steps)
        configured = optimizer.state_dict()["param_groups"]  # a checkpoint's must agree (train/checkpoint.py)
        if resume and self.ckpt is not None and not self.fsdp:
            load_optimizer(self.ckpt, optimizer.load_state_dict, configured)
        # FSDP: the prepared model is sharded in place; the main process keeps a CPU copy to write checkpoints
        self.save_copy = copy.deepcopy(policy).cpu() if self.fsdp and acc.is_main_process else None
        self.policy, self.optimizer = acc.prepare(policy, optimizer)
        if self.fsdp:
            # weights gathered once per step (distributed.gather_params) and kept whole through rollout,
            # forward and backward; FSDP shards gradients and optimizer states
            self.policy.set_reshard_after_forward(False)
            if resume and self.ckpt is not None:
                load_optimizer(
                    self.ckpt,
                    lambda state: load_full_optimizer_state_dict(self.policy, self.optimizer, state),
                    configured,
                )
            gather_params(self.policy)

    # ======================================================================== boilerplate: the loop

    def fit(self) -> dict:
        from tqdm import tqdm

        cfg, acc = self.cfg, self.accelerator
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        bar = tqdm(
            total=cfg.steps,
            initial=self.start_step,
            desc=f"{cfg.algo}",
            disable=not acc.is_main_process,
            dynamic_ncols=True,
        )
        step = self.start_step
        if cfg.eval_every > 0 and self.start_step == 0 and cfg.steps > 0 and self.eval_prompts:
            base, headline = self.evaluate(0)
            self._log(0, base, append_only=True)  # the base model: curves start at step 0
            self._announce(0, headline, bar)
        try:
            for step in range(self.start_step + 1, cfg.steps + 1):
                tic = time.perf_counter()
                lr = current_lr(self.scheduler)  # the lr this step's update used
                row = self.train_step(step)
                step_schedule(self.scheduler)  # once per training step, with or without an update
                row[M.TIME_STEP] = time.perf_counter() - tic
                row[M.LR] = lr
                row = average_over_processes(row, acc)
                for key in (*M.BUDGET, *(M.BUDGET_TOTAL.format(key=k) for k in M.BUDGET)):
                    row[key] *= acc.num_processes  # what the processes spent together: a sum, not a mean
                self.collector.observe_zero_std(row[M.ZERO_STD_RATIO])
                if cfg.eval_every > 0 and step % cfg.eval_every == 0 and step != cfg.steps:
                    metrics, headline = self.evaluate(step)
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
                final, headline = self.evaluate(cfg.steps)
                self._log(cfg.steps, final, append_only=True)
                self._announce(cfg.steps, headline, bar)
                if acc.is_main_process:
                    write_file(self.run_dir / "eval.json", json.dumps(final, indent=1), within=self.run_dir)
            self._report()
            if acc.is_main_process:
                ckpt = checkpoint_dir(self.run_dir, cfg.steps)
                if (ckpt / "trainer_state.json").is_file():  # resuming this run now has nothing to do
                    mark_finished(ckpt)
                bar.write(f"run directory: {self.run_dir} (open report.html)")
        except NonFiniteError as e:
            bar.close()
            raise NonFiniteError(
                f"step {step}: {e}, stopped before the update was applied or saved; {self._after_nan()}"
            ) from None
        except RewardError as e:  # e.g. a reward server that stopped answering: resume once it is back
            bar.close()
            ckpt = latest_checkpoint(self.run_dir)
            kept = (
                f"the checkpoint of step {load_trainer_state(ckpt)['step']} is kept"
                if ckpt
                else "no checkpoint yet"
            )
            raise RewardError(
                f"step {step}: {e}; {kept}; continue with: t2i-gcpo train --resume {self.run_dir}"
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

    def _after_nan(self) -> str:
        """What a run stopped by the NaN guard can do: end at its last good checkpoint (a command that works:
        the steps it names pass the config's checks), or start over with other settings in a new --out (the
        run's own folder is refused to a new run: it holds this one)."""
        over = (
            f"start over with other settings (e.g. a lower optim.lr) in a new --out "
            f"({self.run_dir} keeps this run)"
        )
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            return f"no checkpoint was written before it: {over}"
        saved = load_trainer_state(ckpt)["step"]
        kept = (
            f"the last good checkpoint (step {saved}) is kept in {self.run_dir}; resuming "
            f"repeats the same steps"
        )
        warmup = self.cfg.optim.warmup_steps
        if warmup and warmup >= saved:  # --steps {saved} would end the run in its warmup: refused
            return f"{kept}: {over}"
        return f"{kept}: end the run there with {self._resume_command(saved)}, or {over}"

    def _resume_command(self, steps: int | None = None) -> str:
        return resume_command(self.run_dir, self.cfg.credit.scheme, self.cfg.reward, steps)

    def _interrupted_line(self) -> str:
        """What a stopped run says: where it stopped and the command that continues it."""
        resume = self._resume_command()
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            return f"interrupted before the first checkpoint; start it again from step 0 with: {resume}"
        where = " during the final evaluation" if self.final_phase else ""
        return (
            f"interrupted{where}: checkpoint at step {load_trainer_state(ckpt)['step']}; "
            f"continue with: {resume}"
        )

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

    def evaluate(self, step: int) -> tuple[dict, str]:
        """The task's held-out score of the current policy: (metrics to log, the lines to print). Where the
        task returns its items ("rows": key, category, score), the main process writes them to
        eval/step_NNNNNN.jsonl and, from step 1 on, adds each category's paired change from step 0 with its
        95 % interval (eval/records/paired.py; metrics.EVAL_CHANGE): the held-out prompts and their samples'
        noise are the same at every step, so each item pairs with itself at step 0."""
        cfg = self.cfg
        if (
            self.eval_suite is not None
        ):  # a benchmark suite's score (eval_suite), rows of key, category, score
            res = self.eval_suite.evaluate(
                unwrap(self.policy),
                self.eval_prompts,
                cfg.eval_images_per_prompt,
                self.sampling,
                seed=cfg.seed,
                accelerator=self.accelerator,
            )
            return res["metrics"], res["headline"]
        res = self.task.evaluate(
            unwrap(self.policy),
            self.reward,
            self.eval_prompts,
            cfg.eval_images_per_prompt,
            self.sampling,
            seed=cfg.seed,
            accelerator=self.accelerator,
        )
        metrics, headline = dict(res["metrics"]), res["headline"]
        rows = res.get("rows") or []
        if not rows or not self.accelerator.is_main_process:
            return metrics, headline
        from t2i_gcpo.eval.records.paired import (
            categories_line,
            category_means,
            change_headline,
            change_metrics,
            paired_change,
        )

        self._write_eval_rows(step, rows, res.get("aggregate", "items"))
        base = self._base_rows(step, rows)
        change = None
        if base is not None and step > 0:
            try:
                change = paired_change(
                    base, rows, res.get("aggregate", "items"), names=("step 0", f"step {step}")
                )
            except UserError as e:  # step 0's items are not these (a run folder of an older version)
                headline += f" (no change from step 0: {e})"
        if change is not None:
            metrics.update(change_metrics(change))
            headline += "; " + change_headline(change)
        line = categories_line(category_means(rows), change)
        return metrics, headline + (f"\n  {line}" if line else "")

    def _write_eval_rows(self, step: int, rows: list[dict], aggregate: str) -> None:
        """eval/step_NNNNNN.jsonl: the held-out items of the evaluation at `step`, and beside them
        eval/protocol.json, what the evaluation was (eval/records/protocol.py)."""
        from t2i_gcpo.eval.records.paired import strict_json

        folder = self.run_dir / "eval"
        write_file(
            folder / f"step_{step:06d}.jsonl",
            "".join(json.dumps(strict_json(r)) + "\n" for r in rows),
            within=self.run_dir,
        )
        if not (folder / "protocol.json").is_file():
            write_file(
                folder / "protocol.json",
                json.dumps(self._protocol(aggregate), indent=1) + "\n",
                within=self.run_dir,
            )

    def _protocol(self, aggregate: str) -> dict:
        """The held-out evaluation's protocol: the task, its prompt file, the run's model, the reward that
        scores it, the seeding rule, the images per prompt, the sampling settings and how the overall
        aggregates the items (`aggregate`: "categories" or "items", eval/records/paired.py)."""
        from t2i_gcpo.eval.records.protocol import protocol_record, scorer_record

        cfg, s = self.cfg, self.sampling
        data = [cfg.eval_prompts] if cfg.eval_prompts and Path(cfg.eval_prompts).is_file() else []
        return protocol_record(
            f"held-out:{self.task.name}",
            data=data,
            model=cfg.model,
            scorer=scorer_record("reward", str(cfg.reward)),
            seeds={
                "seed": cfg.seed,
                "rule": "prompt i's samples from a generator seeded by (seed, 'eval', i)",
            },
            images_per_prompt=cfg.eval_images_per_prompt,
            aggregate=aggregate,
            sampling={
                "guidance_scale": s.guidance_scale,
                "temperature": s.temperature,
                "top_k": s.top_k,
                "top_p": s.top_p,
                "steps": s.steps,
                "reveal_order": s.reveal_order,
                "autocast": s.autocast,
            },
        )

    def _base_rows(self, step: int, rows: list[dict]) -> list[dict] | None:
        """The held-out items of step 0: these at step 0, else those kept since (a resumed run reads them
        back from eval/step_000000.jsonl); None where the run has none."""
        if step == 0:
            self.eval_base = rows
        if self.eval_base is None:
            from t2i_gcpo.outdir import read_jsonl

            path = self.run_dir / "eval" / "step_000000.jsonl"
            self.eval_base = read_jsonl(path) if path.is_file() else None
        return self.eval_base

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
            write_file(self.run_dir / "processes.json", json.dumps(info, indent=1), within=self.run_dir)
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
        return any_process(bool(self.stop_requested), self.accelerator)

    def _log(self, step: int, row: dict, append_only: bool = False) -> None:
        if not self.accelerator.is_main_process:
            return
        row = {M.STEP: step, **{k: (v if math.isfinite(v) else None) for k, v in row.items()}}
        append_text(self.run_dir / "metrics.jsonl", json.dumps(row) + "\n", within=self.run_dir)
        if not append_only:
            self.step_row = row  # the step's checkpoint keeps it (a torn last line is restored on resume)
        self.logged_rows += 1
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
            save_text_heatmap(
                self.run_dir / "credit_maps" / f"step_{step:06d}.html",
                batch,
                unwrap(self.policy),
                self.credit_ref,
                self.cfg,
                step,
                self.task,
                within=self.run_dir,
            )
            return
        save_sample_grid(
            self.run_dir / "samples" / f"step_{step:06d}.png",
            batch,
            batch.rollout.group_size,
            within=self.run_dir,
        )
        save_credit_maps(
            self.run_dir / "credit_maps" / f"step_{step:06d}.png",
            batch,
            unwrap(self.policy),
            self.credit_ref,
            self.cfg,
            step,
            within=self.run_dir,
        )

    def _report(self) -> None:
        """Write report.html, unless it already shows every logged row (a run whose last step drew its
        samples ends with the report that step wrote)."""
        if self.accelerator.is_main_process and self.reported_rows != self.logged_rows:
            from t2i_gcpo.rewards.combine import reward_bounds
            from t2i_gcpo.viz.report import write_run_report

            eval_every = self.cfg.eval_every if self.eval_prompts else -1  # -1: the report says there is none
            write_run_report(self.run_dir, reward_bounds=reward_bounds(self.reward), eval_every=eval_every)
            self.reported_rows = self.logged_rows

    def save(self, step: int) -> None:
        acc = self.accelerator
        acc.wait_for_everyone()
        collected, carry = collector_checkpoint(gather_objects(self.collector.state_dict(), acc))
        policy, optimizer_state = unwrap(self.policy), None
        if self.fsdp:  # gather the shards (every process), write them from the main process's copy
            weights = full_state_dict(self.policy)
            optimizer_state = full_optimizer_state_dict(self.policy, self.optimizer)
            if acc.is_main_process:
                self.save_copy.load_state_dict(weights)
                policy = self.save_copy
        failed = None
        if acc.is_main_process:
            if optimizer_state is None:
                optimizer_state = self.optimizer.state_dict()
            row = self.step_row if self.step_row is not None and self.step_row[M.STEP] == step else None
            state = {"algo": self.cfg.algo, **collected, **({"metrics_row": row} if row else {})}
            try:
                sync_file(self.run_dir / "metrics.jsonl")  # the rows up to this checkpoint are on disk first
                save_checkpoint(
                    self.run_dir,
                    step,
                    policy,
                    optimizer_state,
                    state,
                    carry=carry,
                    scheduler_state=self.scheduler.state_dict(),
                    keep=self.cfg.keep_checkpoints,
                )
            except CheckpointError as e:
                failed = e
        if any_process(failed is not None, acc):  # every process stops together, the main one says why
            ckpt = latest_checkpoint(self.run_dir)
            kept = f"the checkpoint of step {int(ckpt.name[5:])} is kept" if ckpt else "no checkpoint yet"
            raise CheckpointError(
                f"{failed or 'the main process could not write the checkpoint'}; {kept}; free space, then "
                f"continue with: {self._resume_command()}"
            )

    def _load_resume(self, policy: Any) -> Any:
        from t2i_gcpo.policies.registry import load_policy

        self.ckpt = latest_checkpoint(self.run_dir)
        if self.ckpt is None:  # stopped before its first save: the run starts again from its config
            return policy
        self.start_step = load_trainer_state(self.ckpt)["step"]
        acc = self.accelerator
        self.collector.load_state_dict(
            load_collector_state(self.ckpt, acc.process_index, acc.num_processes, acc.device)
        )
        if self.start_step > self.cfg.steps:
            raise UserError(
                f"cannot resume: {self.run_dir} has trained {self.start_step} steps, more than "
                f"steps={self.cfg.steps}"
            )
        resumed = load_policy(str(self.ckpt / "model"), self.cfg.model_options)
        policy.load_state_dict(resumed.state_dict())
        return policy
