"""Everything `t2i-gcpo train` checks and loads before the first step, so bad input fails with one
line and nothing is written; then the run itself."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from t2i_gcpo.config import TrainConfig, _read_yaml, from_dict, load_config
from t2i_gcpo.errors import UserError, check_writable_dir

if TYPE_CHECKING:
    from t2i_gcpo.policies.base import Policy, PromptRecord
    from t2i_gcpo.rewards.base import Reward
    from t2i_gcpo.tasks.base import Task


@dataclass
class Job:
    cfg: TrainConfig
    run_dir: Path | None
    prompts: list[PromptRecord]
    eval_prompts: list[PromptRecord] | None
    policy: Policy
    reward: Reward
    task: Task
    resume: bool
    finished: str | None = None  # a resumed run that has nothing left to do: the line to print
    lock: Any = None  # the run directory's OutputLock (main process), released when `run` ends


# `model` / `reward` for a policy or reward given as a Python object that no string can load again:
# "<python>:NAME" (the API saves such a policy's initial weights and records their path instead)
PYTHON_OBJECT = "<python>"


def is_python_object(spec: str | None) -> bool:
    return bool(spec) and spec.split(":", 1)[0] == PYTHON_OBJECT


def local_device() -> str:
    """This process's device (accelerate sets LOCAL_RANK per process on multi-GPU launches)."""
    import os

    import torch

    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"


def prepare(algo: str | None = None, config_file: str | None = None, flags: dict | None = None,
            overrides: tuple[str, ...] = (), resume_dir: Path | None = None, steps: int | None = None, *,
            cfg: TrainConfig | None = None, policy: Policy | None = None,
            reward: Reward | None = None) -> Job:  # fmt: skip
    """Everything a run needs, checked and loaded; the run directory locked (released by `run`). `cfg`
    replaces the config built from the other arguments; `policy` and `reward` objects (from the Python
    API) replace loading ``cfg.model`` and building ``cfg.reward``, which then name them (`PYTHON_OBJECT`
    where they cannot be loaded again)."""
    lock = None
    if resume_dir is not None:
        if resume_dir.is_dir():
            lock = _lock(resume_dir)
        try:
            cfg, finished = _resume_config(resume_dir, steps)
            if finished:
                return Job(
                    cfg, resume_dir, [], None, None, None, None, resume=True, finished=finished, lock=lock
                )
            run_dir = resume_dir
            check_writable_dir(run_dir, "run directory")
            if reward is None and is_python_object(cfg.reward):
                raise UserError(
                    f"cannot resume {run_dir} here: it was trained with the Python reward '{cfg.reward.split(':', 1)[1]}'; "
                    f"resume it from Python with the same function: t2i_gcpo.train(resume='{run_dir}', reward=…)"
                )
        except BaseException:
            _release(lock)
            raise
    else:
        cfg = cfg if cfg is not None else load_config(algo, config_file, flags, overrides)
        for key, given in (("model", policy), ("reward", reward)):
            if given is None and is_python_object(getattr(cfg, key)):
                raise UserError(
                    f"config {key} '{getattr(cfg, key)}' names a Python object: pass it from Python"
                )
        if not cfg.prompts:  # null in a --config file or --set prompts=null
            raise UserError("config key 'prompts': a training run needs a prompt file, got none")
        from t2i_gcpo.train.tracking import resolve_report_to

        resolve_report_to(cfg.report_to)  # a tracker that is not installed: fail before loading anything
        run_dir = Path(cfg.out) if cfg.out else None
        # before any work: an --out that is a file or cannot be written fails now, not at the first save
        check_writable_dir(run_dir if run_dir is not None else Path("runs"), "run directory")
        if run_dir is not None:
            lock = _lock(run_dir)
            try:
                check_new_run_dir(run_dir)
            except BaseException:
                _release(lock)
                raise
    try:
        return _load(cfg, run_dir, resume_dir is not None, lock, policy, reward)
    except BaseException:
        _release(lock)
        raise


def _lock(run_dir: Path) -> Any:
    """The run directory's lock, taken by the main process only (the others share its run)."""
    import os

    from t2i_gcpo.outdir import lock_output

    return lock_output(run_dir) if int(os.environ.get("RANK", 0)) == 0 else None


