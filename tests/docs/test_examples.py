"""Every script in examples/ runs as a user runs it (a fresh process, from another directory) and writes
what it says it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from repo_paths import REPO

EXAMPLES = REPO / "examples"


def run_example(name: str, out: Path, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(
        [sys.executable, str(EXAMPLES / name), str(out)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def test_every_example_has_a_test():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(
        ["train_with_python_reward.py", "sample_and_evaluate.py", "credit_map.py", "custom_credit.py"]
    )


@pytest.mark.slow
def test_train_with_python_reward(tmp_path):
    out = tmp_path / "run"
    printed = run_example("train_with_python_reward.py", out, tmp_path)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert f"step 2: reward {rows[1]['reward/mean']:.4f}" in printed
    assert (out / "checkpoints" / "step_000002" / "model").is_dir()
    assert (out / "prompts.txt").read_text().count("\n") == 3


@pytest.mark.slow
def test_sample_and_evaluate(tmp_path):
    out = tmp_path / "ex"
    printed = run_example("sample_and_evaluate.py", out, tmp_path)
    assert "generated (2, 4, 3, 32, 32) images" in printed
    assert len(list((out / "samples").glob("0000[01]/samples/*.png"))) == 8
    summary = json.loads((out / "eval" / "summary.json").read_text())
    assert f"ShapeWorld strict score {summary['overall']:.3f} over 4 prompts" in printed
    assert len((out / "eval" / "results.jsonl").read_text().splitlines()) == 16


@pytest.mark.slow
def test_credit_map(tmp_path):
    out = tmp_path / "maps"
    printed = run_example("credit_map.py", out, tmp_path)
    assert (out / "00000.png").is_file() and (out / "00001.png").is_file()
    assert (out / "credit_maps.html").is_file()
    lifts = json.loads((out / "lift.json").read_text())
    assert set(lifts) == {"gcpo", "uniform"} and all(v == pytest.approx(1.0) for v in lifts["uniform"])
    assert "gcpo" in printed and "uniform" in printed


@pytest.mark.slow
def test_custom_credit(tmp_path):
    out = tmp_path / "run"
    printed = run_example("custom_credit.py", out, tmp_path)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert f"step 1: reward {rows[0]['reward/mean']:.4f}, mean largest token weight " in printed
    assert rows[0]["credit/weight_max"] > 1  # not uniform: the scheme's own weights were used
    credit = yaml.safe_load((out / "config.yaml").read_text())["credit"]
    assert credit["scheme"] == f"{(EXAMPLES / 'custom_credit.py').resolve()}:prompt_sensitivity"
    assert credit["options"] == {"power": 2.0}
