"""Checkpoints of a run: policy weights (safetensors, via the adapter's save_pretrained), optimizer
state and carried groups (safetensors + JSON, `tensor_tree`: a run directory may come from someone
else, and nothing in it is a pickle) and the trainer state. Each is written to a temporary directory and
renamed into place, so a crash or Ctrl-C never leaves a half-written checkpoint behind; the
``checkpoints/latest`` pointer is replaced atomically, and a missing or damaged pointer falls back to the
newest complete step. The last `keep` checkpoints are kept (config key keep_checkpoints). Nothing is written
through a link: ``checkpoints`` must be a plain folder (outdir.real_dir), and a save that fails (a full disk)
leaves the previous checkpoints as they were and raises `CheckpointError`.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import ConfigDict, Field
from typing_extensions import Required, TypedDict

from t2i_gcpo.errors import UserError
from t2i_gcpo.outdir import WriteError, read_json, read_side_text, real_dir, write_file
from t2i_gcpo.train.tensor_tree import load_tree, save_tree, tree_files

STEP_DIR = re.compile(r"step_(\d+)")


class CheckpointError(UserError):
    """A checkpoint could not be written (a full disk, a read-only folder): the run stops, the previous
    checkpoints are kept. Not a usage error: exit status 1."""

    exit_code = 1


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


def save_checkpoint(
    run_dir: Path,
    step: int,
    policy: Any,
    optimizer_state: dict,
    state: dict,
    carry: Any = None,
    scheduler_state: dict | None = None,
    keep: int = 2,
) -> Path:
    """`optimizer_state`: the optimizer's whole state dict (FSDP: gathered from the shards). `carry`:
    groups kept for the next step, one entry per process. `scheduler_state`: the lr scheduler's state
    dict. All are written as safetensors + JSON. Then the checkpoints older than the last `keep` are
    removed. A write that fails (OSError: a full disk) removes what it had written and raises
    `CheckpointError`; the earlier checkpoints are untouched."""
    from safetensors import SafetensorError

    final = checkpoint_dir(run_dir, step)
    root = real_dir(final.parent, within=run_dir)
    tmp = final.with_name(final.name + ".tmp")
    try:
        _remove(tmp)
        tmp.mkdir()
        policy.save_pretrained(str(tmp / "model"))
        save_tree(tmp, "optimizer", optimizer_state, within=root)
        if carry is not None:
            save_tree(tmp, "carry", carry, within=root)
        if scheduler_state is not None:
            save_tree(tmp, "scheduler", scheduler_state, within=root)
        write_file(tmp / "trainer_state.json", json.dumps({"step": step, **state}, indent=1), within=root)
        _remove(final)
        tmp.rename(final)
        write_file(root / "latest", final.name + "\n", within=root)
    except (OSError, SafetensorError, WriteError) as e:  # safetensors reports a full disk as its own error
        shutil.rmtree(tmp, ignore_errors=True)
        reason = getattr(e, "strerror", None) or " ".join(str(e).split())[:200]
        raise CheckpointError(f"cannot write the checkpoint of step {step} in {root}: {reason}") from None
    for old in _step_dirs(run_dir)[:-keep]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _remove(path: Path) -> None:
    """Remove a checkpoint folder of ours about to be written again; a link or a file is unlinked, never
    followed (rmtree refuses links)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def _step_dirs(run_dir: Path) -> list[Path]:
    """The run's checkpoint folders ``step_NNNNNN`` (not the ``.tmp`` ones, not links), oldest first."""
    root = run_dir / "checkpoints"
    if root.is_symlink() or not root.is_dir():
        return []
    found = [p for p in root.glob("step_*") if STEP_DIR.fullmatch(p.name) and stat.S_ISDIR(p.lstat().st_mode)]
    return sorted(found, key=lambda p: int(STEP_DIR.fullmatch(p.name).group(1)))


