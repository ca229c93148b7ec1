"""Everything `t2i-gcpo train` checks and loads before the first step, so bad input fails with one
line and nothing is written; then the run itself."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from t2i_gcpo.config import TrainConfig, _read_yaml, from_dict, load_config
from t2i_gcpo.errors import UserError, check_writable_dir
from t2i_gcpo.outdir import check_plain_tree

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


@dataclass(frozen=True)
class ResumeOptions:
    """What a resumed run may run and read of what its folder names (docs/errors.md#run-code): the run's
    `credit` scheme or `reward` named again (their code then runs, on its current content), or
    `trust_run_code` (the code the run started with, unchanged); `allow_changed_inputs`: continue on the
    new content of a prompt or code file edited since the run started."""

    credit: str | None = None
    reward: str | None = None
    trust_run_code: bool = False
    allow_changed_inputs: bool = False


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
            reward: Reward | None = None, resume_options: ResumeOptions = ResumeOptions()) -> Job:  # fmt: skip
    """Everything a run needs, checked and loaded; the run directory locked (released by `run`). `cfg`
    replaces the config built from the other arguments; `policy` and `reward` objects (from the Python
    API) replace loading ``cfg.model`` and building ``cfg.reward``, which then name them (`PYTHON_OBJECT`
    where they cannot be loaded again). A resumed run imports the code its folder names only as
    `resume_options` allow."""
    lock = None
    if resume_dir is not None:
        if resume_dir.is_dir():
            lock = _lock(resume_dir)
        try:
            return _prepare_resume(resume_dir, steps, resume_options, reward, lock)
        except BaseException:
            _release(lock)
            raise
    cfg = cfg if cfg is not None else load_config(algo, config_file, flags, overrides)
    for key, given in (("model", policy), ("reward", reward)):
        if given is None and is_python_object(getattr(cfg, key)):
            raise UserError(f"config {key} '{getattr(cfg, key)}' names a Python object: pass it from Python")
    if not cfg.prompts:  # null in a --config file or --set prompts=null
        raise UserError("config key 'prompts': a training run needs a prompt file, got none")
    from t2i_gcpo.train.tracking import resolve_report_to

    resolve_report_to(cfg.report_to)  # a tracker that is not installed: fail before loading anything
    run_dir = Path(cfg.out) if cfg.out else None
    # before any work: an --out that is a file or cannot be written fails now, not at the first save
    check_writable_dir(run_dir if run_dir is not None else Path("runs"), "run directory")
    if run_dir is not None:
        lock = _lock(run_dir, check_tree=False)  # a folder of the user's is refused before it is walked
        try:
            check_new_run_dir(run_dir)
            check_plain_tree(run_dir)
        except BaseException:
            _release(lock)
            raise
    try:
        return _load(cfg, run_dir, False, lock, policy, reward)
    except BaseException:
        _release(lock)
        raise


def _prepare_resume(run_dir: Path, steps: int | None, options: ResumeOptions, reward: Reward | None,
                    lock: Any) -> Job:  # fmt: skip
    """`prepare` for ``--resume``: the saved config read, the code it names imported only as `options`
    allow (usercode.run_code_guard), the prompt files checked against their fingerprints."""
    from t2i_gcpo.train.input_files import check_unchanged, read_record
    from t2i_gcpo.usercode import RunCodeGuard, run_code_guard

    data, finished = _read_resumable(run_dir, steps)
    recorded = read_record(run_dir)
    guard = RunCodeGuard(
        source=str(run_dir / "config.yaml"),
        named=_named_again(run_dir, data, options),
        trust=options.trust_run_code,
        recorded=None if recorded is None else {p: e["sha256"] for p, e in recorded.items()},
        allow_changed=options.allow_changed_inputs,
    )
    with run_code_guard(guard):
        cfg = from_dict(data)  # imports the code it names, as the guard allows (also for a finished run)
        if steps is not None:
            cfg.steps = steps
        if finished:
            return Job(cfg, run_dir, [], None, None, None, None, resume=True, finished=finished, lock=lock)
        check_writable_dir(run_dir, "run directory")
        if reward is None and is_python_object(cfg.reward):
            raise UserError(
                f"cannot resume {run_dir} here: it was trained with the Python reward '{cfg.reward.split(':', 1)[1]}'; "
                f"resume it from Python with the same function: t2i_gcpo.train(resume='{run_dir}', reward=…)"
            )
        check_unchanged(cfg, recorded, options.allow_changed_inputs)
        return _load(cfg, run_dir, True, lock, None, reward)


def _named_again(run_dir: Path, data: dict, options: ResumeOptions) -> frozenset[str]:
    """The kinds of code ("credit scheme", "reward") the user named again for this resume: each given
    must be the run's own (after paths are made absolute), else a one-line UserError."""
    from t2i_gcpo.config import canonical_spec
    from t2i_gcpo.rewards.registry import canonical_reward

    credit = data.get("credit")
    saved = {"credit scheme": credit.get("scheme") if isinstance(credit, dict) else None,
             "reward": data.get("reward")}  # fmt: skip
    named = set()
    for what, option, given, canonical in (("credit scheme", "--credit", options.credit, canonical_spec),
                                           ("reward", "--reward", options.reward, canonical_reward)):  # fmt: skip
        if given is None:
            continue
        own = saved[what]
        if not isinstance(own, str) or canonical(own) != canonical(given):
            raise UserError(
                f"{option} {given}: {run_dir} was trained with the {what} {own!r}; a resumed run keeps its "
                f"own (name it to let its code run), another {what} needs a new run"
            )
        named.add(what)
    return frozenset(named)


def _lock(run_dir: Path, check_tree: bool = True) -> Any:
    """The run directory's lock, taken by the main process only (the others share its run)."""
    import os

    from t2i_gcpo.outdir import lock_output

    return lock_output(run_dir, check_tree=check_tree) if int(os.environ.get("RANK", 0)) == 0 else None


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
    from t2i_gcpo.rewards.registry import build_reward, check_reward_spec, record_reward
    from t2i_gcpo.tasks.registry import get_task
    from t2i_gcpo.train.credit import check_user_credit

    if reward is None:  # a spec's typo or a missing weights folder: one line before the model loads
        check_reward_spec(cfg.reward)
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
        placed = cfg.reward_options.device
        reward = build_reward(cfg.reward, grid=policy.layout.grid, device=local_device(), output=policy.output,
                              reward_device=None if placed == "auto" else placed,
                              batch_size=cfg.reward_options.batch_size)  # fmt: skip
        cfg.reward = record_reward(cfg.reward, reward)  # a reward server's spec and version, in config.yaml
    dry = dry_sample(cfg, policy, reward, prompts)
    check_reward(cfg, reward, prompts, eval_prompts, dry)
    check_user_credit(cfg, policy, prompts, dry)  # a user's credit function on the same dry sample
    check_scheme_fits(cfg, policy)
    return Job(cfg, run_dir, prompts, eval_prompts, policy, reward, task, resume=resume, lock=lock)


def dry_sample(cfg: TrainConfig, policy: Policy, reward: Reward, prompts: list) -> Callable[[], Any]:
    """The checks' dry sample — one group of 2 of the first prompt, sampled as the run will (float32) and
    scored (tasks/loop.Scored) — drawn the first time a check asks for it, then the same for the next."""
    from t2i_gcpo.tasks.loop import group_generators, sample_and_score
    from t2i_gcpo.train.trainer import sampling_params

    sampling = dataclasses.replace(sampling_params(cfg), autocast="none")
    return functools.cache(
        lambda: sample_and_score(
            policy, reward, prompts[:1], 2, sampling, group_generators(cfg.seed, "dry", [0])
        )
    )


def check_reward(
    cfg: TrainConfig, reward: Reward, prompts: list, eval_prompts: list | None, dry: Callable[[], Any]
) -> None:
    """Before the run directory exists: the reward takes every training and held-out prompt (the
    arithmetic reward needs answers, the OCR reward a quoted phrase), and a reward that runs user code (a
    ``module:function`` or the API's Python callable) or asks for a probe (a VLM judge behind a server)
    scores the `dry` sample without failing — an exception, NaN, a wrong count or a server that is down
    stops here."""
    from t2i_gcpo.rewards.combine import RewardError, check_prompts, probes, runs_user_code

    for key, records in (("prompts", prompts), ("eval_prompts", eval_prompts or [])):
        try:
            check_prompts(reward, [p.text for p in records], [p.meta for p in records])
        except UserError as e:
            raise UserError(f"{getattr(cfg, key)}: {e}") from None
    if (runs_user_code(reward) or probes(reward)) and prompts:
        try:
            dry()
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


def _read_resumable(run_dir: Path, steps: int | None) -> tuple[dict, str | None]:
    """The saved config of the run in `run_dir` as read from its config.yaml (not yet validated: that
    imports the code it names, under the caller's guard) and, when the run has already finished its steps
    (`steps` when given), the one line that says so. Reads only."""
    from t2i_gcpo.train.checkpoint import latest_checkpoint, load_trainer_state

    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"cannot resume: {run_dir} is a file, not a run directory")
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise UserError(f"cannot resume: {saved} not found (is {run_dir} a run directory?)")
    data = _read_yaml(saved)
    if steps is not None and steps < 0:
        raise UserError(f"--steps must be ≥ 0, got {steps}")
    total = steps if steps is not None else data.get("steps", TrainConfig.steps)
    if not isinstance(total, int) or isinstance(total, bool):
        raise UserError(f"{saved}: config key 'steps': expected int, got {total!r}")
    ckpt = latest_checkpoint(run_dir)
    state = load_trainer_state(ckpt) if ckpt is not None else {"step": 0}  # none: start from the beginning
    done = state["step"]
    if done > total:
        given = "--steps" if steps is not None else "its saved config's steps"
        raise UserError(
            f"cannot resume: {run_dir} has trained {done} steps, more than {given} ({total}); "
            f"give --steps N with N ≥ {done}"
        )
    if done == total and state.get("finished"):
        return data, (
            f"{run_dir} already finished its {total} steps; nothing to do "
            f"(train longer with: t2i-gcpo train --resume {run_dir} --steps N)"
        )
    return data, None


