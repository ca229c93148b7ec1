"""A run directory's life outside the training loop: claimed under a default name, marked as a run
with its config, and set up to continue (saved steps, metric rows a resumed run writes again)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from t2i_gcpo import metrics as M
from t2i_gcpo.config import TrainConfig, save_config
from t2i_gcpo.errors import UserError
from t2i_gcpo.metrics import MetricsRow
from t2i_gcpo.outdir import atomic_write_text, parse_json, read_side_text, read_yaml


def claim_default_run_dir(algo: str) -> tuple[Path, Any]:
    """runs/<algo>-<date>-<time> (or a free `-2`, `-3` … next to it), created and locked for this
    process: (the directory, its lock)."""
    from t2i_gcpo.outdir import lock_output

    run_dir = claim_run_dir(Path("runs") / f"{algo}-{time.strftime('%Y%m%d-%H%M%S')}")
    return run_dir, lock_output(run_dir)


def claim_run_dir(base: Path) -> Path:
    """Create `base`, or `base-2`, `base-3` … if it exists, exclusively: two runs started in the same
    second never share a directory."""
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise UserError(f"cannot create a run directory next to {base}: too many runs share its name")


def prepare_run_dir(cfg: TrainConfig, run_dir: Path) -> None:
    """Mark `run_dir` as a run (outdir.is_run_dir) and save its config: from here on `--resume` continues
    it, from its latest checkpoint or, before the first one, from the beginning."""
    from t2i_gcpo.outdir import RUN_MARKER

    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / RUN_MARKER, "written by t2i-gcpo train: this folder is a run (config.yaml)\n")
    save_config(cfg, run_dir / "config.yaml")


def continue_run_dir(run_dir: Path, start_step: int, steps: int, step_row: dict | None = None) -> None:
    """Before a resumed run trains from `start_step` to `steps`: record `steps` in its saved config (a
    later plain --resume continues to the same total), drop metric rows the run will write again (the
    checkpoint's own row, `step_row`, put back where the file lost it), and drop eval.json when the run goes
    past the end it described."""
    import yaml

    saved = run_dir / "config.yaml"
    data = read_yaml(saved)
    if data.get("steps") != steps:
        data["steps"] = steps
        atomic_write_text(saved, yaml.safe_dump(data, sort_keys=False))
    if start_step == 0:  # no checkpoint yet: the run starts again, base evaluation included
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    else:
        truncate_metrics(
            run_dir / "metrics.jsonl", start_step, redo_final=start_step == steps, restore=step_row
        )
    if start_step < steps:
        (run_dir / "eval.json").unlink(missing_ok=True)


def _is_eval_only(row: dict) -> bool:
    """A held-out evaluation row of its own (step 0's base model, or a run's final one)."""
    return all(k == M.STEP or k.startswith("eval/") for k in row)


def truncate_metrics(path: Path, step: int, redo_final: bool = False, restore: dict | None = None) -> None:
    """Drop metric rows written after the checkpoint being resumed (they will be recomputed), and with
    `redo_final` the final evaluation row at `step` too (the run is about to write it again). A
    half-written last line (a crash mid-write) is dropped; damage anywhere else is a `UserError`. `restore`:
    the checkpoint's own row of `step` (trainer_state.json), written back where the file has none (its line
    was the torn one, or never reached the disk): a resume loses no row of a step it does not redo."""
    if not path.exists() and not path.is_symlink():
        if restore is not None:
            atomic_write_text(path, json.dumps(restore) + "\n")
        return
    lines = read_side_text(path).splitlines()
    kept, has_row = [], False
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = parse_json(line, f"{path}:{i + 1}", MetricsRow)
            row_step = row[M.STEP]
        except UserError:  # malformed, nested too deeply, not a row
            if i == len(lines) - 1:
                continue  # cut short by a crash while it was written: it will be written again
            raise UserError(f"{path}:{i + 1}: not a metrics row (damaged file?)") from None
        if row_step < step or (row_step == step and not (redo_final and _is_eval_only(row))):
            kept.append(line)
            has_row = has_row or (row_step == step and not _is_eval_only(row))
    if restore is not None and restore.get(M.STEP) == step and not has_row:
        kept.append(json.dumps(restore))
    atomic_write_text(path, "".join(ln + "\n" for ln in kept))


def resume_command(run_dir: Path, credit: str | None, reward: str | None, steps: int | None = None) -> str:
    """The command that continues the run in `run_dir` (to `steps` in all), one that works as printed: the
    run's own credit and reward code named again (a resumed run runs only code that is named:
    docs/errors.md#run-code), quoted for the shell; code in a file inside the run folder said to be there (the
    folder may come from someone else). A run trained with a Python function resumes from Python."""
    import shlex

    from t2i_gcpo.core.schemes import CREDIT_SCHEMES
    from t2i_gcpo.rewards.registry import user_code_specs
    from t2i_gcpo.usercode import PYTHON_OBJECT, code_files, is_function_spec

    if any(isinstance(spec, str) and spec.split(":", 1)[0] == PYTHON_OBJECT for spec in (credit, reward)):
        return f"t2i_gcpo.train(resume={str(run_dir)!r}, …) with the same Python function"
    parts, code = ["t2i-gcpo", "train", "--resume", str(run_dir)], []
    if steps is not None:
        parts += ["--steps", str(steps)]
    if credit and credit not in CREDIT_SCHEMES and is_function_spec(credit):
        parts += ["--credit", credit]
        code.append(credit)
    if reward and user_code_specs(reward):
        parts += ["--reward", reward]
        code += user_code_specs(reward)
    command = " ".join(shlex.quote(p) for p in parts)
    inside = [spec for spec in code for f in code_files(spec) if f.is_relative_to(Path(run_dir).resolve())]
    if inside:
        command += f" (it runs {inside[0]}, a file inside the run folder: read it first)"
    return command
