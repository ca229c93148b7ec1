"""What a resumed run reads from its folder is checked against its config, and what it writes survives a
full disk (issue 45): an edited lr schedule or optimizer state is refused, a warmup as long as the run is
refused before the run folder exists, a failed checkpoint save is one line that keeps the previous
checkpoint and says how to continue, `keep_checkpoints` sets how many are kept, and crafted side files
(trainer state, a checkpoint's config.json, deeply nested JSON, pickle-only weights) are one line each."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest
import yaml

import t2i_gcpo.train.checkpoint as checkpoint_mod
import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.config import load_config
from t2i_gcpo.errors import UserError
from t2i_gcpo.resources import PROMPTS_DIR

from cli_helpers import cli, error_line
from train_fixtures import copy_run, train_tiny_run

BAR = "gcpo:"  # the progress bar's lines on stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 1-step run in `root/base` (built-in credit and reward: no code of the user's)."""
    return train_tiny_run(tmp_path_factory.mktemp("resume"))


@pytest.fixture(autouse=True)
def no_report(monkeypatch):
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)  # matplotlib: seconds per run


def fresh(trained, where: Path) -> Path:
    return copy_run(trained["base"], where)


def ckpt(run: Path, step: int = 1) -> Path:
    return run / "checkpoints" / f"step_{step:06d}"


def rewrite_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def resume(capsys, run: Path, steps: int = 2) -> tuple[int, str]:
    code, _, err = cli(capsys, "train", "--resume", run, "--steps", steps)
    return code, err


# ------------------------------------------------------------- 5. the saved schedule agrees with the config


def test_an_edited_lr_schedule_or_optimizer_state_is_refused(trained, tmp_path, capsys):
    """scheduler.json with base_lrs [0.5] would set the lr of every later step to 0.5 × λ under a
    config of 3e-3; a weight decay edited into optimizer.json would decay with it."""
    run = fresh(trained, tmp_path)
    rewrite_json(ckpt(run) / "scheduler.json", lambda d: d.update(base_lrs=[0.5]))
    code, err = resume(capsys, run)
    line = error_line(err)
    assert (
        code == 2
        and "scheduler" in line
        and "starts from 0.5 where the run's config optim.lr is 0.003" in line
    )
    assert not ckpt(run, 2).exists()
    shutil.copy(ckpt(trained["base"]) / "scheduler.json", ckpt(run) / "scheduler.json")
    rewrite_json(ckpt(run) / "scheduler.json", lambda d: d.update(last_epoch=7))
    code, err = resume(capsys, run)
    assert code == 2 and "has taken 7 steps, the checkpoint is at step 1" in error_line(err)
    shutil.copy(ckpt(trained["base"]) / "scheduler.json", ckpt(run) / "scheduler.json")

    rewrite_json(ckpt(run) / "optimizer.json", lambda d: d["param_groups"][0].update(weight_decay=10.0))
    code, err = resume(capsys, run)
    line = error_line(err)
    assert code == 2 and "optimizer" in line and "weight_decay 10.0 where the run's config gives 0.0" in line
    shutil.copy(ckpt(trained["base"]) / "optimizer.json", ckpt(run) / "optimizer.json")
    code, err = resume(capsys, run)  # restored: it resumes
    assert code == 0 and ckpt(run, 2).is_dir(), err


def test_a_warmup_as_long_as_the_run_is_refused_before_the_run_folder_exists(trained, tmp_path, capsys):
    out = tmp_path / "new"
    code, _, err = cli(
        capsys,
        "train",
        "--prompts",
        trained["prompts"],
        "--model",
        trained["model"],
        "--out",
        out,
        "--steps",
        "5",
        "--set",
        "optim.warmup_steps=5",
    )
    line = error_line(err)
    assert code == 2 and "config key 'optim.warmup_steps': must be less than steps (5)" in line, line
    assert not out.exists()
    assert load_config(overrides=["steps=5", "optim.warmup_steps=4"]).optim.warmup_steps == 4


# ------------------------------------------------------------- 6. a full disk during a checkpoint save


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint_and_says_how_to_continue(
    trained, tmp_path, capsys, monkeypatch
):
    run = fresh(trained, tmp_path)
    before = {p.name: p.read_bytes() for p in ckpt(run).iterdir() if p.is_file()}
    write = checkpoint_mod.save_tree

    def disk_full(folder, name, value, **kwargs):
        if name == "optimizer":
            raise OSError(errno.ENOSPC, "No space left on device", str(folder / f"{name}.safetensors"))
        return write(folder, name, value, **kwargs)

    monkeypatch.setattr(checkpoint_mod, "save_tree", disk_full)
    code, err = resume(capsys, run, steps=3)
    line = error_line(err, ignore=BAR)
    assert code == 1, err
    assert f"cannot write the checkpoint of step 2 in {run / 'checkpoints'}: No space left on device" in line
    assert (
        "the checkpoint of step 1 is kept" in line and f"continue with: t2i-gcpo train --resume {run}" in line
    )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_000001"], (
        "nothing half-written"
    )
    assert {p.name: p.read_bytes() for p in ckpt(run).iterdir() if p.is_file()} == before
    monkeypatch.undo()  # space freed: the run continues from step 1
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)
    code, err = resume(capsys, run, steps=3)
    assert code == 0 and ckpt(run, 3).is_dir(), err


