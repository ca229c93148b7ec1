"""Input checked before any model is loaded or any folder written — one line, exit 2, nothing written
(issue 45, "Tracebacks and late errors"): trackers that cannot start, credit options out of their
scheme's bounds, a user credit function's output, YAML alias bombs, unbounded sizes, late prompt
and sampling checks, complex rewards."""

from __future__ import annotations

import pytest

from t2i_gcpo.errors import UserError
from t2i_gcpo.resources import PROMPTS_DIR
from t2i_gcpo.train import tracking

from cli_helpers import cli, error_line

TRAIN_PROMPTS = str(PROMPTS_DIR / "shapeworld_train.txt")


# ----------------------------------------------------------------------------- trackers


def test_wandb_without_a_key_is_one_line_before_the_run_folder(tmp_path, monkeypatch, capsys):
    """`train --report-to wandb` (an example of `train --help`) with W&B installed but not logged in: a
    traceback once the run folder existed."""
    pytest.importorskip("wandb")
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc, no wandb settings
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / "wandb"))
    out = tmp_path / "run"
    code, _, err = cli(capsys, "train", "--prompts", TRAIN_PROMPTS, "--report-to", "wandb", "--out", out)
    line = error_line(err)
    assert code == 2 and line.startswith("error: report_to=wandb cannot start: ") and "wandb login" in line
    assert not out.exists()
    monkeypatch.setenv("WANDB_MODE", "offline")  # logs locally: needs no key
    tracking.check_can_start("wandb")


def test_mlflow_whose_store_cannot_open_is_one_line_before_the_run_folder(tmp_path, monkeypatch, capsys):
    """MLflow without sqlalchemy (what the dev extra installs) and a file: store without its switch: a
    traceback once the run folder existed."""
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    if not tracking.installed("sqlalchemy"):  # first: MLflow caches what a store it opened once
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        monkeypatch.chdir(tmp_path)  # MLflow's default store: ./mlflow.db
        with pytest.raises(
            UserError, match=r"needs sqlalchemy and alembic: pip install 't2i-gcpo\[mlflow\]'"
        ):
            tracking.check_can_start("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    out = tmp_path / "run"
    code, _, err = cli(capsys, "train", "--prompts", TRAIN_PROMPTS, "--report-to", "mlflow", "--out", out)
    line = error_line(err)
    assert code == 2 and "report_to=mlflow cannot open its tracking store file:" in line
    assert "MLFLOW_ALLOW_FILE_STORE=true" in line and not out.exists()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tracking.check_can_start("mlflow")
