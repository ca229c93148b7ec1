"""End to end from the command line on the shipped ShapeWorld model: a short run, Ctrl-C, resume."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from t2i_gcpo.resources import PROMPTS_DIR

ARGS = [
    "--prompts",
    str(PROMPTS_DIR / "shapeworld_train.txt"),
    "--steps",
    "4",
    "--seed",
    "3",
    "--set",
    "rollout.prompts_per_step=4",
    "--set",
    "rollout.group_size=4",
    "--set",
    "sample_every=2",
    "--set",
    "save_every=1",
    "--set",
    "eval_every=-1",
]


def t2i(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "t2i_gcpo.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_train_cli_run_directory_ctrl_c_and_resume(tmp_path):
    full = tmp_path / "full"
    p = t2i("train", *ARGS, "--out", str(full))
    out, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-2000:]
    rows = metrics(full)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert math.isfinite(r["reward/mean"]) and 0 <= r["strict/overall"] <= 1
        if r["groups_kept"]:
            assert math.isfinite(r["loss/policy"]) and math.isfinite(r["credit/weight_max"])
    for name in (
        "config.yaml",
        "report.html",
        "samples/step_000002.png",
        "credit_maps/step_000004.png",
        "checkpoints/latest",
        "processes.json",
    ):
        assert (full / name).is_file(), name
    assert list((full / "tb").iterdir())

    # the same run, interrupted with Ctrl-C after its second step, then resumed
    part = tmp_path / "part"
    p = t2i("train", *ARGS, "--out", str(part))
    deadline = time.time() + 600
    while time.time() < deadline and not ((part / "metrics.jsonl").is_file() and len(metrics(part)) >= 2):
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 130, err[-2000:]
    assert "resume" in out + err
    saved = int((part / "checkpoints" / "latest").read_text().strip().split("_")[1])
    assert 2 <= saved < 4, "the interrupted step was finished and saved"
    p = t2i("train", "--resume", str(part))
    out, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-2000:]
    resumed = metrics(part)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(rows, resumed):
        for k in a:
            if not k.startswith("time/"):
                # loss/policy is a mean of ±ρA terms that nearly cancel: compare it absolutely
                assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (a["step"], k)


@pytest.mark.slow
def test_bad_inputs_exit_2_with_one_line(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    unknown = tmp_path / "u.txt"
    unknown.write_text("a photo of a circle\na photo of a dog\n")
    for args in (["train", "--prompts", str(empty)], ["train", "--prompts", str(unknown)], ["train"]):
        p = t2i(*args, cwd=tmp_path)
        out, err = p.communicate(timeout=300)
        assert p.returncode == 2, (args, err)
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_rl_raises_the_shipped_models_score_on_hard_prompts(tmp_path):
    """The main job works: a short DAPO run on 8 position prompts (the base model gets about 6 in 10
    right) raises their strict score within 10 steps, measured on the same prompts with 16 images
    each (step 0 and step 10 are evaluated with the same sampling seed)."""
    rows = [json.loads(x) for x in (PROMPTS_DIR / "shapeworld_train.jsonl").read_text().splitlines()]
    hard = tmp_path / "position.jsonl"
    hard.write_text("".join(json.dumps(m) + "\n" for m in [m for m in rows if m["tag"] == "position"][:8]))
    run = tmp_path / "run"
    p = t2i(
        "train",
        "--prompts",
        str(hard),
        "--algo",
        "dapo",
        "--steps",
        "10",
        "--seed",
        "0",
        "--out",
        str(run),
        "--set",
        f"eval_prompts={hard}",
        "--set",
        "eval_every=10",
        "--set",
        "eval_images_per_prompt=16",
        "--set",
        "sample_every=0",
        "--set",
        "save_every=1000",
    )
    out, err = p.communicate(timeout=1800)
    assert p.returncode == 0, err[-2000:]
    curve = {r["step"]: r["eval/strict/overall"] for r in metrics(run) if "eval/strict/overall" in r}
    assert sorted(curve) == [0, 10]
    assert f"step 0: held-out strict {curve[0]:.3f}" in out  # the base score is printed, not only logged
    assert f"step 10: held-out strict {curve[10]:.3f}" in out  # the final one in the same form
    assert f"run directory: {run}" in out
    # measured here: 0.609 → 0.875 in 10 steps (0.953 at 20, 0.984 at 30)
    assert curve[10] >= curve[0] + 0.15, curve


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["vine", "tempo", "eg-grpo", "balanced"])
def test_tree_credit_presets_run_two_steps_on_the_shipped_prior(tmp_path, algo):
    """Each preset of docs/concepts/tree_credit.md#running-tree-credit, 2 steps from the command line with
    the shipped model's own grid and the presets' own branching settings (the default tier trains every
    preset on the tiny prior: tests/train/test_train.py::test_every_algorithm_trains_and_logs)."""
    out = tmp_path / algo
    p = t2i(
        "train",
        "--algo",
        algo,
        "--prompts",
        str(PROMPTS_DIR / "shapeworld_train.txt"),
        "--steps",
        "2",
        "--seed",
        "3",
        "--set",
        "rollout.prompts_per_step=2",
        "--set",
        "rollout.group_size=4",
        "--set",
        "eval_every=-1",
        "--out",
        str(out),
    )
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-2000:]
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    G = 4
    for r in rows:
        extra = r["budget/samples"] - r["groups_drawn"] * G  # the continuations scored
        assert extra > 0 if algo == "vine" and r["groups_kept"] else extra == 0, r
