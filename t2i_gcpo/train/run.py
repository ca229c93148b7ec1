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
from t2i_gcpo.hardware import local_device
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
    plan: Any = None  # train/plan.Plan: the trackers (each checked to start) and a step's cost
    eval_suite: Any = None  # train/eval_suite.SuiteEvaluation: the held-out evaluation by a benchmark suite


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
    # a command that resumes runs it cannot name code for (`compare`): what its refusal says to do instead
    remedy: str | None = None


# `model` / `reward` for a policy or reward given as a Python object that no string can load again:
# "<python>:NAME" (the API saves such a policy's initial weights and records their path instead)
PYTHON_OBJECT = "<python>"


def is_python_object(spec: str | None) -> bool:
    return bool(spec) and spec.split(":", 1)[0] == PYTHON_OBJECT


def prepare(
    algo: str | None = None,
    config_file: str | None = None,
    flags: dict | None = None,
    overrides: tuple[str, ...] = (),
    resume_dir: Path | None = None,
    steps: int | None = None,
    *,
    cfg: TrainConfig | None = None,
    policy: Policy | None = None,
    reward: Reward | None = None,
    resume_options: ResumeOptions = ResumeOptions(),
) -> Job:
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
    from t2i_gcpo.train.plan import plan_config

    trackers = plan_config(cfg)  # trackers, a step's cost: before a folder or a model (train/plan.py)
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
        return _load(cfg, run_dir, False, lock, policy, reward, trackers)
    except BaseException:
        _release(lock)
        raise


def _prepare_resume(
    run_dir: Path, steps: int | None, options: ResumeOptions, reward: Reward | None, lock: Any
) -> Job:
    """`prepare` for ``--resume``: the saved config read with `steps` applied and checked, the code it names
    imported only as `options` allow (usercode.run_code_guard), the prompt files checked against their
    fingerprints, then the plan of the run as it will continue."""
    from t2i_gcpo.train.input_files import check_unchanged, read_record
    from t2i_gcpo.usercode import run_code_guard

    data, finished = _read_resumable(run_dir, steps)
    recorded = read_record(run_dir)
    with run_code_guard(_resume_guard(run_dir, data, options, recorded)):
        cfg = _resumed_config(run_dir, data, steps)  # imports the code it names (also for a finished run)
        if finished:
            return Job(cfg, run_dir, [], None, None, None, None, resume=True, finished=finished, lock=lock)
        check_writable_dir(run_dir, "run directory")
        if reward is None and is_python_object(cfg.reward):
            raise UserError(
                f"cannot resume {run_dir} here: it was trained with the Python reward "
                f"'{cfg.reward.split(':', 1)[1]}'; resume it from Python with the same function: "
                f"t2i_gcpo.train(resume='{run_dir}', reward=…)"
            )
        check_unchanged(cfg, recorded, options.allow_changed_inputs)
        from t2i_gcpo.train.plan import plan_config

        return _load(cfg, run_dir, True, lock, None, reward, plan_config(cfg))


def check_resumable(run_dir: Path, steps: int | None, options: ResumeOptions) -> None:
    """What `--resume` checks of a run before it loads a model — its saved config with `steps` applied,
    the code its config names imported only as `options` allow, its checkpoint's carried groups (never a
    pickle) — for `compare`, which checks every run it will continue before it trains any."""
    from t2i_gcpo.rewards.registry import user_code_specs
    from t2i_gcpo.train.checkpoint import latest_checkpoint, load_carry
    from t2i_gcpo.train.input_files import read_record
    from t2i_gcpo.usercode import import_function, run_code_guard

    data, _ = _read_resumable(run_dir, steps)  # its trainer state read and checked
    with run_code_guard(_resume_guard(run_dir, data, options, read_record(run_dir))):
        cfg = _resumed_config(run_dir, data, steps)
        for spec in user_code_specs(cfg.reward):
            import_function(spec, "reward")
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        load_carry(ckpt)  # a pickle an earlier version wrote is refused unread, before any run trains


