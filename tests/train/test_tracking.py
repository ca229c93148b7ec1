"""`report_to`: the trackers get the metric names and values of metrics.jsonl, offline — TensorBoard,
Weights & Biases (WANDB_MODE=offline), MLflow (a file store) and Trackio (its local store, where
installed); a tracker whose package is missing is a one-line error naming the pip extra."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.cli import cli
from t2i_gcpo.errors import UserError
from t2i_gcpo.train import tracking
from t2i_gcpo.train.run import prepare, run
from t2i_gcpo.train.tracking import flat_config, installed, resolve_report_to

from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

FAST = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=2",
    "sample_every=0",
    "save_every=1",
    "eval_every=0",
    "eval_images_per_prompt=2",
    "optim.lr_scheduler=linear",
]


def test_names_all_none_and_a_missing_package(monkeypatch, tmp_path):
    monkeypatch.setattr(
        tracking, "check_can_start", lambda name: None
    )  # whether each starts: test_input_checks
    assert resolve_report_to("tensorboard") == ["tensorboard"]
    assert resolve_report_to("none") == []
    assert resolve_report_to("tensorboard, tensorboard") == ["tensorboard"]
    assert resolve_report_to("all") == [t for t in tracking.TRACKERS if installed(t)]
    assert "tensorboard" in resolve_report_to("all")  # a dependency: always there
    with pytest.raises(UserError, match="report_to.: must be one of"):
        resolve_report_to("tensorbord")
    with pytest.raises(UserError, match="cannot be combined"):
        resolve_report_to("none,wandb")
    monkeypatch.setattr(tracking, "installed", lambda name: name == "tensorboard")
    with pytest.raises(
        UserError, match=r"report_to=mlflow needs the mlflow package: pip install 't2i-gcpo\[mlflow\]'"
    ):
        resolve_report_to("tensorboard,mlflow")
    assert resolve_report_to("all") == ["tensorboard"]
    # through the CLI: before any model is loaded or folder written
    out = tmp_path / "run"
    res = CliRunner().invoke(
        cli, ["train", "--prompts", "prompts/shapeworld_train.txt", "--report-to", "wandb", "--out", str(out)]
    )
    assert isinstance(res.exception, UserError), res.output  # main() prints it as one 'error:' line, exit 2
    assert str(res.exception) == "report_to=wandb needs the wandb package: pip install 't2i-gcpo[wandb]'"
    assert not out.exists()
    assert flat_config({"a": {"b": 1, "c": None}, "d": "x"}) == {"a.b": 1, "a.c": "null", "d": "x"}


def metrics_rows(run_dir: Path) -> dict[int, dict[str, float]]:
    """step → every logged value of that step (a train row and an eval row can share a step)."""
    out: dict[int, dict[str, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row.pop("step"), {}).update({k: v for k, v in row.items() if v is not None})
    return out


def tensorboard_rows(run_dir: Path) -> dict[int, dict[str, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = [p for p in (run_dir / "tb").iterdir() if p.is_dir()]
    acc = EventAccumulator(str(folder))
    acc.Reload()
    out: dict[int, dict[str, float]] = {}
    for tag in acc.Tags()["scalars"]:
        for event in acc.Scalars(tag):
            out.setdefault(event.step, {})[tag] = event.value
    return out


def mlflow_rows(store: Path) -> dict[int, dict[str, float]]:
    """The file store's metric files: <experiment>/<run>/metrics/<name>, lines 'time value step'."""
    (metrics_dir,) = list(store.glob("*/*/metrics"))
    out: dict[int, dict[str, float]] = {}
    for f in metrics_dir.rglob("*"):
        if f.is_file():
            for line in f.read_text().splitlines():
                _, value, step = line.split()
                out.setdefault(int(step), {})[str(f.relative_to(metrics_dir))] = float(value)
    return out


def trackio_rows(store: Path) -> dict[int, dict[str, float]]:
    (db,) = list(store.glob("t2i-gcpo*.db"))
    out: dict[int, dict[str, float]] = {}
    with sqlite3.connect(db) as con:
        for step, values in con.execute("select step, metrics from metrics"):
            out.setdefault(step, {}).update(json.loads(values))
    return out


def assert_same(expected: dict, got: dict, what: str) -> None:
    assert sorted(got) == sorted(expected), what
    for step, row in expected.items():
        assert sorted(got[step]) == sorted(row), (what, step)
        for k, v in row.items():
            assert got[step][k] == pytest.approx(v, rel=1e-6, abs=1e-9), (what, step, k)


def test_every_tracker_logs_the_metric_names_and_values_of_metrics_jsonl(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this switch
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    trackers = ["tensorboard", "wandb", "mlflow"] + (["trackio"] if installed("trackio") else [])
    out = tmp_path / "run"
    flags = dict(
        prompts=str(write_prompt_file(tmp_path / "p.jsonl")),
        model=str(tiny_policy_dir(tmp_path)),
        reward="train_fixtures:redness",
        out=str(out),
        steps=2,
        seed=0,
        report_to=",".join(trackers),
    )
    overrides = (*FAST, f"eval_prompts={write_prompt_file(tmp_path / 'eval.jsonl', n=2)}")
    run(prepare(algo="gcpo", flags=flags, overrides=overrides))

    expected = metrics_rows(out)
    assert sorted(expected) == [1, 2] and "lr" in expected[1] and "eval/strict/overall" in expected[2]
    assert_same(expected, tensorboard_rows(out), "tensorboard")
    assert_same(expected, mlflow_rows(tmp_path / "mlruns"), "mlflow")
    (wandb_file,) = list(out.glob("wandb/offline-run-*/run-*.wandb"))  # W&B's binary record log
    data = wandb_file.read_bytes()
    names = {k for row in expected.values() for k in row}
    assert [k for k in sorted(names) if k.encode() not in data] == [], "every metric name in the W&B run"
    assert b"optim.lr_scheduler" in data and out.name.encode() in data  # the config and the run's name
    if "trackio" in trackers:
        assert_same(expected, trackio_rows(tmp_path / "trackio"), "trackio")


def test_report_to_none_writes_metrics_jsonl_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)
    out = tmp_path / "run"
    flags = dict(
        prompts=str(write_prompt_file(tmp_path / "p.jsonl")),
        model=str(tiny_policy_dir(tmp_path)),
        reward="train_fixtures:redness",
        out=str(out),
        steps=1,
        seed=0,
        report_to="none",
    )
    run(prepare(algo="gcpo", flags=flags, overrides=(*FAST[:-3], "eval_every=-1")))
    assert (out / "metrics.jsonl").is_file() and not (out / "tb").exists()