# ------------------------------------------------------------- 7. how many checkpoints are kept


def test_keep_checkpoints_sets_how_many_are_kept(trained, tmp_path, capsys):
    run = fresh(trained, tmp_path)
    data = yaml.safe_load((run / "config.yaml").read_text())
    assert data["keep_checkpoints"] == 2  # the default, recorded
    data["keep_checkpoints"] = 1
    (run / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    code, err = resume(capsys, run, steps=3)
    assert code == 0, err
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000003"]
    data["keep_checkpoints"] = 3
    (run / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    code, err = resume(capsys, run, steps=6)
    assert code == 0, err
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == [
        f"step_00000{k}" for k in (4, 5, 6)
    ]
    with pytest.raises(UserError, match=r"config key 'keep_checkpoints': must be ≥ 1 .*got 0"):
        load_config(overrides=["keep_checkpoints=0"])


# ------------------------------------------------------------- 8. crafted side files


@pytest.mark.parametrize(
    "content, needle",
    [
        ("[1, 2]", "its content: input should be a valid dictionary"),
        ('{"step": "1"}', "'step': input should be a valid integer, got '1'"),
        ('{"step": 1, "zero_std_estimate": "x"}', "'zero_std_estimate': input should be a valid number"),
        (
            '{"step": 1, "zero_std_estimate": 7}',
            "'zero_std_estimate': input should be less than or equal to 1",
        ),
        ('{"step": 1, "budget": [{"budget/samples": "many"}]}', "'budget.0.budget/samples': input should be"),
        ('{"step": -4}', "'step': input should be greater than or equal to 0, got -4"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("{step: 1", "is not valid JSON"),
    ],
    ids=["list", "step-str", "zero-std-str", "zero-std-range", "budget", "negative", "nested", "broken"],
)
def test_a_crafted_trainer_state_is_one_line(trained, tmp_path, capsys, content, needle):
    run = fresh(trained, tmp_path)
    (ckpt(run) / "trainer_state.json").write_text(content)
    code, err = resume(capsys, run)
    line = error_line(err)
    assert code == 2 and "trainer_state.json" in line and needle in line, line
    assert not ckpt(run, 2).exists()


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("num_layers", "2", "config key 'num_layers' must be int, got '2'"),
        ("grid", "ab", "config key 'grid' must be tuple[int, int], got 'ab'"),
        ("default_cfg_scale", [3], "config key 'default_cfg_scale' must be float"),
        ("storage_dtype", "int8", "config key 'storage_dtype' must be float16 | bfloat16 | float32"),
        ("num_heads", 3, "not an AR policy config"),
        ("surprise", 1, "unknown config key 'surprise'"),
    ],
)
def test_wrong_types_in_a_checkpoints_config_json_are_one_line(trained, tmp_path, capsys, key, value, needle):
    run = fresh(trained, tmp_path)
    rewrite_json(ckpt(run) / "model" / "prior" / "config.json", lambda d: d.update({key: value}))
    code, err = resume(capsys, run)
    line = error_line(err)
    assert code == 2 and "model/prior/config.json" in line and needle in line, line


def test_a_deeply_nested_metrics_row_is_one_line(trained, tmp_path, capsys):
    run = fresh(trained, tmp_path)
    rows = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text('{"step": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n" + rows)
    code, err = resume(capsys, run)
    assert code == 2 and f"{run / 'metrics.jsonl'}:1: not a metrics row" in error_line(err)


def test_a_text_checkpoint_holding_only_pytorch_model_bin_is_one_line(tmp_path, capsys):
    import torch
    from safetensors.torch import load_file

    from tiny_models import build_tiny_text_lm

    folder = tmp_path / "lm"
    build_tiny_text_lm(folder)
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    out = tmp_path / "run"
    code, _, err = cli(
        capsys,
        "train",
        "--model",
        f"text:{folder}",
        "--prompts",
        PROMPTS_DIR / "arithmetic_train.jsonl",
        "--reward",
        "arithmetic",
        "--out",
        out,
    )
    line = error_line(err, ignore="Writing")
    assert code == 2 and "pytorch_model.bin: weights saved as a pickle" in line, line
    assert not out.exists()