def is_complete(ckpt: Path) -> bool:
    """A checkpoint folder (not a link) holding the trainer state, the optimizer state and the model
    folder (a save writes them all before the folder gets its name: anything less is damage). What the
    trainer state says is checked when it is read (`load_trainer_state`)."""
    return (
        not ckpt.is_symlink()
        and (ckpt / "trainer_state.json").is_file()
        and (all(p.is_file() for p in tree_files(ckpt, "optimizer")) or (ckpt / LEGACY_OPTIMIZER).is_file())
        and (ckpt / "model").is_dir()
    )


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``checkpoints/latest`` names; if that pointer is missing, unreadable or names an
    incomplete checkpoint, the newest complete ``step_*`` folder; None when there is none."""
    pointer = run_dir / "checkpoints" / "latest"
    try:
        name = read_side_text(pointer).strip()
    except UserError:
        name = ""
    if STEP_DIR.fullmatch(name) and is_complete(pointer.parent / name):
        return pointer.parent / name
    for ckpt in reversed(_step_dirs(run_dir)):
        if is_complete(ckpt):
            return ckpt
    return None


Finite = Annotated[float, Field(allow_inf_nan=False)]


class TrainerState(TypedDict, total=False):
    """trainer_state.json: each entry a resume reads, with the types and ranges it takes (the budget spent
    and, with budget allocation, the prompts' reward history and the extra draws owed: one entry per
    process). Other entries are kept as they are."""

    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]
    step: Required[Annotated[int, Field(ge=0)]]
    finished: bool
    algo: str
    zero_std_estimate: Annotated[float, Field(ge=0, le=1)] | None
    budget: list[dict[str, Finite] | None] | None
    history: list[dict[str, Annotated[list[Finite], Field(min_length=2, max_length=2)]]] | None
    owed: list[Annotated[float, Field(ge=0, lt=1)]] | None
    metrics_row: dict[str, float | None]  # the step's metrics.jsonl row (restored where the file lost it)


def load_trainer_state(ckpt: Path) -> dict:
    """A checkpoint's trainer_state.json, checked (`TrainerState`: a step ≥ 0, finite numbers, the budget
    spent as numbers per process …); else a one-line UserError naming the file and the entry."""
    return read_json(ckpt / "trainer_state.json", TrainerState)


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def mark_finished(ckpt: Path) -> None:
    """Record in a checkpoint's trainer state that the run ended there: trained, evaluated, reported."""
    state = load_trainer_state(ckpt)
    if not state.get("finished"):
        write_file(
            ckpt / "trainer_state.json",
            json.dumps({**state, "finished": True}, indent=1),
            within=ckpt.parent.parent,
        )


LEGACY_OPTIMIZER, LEGACY_CARRY = "optimizer.pt", "carry.pt"  # torch.save files of earlier versions


def carry_types() -> dict[str, type]:
    """The dataclasses a carry file may hold (the allow-list `load_tree` builds from)."""
    from t2i_gcpo.core.tree import Leaves, Tree
    from t2i_gcpo.policies.base import PromptRecord, Rollout, SamplingParams
    from t2i_gcpo.rewards.base import RewardOutput
    from t2i_gcpo.train.batch import Batch

    return {c.__name__: c for c in (Batch, Rollout, PromptRecord, SamplingParams, RewardOutput, Tree, Leaves)}


def load_carry(ckpt: Path, device: Any = "cpu") -> list | None:
    """The groups each process carried into the next step (None: the run carried none). A carry.pt
    (a pickle, written by earlier versions) is refused unread: reading it could run its code."""
    if any(p.exists() for p in tree_files(ckpt, "carry")):  # one of the two missing: an error, not "none"
        return load_tree(ckpt, "carry", "the carried groups", carry_types(), device)
    legacy = ckpt / LEGACY_CARRY
    if legacy.exists():
        raise UserError(
            f"{legacy} is a pickle (written by an earlier version) and is not read: it could run code; "
            f"if you trust this run, delete it to resume without the carried groups (the next "
            f"step draws new ones)"
        )
    return None