def _resume_guard(run_dir: Path, data: dict, options: ResumeOptions, recorded: dict | None) -> Any:
    """The guard of what a resumed run may import of the code its config (`data`) names."""
    from t2i_gcpo.usercode import RunCodeGuard

    credit = data.get("credit")
    specs = {
        "credit scheme": credit.get("scheme") if isinstance(credit, dict) else None,
        "reward": data.get("reward"),
    }
    return RunCodeGuard(
        source=str(run_dir / "config.yaml"),
        named=_named_again(run_dir, data, options),
        trust=options.trust_run_code,
        recorded=None if recorded is None else {p: e["sha256"] for p, e in recorded.items()},
        allow_changed=options.allow_changed_inputs,
        specs={what: spec for what, spec in specs.items() if isinstance(spec, str)},
        folder=run_dir,
        remedy=options.remedy,
    )


def _resumed_config(run_dir: Path, data: dict, steps: int | None) -> TrainConfig:
    """The run's config as it will continue: the saved one with `steps` applied, validated as a new run's
    is (a warmup longer than the run, …); a refusal names the run and the --steps given."""
    if steps is not None:
        data = {**data, "steps": steps}
    try:
        return from_dict(data)
    except UserError as e:
        if not str(e).startswith("config key"):  # code the guard refused, a file that does not exist …
            raise
        given = f" with --steps {steps}" if steps is not None else ""
        raise UserError(f"cannot resume {run_dir}{given}: {e}") from e.__cause__


def _named_again(run_dir: Path, data: dict, options: ResumeOptions) -> frozenset[str]:
    """The kinds of code ("credit scheme", "reward") the user named again for this resume: each given
    must be the run's own (after paths are made absolute), else a one-line UserError."""
    from t2i_gcpo.config import canonical_spec
    from t2i_gcpo.rewards.registry import canonical_reward

    credit = data.get("credit")
    saved = {
        "credit scheme": credit.get("scheme") if isinstance(credit, dict) else None,
        "reward": data.get("reward"),
    }
    named = set()
    for what, option, given, canonical in (
        ("credit scheme", "--credit", options.credit, canonical_spec),
        ("reward", "--reward", options.reward, canonical_reward),
    ):
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
            f"{run_dir} already holds a run; continue it with {_continue(run_dir)} or pick another --out"
        )
    entries = foreign_entries(run_dir)
    if entries:
        raise UserError(
            f"--out {run_dir} is not empty and not a run directory (it holds {shorten(entries[0], 60)}"
            f"{f' and {len(entries) - 1} more' if len(entries) > 1 else ''}); pick a new or empty folder"
        )


def plan_job(cfg: TrainConfig, policy: Policy | None = None, trackers: list[str] | None = None) -> Job:
    """A run of `cfg` loaded and checked as `prepare` checks it, without a run directory: what `compare`
    checks of each arm before it trains any (`policy`: the model loaded once for them all; `trackers`:
    already checked to start)."""
    return _load(cfg, None, False, None, policy, None, trackers)


def _continue(run_dir: Path) -> str:
    """The command that continues the run in `run_dir`, its own code named (train/run_dir.resume_command);
    from its config.yaml as saved, which is not checked here: a config that cannot be read gives the bare
    command, whose own checks then say what is wrong."""
    from t2i_gcpo.outdir import read_yaml
    from t2i_gcpo.train.run_dir import resume_command

    try:
        data = read_yaml(run_dir / "config.yaml")
        credit = data.get("credit") if isinstance(data, dict) else None
        code = (credit.get("scheme") if isinstance(credit, dict) else None, data.get("reward"))
    except (UserError, AttributeError):
        code = (None, None)
    return resume_command(run_dir, *(c if isinstance(c, str) else None for c in code))