def _release(lock: Any) -> None:
    if lock is not None:
        lock.release()


def check_new_run_dir(run_dir: Path) -> None:
    """A new run goes into a new or empty folder: a run's folder is continued with --resume, and any
    other folder holds the user's files, which a run would overwrite (config.yaml, report.html) or be
    mixed with (an earlier eval.json)."""
    from t2i_gcpo.errors import shorten
    from t2i_gcpo.outdir import foreign_entries, is_run_dir

    if is_run_dir(run_dir):
        raise UserError(
            f"{run_dir} already holds a run; continue it with --resume {run_dir} or pick another --out"
        )
    entries = foreign_entries(run_dir)
    if entries:
        raise UserError(
            f"--out {run_dir} is not empty and not a run directory (it holds {shorten(entries[0], 60)}"
            f"{f' and {len(entries) - 1} more' if len(entries) > 1 else ''}); pick a new or empty folder"
        )


def _load(cfg: TrainConfig, run_dir: Path | None, resume: bool, lock: Any, policy: Policy | None,
          reward: Reward | None) -> Job:  # fmt: skip
    """Load the model, task, prompts and reward of a run (everything checked before the first step);
    a `policy` or `reward` object given is used as it is."""
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.policies.sampling import resolve_guidance_scale
    from t2i_gcpo.rewards.registry import build_reward
    from t2i_gcpo.tasks.registry import get_task

    if policy is None:
        policy = load_policy(cfg.model, cfg.model_options)
    cfg.task = cfg.task or policy.default_task
    task = get_task(cfg.task, policy)
    prompts = task.load_prompts(cfg.prompts)
    if cfg.reward is None:
        if task.default_reward is None:
            raise UserError(
                f"task '{task.name}' has no default reward: give --reward (e.g. geneval:DETECTOR,CLIP)"
            )
        cfg.reward = task.default_reward
    # the held-out score needs the task's own scorer; its variants (e.g. shapeworld:flow_grpo) keep it
    default = task.default_reward
    same_scorer = default is not None and cfg.reward.split(":")[0] == default.split(":")[0]
    if cfg.eval_prompts is None and same_scorer:
        cfg.eval_prompts = task.default_eval_prompts()
    eval_prompts = task.load_prompts(cfg.eval_prompts) if cfg.eval_prompts else None
    policy.check_prompts([p.text for p in prompts + (eval_prompts or [])])
    if cfg.rollout.cfg_scale is None:  # the checkpoint's recommendation (ShapeWorld stores one)
        cfg.rollout.cfg_scale = resolve_guidance_scale(policy, None)
    if reward is None:
        reward = build_reward(
            cfg.reward, grid=policy.layout.grid, device=local_device(), output=policy.output
        )
    check_reward(cfg, policy, reward, prompts, eval_prompts)
    check_scheme_fits(cfg, policy)
    return Job(cfg, run_dir, prompts, eval_prompts, policy, reward, task, resume=resume, lock=lock)


def check_reward(
    cfg: TrainConfig, policy: Policy, reward: Reward, prompts: list, eval_prompts: list | None
) -> None:
    """Before the run directory exists: the reward takes every training and held-out prompt (the
    arithmetic reward needs answers), and a reward that runs user code (a ``module:function`` or the
    API's Python callable) scores a dry sample (one group of 2 of the first prompt) without failing —
    an exception, NaN or a wrong count stops here."""
    import dataclasses

    from t2i_gcpo.rewards.combine import RewardError, check_prompts, runs_user_code
    from t2i_gcpo.tasks.loop import group_generators, sample_and_score
    from t2i_gcpo.train.trainer import sampling_params

    for key, records in (("prompts", prompts), ("eval_prompts", eval_prompts or [])):
        try:
            check_prompts(reward, [p.text for p in records], [p.meta for p in records])
        except UserError as e:
            raise UserError(f"{getattr(cfg, key)}: {e}") from None
    if runs_user_code(reward) and prompts:
        sampling = dataclasses.replace(sampling_params(cfg), autocast="none")
        try:
            sample_and_score(policy, reward, prompts[:1], 2, sampling, group_generators(cfg.seed, "dry", [0]))
        except RewardError as e:  # still a RewardError (a UserError): the API's callers catch it as such
            raise RewardError(f"{e} (on a dry sample, before the run started)") from e.__cause__


