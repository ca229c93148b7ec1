"""The Python API: train a policy, generate and evaluate images, draw credit maps.

The ``t2i-gcpo`` commands ``train``, ``sample``, ``eval shapeworld|geneval|geneval2|judge`` and ``credit-map``
parse their options and call these functions, so a notebook and the command line run the same code and,
for the same seed, give the same results.

    from t2i_gcpo import api

    result = api.train(
        prompts=["a photo of a red circle", "a photo of two blue squares"],
        reward=lambda images, prompts, metadata: images[:, 0].mean((1, 2)),  # redness
        overrides={"rollout.prompts_per_step": 2, "rollout.group_size": 4},
        steps=2,
        out="runs/redness",
    )
    print(result.run_dir, result.metrics[-1]["reward/mean"])

Bad input raises `t2i_gcpo.errors.UserError` (a failing reward: its subclass `RewardError`) with a
one-line message, before anything is written where it can be checked beforehand.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from t2i_gcpo.errors import UserError

if TYPE_CHECKING:
    import torch

    from t2i_gcpo.config import TrainConfig
    from t2i_gcpo.policies.base import Policy
    from t2i_gcpo.rewards.base import RewardOutput

__all__ = [
    "RewardFn",
    "SampleResult",
    "TrainResult",
    "credit_maps",
    "evaluate_geneval",
    "evaluate_geneval2",
    "evaluate_judge",
    "evaluate_shapeworld",
    "generate",
    "load_config",
    "load_policy",
    "sample",
    "train",
]

RewardFn = Callable[[Any, list, list], Union[Sequence[float], "torch.Tensor", "RewardOutput"]]
"""A Python reward: ``reward(images, prompts, metadata) -> scores``.

- ``images``: float tensor [B, 3, H, W] in [0, 1] (a text model: a list of B strings);
- ``prompts``: the B prompt texts, each prompt's group of samples next to each other (B = prompts × G);
- ``metadata``: B dicts, each prompt's GenEval metadata (``tag``, ``include``, … — empty keys where the
  prompt has none; for the arithmetic world the question's ``answer`` and ``steps``);
- returns B finite scores: a list of floats, a tensor [B] (or [B, 1]), or a
  `t2i_gcpo.rewards.base.RewardOutput` (scores and per-sample details, e.g. ``strict`` and ``tag`` for
  the GenEval step metrics).