def _load(
    cfg: TrainConfig,
    run_dir: Path | None,
    resume: bool,
    lock: Any,
    policy: Policy | None,
    reward: Reward | None,
    trackers: list[str] | None = None,
) -> Job:
    """Load the model, task, prompts and reward of a run and check its plan (everything checked before the
    first step and before the run directory is written); a `policy` or `reward` object given is used as it
    is."""
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.policies.sampling import resolve_guidance_scale
    from t2i_gcpo.rewards.registry import build_reward, check_reward_spec, record_reward
    from t2i_gcpo.tasks.registry import get_task
    from t2i_gcpo.train.credit import check_user_credit
    from t2i_gcpo.train.plan import plan_memory, plan_run

    if reward is None:  # a spec's typo or a missing weights folder: one line before the model loads
        check_reward_spec(cfg.reward)
    if policy is None:
        policy = load_policy(cfg.model, cfg.model_options)
    cfg.task = cfg.task or policy.default_task
    task = get_task(cfg.task, policy)
    resolve_reward_and_held_out(cfg, task)
    if cfg.rollout.cfg_scale is None:  # the checkpoint's recommendation (ShapeWorld stores one)
        cfg.rollout.cfg_scale = resolve_guidance_scale(policy, None)
    plan = plan_run(cfg, policy, trackers)  # trackers, decode loop, scheme × model, a step's cost
    prompts = task.load_prompts(cfg.prompts)
    eval_suite = None
    if cfg.eval_suite:  # a benchmark suite's prompts and scorer in place of the task's held-out evaluation
        from t2i_gcpo.train.eval_suite import SuiteEvaluation

        eval_suite = SuiteEvaluation(cfg, device=local_device())
        eval_prompts = eval_suite.prompts
    else:
        eval_prompts = task.load_prompts(cfg.eval_prompts) if cfg.eval_prompts else None
    policy.check_prompts([p.text for p in prompts + (eval_prompts or [])])
    plan = plan_memory(cfg, policy, plan, prompts[0])  # the memory a step holds, measured on the model
    if reward is None:
        placed = cfg.reward_options.device
        reward = build_reward(
            cfg.reward,
            grid=policy.layout.grid,
            device=local_device(),
            output=policy.output,
            reward_device=None if placed == "auto" else placed,
            batch_size=cfg.reward_options.batch_size,
        )
        cfg.reward = record_reward(cfg.reward, reward)  # a reward server's spec and version, in config.yaml
    dry = dry_sample(cfg, policy, reward, prompts)
    check_reward(cfg, reward, prompts, None if eval_suite else eval_prompts, dry)  # a suite scores its own
    if eval_suite is not None and eval_suite.scorer.kind == "judge" and cfg.eval_every >= 0 and prompts:
        eval_suite.probe(dry().outputs)  # a judge that is down: one line now, not at the first evaluation
    check_user_credit(cfg, policy, prompts, dry)  # a user's credit function on the same dry sample
    note_step_rewards(cfg, policy)
    return Job(
        cfg,
        run_dir,
        prompts,
        eval_prompts,
        policy,
        reward,
        task,
        resume=resume,
        lock=lock,
        plan=plan,
        eval_suite=eval_suite,
    )


def resolve_reward_and_held_out(cfg: TrainConfig, task: Task) -> None:
    """The task's default reward where the config names none, and its held-out prompts where the reward is
    the task's own scorer (its variants, e.g. shapeworld:flow_grpo, keep it): another reward scores only
    the held-out prompts given (eval_prompts)."""
    if cfg.reward is None:
        if task.default_reward is None:
            raise UserError(
                f"task '{task.name}' has no default reward: give --reward (e.g. geneval:DETECTOR,CLIP)"
            )
        cfg.reward = task.default_reward
    default = task.default_reward
    same_scorer = default is not None and cfg.reward.split(":")[0] == default.split(":")[0]
    if cfg.eval_prompts is None and same_scorer and not cfg.eval_suite:  # a suite holds its own prompts
        cfg.eval_prompts = task.default_eval_prompts()