def check_scheme_fits(cfg: TrainConfig, policy: Policy) -> None:
    """Before the run directory exists: the model's family gives what the credit scheme needs
    (train/credit.check_capabilities), and a scheme that branches finds branch points in the model's
    samples (train/branches.check_spacing); a scheme that scores every reveal step says what that costs."""
    from t2i_gcpo.core.schemes import get_scheme
    from t2i_gcpo.train.branches import check_spacing
    from t2i_gcpo.train.credit import check_capabilities, step_reward_note
    from t2i_gcpo.train.trainer import sampling_params

    check_capabilities(cfg.credit.scheme, policy)
    needs = get_scheme(cfg.credit.scheme).needs
    if "branches" in needs:
        check_spacing(policy, cfg.branching, sampling_params(cfg))
    if "leaves" in needs:
        check_tree_groups(cfg)
    if "step_rewards" in needs and int(os.environ.get("RANK", 0)) == 0:  # its extra reward calls, said once
        steps = sampling_params(cfg).steps or policy.default_sampling().steps
        print(step_reward_note(cfg.credit.scheme, int(steps)), flush=True)


def check_tree_groups(cfg: TrainConfig) -> None:
    """Tree groups need the same number of leaves in every group (branching.rule spread or entropy) and
    continuations that train as the roots do (masked models: the trajectory estimator)."""
    if cfg.branching.rule not in ("spread", "entropy"):
        raise UserError(
            f"credit scheme '{cfg.credit.scheme}' grows tree groups, which branch with branching.rule=spread or "
            f"entropy (k points in every sample), got branching.rule={cfg.branching.rule}"
        )
    if cfg.model_options.estimator != "trajectory":
        raise UserError(
            f"credit scheme '{cfg.credit.scheme}' trains on continuations, which are trajectory samples: "
            "set model_options.estimator=trajectory"
        )


def _resume_config(run_dir: Path, steps: int | None) -> tuple[TrainConfig, str | None]:
    """The saved config of the run in `run_dir` (steps replaced by `steps` when given) and, when the
    run has already finished those steps, the one line that says so. Reads only."""
    from t2i_gcpo.train.checkpoint import latest_checkpoint, load_trainer_state

    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"cannot resume: {run_dir} is a file, not a run directory")
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise UserError(f"cannot resume: {saved} not found (is {run_dir} a run directory?)")
    cfg = from_dict(_read_yaml(saved))
    if steps is not None:
        if steps < 0:
            raise UserError(f"--steps must be ≥ 0, got {steps}")
        cfg.steps = steps
    ckpt = latest_checkpoint(run_dir)
    state = load_trainer_state(ckpt) if ckpt is not None else {"step": 0}  # none: start from the beginning
    done = state["step"]
    if done > cfg.steps:
        given = "--steps" if steps is not None else "its saved config's steps"
        raise UserError(
            f"cannot resume: {run_dir} has trained {done} steps, more than {given} ({cfg.steps}); "
            f"give --steps N with N ≥ {done}"
        )
    if done == cfg.steps and state.get("finished"):
        return cfg, (
            f"{run_dir} already finished its {cfg.steps} steps; nothing to do "
            f"(train longer with: t2i-gcpo train --resume {run_dir} --steps N)"
        )
    return cfg, None


def run(job: Job) -> dict:
    """Train (or, for a finished run, print so); the held-out scores at the end ({} when none)."""
    import json
    import os

    from t2i_gcpo.train.trainer import Trainer

    trainer = None
    try:
        if job.finished:
            if int(os.environ.get("RANK", 0)) == 0:  # one line, also under `accelerate launch`
                print(job.finished)
            final = job.run_dir / "eval.json"
            return json.loads(final.read_text()) if final.is_file() else {}
        trainer = Trainer(
            job.cfg, job.run_dir, job.prompts, job.policy, job.reward, job.task, job.eval_prompts, job.resume
        )
        return trainer.fit()
    finally:
        _release(job.lock)
        _release(getattr(trainer, "lock", None))  # a default run directory, locked when it was claimed
