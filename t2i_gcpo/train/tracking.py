"""Experiment trackers through accelerate's tracker API (`report_to`): TensorBoard (the default, in the
run directory's tb/), Weights & Biases, MLflow and Trackio, each given the same metric names and values
as metrics.jsonl (t2i_gcpo/metrics.py), at the same steps.

Where each one writes: TensorBoard to <run>/tb/t2i-gcpo/; W&B to <run>/wandb/ (online or, with
WANDB_MODE=offline, as an offline run to `wandb sync` later), project t2i-gcpo; MLflow to its tracking URI
(MLFLOW_TRACKING_URI, else MLflow's default ./mlflow.db), experiment t2i-gcpo; Trackio to its local
store (TRACKIO_DIR), project t2i-gcpo. The W&B, MLflow and Trackio run is named after the run directory;
all but TensorBoard also get the resolved config (dotted keys)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from t2i_gcpo.config import PROJECT, TRACKERS, check_report_to
from t2i_gcpo.errors import UserError


def installed(name: str) -> bool:
    """The tracker's package (its module has the tracker's name; mlflow-skinny provides mlflow)."""
    return importlib.util.find_spec(name) is not None


def tracker_names(spec: str, installed_only: bool = False) -> list[str]:
    """The trackers `spec` names ('all': every installed one; 'none': none), in order, once each.
    `installed_only`: a named tracker that is not installed is a UserError naming its pip extra."""
    check_report_to(spec)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if "none" in names:
        if len(names) > 1:
            raise UserError("report_to: 'none' cannot be combined with trackers")
        return []
    if "all" in names:
        return [t for t in TRACKERS if installed(t)]
    missing = [n for n in dict.fromkeys(names) if not installed(n)] if installed_only else []
    if missing:
        n = missing[0]
        raise UserError(f"report_to={n} needs the {n} package: pip install 't2i-gcpo[{n}]'")
    return list(dict.fromkeys(names))


def resolve_report_to(spec: str) -> list[str]:
    """The trackers `spec` asks for (`tracker_names`), each checked to start as the run would start it
    (`check_can_start`: 'all' included): a UserError naming the pip extra for one that is not installed, or
    what stops one from starting."""
    trackers = tracker_names(spec, installed_only=True)
    for name in trackers:
        check_can_start(name)
    return trackers


def check_can_start(tracker: str) -> None:
    """A one-line UserError, before any run directory exists, for a tracker that would fail when the run
    starts it: W&B online without an API key (`wandb login`), MLflow whose tracking store cannot be opened
    (its default ./mlflow.db without sqlalchemy, a file store without MLFLOW_ALLOW_FILE_STORE, a server
    that does not answer). Each asks the tracker itself, as starting the run would."""
    import os

    if tracker == "wandb" and os.environ.get("WANDB_MODE", "online") not in ("offline", "disabled", "dryrun"):
        import wandb

        try:
            wandb.login(verify=False)  # reads the key (env, netrc, settings), as wandb.init does
        except Exception as e:  # wandb.errors.UsageError without a key on a non-interactive terminal
            raise UserError(
                f"report_to=wandb cannot start: {_first_line(e)} (run `wandb login`, set WANDB_API_KEY, or "
                "WANDB_MODE=offline to log locally)"
            ) from None
    elif tracker == "mlflow":
        import mlflow

        try:  # what accelerate's MLflow tracker does first
            mlflow.search_experiments(filter_string=f"name = '{PROJECT}'", max_results=1)
        except Exception as e:
            uri = mlflow.get_tracking_uri()
            hint = ""
            if uri.startswith("sqlite:") and not installed("sqlalchemy"):
                hint = " (its database store needs sqlalchemy and alembic: pip install 't2i-gcpo[mlflow]')"
            elif "MLFLOW_ALLOW_FILE_STORE" in str(e):
                hint = " (a file store needs MLFLOW_ALLOW_FILE_STORE=true)"
            raise UserError(
                f"report_to=mlflow cannot open its tracking store {uri}{hint}: {_first_line(e)}"
            ) from None


def _first_line(error: Exception) -> str:
    from t2i_gcpo.errors import shorten

    return shorten(" ".join(str(error).split()) or type(error).__name__, 160)


def flat_config(data: dict, prefix: str = "") -> dict[str, Any]:
    """{'optim': {'lr': 1e-4}} → {'optim.lr': 1e-4}; None → 'null' (trackers' config tables want scalars)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = "null" if value is None else value
    return out


def start_trackers(
    accelerator: Any, trackers: list[str], run_dir: Path, config: dict, start_step: int, resume: bool = False
) -> None:
    """init_trackers for a run in `run_dir` that resumes after `start_step`. TensorBoard drops events
    past start_step (a killed run's steps after its checkpoint are trained again), and all of them when
    a resumed run starts over from step 0 (it had no checkpoint). TensorBoard's event file is written by
    `EventFile` (never through a link); W&B's folder is checked to be a folder of the run, not a link."""
    if not trackers:
        return
    from t2i_gcpo.outdir import real_dir

    if "wandb" in trackers:
        real_dir(run_dir / "wandb", within=run_dir)
    from t2i_gcpo.train.event_file import EventFile

    purge = (start_step + 1 if start_step else 0) if resume else None
    accelerator.log_with = [
        EventFile(run_dir, purge) if getattr(t, "value", t) == "tensorboard" else t
        for t in accelerator.log_with
    ]
    name = run_dir.resolve().name
    kwargs = {
        "wandb": {"dir": str(run_dir), "name": name},
        "mlflow": {"run_name": name},
        "trackio": {"name": name},
    }
    accelerator.init_trackers(PROJECT, init_kwargs=kwargs)
    flat = flat_config(config)
    for tracker in accelerator.trackers:
        if tracker.name != "tensorboard":  # TensorBoard's hparams would add a sub-run; config.yaml holds it
            tracker.store_init_configuration(flat)


def log_metrics(accelerator: Any, row: dict, step: int) -> None:
    """One metrics.jsonl row to every tracker (None values, NaN in the row, are left out)."""
    values = {k: v for k, v in row.items() if k != "step" and v is not None}
    if values and accelerator.trackers:
        accelerator.log(values, step=step)


def finish_trackers(accelerator: Any) -> None:
    """Close every tracker (flush TensorBoard, end the W&B / MLflow / Trackio run). Not
    accelerator.end_training: it also destroys the process group, which the caller leaves later
    (train.distributed.leave_process_group) once every rank is done."""
    for tracker in accelerator.trackers:
        tracker.finish()
    accelerator.trackers = []