def load_optimizer(ckpt: Path, load: Callable[[dict], None], expected: list[dict] | None = None) -> None:
    """Read the optimizer state of `ckpt` and hand it to `load`: an optimizer's `load_state_dict`, or
    (FSDP) the loader that shards it. A damaged file, a state that does not fit the model, or (with
    `expected`, the param groups the run's config builds) hyperparameters other than the config's is a
    UserError. An earlier version's optimizer.pt is read with torch's weights-only loader, which builds
    only tensors and plain containers (no code runs)."""
    legacy = ckpt / LEGACY_OPTIMIZER
    if not tree_files(ckpt, "optimizer")[1].exists() and legacy.is_file():
        path = legacy
        try:
            state = torch.load(legacy, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises RuntimeError, EOFError, UnpicklingError … on a damaged file
            message = " ".join(str(e).split())[:200]
            raise UserError(f"{legacy}: cannot read the optimizer state (damaged file?): {message}") from None
    else:
        path = ckpt / "optimizer.{safetensors,json}"
        state = load_tree(ckpt, "optimizer", "the optimizer state")
    if expected is not None:
        _check_param_groups(state, expected, path)
    try:
        load(state)
    except (ValueError, KeyError, RuntimeError, TypeError) as e:
        raise UserError(f"{path}: the optimizer state does not match the model: {e}") from None


# the optimizer hyperparameters a checkpoint must share with the run's config (the lr is the schedule's)
CONFIGURED = ("initial_lr", "weight_decay", "betas", "eps", "amsgrad", "maximize")


def _check_param_groups(state: Any, expected: list[dict], path: Path) -> None:
    groups = state.get("param_groups") if isinstance(state, dict) else None
    if not isinstance(groups, list) or len(groups) != len(expected):
        return  # the load reports a state that does not fit the model
    for group, want in zip(groups, expected):
        for key in CONFIGURED:
            if key in want and isinstance(group, dict) and key in group and not _same(group[key], want[key]):
                raise UserError(
                    f"{path}: the optimizer state holds {key} {group[key]!r} where the run's config gives "
                    f"{want[key]!r} (optim.*): it was not written by this run (edited?); resume it with the "
                    "checkpoint it wrote, or start a new run"
                )


def _same(a: Any, b: Any) -> bool:
    """Equal values, floats within rounding (a list or tuple element-wise)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def load_scheduler(ckpt: Path, lr: float | None = None, steps_done: int | None = None) -> dict | None:
    """The lr scheduler's saved state (None: a checkpoint from before runs saved one). With `lr` (the
    config's optim.lr) and `steps_done` (the checkpoint's step): a state whose schedule starts from another
    lr, or has taken another number of steps, is a one-line UserError (it would set the run's lr)."""
    if not tree_files(ckpt, "scheduler")[1].is_file():
        return None
    state = load_tree(ckpt, "scheduler", "the lr scheduler state")
    where = ckpt / "scheduler.{safetensors,json}"
    base = state.get("base_lrs") if isinstance(state, dict) else None
    if not isinstance(base, list) or not base or not all(_finite_number(b) for b in base):
        raise UserError(f"{where}: not an lr scheduler state t2i-gcpo wrote (base_lrs {base!r}; damaged?)")
    if lr is not None and not all(_same(b, lr) for b in base):
        raise UserError(
            f"{where}: the lr schedule starts from {base[0]!r} where the run's config optim.lr is {lr!r} "
            "(edited?); resume it with the checkpoint it wrote, or start a new run"
        )
    if steps_done is not None and state.get("last_epoch") != steps_done:
        raise UserError(
            f"{where}: the lr schedule has taken {state.get('last_epoch')!r} steps, the checkpoint is at "
            f"step {steps_done} (edited?)"
        )
    return state


def collector_checkpoint(states: list[dict]) -> tuple[dict, list | None]:
    """The batch collectors' states (train/collect.py `state_dict`, one per process in process order)
    as a checkpoint stores them: (trainer-state entries, carry). The running zero-std estimate goes to
    trainer_state.json (every process holds the same); the carried groups to carry.safetensors + .json,
    one entry per process (None: no process carried any, and no carry file is written); the budget
    spent so far and (budget allocation) the prompts' reward history, one entry per process, to
    trainer_state.json."""
    carry = [s["carry"] for s in states]
    state = {"zero_std_estimate": states[0]["zero_std_estimate"], "budget": [s.get("budget") for s in states]}
    if any("history" in s for s in states):  # budget allocation: each process's prompt → [reward sum, count]
        state["history"] = [s.get("history") or {} for s in states]
        state["owed"] = [float(s.get("owed") or 0.0) for s in states]  # knapsack's fraction of a group
    return state, (carry if any(c is not None for c in carry) else None)


def load_collector_state(ckpt: Path, process_index: int, num_processes: int, device: Any = "cpu") -> dict:
    """This process's batch collector state saved in `ckpt` (see `collector_checkpoint`). Groups
    carried by a run with another number of processes are dropped (the main process says so)."""
    state = load_trainer_state(ckpt)
    carry = load_carry(ckpt, device)
    own = None
    if carry is not None and len(carry) == num_processes:
        own = carry[process_index]
    elif carry is not None and process_index == 0:
        print(f"note: {len(carry)} processes carried groups into step {state['step'] + 1}; dropped them")
    budget = state.get("budget") or []  # per process; a run with another number of processes: the totals
    if len(budget) == num_processes:  # go to the main process, so the run's sums stay right
        spent = budget[process_index]
    else:
        spent = {
            k: sum((b or {}).get(k, 0.0) for b in budget) for k in set().union(*(b or {} for b in budget))
        }
        spent = spent if process_index == 0 else None
    histories = state.get("history") or []  # per process; another number of processes: every process
    if len(histories) == num_processes:  # gets the pooled history (a prompt's sums and counts added)
        history = histories[process_index]
    else:
        history = {}
        for seen in histories:
            for text, (total, count) in seen.items():
                pooled = history.setdefault(text, [0.0, 0.0])
                pooled[0], pooled[1] = pooled[0] + total, pooled[1] + count
    loaded = {
        "carry": own,
        "zero_std_estimate": state.get("zero_std_estimate"),
        "budget": spent,
        "history": history,
    }
    if state.get("owed") is not None:  # knapsack's fraction of a group; another number of processes: none
        owed = state["owed"]
        loaded["owed"] = owed[process_index] if len(owed) == num_processes else 0.0
    return loaded