def dry_sample(cfg: TrainConfig, policy: Policy, reward: Reward, prompts: list) -> Callable[[], Any]:
    """The checks' dry sample — one group of 2 of the first prompt, sampled as the run will (float32) and
    scored (tasks/loop.Scored) — drawn the first time a check asks for it, then the same for the next."""
    from t2i_gcpo.tasks.loop import group_generators, sample_and_score
    from t2i_gcpo.train.run_settings import sampling_params

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


def note_step_rewards(cfg: TrainConfig, policy: Policy) -> None:
    """A scheme that scores every reveal step's prediction says what that costs, once, before the run."""
    from t2i_gcpo.train.credit import needs_step_rewards, step_reward_note
    from t2i_gcpo.train.run_settings import sampling_params

    if needs_step_rewards(cfg.credit.scheme) and int(os.environ.get("RANK", 0)) == 0:
        steps = sampling_params(cfg).steps or policy.default_sampling().steps
        print(step_reward_note(cfg.credit.scheme, int(steps)), flush=True)


def _read_resumable(run_dir: Path, steps: int | None) -> tuple[dict, str | None]:
    """The saved config of the run in `run_dir` as read from its config.yaml (not yet validated: that
    imports the code it names, under the caller's guard) and, when the run has already finished its steps
    (`steps` when given), the one line that says so. Reads only."""
    from t2i_gcpo.train.checkpoint import latest_checkpoint, load_trainer_state
    from t2i_gcpo.train.run_dir import resume_command

    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"cannot resume: {run_dir} is a file, not a run directory")
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise UserError(f"cannot resume: {saved} not found (is {run_dir} a run directory?)")
    data = _read_yaml(saved, follow=False)  # a run folder's own file: never read through a link
    if steps is not None and steps < 0:
        raise UserError(f"--steps must be ≥ 0, got {steps}")
    total = steps if steps is not None else data.get("steps", TrainConfig.steps)
    if not isinstance(total, int) or isinstance(total, bool):
        raise UserError(f"{saved}: config key 'steps': expected int, got {total!r}")
    ckpt = latest_checkpoint(run_dir)
    state = load_trainer_state(ckpt) if ckpt is not None else {"step": 0}  # none: start from the beginning
    done = state["step"]
    credit = data.get("credit")
    code = (credit.get("scheme") if isinstance(credit, dict) else None, data.get("reward"))
    if done > total:
        given = "--steps" if steps is not None else "its saved config's steps"
        raise UserError(
            f"cannot resume: {run_dir} has trained {done} steps, more than {given} ({total}); give --steps N "
            f"with N ≥ {done} (to end it there: {resume_command(run_dir, *code, steps=done)})"
        )
    if done == total and state.get("finished"):
        longer = resume_command(run_dir, *code, steps=max(2 * total, total + 1))
        return (
            data,
            f"{run_dir} already finished its {total} steps; nothing to do (train longer with: {longer})",
        )
    return data, None


def _absolute_paths(cfg: TrainConfig) -> None:
    """The user files `cfg` names (prompt files, reward code and checkpoints) by their absolute paths, so
    that a resume from another directory reads the same files, never others of the same name (a shipped
    prompt file named by its short name stays so: it is found in the installed package)."""
    from t2i_gcpo.rewards.registry import canonical_reward

    for owner, key in (
        (cfg, "prompts"),
        (cfg, "eval_prompts"),
        (cfg.eval_suite_options, "data"),
        (cfg.eval_suite_options, "vqa"),
    ):
        value = getattr(owner, key)
        if value and Path(value).expanduser().exists():
            setattr(owner, key, str(Path(value).expanduser().resolve()))
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
            job.cfg,
            job.run_dir,
            job.prompts,
            job.policy,
            job.reward,
            job.task,
            job.eval_prompts,
            job.resume,
            eval_suite=job.eval_suite,
        )
        if main:
            write_record(trainer.run_dir, inputs)
        return trainer.fit()
    finally:
        _release(job.lock)
        _release(getattr(trainer, "lock", None))  # a default run directory, locked when it was claimed
