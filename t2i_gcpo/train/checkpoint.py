"""Checkpoints of a run: policy weights (safetensors, via the adapter's save_pretrained), optimizer
state and the trainer state. Each is written to a temporary directory and renamed into place, so a
crash or Ctrl-C never leaves a half-written checkpoint behind.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from t2i_gcpo.errors import UserError

KEEP_LAST = 2


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


def save_checkpoint(
    run_dir: Path, step: int, policy: Any, optimizer: torch.optim.Optimizer, state: dict
) -> Path:
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    policy.save_pretrained(str(tmp / "model"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **state}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (run_dir / "checkpoints" / "latest").write_text(final.name + "\n")
    for old in sorted(p for p in (run_dir / "checkpoints").glob("step_*") if not p.name.endswith(".tmp"))[
        :-KEEP_LAST
    ]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    if not (path / "trainer_state.json").is_file():
        raise UserError(f"checkpoint {path} is incomplete (no trainer_state.json)")
    return path


def load_trainer_state(ckpt: Path) -> dict:
    return json.loads((ckpt / "trainer_state.json").read_text())


def load_optimizer(ckpt: Path, optimizer: torch.optim.Optimizer) -> None:
    optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True))
