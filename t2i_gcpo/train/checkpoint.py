"""Checkpoints of a run: policy weights (safetensors, via the adapter's save_pretrained), optimizer
state and the trainer state. Each is written to a temporary directory and renamed into place, so a
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
    groups kept for the next step, one entry per process (pickled to ``carry.pt``). `scheduler_state`:
    the lr scheduler's state dict (``scheduler.pt``)."""
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    policy.save_pretrained(str(tmp / "model"))
    torch.save(optimizer_state, tmp / "optimizer.pt")
    if carry is not None:
        torch.save(carry, tmp / "carry.pt")
    if scheduler_state is not None:
        torch.save(scheduler_state, tmp / "scheduler.pt")
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
        and (ckpt / "optimizer.pt").is_file()
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


def _read(path: Path, what: str, **load_options: Any) -> Any:
    """torch.load(path); a damaged file is a UserError naming `what` it should have held."""
    try:
        return torch.load(path, **load_options)
    except Exception as e:  # torch raises RuntimeError, EOFError, UnpicklingError … on a damaged file
        message = " ".join(str(e).split())[:200]
        raise UserError(f"{path}: cannot read {what} (damaged file?): {message}") from None


def load_carry(ckpt: Path, device: Any = "cpu") -> list | None:
    """The groups each process carried into the next step (None: the run carried none)."""
    path = ckpt / "carry.pt"
    if not path.is_file():
        return None
    # pickled Batch objects, written by save_checkpoint
    return _read(path, "the carried groups", map_location=device, weights_only=False)


def load_optimizer(ckpt: Path, load: Callable[[dict], None]) -> None:
    """Read ckpt/optimizer.pt and hand it to `load`: an optimizer's `load_state_dict`, or (FSDP) the
    loader that shards it. A damaged file or a state that does not fit the model is a UserError."""
    path = ckpt / "optimizer.pt"
    state = _read(path, "the optimizer state", map_location="cpu", weights_only=True)
    try:
        load(state)
    except (ValueError, KeyError, RuntimeError) as e:
        raise UserError(f"{path}: the optimizer state does not match the model: {e}") from None


def load_scheduler(ckpt: Path) -> dict | None:
    """The lr scheduler's saved state (None: a checkpoint from before runs saved one)."""
    path = ckpt / "scheduler.pt"
    return _read(path, "the lr scheduler state", weights_only=True) if path.is_file() else None