def _absolute_paths(cfg: TrainConfig) -> None:
    """The user files `cfg` names (prompt files, reward code and checkpoints) by their absolute paths, so
    that a resume from another directory reads the same files, never others of the same name (a shipped
    prompt file named by its short name stays so: it is found in the installed package)."""
    from t2i_gcpo.rewards.registry import canonical_reward

    for key in ("prompts", "eval_prompts"):
        value = getattr(cfg, key)
        if value and Path(value).expanduser().exists():
            setattr(cfg, key, str(Path(value).expanduser().resolve()))
    cfg.reward = canonical_reward(cfg.reward)


def run(job: Job) -> dict:
    """Train (or, for a finished run, print so); the held-out scores at the end ({} when none)."""
    import os

    from t2i_gcpo.outdir import read_side_json
    from t2i_gcpo.train.input_files import fingerprints, write_record
    from t2i_gcpo.train.trainer import Trainer

    trainer = None
    main = int(os.environ.get("RANK", 0)) == 0
    try:
        if job.finished:
            if main:  # one line, also under `accelerate launch`
                print(job.finished)
            final = job.run_dir / "eval.json"
            return read_side_json(final) if final.is_file() else {}
        if not job.resume:
            _absolute_paths(job.cfg)  # before config.yaml is written: a resume elsewhere reads the same files
        inputs = fingerprints(job.cfg)  # what the run reads now, recorded once its directory exists
        trainer = Trainer(
            job.cfg, job.run_dir, job.prompts, job.policy, job.reward, job.task, job.eval_prompts, job.resume
        )
        if main:
            write_record(trainer.run_dir, inputs)
        return trainer.fit()
    finally:
        _release(job.lock)
        _release(getattr(trainer, "lock", None))  # a default run directory, locked when it was claimed