An exception inside it, a NaN/inf score or a wrong number of scores raises `RewardError` naming it.
"""

PromptsArg = str | os.PathLike | Sequence[str] | Sequence[Mapping[str, Any]]
ModelArg = Union[str, "Policy"]


# ----------------------------------------------------------------------------- models and configs


def load_policy(model: str, **options: Any) -> Policy:
    """Load a policy by name or path, as ``--model`` does.

    Args:
        model: a shipped model (``"shapeworld"``, the AR prior; ``"shapeworld-64"``,
            ``"shapeworld-masked"``, ``"arithmetic"``, the text model), a checkpoint directory (e.g. a
            run's ``checkpoints/step_000200/model``), or ``"FAMILY:PATH"`` for a registered family
            (``janus``, ``llamagen``, ``amused``, ``masked``, ``text``, ``ar``, or your own:
            docs/guides/new_family.md; `registry.models_help()` lists them).
        **options: ``model_options`` config keys, each read by the families that declare it:
            ``dtype``, ``lora_rank``, ``gradient_checkpointing`` (real checkpoints), ``estimator``,
            ``remask_count`` (masked models), ``negative`` (text), ``gpt_size``, ``image_size``,
            ``cfg_interval`` (LlamaGen); another family's key is an error.

    Returns:
        The policy adapter (a ``torch.nn.Module``): ``rollout``, ``logprobs``, ``decode``,
        ``save_pretrained``.

    Raises:
        UserError: unknown model, missing path, or an unknown option.
    """
    from t2i_gcpo.config import ModelOptions, _apply
    from t2i_gcpo.policies.registry import load_policy as _load

    opts = None
    if options:
        opts = ModelOptions()
        _apply(opts, options, prefix="model_options.")
    return _load(model, opts)


def load_config(
    preset: str | None = None,
    file: str | os.PathLike | None = None,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
) -> TrainConfig:
    """A training config: an algorithm preset, a YAML file on top of it, then overrides.

    Args:
        preset: ``grpo``, ``dapo``, ``gcpo``, ``dgpo``, ``gcpo-official``, ``critical``, ``stage``
            (default: the ``algo`` a YAML `file` names, else ``gcpo``).
        file: a YAML config (``--config``).
        overrides: dotted keys to values (``{"optim.lr": 3e-5}``) or ``--set`` strings
            (``["optim.lr=3e-5"]``).

    Returns:
        The validated `t2i_gcpo.config.TrainConfig`; edit its fields and pass it to `train`.

    Raises:
        UserError: unknown preset or key, a value of the wrong type, a failed cross-field check.
    """
    from t2i_gcpo.config import load_config as _load

    return _load(preset, file, None, _overrides(overrides))


def _overrides(
    overrides: Mapping[str, Any] | Sequence[str] | str | None,
) -> Mapping[str, Any] | tuple[str, ...]:
    if overrides is None:
        return ()
    if isinstance(overrides, str):  # one "key=value" string, not its characters
        return (overrides,)
    return overrides if isinstance(overrides, Mapping) else tuple(overrides)


def _policy_and_name(model: ModelArg | None) -> tuple[Any, str | None]:
    """(the policy object or None, the string config.yaml records for `model`)."""
    if model is None or isinstance(model, (str, os.PathLike)):  # before importing torch: refusals stay fast
        return None, None if model is None else os.fspath(model)
    from t2i_gcpo.policies.base import missing_members, with_member_defaults
    from t2i_gcpo.train.run import PYTHON_OBJECT

    missing = missing_members(model)  # the protocol's members, checked by name
    if missing:
        raise UserError(
            f"model must be a name, a path or a Policy (t2i_gcpo.policies.base.Policy), got "
            f"{type(model).__name__}, which lacks {', '.join(missing)}"
        )
    return with_member_defaults(model), f"{PYTHON_OBJECT}:{type(model).__name__}"


def _load(model: ModelArg) -> Policy:
    from t2i_gcpo.hardware import local_device

    policy, name = _policy_and_name(model)  # a policy object stays where its owner put it
    return policy if policy is not None else load_policy(name).to(local_device())  # a GPU when there is one


def _model_identity(model: ModelArg, policy: Policy) -> str:
    """What generated images record as their model: a name or absolute path, or for a Python object its
    class and parameter checksum (a later call with changed weights does not resume into the folder)."""
    from t2i_gcpo.policies.registry import model_identity

    if isinstance(model, (str, os.PathLike)):
        return model_identity(os.fspath(model))
    from t2i_gcpo.train.distributed import param_checksum
    from t2i_gcpo.train.run import PYTHON_OBJECT

    return f"{PYTHON_OBJECT}:{type(policy).__name__}:{float(param_checksum(policy)):.17g}"


def _reward_and_name(reward: str | RewardFn | None) -> tuple[Any, str | None]:
    """(a reward object or None, the string config.yaml records for `reward`): a function importable
    as ``module:function`` is recorded so, which the command line can resume."""
    if reward is None or isinstance(reward, str):
        return None, reward
    from t2i_gcpo.rewards.combine import Checked, FunctionReward
    from t2i_gcpo.train.run import PYTHON_OBJECT

    wrapped = FunctionReward(reward)
    module, qualname = getattr(reward, "__module__", None), getattr(reward, "__qualname__", "")
    spec = f"{PYTHON_OBJECT}:{wrapped.name}"
    if module and module != "__main__" and qualname.isidentifier():
        import importlib

        try:
            if getattr(importlib.import_module(module), qualname, None) is reward:
                spec = f"{module}:{qualname}"
                wrapped.origin = spec
        except Exception:  # not importable again: recorded as a Python object
            pass
    return Checked(wrapped), spec


def _credit_spec(credit: str | Callable[..., Any] | None) -> str | None:
    """The string config.yaml records for `credit` (``credit.scheme``): a name or spec as it is; a function
    importable as ``module:function`` so (the command line can resume it), any other function added to the
    registry under ``<python>:NAME`` (resumable from Python, given again)."""
    if credit is None or isinstance(credit, str):
        return credit
    if isinstance(credit, os.PathLike):
        raise UserError(
            f"credit: give a file's function as 'path/to/file.py:function', got the path {credit}"
        )
    if not callable(credit):
        raise UserError(
            f"credit must be a scheme name, a 'file.py:function' spec or a function, got {credit!r}"
        )
    from t2i_gcpo.core.schemes import CreditSchemeError, add_user_scheme
    from t2i_gcpo.usercode import PYTHON_OBJECT

    module, qualname = getattr(credit, "__module__", None), getattr(credit, "__qualname__", "")
    if module and module != "__main__" and qualname.isidentifier():
        import importlib

        try:
            if getattr(importlib.import_module(module), qualname, None) is credit:
                return f"{module}:{qualname}"
        except Exception:  # not importable again: recorded as a Python object
            pass
    spec = f"{PYTHON_OBJECT}:{getattr(credit, '__name__', type(credit).__name__)}"
    try:
        add_user_scheme(spec, credit)
    except CreditSchemeError as e:
        raise UserError(str(e)) from None
    return spec


def _check_sampling(
    cfg_scale: float | None = None, temperature: float = 1.0, top_k: int = 0, seed: int = 0, n: int = 1
) -> float | None:
    """The sampling arguments checked as the config keys they set (rollout.cfg_scale, rollout.temperature,
    rollout.top_k, seed: the same types and bounds, no NaN or inf) and `n` ≥ 1, before any model is
    loaded; returns `cfg_scale`."""
    import numbers

    from t2i_gcpo.config import check_value

    for name, key, value, kind in (
        ("cfg_scale", "rollout.cfg_scale", cfg_scale, numbers.Real),
        ("temperature", "rollout.temperature", temperature, numbers.Real),
        ("top_k", "rollout.top_k", top_k, numbers.Integral),
        ("seed", "seed", seed, numbers.Integral),
        ("n", "eval_images_per_prompt", n, numbers.Integral),
    ):
        if value is None and key == "rollout.cfg_scale":  # the model's own
            continue
        if isinstance(value, bool) or not isinstance(value, kind):
            raise UserError(
                f"{name} must be {'an integer' if kind is numbers.Integral else 'a number'}, got {value!r}"
            )
        check_value(key, value, what=name)
    return cfg_scale


@contextmanager
def _locked_out(
    out: str | os.PathLike, command: str, settings: Mapping[str, Any] | None = None, overwrite: bool = False
) -> Iterator[Path]:
    """The output folder, checked writable and locked while the caller writes it (one command at a time
    per folder, as `t2i_gcpo.outdir.lock_output`: another holder is a UserError naming it), and not made
    by another command or (unless `overwrite`) with other `settings` (`outdir.check_settings_record`);
    the caller records its settings (`_record_out`) before its first output."""
    from t2i_gcpo.errors import check_writable_dir
    from t2i_gcpo.outdir import check_settings_record, lock_output

    out_dir = check_writable_dir(out, "--out")
    with lock_output(out_dir):
        check_settings_record(out_dir, command, settings or {}, redo="--overwrite", redoing=overwrite)
        yield out_dir


def _record_out(out_dir: Path, command: str, settings: Mapping[str, Any] | None = None) -> None:
    """Record in the locked `out_dir` that `command` writes there with `settings` (before
    its first output)."""
    from t2i_gcpo.outdir import write_settings_record

    if _main_process():
        write_settings_record(out_dir, command, settings or {})


# ----------------------------------------------------------------------------- prompts


def _is_prompt_file(prompts: Any) -> bool:
    """A path, or a string naming a prompt file (any other string is a prompt)."""
    return isinstance(prompts, os.PathLike) or (
        isinstance(prompts, str) and (Path(prompts).suffix in (".txt", ".jsonl") or Path(prompts).is_file())
    )


def _prompt_file_text(prompts: Sequence[Any]) -> tuple[str, str]:
    """(file name, content) of a prompt list: strings → prompts.txt, metadata dicts → prompts.jsonl."""
    items = list(prompts)
    if not items:
        raise UserError("prompts: the list is empty")
    if all(isinstance(p, str) for p in items):
        for i, p in enumerate(items):
            if not p.strip() or "\n" in p or p.lstrip().startswith("#"):
                raise UserError(f"prompts[{i}] must be one non-empty line not starting with '#', got {p!r}")
        return "prompts.txt", "".join(p.strip() + "\n" for p in items)
    if all(isinstance(p, Mapping) for p in items):
        try:
            return "prompts.jsonl", "".join(json.dumps(dict(p), ensure_ascii=False) + "\n" for p in items)
        except (TypeError, ValueError) as e:
            raise UserError(f"prompts: a metadata dict is not JSON data ({e})") from None
    raise UserError("prompts must be a .txt/.jsonl file path, a list of strings or a list of metadata dicts")


@contextmanager
def _prompt_path(prompts: PromptsArg) -> Iterator[str]:
    """A file path for `prompts`: the file itself (the user's, else the shipped one it names, e.g.
    ``prompts/shapeworld_test.txt``), or a temporary file holding the list."""
    if _is_prompt_file(prompts):
        from t2i_gcpo.resources import prompt_file

        yield str(prompt_file(prompts))
        return
    name, text = _prompt_file_text([prompts] if isinstance(prompts, str) else prompts)
    with tempfile.TemporaryDirectory(prefix="t2i-gcpo-prompts-") as tmp:
        path = Path(tmp) / name
        path.write_text(text, encoding="utf-8")
        try:
            yield str(path)
        except UserError as e:  # name the list's entry, not the temporary file's line (one entry a line)
            message = re.sub(
                rf"{re.escape(str(path))}:(\d+):", lambda m: f"prompts[{int(m[1]) - 1}]:", str(e)
            )
            raise type(e)(message.replace(str(path), "the prompt list")) from e.__cause__


# ----------------------------------------------------------------------------- train


@dataclass
class TrainResult:
    """What `train` returns.

    Attributes:
        run_dir: the run directory: config.yaml, metrics.jsonl, checkpoints/, tb/, report.html.
        metrics: every row of metrics.jsonl (dicts keyed by the names in `t2i_gcpo.metrics`), in order.
        eval: the final held-out scores (``eval/…`` keys); empty when the run has no held-out prompts.
        policy: the trained policy (trained in place when one was passed in); None when a resumed run
            had nothing left to do — load its last checkpoint with `load_policy`.
    """

    run_dir: Path
    metrics: list[dict]
    eval: dict
    policy: Policy

    @property
    def checkpoint(self) -> Path | None:
        """The last checkpoint's model directory (give it to `load_policy`), None if there is none."""
        from t2i_gcpo.train.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(self.run_dir)
        return ckpt / "model" if ckpt is not None else None


def train(
    model: ModelArg | None = None,
    prompts: PromptsArg | None = None,
    reward: str | RewardFn | None = None,
    config: str | os.PathLike | TrainConfig | None = None,
    *,
    algo: str | None = None,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    out: str | os.PathLike | None = None,
    steps: int | None = None,
    seed: int | None = None,
    report_to: str | None = None,
    resume: str | os.PathLike | None = None,
    credit: str | Callable[..., Any] | None = None,
    trust_run_code: bool = False,
    allow_changed_inputs: bool = False,
) -> TrainResult:
    """Train a policy with GRPO, DAPO, GCPO or DGPO (``t2i-gcpo train``).

    Args:
        model: a model name or path as for `load_policy` (default: the config's, ``"shapeworld"``),
            or a policy object (e.g. from `load_policy`), which is trained in place; its initial
            weights are saved as ``run_dir/initial_model``, the run's model for a resume.
        prompts: a .txt/.jsonl prompt file, a prompt string, a list of them (parsed like a .txt file's lines:
            they must fit the model's task, e.g. ShapeWorld's GenEval templates), or a list of GenEval
            metadata dicts (as a .jsonl file's rows). A list is saved as the run's ``prompts.txt`` /
            ``prompts.jsonl``, so the run can be resumed.
        reward: a reward spec string as for ``--reward`` (``"shapeworld"``, ``"clip:CKPT"``,
            ``"module:function"``, weighted sums; default: the task's own), or a Python callable
            ``reward(images, prompts, metadata)`` (see `RewardFn`).
        config: a preset name (``"dapo"``, ``"gcpo"``, …), a YAML config file (applied on top of the
            preset `algo` or the one it names), or a `TrainConfig` object (e.g. from `load_config`,
            used as it is).
        algo: the preset under a YAML `config` (``--algo``).
        overrides: dotted config keys to values, ``{"rollout.group_size": 16}``, or ``--set`` strings.
        out: the run directory (default ``runs/<algo>-<time>``); it must not hold a run already.
        steps: optimizer steps (default: the config's, 200). With `resume`: train to this many in all.
        seed: seed of prompt order, sampling and initialisation (default 0).
        report_to: experiment trackers (``--report-to``): ``"tensorboard"`` (default), ``"wandb"``,
            ``"mlflow"``, ``"trackio"``, ``"all"``, ``"none"`` or a comma-separated list; one that is not
            installed is refused before anything is loaded.
        resume: continue the run in this directory from its last checkpoint, with its saved config
            (only `steps` may change; a run trained with a Python reward or credit function needs the same
            function as `reward` / `credit`). The code its config names (a ``file.py:function`` or
            ``module:function`` credit scheme or reward) runs only when given again as `credit` /
            `reward` (the same spec) or with `trust_run_code` (docs/errors.md#run-code).
        credit: the token-credit scheme (``--credit``, config key ``credit.scheme``; default: the
            preset's): a registered name (``"gcpo"``, ``"uniform"``, …), ``"path/to/file.py:function"``,
            ``"module:function"``, or a function ``fn(inputs, **options) -> w [B, T]`` marked with
            `t2i_gcpo.credit_scheme` (docs/guides/custom-credit.md); its options: ``credit.options.NAME``.
        trust_run_code: with `resume`, run the code the run's config names without naming it again, if it
            is the code the run started with (``--trust-run-code``).
        allow_changed_inputs: with `resume`, continue although a prompt, credit or reward file changed
            since the run started (``--allow-changed-inputs``).

    Returns:
        `TrainResult`: the run directory, its metrics rows, the final held-out scores and the policy.

    Raises:
        UserError: bad input (paths, prompts the model cannot take, config keys), checked before the
            run directory is written; RewardError (a UserError) when the reward raises or returns NaN
            or the wrong number of scores.
        KeyboardInterrupt: Ctrl-C or SIGTERM, after saving a checkpoint (resume with ``resume=``).
    """
    policy, model_name = _policy_and_name(model)
    reward_obj, reward_name = _reward_and_name(reward)
    credit_name = _credit_spec(credit)
    if resume is not None:
        given = [
            k
            for k, v in (
                ("prompts", prompts),
                ("config", config),
                ("algo", algo),
                ("overrides", overrides or None),
                ("out", out),
                ("report_to", report_to),
                ("seed", seed),
            )
            if v is not None
        ]
        given += ["model"] if model is not None else []
        if given:
            raise UserError(
                f"resume takes the run's saved config; only steps may be given with it (and its reward or "
                f"credit again), not {', '.join(given)}"
            )
        from t2i_gcpo.train.run import ResumeOptions

        options = ResumeOptions(
            credit=credit_name,
            reward=reward_name,
            trust_run_code=trust_run_code,
            allow_changed_inputs=allow_changed_inputs,
        )
        job = _prepare(resume_dir=Path(resume), steps=steps, reward=reward_obj, resume_options=options)
        return _finish(job, _run(job))
    if trust_run_code or allow_changed_inputs:
        raise UserError(
            "trust_run_code and allow_changed_inputs go with resume= (a new run runs the code you give)"
        )
    if prompts is None:
        raise UserError("missing prompts (a .txt/.jsonl file or a list of prompts)")
    from t2i_gcpo.config import TrainConfig, preset_names
    from t2i_gcpo.config import load_config as _load

    presets = preset_names()
    if isinstance(config, str) and config in presets:  # a preset name; any other string is a file
        if algo is not None:
            raise UserError(f"give the preset once: config={config!r} or algo={algo!r}")
        config, algo = None, config
    elif (
        isinstance(config, str) and Path(config).suffix not in (".yaml", ".yml") and not Path(config).exists()
    ):
        raise UserError(f"config {config!r} is neither a preset ({', '.join(presets)}) nor a YAML file")
    elif isinstance(config, TrainConfig) and algo is not None:
        raise UserError("algo= picks a preset; a TrainConfig object already holds its own (config.algo)")

    base = config if isinstance(config, TrainConfig) else None
    listed = not _is_prompt_file(prompts)
    with _prompt_path(prompts) as prompt_file:
        flags = {
            "prompts": prompt_file,
            "model": model_name,
            "reward": reward_name,
            "out": None if out is None else os.fspath(out),
            "steps": steps,
            "seed": seed,
            "report_to": report_to,
            "credit.scheme": credit_name,
        }
        file = None if base is not None or config is None else os.fspath(config)
        cfg = _load(algo, file, flags, _overrides(overrides), base=base)
        job = _prepare(cfg=cfg, policy=policy, reward=reward_obj)  # locks an out= run directory
        try:
            # what a string cannot load again goes into the run directory, so that the run can be resumed
            if listed or policy is not None:
                _claim_run_dir(job)
            if listed:
                _keep_prompt_list(job, Path(prompt_file))
            if policy is not None:
                _keep_initial_policy(job)
        except BaseException:
            if job.lock is not None:
                job.lock.release()
            raise
    return _finish(job, _run(job))


def _main_process() -> bool:
    return int(os.environ.get("RANK", 0)) == 0


def _claim_run_dir(job: Any) -> None:
    """Name, create and lock the run directory now (the trainer would only at its start); under several
    processes it must be given (each would pick its own name)."""
    from t2i_gcpo.train.run_dir import claim_default_run_dir

    if job.run_dir is None:
        if int(os.environ.get("WORLD_SIZE", 1)) > 1:
            raise UserError(
                "give out= when training a policy object or a prompt list under several processes"
            )
        # the lock is released when the run ends, as an out= one
        job.run_dir, job.lock = claim_default_run_dir(job.cfg.algo)
    if _main_process():
        job.run_dir.mkdir(parents=True, exist_ok=True)


def _keep_prompt_list(job: Any, temporary: Path) -> None:
    """Copy a prompt list's temporary file into the run directory and point the config at it."""
    from t2i_gcpo.outdir import atomic_write_text

    path = job.run_dir / temporary.name
    if _main_process():
        atomic_write_text(path, temporary.read_text(encoding="utf-8"), within=job.run_dir)
    job.cfg.prompts = str(path)


INITIAL_MODEL = "initial_model"  # a policy object's weights before training, in the run directory


def _keep_initial_policy(job: Any) -> None:
    """Save a policy object's weights before training as run_dir/initial_model and record that path as
    the run's model: a resumed run starts from it (the KL and DGPO reference is the initial policy),
    then loads the checkpoint. Lossless (float32), as the trainer's checkpoints."""
    import shutil

    path = job.run_dir / INITIAL_MODEL
    if _main_process():
        job.policy.keep_full_precision()
        partial = job.run_dir / f".{INITIAL_MODEL}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        job.policy.save_pretrained(str(partial))
        os.replace(partial, path)
    job.cfg.model = str(path)


def _prepare(**kwargs: Any) -> Any:
    from t2i_gcpo.train.run import prepare

    try:
        return prepare(**kwargs)
    except UserError as e:  # e.g. the dry sample's RewardError: raised here, its cause kept
        raise e.with_traceback(None) from e.__cause__


def _run(job: Any) -> dict:
    from t2i_gcpo.train.run import run

    try:
        return run(job)  # releases the run directory's lock
    except KeyboardInterrupt as interrupt:  # the command line names the folder to continue, and how
        from t2i_gcpo.train.run_dir import resume_command

        interrupt.run_dir = job.run_dir
        if job.run_dir is not None:
            interrupt.resume = resume_command(job.run_dir, job.cfg.credit.scheme, job.cfg.reward)
        raise
    except UserError as e:  # the message says what went wrong: the traceback starts here, the cause is kept
        raise e.with_traceback(None) from e.__cause__


def _finish(job: Any, final: dict) -> TrainResult:
    run_dir = Path(job.run_dir) if job.run_dir is not None else Path(job.cfg.out)
    from t2i_gcpo.metrics import MetricsRow
    from t2i_gcpo.outdir import read_jsonl

    rows = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        rows = read_jsonl(metrics, MetricsRow)
    return TrainResult(run_dir=run_dir, metrics=rows, eval=final, policy=None if job.finished else job.policy)


# ----------------------------------------------------------------------------- generate, sample, evaluate


def generate(
    model: ModelArg,
    prompts: PromptsArg,
    n: int = 4,
    *,
    cfg_scale: float | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    steps: int | None = None,
    reveal_order: str | None = None,
    seed: int = 0,
    batch: int = 16,
) -> Any:
    """Generate `n` images (or texts) per prompt, in memory.

    Prompt i's samples are drawn from its own generator, seeded by (seed, "generate", i), exactly as
    `sample` and the ``eval`` commands draw them: the same settings give the same images as the files
    `sample` writes.

    Args:
        model: a model name or path (see `load_policy`) or a policy object.
        prompts: a prompt, a list of prompts, or a .txt/.jsonl prompt file.
        n: samples per prompt.
        cfg_scale: classifier-free guidance scale (default: the model's recommended one).
        temperature: sampling temperature.
        top_k: keep the k most likely tokens (0: all).
        steps: masked models' decoding steps (default: the model's).
        reveal_order: masked models' ``"confidence"`` or ``"random"`` (default: the model's).
        seed: the seed.
        batch: prompts per sampling call (does not change the samples).

    Returns:
        Images as a float tensor [P, n, 3, H, W] in [0, 1]; for a text model, P lists of n strings.

    Raises:
        UserError: a prompt the model cannot take, masked settings for a model that has none.
    """
    import torch

    from t2i_gcpo.eval.geneval import image_sampling
    from t2i_gcpo.policies.base import PromptRecord
    from t2i_gcpo.tasks.loop import group_generators, sample_and_decode

    _check_sampling(cfg_scale, temperature, top_k, seed, n)
    if batch < 1:
        raise UserError(f"batch must be >= 1, got {batch}")
    if isinstance(prompts, str) and not _is_prompt_file(prompts):
        prompts = [prompts]
    policy = _load(model).eval()
    if _is_prompt_file(prompts):
        from t2i_gcpo.resources import prompt_file

        prompts = prompt_file(prompts)  # the user's file, else the shipped one it names
    if _is_prompt_file(prompts) and policy.output == "text":  # e.g. arithmetic questions
        from t2i_gcpo.tasks.registry import get_task

        texts = [p.text for p in get_task(policy.default_task, policy).load_prompts(os.fspath(prompts))]
    elif _is_prompt_file(prompts):  # any text a line, as `sample` reads it (GenEval rows: their prompt)
        from t2i_gcpo.worlds.shapeworld import read_prompt_file

        texts = [m["prompt"] for m in read_prompt_file(os.fspath(prompts), strict=False)]
    else:
        texts = list(prompts)
    policy.check_prompts(texts)
    sampling = image_sampling(
        policy,
        cfg_scale=cfg_scale,
        temperature=temperature,
        top_k=top_k,
        steps=steps,
        reveal_order=reveal_order,
    )
    outputs: list[Any] = []
    for start in range(0, len(texts), batch):
        chunk = texts[start : start + batch]
        _, out = sample_and_decode(
            policy,
            [PromptRecord(t) for t in chunk],
            n,
            sampling,
            group_generators(seed, "generate", range(start, start + len(chunk))),
        )
        outputs += [out[i * n : (i + 1) * n] for i in range(len(chunk))]
    if outputs and torch.is_tensor(outputs[0]):
        return torch.stack(outputs)
    return [list(o) for o in outputs]


@dataclass
class SampleResult:
    """What `sample` wrote.

    Attributes:
        folder: the output folder, in GenEval's layout (``folder/00000/samples/0000.png`` …).
        grid: the path of grid.png (each prompt's images side by side).
        prompts: the prompt texts, in folder order.
        n: images per prompt.
        written: images this call made (the others were made earlier, with the same settings).
    """

    folder: Path
    grid: Path
    prompts: list[str]
    n: int
    written: int = 0

    def image_paths(self, index: int) -> list[Path]:
        """The image files of prompt `index`."""
        from t2i_gcpo.eval.layout import sample_path

        return [sample_path(self.folder, index, k) for k in range(self.n)]


def sample(
    prompts: PromptsArg,
    out: str | os.PathLike,
    model: ModelArg = "shapeworld",
    n: int = 4,
    *,
    cfg_scale: float | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    steps: int | None = None,
    reveal_order: str | None = None,
    seed: int = 0,
    grid_scale: int = 4,
    overwrite: bool = False,
) -> SampleResult:
    """Write `n` images per prompt in GenEval's folder layout (``t2i-gcpo sample``).

    Writes ``out/00000/metadata.jsonl``, ``out/00000/samples/0000.png`` … and ``generation.json`` (the
    settings) per prompt, and ``out/grid.png``. Resumable: images already written for the same prompts
    and settings are kept; a folder made with other settings (`cfg_scale`, `steps`, `reveal_order` left
    out mean the model's own) is refused, naming the setting that continues it, unless ``overwrite=True``.
    `out` is locked while it is written (another command writing it is refused).

    Args:
        prompts: a .txt/.jsonl prompt file, a prompt or a list of prompts (each must fit the model's task).
        out: the output folder.
        model: a model name or path (see `load_policy`) or a policy object.
        n: images per prompt.
        cfg_scale: guidance scale (default: the model's).
        temperature: sampling temperature.
        top_k: keep the k most likely tokens (0: all).
        steps: masked models' decoding steps (default: as `cfg_scale`).
        reveal_order: masked models' ``"confidence"`` or ``"random"`` (default: as `cfg_scale`).
        seed: the seed (the images equal `generate`'s for the same settings).
        grid_scale: nearest-neighbour upscaling of grid.png.
        overwrite: delete the prompt folders already in `out` first.

    Returns:
        `SampleResult`: the folder, grid.png, the prompts and the image paths.

    Raises:
        UserError: an unwritable `out` or one another command holds, a prompt that does not parse or
            that the model cannot take, a folder made for other prompts or settings; nothing is written
            then.
    """
    import numpy as np
    from PIL import Image

    from t2i_gcpo.eval.geneval import generate_geneval, image_sampling
    from t2i_gcpo.eval.layout import sample_path
    from t2i_gcpo.outdir import write_file
    from t2i_gcpo.tasks.registry import get_task
    from t2i_gcpo.train.visuals import image_grid
    from t2i_gcpo.worlds.shapeworld import read_prompt_file

    _check_sampling(cfg_scale, temperature, top_k, seed, n)
    if isinstance(grid_scale, bool) or not isinstance(grid_scale, int) or not 1 <= grid_scale <= 32:
        raise UserError(f"grid_scale must be an integer from 1 to 32, got {grid_scale!r}")
    with _locked_out(out, "sample", overwrite=overwrite) as out_dir:  # before loading anything
        with _prompt_path(prompts) as prompts_path:
            texts = [m["prompt"] for m in read_prompt_file(prompts_path, strict=False)]
            policy = _load(model).eval()
            policy.check_prompts(texts)  # every word the model cannot take, at once
            # every prompt parsed into GenEval metadata (the parser's error names file and
            # line) before writing
            metadata = [p.meta for p in get_task(policy.default_task).load_prompts(prompts_path)]
        sampling = image_sampling(
            policy,
            cfg_scale=cfg_scale,
            temperature=temperature,
            top_k=top_k,
            steps=steps,
            reveal_order=reveal_order,
        )
        _record_out(out_dir, "sample")  # the settings of its images: each prompt folder's generation.json
        written = generate_geneval(
            policy,
            metadata,
            out_dir,
            sampling,
            n=n,
            batch=max(1, 64 // n),
            seed=seed,
            model=_model_identity(model, policy),
            overwrite=overwrite,
        )
        images = np.stack(
            [
                np.asarray(Image.open(sample_path(out_dir, i, k)).convert("RGB"))
                for i in range(len(metadata))
                for k in range(n)
            ]
        )
        cols = min(len(images), n * max(1, 16 // n))  # whole groups per row, ≈ 16 images wide
        pixels = -(-len(images) // cols) * cols * images.shape[1] * images.shape[2] * grid_scale**2
        if pixels > MAX_GRID_PIXELS:
            raise UserError(
                f"grid.png would hold {pixels / 1e6:.0f} M pixels at grid_scale {grid_scale} (at most "
                f"{MAX_GRID_PIXELS / 1e6:.0f} M): give a smaller one (the images are written)"
            )
        grid = out_dir / "grid.png"
        picture = Image.fromarray(image_grid(images, cols=cols, scale=grid_scale))
        write_file(grid, lambda f: picture.save(f, format="PNG"), within=out_dir)
    return SampleResult(out_dir, grid, [m["prompt"] for m in metadata], n, written)


MAX_GRID_PIXELS = 100_000_000  # sample's grid.png: ≈ 300 MB in memory; what image viewers still open


def evaluate_shapeworld(
    out: str | os.PathLike,
    model: ModelArg = "shapeworld",
    prompts: PromptsArg | None = None,
    n: int = 4,
    *,
    batch: int = 16,
    cfg_scale: float | None = None,
    steps: int | None = None,
    reveal_order: str | None = None,
    seed: int = 0,
    overwrite: bool = False,
) -> dict:
    """Score a model on held-out ShapeWorld prompts with the ShapeWorld detector through GenEval's rules
    (``t2i-gcpo eval shapeworld``).

    Writes ``out/images/`` (GenEval layout, resumable as in `sample`, recorded settings included),
    ``out/results.jsonl`` (one row per image: ``key``, ``category``, ``score``, ``tag``, ``correct``,
    ``partial`` …), ``out/summary.txt`` / ``summary.json`` and ``out/protocol.json`` (what was evaluated:
    eval/records/protocol.py); `out` is locked meanwhile.

    Args:
        out: the output folder.
        model: a model name or path (see `load_policy`) or a policy object.
        prompts: a prompt file or list (default: the shipped prompts/shapeworld_test.jsonl).
        n: images per prompt.
        batch: prompts per sampling call.
        cfg_scale: guidance scale (default: the model's).
        steps: masked models' decoding steps (default: as `cfg_scale`).
        reveal_order: masked models' reveal order (default: as `cfg_scale`).
        seed: the seed.
        overwrite: regenerate the images already in ``out/images``.

    Returns:
        GenEval's summary, as summary.json: ``{"tags": {tag: {"score", "correct", "total"}},
        "overall": the unweighted mean of the tag scores}``.
    """
    from t2i_gcpo.eval.geneval import generate_geneval, image_sampling, score_geneval_folder
    from t2i_gcpo.eval.records.protocol import scorer_record
    from t2i_gcpo.resources import PROMPTS_DIR
    from t2i_gcpo.tasks.registry import get_task

    _check_sampling(cfg_scale, seed=seed, n=n)
    with _locked_out(out, "eval shapeworld", overwrite=overwrite) as out:
        policy = _load(model).eval()
        task = get_task(policy.default_task, policy)
        with _prompt_path(prompts if prompts is not None else PROMPTS_DIR / "shapeworld_test.jsonl") as path:
            metadata = [p.meta for p in task.load_prompts(path)]
        root = out / "images"
        sampling = image_sampling(policy, cfg_scale=cfg_scale, steps=steps, reveal_order=reveal_order)
        _record_out(out, "eval shapeworld")  # the settings of its images: generation.json under images/
        generate_geneval(
            policy,
            metadata,
            root,
            sampling,
            n=n,
            batch=batch,
            seed=seed,
            model=_model_identity(model, policy),
            overwrite=overwrite,
        )
        summary = score_geneval_folder(root, _ShapeWorldDetector(), None, out, metadata_list=metadata, n=n)
        _write_layout_protocol(out, "shapeworld", root, scorer_record("detector", "shapeworld"))
        return summary


def _write_layout_protocol(out: Path, suite: str, root: Path, scorer: dict) -> None:
    """out/protocol.json of a GenEval-layout evaluation: the prompts, model, seeds and sampling its images
    record (`layout.layout_protocol`), the scorer, and the overall as the mean of the tags."""
    from t2i_gcpo.eval.layout import layout_protocol
    from t2i_gcpo.eval.records.protocol import protocol_record, write_protocol

    fields = layout_protocol(root)
    write_protocol(
        out,
        protocol_record(suite, scorer=scorer, aggregate="categories", images=str(root.resolve()), **fields),
    )


class _ShapeWorldDetector:
    """ShapeWorld's pixel detector behind the GenEval detector interface (PIL image → detections)."""

    name = "shapeworld"

    def __call__(self, image: Any) -> Any:
        import numpy as np

        from t2i_gcpo.worlds.shapeworld.detect import detect

        return detect(np.asarray(image.convert("RGB")))


def evaluate_geneval(
    out: str | os.PathLike,
    detector: str,
    model: ModelArg | None = None,
    *,
    clip: str | None = None,
    clip_model: str = "ViT-L-14",
    score_only: str | os.PathLike | None = None,
    n: int = 4,
    batch: int = 4,
    cfg_scale: float | None = None,
    steps: int | None = None,
    reveal_order: str | None = None,
    seed: int = 0,
    device: str = "cpu",
    overwrite: bool = False,
) -> dict:
    """GenEval's 553 prompts: generate `n` images each (resumable), score them with the detector and
    CLIP colour classification through GenEval's rules (``t2i-gcpo eval geneval``).

    Args:
        out: the output folder: images/ (unless `score_only`), results.jsonl, summary.txt/json,
            protocol.json.
        detector: a local Mask2Former checkpoint folder (COCO instance segmentation), or
            ``"shapeworld"`` (ShapeWorld's pixel detector, no CLIP needed).
        model: a model name or path (see `load_policy`) or a policy object to generate with.
        clip: a local open_clip checkpoint (required with Mask2Former).
        clip_model: the open_clip architecture of `clip`.
        score_only: score this existing GenEval-layout folder instead of generating (no `model`).
        n: images per prompt.
        batch: prompts per sampling call.
        cfg_scale: guidance scale (default: the model's).
        steps: masked models' decoding steps (default: as `cfg_scale`).
        reveal_order: masked models' reveal order (default: as `cfg_scale`).
        seed: the seed.
        device: device of the scoring models.
        overwrite: regenerate the images already in ``out/images``.

    Returns:
        GenEval's summary, as summary.json (see `evaluate_shapeworld`).
    """
    from t2i_gcpo.eval.geneval import load_geneval_prompts, score_geneval_folder

    _check_model_or_score_only(model, score_only, overwrite, n, batch)
    _check_sampling(cfg_scale, seed=seed, n=n)
    source = {"--score-only": None if score_only is None else os.path.realpath(score_only)}
    with _locked_out(out, "eval geneval", source, overwrite=overwrite) as out:
        prompts = load_geneval_prompts() if model is not None else None
        _check_generation(out, model, prompts, n, cfg_scale, steps, reveal_order, seed, overwrite)
        if detector == "shapeworld":
            det, colors = _ShapeWorldDetector(), None
        else:
            from t2i_gcpo.scoring.color_clip import ClipColorClassifier
            from t2i_gcpo.scoring.detector_mask2former import Mask2FormerDetector

            det = Mask2FormerDetector.from_pretrained(detector, device=device)  # a bad path fails first
            if not clip:
                raise UserError(
                    "--clip CKPT is required with a Mask2Former detector (GenEval classifies "
                    "colours with CLIP)"
                )

            colors = ClipColorClassifier.from_pretrained(clip, clip_model, device=device)
        root = Path(score_only) if score_only is not None else out / "images"
        _record_out(out, "eval geneval", source)
        if model is not None:  # root is out/images
            _generate_into(out, model, prompts, n, batch, cfg_scale, steps, reveal_order, seed, overwrite)
        summary = score_geneval_folder(
            root, det, colors, out, metadata_list=prompts, n=n if model is not None else None
        )
        from t2i_gcpo.eval.records.protocol import scorer_record

        clip_fields = (
            {} if detector == "shapeworld" else {"clip": scorer_record("clip", clip, model=clip_model)}
        )
        _write_layout_protocol(out, "geneval", root, scorer_record("detector", detector, **clip_fields))
        return summary


# ----------------------------------------------------------------------------- question-based suites


def _scorer_identity(vqa: str | os.PathLike | None, judge: str | None, judge_model: str | None) -> str:
    """What scored a folder, as its settings record holds it (a VQA folder's real path, or the judge)."""
    if vqa is not None:
        return "vqa:" + os.path.realpath(os.path.expanduser(os.fspath(vqa)))
    return f"judge:{judge}" + (f" ({judge_model})" if judge_model else "")


def _judge_client(
    judge: str, judge_model: str | None, timeout: float, api_key_env: str = "OPENAI_API_KEY"
) -> Any:
    from t2i_gcpo.eval.suites.judge_client import JudgeClient

    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise UserError(f"--timeout must be > 0 seconds, got {timeout!r}")
    return JudgeClient(judge, model=judge_model, timeout=timeout, api_key=os.environ.get(api_key_env))


def _check_asking(concurrency: int, retries: int, backoff: float) -> None:
    for name, value, low in (("--concurrency", concurrency, 1), ("--retries", retries, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 1024:
            raise UserError(f"{name} must be a whole number in [{low}, 1024], got {value!r}")
    if not (isinstance(backoff, (int, float)) and 0 <= backoff <= 600):
        raise UserError(f"--backoff must be in [0, 600] seconds, got {backoff!r}")


def _sampling_record(sampling: Any) -> dict:
    return {
        "cfg_scale": sampling.guidance_scale,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "steps": sampling.steps,
        "reveal_order": sampling.reveal_order,
    }


def _source_entries(metas: list[dict], keys: Sequence[str], root: Path, n: int | None) -> list:
    """(index, metadata, image paths) of a GenEval-layout folder holding exactly `metas` (in order)."""
    from t2i_gcpo.eval.geneval import run_entries

    entries = run_entries(root, metas, n, keys)
    empty = [f"{i:05d}" for i, _, paths in entries if not paths]
    if empty:
        raise UserError(
            f"{root}: {len(empty)} prompt folder(s) have no images (first: {empty[0]}); finish generation"
        )
    return entries


def _check_model_or_score_only(
    model: ModelArg | None, score_only: str | os.PathLike | None, overwrite: bool, n: int, batch: int
) -> None:
    """The arguments of an evaluation that generates with `model` or scores the folder `score_only`: one of
    them, --overwrite only with a model, at least one image per prompt and one prompt per call."""
    if (model is None) == (score_only is None):
        raise UserError("give either --model (generate, then score) or --score-only DIR")
    if overwrite and model is None:
        raise UserError("--overwrite regenerates images: it needs --model, not --score-only")
    if n < 1 or batch < 1:
        raise UserError(f"--n and --batch must be >= 1 (got {n}, {batch})")


def _generate_into(
    out: Path,
    model: ModelArg,
    metas: list[dict],
    n: int,
    batch: int,
    cfg_scale: float | None,
    steps: int | None,
    reveal_order: str | None,
    seed: int,
    overwrite: bool,
) -> tuple[Any, str]:
    """Generate `n` images per prompt of `metas` into out/images (GenEval layout, resumable); (the sampling
    settings, the model's identity)."""
    from t2i_gcpo.eval.geneval import generate_geneval, image_sampling

    policy = _load(model).eval()
    sampling = image_sampling(policy, cfg_scale=cfg_scale, steps=steps, reveal_order=reveal_order)
    identity = _model_identity(model, policy)
    generate_geneval(
        policy,
        metas,
        out / "images",
        sampling,
        n=n,
        batch=batch,
        seed=seed,
        model=identity,
        overwrite=overwrite,
    )
    return sampling, identity


def _check_generation(
    out: Path,
    model: ModelArg | None,
    metas: list[dict],
    n: int,
    cfg_scale: float | None,
    steps: int | None,
    reveal_order: str | None,
    seed: int,
    overwrite: bool,
) -> None:
    """Refuse images of other prompts or settings in out/images before any model is loaded."""
    from t2i_gcpo.eval.geneval import masked_asked
    from t2i_gcpo.eval.layout import check_resumable

    if isinstance(model, (str, os.PathLike)) and not overwrite:
        known = {
            "model": _model_identity(model, None),
            "seed": seed,
            "temperature": 1.0,
            "top_k": 0,
            "n": n,
            **({"cfg_scale": cfg_scale} if cfg_scale is not None else {}),
            **masked_asked(steps, reveal_order),
        }
        check_resumable(out / "images", metas, known)


def _generation_protocol(model: ModelArg | None, identity: str | None, sampling: Any, seed: int) -> dict:
    if model is None:
        return {"model": None, "seeds": None, "sampling": None}
    return {
        "model": os.fspath(model) if isinstance(model, (str, os.PathLike)) else None,
        "seeds": {"seed": seed, "per_prompt": 'tasks.loop.seed_for(seed, "generate", prompt index)'},
        "sampling": _sampling_record(sampling),
        "model_identity": identity,
    }


def evaluate_geneval2(
    out: str | os.PathLike,
    data: str | os.PathLike,
    model: ModelArg | None = None,
    *,
    vqa: str | os.PathLike | None = None,
    judge: str | None = None,
    judge_model: str | None = None,
    method: str = "soft_tifa_gm",
    score_only: str | os.PathLike | None = None,
    images: str | os.PathLike | None = None,
    n: int = 1,
    batch: int = 4,
    cfg_scale: float | None = None,
    steps: int | None = None,
    reveal_order: str | None = None,
    seed: int = 0,
    device: str = "cpu",
    vqa_dtype: str = "auto",
    vqa_batch: int = 8,
    concurrency: int = 8,
    timeout: float = 60.0,
    retries: int = 2,
    backoff: float = 1.0,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """GenEval 2 (``t2i-gcpo eval geneval2``; docs/evaluation/geneval2.md): generate `n` images per prompt of
    the user's ``geneval2_data.jsonl`` (resumable), ask a VQA model every atom's question (resumable:
    ``answers.jsonl``), score Soft-TIFA AM / GM and TIFA (or VQAScore) as the reference does.

    Args:
        out: the output folder: images/ (when generating), answers.jsonl, results.jsonl, summary.json/txt,
            protocol.json.
        data: GenEval 2's data file (not shipped: its licence is CC BY-NC 4.0).
        model: a model name or path, or a policy object, to generate with; else `score_only` or `images`.
        vqa: a local VLM folder (Qwen3-VL-8B-Instruct is the reference's) — or `judge`, an OpenAI-compatible
            server's URL (with `judge_model`, the name it serves), for the answer's log-probabilities.
        method: the headline and each row's score: soft_tifa_gm, soft_tifa_am, tifa or vqascore.
        score_only: score this GenEval-layout folder of the same prompts instead of generating.
        images: score the reference's image map instead: a JSON object {prompt: image path}.
        n: images per prompt (the reference scores one).
        batch: prompts per sampling call.
        cfg_scale: the guidance scale, as ``eval geneval``.
        steps: masked decoding steps, as ``eval geneval``.
        reveal_order: the masked reveal order, as ``eval geneval``.
        seed: the sampling seed, as ``eval geneval``.
        device: where the VQA model runs.
        vqa_dtype: the VQA model's dtype (auto: the checkpoint's).
        vqa_batch: questions per forward pass.
        concurrency: the judge's requests in flight.
        timeout: seconds each request may take.
        retries: tries after the first.
        backoff: seconds before the first retry (doubling).
        overwrite: regenerate the images already in out/images.

    Returns:
        summary.json's content: ``overall`` (the method's score in [0, 1]), ``methods`` (every method
        scored), ``categories`` (per atom count), ``skills`` and ``atom_counts`` (the reference's analysis).
    """
    from t2i_gcpo.eval.outputs import write_evaluation
    from t2i_gcpo.eval.records.protocol import file_sha256, protocol_record
    from t2i_gcpo.eval.suites import geneval2 as g2
    from t2i_gcpo.eval.suites.asking import ANSWERS_NAME
    from t2i_gcpo.scoring.soft_tifa import KEYS

    sources = [x is not None for x in (model, score_only, images)]
    if sum(sources) != 1:
        raise UserError("give one of --model (generate, then score), --score-only DIR or --images MAP.json")
    if (vqa is None) == (judge is None):
        raise UserError(
            "give --vqa DIR (a local VLM) or --judge URL (an OpenAI-compatible server), one of them"
        )
    if method not in g2.METHODS:
        raise UserError(f"--method must be one of {', '.join(g2.METHODS)}, got {method!r}")
    if overwrite and model is None:
        raise UserError("--overwrite regenerates images: it needs --model")
    if n < 1 or batch < 1 or vqa_batch < 1:
        raise UserError(f"--n, --batch and --vqa-batch must be >= 1 (got {n}, {batch}, {vqa_batch})")
    _check_asking(concurrency, retries, backoff)
    _check_sampling(cfg_scale, seed=seed, n=n)
    rows = g2.read_geneval2_data(data)  # a wrong format: one line before anything else
    settings = {
        "--data": file_sha256(Path(data).expanduser()),
        "scorer": _scorer_identity(vqa, judge, judge_model),
        "--score-only": score_only and os.path.realpath(score_only),
        "--images": images and os.path.realpath(images),
    }
    with _locked_out(out, "eval geneval2", settings, overwrite=overwrite) as out:
        _check_generation(out, model, rows, n, cfg_scale, steps, reveal_order, seed, overwrite)
        if images is not None:
            entries = _image_map_entries(Path(images), rows)
        elif score_only is not None:
            entries = _source_entries(rows, KEYS, Path(score_only), None)
        if vqa is not None:
            from t2i_gcpo.eval.records.protocol import folder_revision
            from t2i_gcpo.scoring.vlm import LocalVLM

            scorer = LocalVLM.from_pretrained(
                vqa, device=device, dtype=vqa_dtype, batch_size=vqa_batch, revision=folder_revision(vqa)
            )
        else:
            scorer = _judge_client(judge, judge_model, timeout)
        _record_out(out, "eval geneval2", settings)
        sampling = identity = None
        if model is not None:
            sampling, identity = _generate_into(
                out, model, rows, n, batch, cfg_scale, steps, reveal_order, seed, overwrite
            )
            entries = _source_entries(rows, KEYS, out / "images", n)
        results = g2.score_entries(
            entries,
            scorer,
            method,
            log=out / ANSWERS_NAME,
            within=out,
            concurrency=concurrency,
            retries=retries,
            backoff=backoff,
            progress=progress,
        )
        summary = {**g2.summarize(results, method), "scorer": scorer.name}
        record = scorer.record(top_logprobs=scorer.top_logprobs) if judge is not None else scorer.record()
        protocol = protocol_record(
            "geneval2",
            data=[data],
            scorer=record,
            images_per_prompt=n if model is not None else None,
            method=method,
            source=os.fspath(score_only or images) if model is None else "generated",
            **_generation_protocol(model, identity, sampling, seed),
        )
        write_evaluation(out, results, summary, g2.format_summary(summary), protocol)
        return summary


def _image_map_entries(path: Path, rows: list[dict]) -> list:
    """(index, row, [image]) from the reference's {prompt: image path} map (a relative path: from the working
    folder, else from the map's folder)."""
    from t2i_gcpo.outdir import read_json

    mapping = read_json(path.expanduser(), follow=True)
    if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
        raise UserError(
            f"--images {path}: expected a JSON object {{prompt: image path}} (GenEval 2's image map)"
        )
    entries = []
    for i, row in enumerate(rows):
        if row["prompt"] not in mapping:
            raise UserError(
                f"--images {path}: no image for the prompt {row['prompt']!r} (line {i + 1} of the data)"
            )
        image = Path(mapping[row["prompt"]]).expanduser()
        if not image.is_absolute() and not image.is_file():
            image = path.expanduser().parent / image
        if not image.is_file():
            raise UserError(
                f"--images {path}: the image of {row['prompt']!r}, {mapping[row['prompt']]}, does not exist"
            )
        entries.append((i, row, [image]))
    return entries


def evaluate_judge(
    out: str | os.PathLike,
    suite: str,
    data: str | os.PathLike,
    judge: str,
    model: ModelArg | None = None,
    *,
    judge_model: str | None = None,
    score_only: str | os.PathLike | None = None,
    n: int | None = None,
    batch: int = 4,
    cfg_scale: float | None = None,
    steps: int | None = None,
    reveal_order: str | None = None,
    seed: int = 0,
    temperature: float | None = None,
    max_tokens: int | None = None,
    concurrency: int = 8,
    timeout: float = 120.0,
    retries: int = 2,
    backoff: float = 1.0,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """A judge-scored suite (``t2i-gcpo eval judge``; docs/evaluation/judge-suites.md): WISE, TIIF-Bench or
    UniGenBench++ — generate `n` images per prompt of its data (resumable), send each to the judge with the
    suite's question, read the answer with the suite's rule (resumable: ``answers.jsonl``), aggregate as its
    paper does.

    Args:
        out: the output folder (as `evaluate_geneval2`'s).
        suite: a registered suite (`t2i_gcpo.eval.suites.suite_names()`).
        data: the suite's data file or folder (its --help names it).
        judge: the judge's OpenAI-compatible URL; `judge_model` the model name it serves.
        model: a model to generate with; else `score_only`: a GenEval-layout folder of these prompts, or a
            folder in the suite's own reference layout.
        n: images per prompt (default: the suite's, e.g. UniGenBench's 4).
        temperature: the judge's sampling temperature (default: the suite's).
        max_tokens: the judge's answer length (default: the suite's).
        concurrency: requests in flight.
        timeout: seconds each request may take.
        retries: tries after the first.
        backoff: seconds before the first retry (doubling).
        batch: prompts per sampling call, as `evaluate_geneval2`.
        cfg_scale: the guidance scale, as `evaluate_geneval2`.
        steps: masked decoding steps, as `evaluate_geneval2`.
        reveal_order: the masked reveal order, as `evaluate_geneval2`.
        seed: the sampling seed, as `evaluate_geneval2`.
        overwrite: regenerate the images already in out/images.

    Returns:
        summary.json's content: ``overall``, ``categories`` and the suite's tables.
    """
    from t2i_gcpo.eval.outputs import write_evaluation
    from t2i_gcpo.eval.records.protocol import data_record, protocol_record
    from t2i_gcpo.eval.suites import get_suite
    from t2i_gcpo.eval.suites.asking import ANSWERS_NAME
    from t2i_gcpo.eval.suites.driver import format_summary, score_suite, summary_of

    spec = get_suite(suite, "judge")
    n = spec.images_per_prompt if n is None else n
    _check_model_or_score_only(model, score_only, overwrite, n, batch)
    if temperature is not None and not (isinstance(temperature, (int, float)) and 0 <= temperature <= 2):
        raise UserError(f"--temperature must be in [0, 2], got {temperature!r}")
    if max_tokens is not None and not (isinstance(max_tokens, int) and max_tokens >= 1):
        raise UserError(f"--max-tokens must be >= 1, got {max_tokens!r}")
    _check_asking(concurrency, retries, backoff)
    _check_sampling(cfg_scale, seed=seed, n=n)
    path = Path(data).expanduser()
    if not path.exists():
        raise UserError(f"--data {path} does not exist ({spec.name} reads {spec.data})")
    items = spec.read(path)  # a wrong format: one line before anything else
    client = _judge_client(judge, judge_model, timeout)
    metas = [{"prompt": it.prompt, "id": it.id, "suite": spec.name} for it in items]
    settings = {
        "--suite": spec.name,
        "--data": data_record(path)["sha256"],
        "scorer": _scorer_identity(None, judge, judge_model),
        "--score-only": score_only and os.path.realpath(score_only),
    }
    with _locked_out(out, "eval judge", settings, overwrite=overwrite) as out:
        _check_generation(out, model, metas, n, cfg_scale, steps, reveal_order, seed, overwrite)
        if score_only is not None:
            entries = _suite_source(spec, items, metas, Path(score_only), n)
        _record_out(out, "eval judge", settings)
        sampling = identity = None
        if model is not None:
            sampling, identity = _generate_into(
                out, model, metas, n, batch, cfg_scale, steps, reveal_order, seed, overwrite
            )
            entries = [
                (i, items[i], paths)
                for i, _, paths in _source_entries(metas, ("prompt", "id"), out / "images", n)
            ]
        rows = score_suite(
            spec,
            entries,
            client,
            log=out / ANSWERS_NAME,
            within=out,
            concurrency=concurrency,
            retries=retries,
            backoff=backoff,
            temperature=temperature,
            max_tokens=max_tokens,
            progress=progress,
        )
        summary = {**summary_of(spec, rows), "scorer": client.name}
        from t2i_gcpo.eval.suites.driver import request_settings

        protocol = protocol_record(
            f"judge:{spec.name}",
            data=[path],
            scorer=client.record(**request_settings(spec, temperature, max_tokens)),
            images_per_prompt=n,
            source=os.fspath(score_only) if model is None else "generated",
            suite_source=spec.source,
            **_generation_protocol(model, identity, sampling, seed),
        )
        write_evaluation(out, rows, summary, format_summary(summary), protocol)
        return summary


def _suite_source(spec: Any, items: list, metas: list[dict], root: Path, n: int) -> list:
    """The images of `root`: a GenEval-layout folder of these prompts, or the suite's reference layout."""
    from t2i_gcpo.eval.layout import METADATA_NAME

    if not root.is_dir():
        raise UserError(f"--score-only {root} is not a folder")
    if (root / "00000" / METADATA_NAME).is_file():
        return [(i, items[i], paths) for i, _, paths in _source_entries(metas, ("prompt", "id"), root, None)]
    entries = []
    for i, item in enumerate(items):
        paths = [spec.reference_image(root, item, s) for s in range(n)]
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise UserError(
                f"--score-only {root}: {missing[0]} is missing ({spec.name}'s own layout; item {item.id})"
            )
        entries.append((i, item, paths))
    return entries


# ----------------------------------------------------------------------------- credit maps


def credit_maps(
    prompts: PromptsArg,
    out: str | os.PathLike,
    model: str = "shapeworld",
    *,
    prompt_file: str | os.PathLike | None = None,
    limit: int | None = None,
    reference: str | None = None,
    schemes: Sequence[str] | None = None,
    group_size: int = 8,
    cfg_scale: float | None = None,
    reward: str | None = None,
    negative: str | None = None,
    seed: int = 0,
    overwrite: bool = False,
) -> str:
    """Sample a group per prompt, score it, and draw every sample's token credit under each scheme
    (``t2i-gcpo credit-map``).

    Writes one PNG per prompt (``out/00000.png`` …) and ``out/credit_maps.html``, replacing an earlier
    run's figures there when it was made with the same settings, else only with `overwrite` (`out` is
    locked meanwhile); where the reward reports object masks (ShapeWorld)
    also ``out/lift.json``, each scheme's credit lift per sample
    (its credit share on the prompt's object tokens over their token share; uniform credit = 1).

    Args:
        prompts: a prompt, a list of prompts, or a .txt/.jsonl prompt file.
        out: the output folder.
        model: a model name or path (see `load_policy`).
        prompt_file: more prompts from a file, after those of `prompts` (``--prompts`` next to
            ``--prompt``).
        limit: use only the first `limit` prompts of the file.
        reference: DGPO's reference model (default: the shipped base model of the family).
        schemes: credit schemes to draw (any of `t2i_gcpo.core.CREDIT_SCHEMES`, or your own as
            ``path/to/file.py:function`` / ``module:function``; default: every registered one).
        group_size: samples per prompt, G ≥ 2.
        cfg_scale: guidance scale (default: the model's).
        reward: a reward spec as for `train` (default: the task's own).
        negative: text models: GCPO's negative context (``"empty"``, ``"wrong_answer"`` or a
            ``{question}`` template).
        seed: the seed.
        overwrite: replace the maps in `out` made with other settings (``--overwrite``).

    Returns:
        The summary the command prints: the credit-lift table (ShapeWorld) or step-lift table (text)
        and the files written.

    Raises:
        UserError: an unknown scheme, G < 2, no prompts, a prompt the model cannot take, an `out` made
            with other settings (without `overwrite`).
    """
    from t2i_gcpo.analysis.credit_maps import check_credit_out
    from t2i_gcpo.errors import check_writable_dir
    from t2i_gcpo.outdir import lock_output

    out_dir = check_writable_dir(out, "--out")  # before loading any model
    with lock_output(out_dir):
        check_credit_out(out_dir)  # someone else's files named like ours: refused before any work
        return _credit_maps(
            prompts,
            out_dir,
            model,
            prompt_file,
            limit,
            reference,
            schemes,
            group_size,
            _check_sampling(cfg_scale, seed=seed),
            reward,
            negative,
            seed,
            overwrite,
        )


def _credit_maps(
    prompts: Any,
    out: Path,
    model: str,
    prompt_file: Any,
    limit: int | None,
    reference: str | None,
    schemes: Sequence[str] | None,
    group_size: int,
    cfg_scale: float | None,
    reward: str | None,
    negative: str | None,
    seed: int,
    overwrite: bool,
) -> str:
    """`credit_maps` once its output folder is locked."""
    from t2i_gcpo.analysis.credit_maps import run_credit_maps
    from t2i_gcpo.config import canonical_spec, check_value, resolve_scheme
    from t2i_gcpo.core import CREDIT_SCHEMES
    from t2i_gcpo.outdir import check_settings_record
    from t2i_gcpo.policies.registry import model_identity
    from t2i_gcpo.resources import prompt_file as shipped_or_own
    from t2i_gcpo.usercode import is_function_spec

    texts: list[str] = []
    if prompts is not None and _is_prompt_file(prompts):
        if prompt_file is not None:
            raise UserError("give prompts as a list when prompt_file is also given")
        prompt_file = prompts
    elif isinstance(prompts, str):
        texts = [prompts]
    elif prompts is not None:
        texts = list(prompts)
    if not texts and prompt_file is None:
        raise UserError("give --prompt TEXT (repeatable) or --prompts FILE")
    given = schemes is not None
    schemes = tuple(CREDIT_SCHEMES) if schemes is None else schemes
    names = tuple(canonical_spec(s.strip()) for s in schemes if s.strip())
    unknown = [s for s in names if s not in CREDIT_SCHEMES and not is_function_spec(s)]
    if unknown or not names:
        raise UserError(
            f"unknown scheme(s) {', '.join(unknown) or '(none)'}: choose from {', '.join(CREDIT_SCHEMES)} "
            "or give your own as path/to/file.py:function"
        )
    for name in names:  # a user's function: imported now, its errors before any sampling
        resolve_scheme(name)
    check_value("rollout.group_size", group_size, what="--group")
    file = None if prompt_file is None else os.fspath(prompt_file)
    settings = {
        "--prompt": texts,
        "--prompts": file and os.path.realpath(shipped_or_own(file)),
        "--limit": limit,
        "--model": model_identity(model),
        "--reference": reference and model_identity(reference),
        "--schemes": list(names),
        "--group": group_size,
        "--cfg": cfg_scale,
        "--reward": reward,
        "--negative": negative,
        "--seed": seed,
    }
    made = check_settings_record(out, "credit-map", settings, redo="--overwrite", redoing=overwrite)
    if not (made or overwrite) and (out / "credit_maps.html").is_file():
        raise UserError(
            f"{out} holds credit maps of an earlier version, which recorded no settings; give "
            "--overwrite to replace them, or choose another --out"
        )
    return run_credit_maps(
        texts,
        file,
        limit,
        model,
        reference,
        names,
        group_size,
        cfg_scale,
        reward,
        seed,
        os.fspath(out),
        negative=negative,
        schemes_given=given,
        settings=settings,
    )
