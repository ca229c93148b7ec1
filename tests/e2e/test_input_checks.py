"""Input checked before any model is loaded or any folder written — one line, exit 2, nothing written
(issue 45, "Tracebacks and late errors"): trackers that cannot start, credit options out of their
scheme's bounds, a user credit function's output, YAML alias bombs, unbounded sizes, late prompt
and sampling checks, complex rewards."""

from __future__ import annotations

import os
import subprocess
import sys

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
    # a process of its own: a W&B session started in this one (another test's offline run) would be reused
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "t2i_gcpo.cli",
            "train",
            "--prompts",
            str(TRAIN_PROMPTS),
            "--report-to",
            "wandb",
            "--out",
            str(out),
            "--steps",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    line = error_line(done.stderr)
    assert (
        done.returncode == 2
        and line.startswith("error: report_to=wandb cannot start: ")
        and "wandb login" in line
    )
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


# ----------------------------------------------------------------------------- credit options


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("top_fraction=0", "config key 'credit.options.top_fraction': must be in [1e-06, 0.999999]"),
        ("top_fraction=2", "config key 'credit.options.top_fraction': must be in [1e-06, 0.999999]"),
        ("tau=0", "config key 'credit.options.tau': must be ≥ 1e-06"),
    ],
)
def test_credit_options_by_name_meet_the_bounds_of_the_schemes_section(option, message):
    """`credit.options.k=0` passed where the section's `credit.vine.k=0` was refused (issue 45): options
    given by name meet the bounds of the scheme's own section."""
    from t2i_gcpo.config import load_config

    with pytest.raises(UserError, match="^" + message.replace("[", r"\[").replace("]", r"\]")):
        load_config("gcpo", overrides=[f"credit.options.{option}"])
    with pytest.raises(UserError, match=r"config key 'credit\.gcpo\."):
        load_config("gcpo", overrides=[f"credit.gcpo.{option}"])
    assert load_config("gcpo", overrides=["credit.options.tau=3"]).credit.options == {"tau": 3.0}


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_a_float_credit_option_refuses_nan_and_inf(value):
    from t2i_gcpo.config import load_config

    with pytest.raises(UserError, match=r"credit\.options\.tau"):
        load_config("gcpo", overrides=[f"credit.options.tau={value}"])


# ----------------------------------------------------------------------------- sizes


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path, capsys):
    """424 bytes of nested aliases became a 220 MB config.yaml in 141 s (issue 45)."""
    levels = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        levels.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(levels) + "\nrollout: {group_size: *i}\n")
    out = tmp_path / "run"
    code, _, err = cli(capsys, "train", "--config", bomb, "--prompts", TRAIN_PROMPTS, "--out", out)
    line = error_line(err)
    assert code == 2 and "aliases (*name) are not accepted in a config" in line and "line 2" in line, line
    assert not out.exists()
    from t2i_gcpo.config import parse_set

    assert parse_set("model_options.negative=*a")[1] == "*a", "a --set value with an alias: the text as it is"


@pytest.mark.parametrize(
    ("key", "value"),
    [("rollout.group_size", 100000), ("rollout.prompts_per_step", 10**6), ("eval_images_per_prompt", 5000)],
)
def test_sample_counts_are_bounded(key, value):
    from t2i_gcpo.config import load_config

    with pytest.raises(UserError, match=rf"config key '{key}': must be in \[\d, 4096\]"):
        load_config("dapo", overrides=[f"{key}={value}"])


def test_a_huge_vq_image_size_in_a_checkpoint_is_one_line(tmp_path, capsys):
    import json
    import shutil

    from t2i_gcpo.resources import PACKAGE_DIR

    model = tmp_path / "model"
    shutil.copytree(PACKAGE_DIR / "assets" / "shapeworld", model)
    config = json.loads((model / "vq" / "config.json").read_text())
    (model / "vq" / "config.json").write_text(json.dumps({**config, "image_size": 32 * 2**20}))
    prompts = tmp_path / "p.txt"
    prompts.write_text("a photo of a red circle\n")
    code, _, err = cli(capsys, "sample", "--model", model, "--prompts", prompts, "--out", tmp_path / "s")
    line = error_line(err)
    assert code == 2 and "image_size must be a multiple of 2^num_down up to 1024, got 33554432" in line, line
    assert not (tmp_path / "s").exists()


# ----------------------------------------------------------------------------- late checks


def test_a_missing_prompt_file_is_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch):
    """It was reported after the model had loaded (16 s)."""
    import t2i_gcpo.policies.registry as registry

    monkeypatch.setattr(registry, "load_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    for key in ("--prompts", "--set"):
        value = tmp_path / "missing.txt" if key == "--prompts" else f"eval_prompts={tmp_path / 'missing.txt'}"
        args = ["--prompts", TRAIN_PROMPTS] if key == "--set" else []
        code, _, err = cli(capsys, "train", key, value, *args, "--out", tmp_path / "run")
        line = error_line(err)
        assert code == 2 and "missing.txt does not exist" in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"top_k": -5}, "top_k must be ≥ 0"),  # a RuntimeError from torch.topk
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"seed": 10**23}, "seed must be in [0, 9223372036854775807]"),
        ({"seed": 1.5}, "seed must be an integer"),
        ({"cfg_scale": float("inf")}, "cfg_scale must be a finite number"),
        ({"n": 0}, "n must be in [1, 4096]"),
    ],
)
def test_the_api_checks_sampling_arguments_before_loading_a_model(kwargs, message, monkeypatch, tmp_path):
    import t2i_gcpo.api as api

    monkeypatch.setattr(api, "_load", lambda model: pytest.fail("the model was loaded"))
    with pytest.raises(UserError) as e:
        api.generate("shapeworld", "a photo of a red circle", **kwargs)
    assert message in str(e.value)
    with pytest.raises(UserError) as e:
        api.sample(["a photo of a red circle"], tmp_path / "s", **kwargs)
    assert message in str(e.value) and not (tmp_path / "s").exists()


def test_complex_rewards_from_the_api_are_refused_like_nan(tmp_path):
    import torch

    from t2i_gcpo import api
    from t2i_gcpo.errors import RewardError

    def complex_reward(images, prompts, metadata):
        return torch.ones(len(prompts), dtype=torch.complex64) * (1 + 1j)

    with pytest.raises(RewardError, match="returned complex scores, expected real numbers"):
        api.train(prompts=["a photo of a red circle"], reward=complex_reward, out=tmp_path / "run", steps=1)
    assert not (tmp_path / "run").exists()
