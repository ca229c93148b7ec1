"""Checkpoints of a run: policy weights (safetensors, via the adapter's save_pretrained), optimizer
state and carried groups (safetensors + JSON, `tensor_tree`: a run directory may come from someone
else, and nothing in it is a pickle) and the trainer state. Each is written to a temporary directory and renamed into place, so a
crash or Ctrl-C never leaves a half-written checkpoint behind; the ``checkpoints/latest`` pointer
is replaced atomically, and a missing or damaged pointer falls back to the newest complete step.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.train.tensor_tree import load_tree, save_tree, tree_files

KEEP_LAST = 2
STEP_DIR = re.compile(r"step_(\d+)")


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and `os.replace`: a
    reader sees the old content or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(
    run_dir: Path,
    step: int,
    policy: Any,
    optimizer_state: dict,
    state: dict,
    carry: Any = None,
    scheduler_state: dict | None = None,
) -> Path:
    """`optimizer_state`: the optimizer's whole state dict (FSDP: gathered from the shards). `carry`:
    groups kept for the next step, one entry per process. `scheduler_state`: the lr scheduler's state
    dict. All are written as safetensors + JSON."""
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    policy.save_pretrained(str(tmp / "model"))
    save_tree(tmp, "optimizer", optimizer_state)
    if carry is not None:
        save_tree(tmp, "carry", carry)
    if scheduler_state is not None:
        save_tree(tmp, "scheduler", scheduler_state)
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **state}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    atomic_write_text(run_dir / "checkpoints" / "latest", final.name + "\n")
    for old in _step_dirs(run_dir)[:-KEEP_LAST]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _step_dirs(run_dir: Path) -> list[Path]:
    """The run's checkpoint folders ``step_NNNNNN`` (not the ``.tmp`` ones), oldest first."""
    root = run_dir / "checkpoints"
    found = (
        [p for p in root.glob("step_*") if p.is_dir() and STEP_DIR.fullmatch(p.name)] if root.is_dir() else []
    )
    return sorted(found, key=lambda p: int(STEP_DIR.fullmatch(p.name).group(1)))


def is_complete(ckpt: Path) -> bool:
    """A checkpoint folder with a readable trainer state, the optimizer state and the model folder."""
    try:
        state = json.loads((ckpt / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(state, dict)
        and isinstance(state.get("step"), int)
        and (all(p.is_file() for p in tree_files(ckpt, "optimizer")) or (ckpt / LEGACY_OPTIMIZER).is_file())
        and (ckpt / "model").is_dir()
    )


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``checkpoints/latest`` names; if that pointer is missing, unreadable or names an
    incomplete checkpoint, the newest complete ``step_*`` folder; None when there is none."""
    pointer = run_dir / "checkpoints" / "latest"
    try:
        name = pointer.read_text().strip()
    except (OSError, ValueError):
        name = ""
    if STEP_DIR.fullmatch(name) and is_complete(pointer.parent / name):
        return pointer.parent / name
    for ckpt in reversed(_step_dirs(run_dir)):
        if is_complete(ckpt):
            return ckpt
    return None


def load_trainer_state(ckpt: Path) -> dict:
    return json.loads((ckpt / "trainer_state.json").read_text())


def mark_finished(ckpt: Path) -> None:
    """Record in a checkpoint's trainer state that the run ended there: trained, evaluated, reported."""
    state = load_trainer_state(ckpt)
    if not state.get("finished"):
        atomic_write_text(ckpt / "trainer_state.json", json.dumps({**state, "finished": True}, indent=1))


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
            f"if you trust this run, delete it to resume without the carried groups (the next step draws new ones)"
        )
    return None


def load_optimizer(ckpt: Path, load: Callable[[dict], None]) -> None:
    """Read the optimizer state of `ckpt` and hand it to `load`: an optimizer's `load_state_dict`, or
    (FSDP) the loader that shards it. A damaged file or a state that does not fit the model is a
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
    try:
        load(state)
    except (ValueError, KeyError, RuntimeError, TypeError) as e:
        raise UserError(f"{path}: the optimizer state does not match the model: {e}") from None


def load_scheduler(ckpt: Path) -> dict | None:
    """The lr scheduler's saved state (None: a checkpoint from before runs saved one)."""
    if not tree_files(ckpt, "scheduler")[1].is_file():
        return None
    return load_tree(ckpt, "scheduler", "the lr scheduler state")


def collector_checkpoint(states: list[dict]) -> tuple[dict, list | None]:
    """The batch collectors' states (train/collect.py `state_dict`, one per process in process order)
    as a checkpoint stores them: (trainer-state entries, carry). The running zero-std estimate goes to
    trainer_state.json (every process holds the same); the carried groups to carry.safetensors + .json,
    one entry per process (None: no process carried any, and no carry file is written); the budget
    spent so far, one entry per process, to trainer_state.json."""
    carry = [s["carry"] for s in states]
    state = {"zero_std_estimate": states[0]["zero_std_estimate"], "budget": [s.get("budget") for s in states]}
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
    return {"carry": own, "zero_std_estimate": state.get("zero_std_estimate"), "budget": spent}
