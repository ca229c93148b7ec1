"""The small repros of issue 59, each as a user meets it from the command line: one line, exit 2, no
traceback, no folder where the command was refused — and the NaN guard's advice, followed, works."""

from __future__ import annotations

import os
import re
import shlex

import pytest

from t2i_gcpo.hardware import usable_cpus

from cli_helpers import cli, error_line
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file


def test_pretrain_with_more_threads_than_cpus_is_one_line(tmp_path, capsys):
    """`pretrain --threads 100000` was a MemoryError traceback (torch starting 100,000 threads)."""
    out = tmp_path / "model"
    code, _, err = cli(capsys, "pretrain", "--threads", "100000", "--out", out)
    line = error_line(err)
    cpus = usable_cpus()
    assert code == 2 and f"--threads 100,000: this process may use {cpus} CPU" in line, line
    assert f"at most --threads {cpus}" in line and not out.exists()


@pytest.mark.parametrize("what", ["prompts", "config", "reward"])
def test_a_fifo_given_as_a_file_is_named_as_one(what, tmp_path, capsys):
    """A named pipe given as the prompt file was "does not exist" (and one given as a file to read blocks
    a reader that opens it plainly)."""
    fifo = tmp_path / ("pipe.py" if what == "reward" else "pipe.txt")
    os.mkfifo(fifo)
    out = tmp_path / "run"
    args = {
        "prompts": ["--prompts", fifo],
        "config": ["--config", fifo, "--prompts", "prompts/shapeworld_train.txt"],
        "reward": ["--prompts", "prompts/shapeworld_train.txt", "--reward", f"{fifo}:score"],
    }[what]
    code, _, err = cli(capsys, "train", *args, "--out", out)
    line = error_line(err)
    assert code == 2 and f"{fifo}" in line and "is a named pipe (FIFO), not a regular file" in line, line
    assert not out.exists()


def test_a_comma_after_a_rewards_name_is_not_read_as_a_module(tmp_path, capsys):
    """`shapeworld,device=cuda:99` was "cannot import reward module 'shapeworld,device=cuda'"."""
    out = tmp_path / "run"
    base = ["train", "--prompts", "prompts/shapeworld_train.txt", "--out", out, "--reward"]
    code, _, err = cli(capsys, *base, "shapeworld,device=cuda:99")
    line = error_line(err)
    assert code == 2 and "follow a ':' after its name, not a ','" in line, line
    assert "write 'shapeworld:device=cuda:99'" in line and "module" not in line, line
    code, _, err = cli(capsys, *base, "shapeworld:device=cuda:99")  # as the line says: the device is checked
    line = error_line(err)
    assert code == 2 and "device cuda:99" in line, line
    assert not out.exists()


def test_the_nan_guards_advice_at_step_1_is_what_the_command_then_accepts(tmp_path, capsys, monkeypatch):
    """The NaN guard stopped step 1 with "start over with other settings", and the same --out was then refused
    ("already holds a run"). The line now says to start over in a new --out; doing so trains, and the old
    folder is refused as the line says."""
    import t2i_gcpo.train.trainer as trainer_mod

    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)
    model, prompts = tiny_policy_dir(tmp_path), write_prompt_file(tmp_path / "p.jsonl")
    common = [
        "--prompts",
        prompts,
        "--model",
        model,
        "--steps",
        "1",
        "--report-to",
        "none",
        "--set",
        "rollout.prompts_per_step=2",
        "--set",
        "rollout.group_size=4",
        "--set",
        "eval_every=-1",
    ]
    out = tmp_path / "run"
    code, _, err = cli(capsys, "train", *common, "--reward", "repro_fixtures:overflowing", "--out", out)
    line = error_line(err, ignore="%|")
    assert code == 1 and line.startswith("error: step 1: ") and "no checkpoint was written" in line, line
    assert re.search(r"start over with other settings \(e\.g\. a lower optim\.lr\) in a new --out", line), (
        line
    )
    code, _, err = cli(capsys, "train", *common, "--reward", "train_fixtures:redness", "--out", out)
    assert code == 2 and "already holds a run" in error_line(err), err  # as the line said: a new --out
    fresh = tmp_path / "again"
    code, _, err = cli(capsys, "train", *common, "--reward", "train_fixtures:redness", "--out", fresh)
    assert code == 0, err
    assert (fresh / "checkpoints").is_dir() and shlex.split(line)  # the line is one shell-readable line
