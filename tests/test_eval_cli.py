"""`t2i-gcpo eval shapeworld`, `eval geneval --score-only` and `compare` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from t2i_gcpo.cli import cli

from train_fixtures import tiny_policy_dir

REPO = Path(__file__).resolve().parents[1]


def invoke(*args: str):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_eval_shapeworld_then_score_only_gives_the_same_summary(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join((REPO / "prompts" / "shapeworld_test.jsonl").read_text().splitlines(True)[:6]))
    out = invoke("eval", "shapeworld", "--prompts", str(prompts), "--n", "2", "--out", str(tmp_path / "ev"))
    assert "Overall score" in out and "partial credit" in out
    images = sorted((tmp_path / "ev" / "images").glob("*/samples/*.png"))
    assert len(images) == 12
    rows = [json.loads(x) for x in (tmp_path / "ev" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(0 <= r["partial"] <= 1 for r in rows)
    # "partial" is the RL reward's §8.2 partial credit, the number training's evaluation reports
    import numpy as np
    from PIL import Image

    from t2i_gcpo.rewards.shapeworld import ShapeWorldReward

    reward = ShapeWorldReward()
    for r in rows:
        expected = reward.score_image(
            np.asarray(Image.open(r["filename"]).convert("RGB")), json.loads(r["metadata"])
        )
        assert r["partial"] == pytest.approx(expected["partial"]), r["filename"]
    invoke("eval", "geneval", "--score-only", str(tmp_path / "ev" / "images"), "--detector", "shapeworld",
           "--out", str(tmp_path / "ev2"))  # fmt: skip
    a = json.loads((tmp_path / "ev" / "summary.json").read_text())
    b = json.loads((tmp_path / "ev2" / "summary.json").read_text())
    assert a == b
    # resumable: running again writes no new image and keeps the same files
    stamps = [p.stat().st_mtime_ns for p in images]
    invoke("eval", "shapeworld", "--prompts", str(prompts), "--n", "2", "--out", str(tmp_path / "ev"))
    assert stamps == [p.stat().st_mtime_ns for p in images]


def test_eval_geneval_needs_clip_with_a_real_detector_and_one_source(tmp_path):
    runner = CliRunner()
    r = runner.invoke(cli, ["eval", "geneval", "--detector", "shapeworld", "--out", str(tmp_path)])
    assert r.exit_code != 0 and "either --model" in str(r.exception)
    r = runner.invoke(cli, ["eval", "geneval", "--score-only", str(tmp_path), "--detector", str(tmp_path / "nope"),
                            "--out", str(tmp_path / "o")])  # fmt: skip
    assert r.exit_code != 0 and "nope" in str(r.exception)


@pytest.mark.slow
def test_compare_two_algorithms_writes_table_plot_and_resumes(tmp_path):
    model = tiny_policy_dir(tmp_path)
    out = tmp_path / "cmp"
    args = ["compare", "--algos", "grpo,gcpo", "--seeds", "2", "--steps", "2", "--eval-every", "1",
            "--model", str(model), "--prompts", str(REPO / "prompts" / "shapeworld_train.jsonl"), "--out", str(out),
            "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=4", "--set", "eval_images_per_prompt=1",
            "--set", "sample_every=0"]  # fmt: skip
    text = invoke(*args)
    assert "| grpo |" in text and "| gcpo |" in text and "steps to GRPO's final" in text
    result = json.loads((out / "comparison.json").read_text())
    assert set(result["table"]) == {"grpo", "gcpo"} and result["table"]["grpo"]["overall"][3] == 2
    assert (out / "curves.png").stat().st_size > 1000
    first = {
        a: json.loads((out / a / "seed0" / "metrics.jsonl").read_text().splitlines()[0])
        for a in ("grpo", "gcpo")
    }
    # curves start at the base model, which scores the same for every algorithm with one seed
    assert first["grpo"]["step"] == 0 and "eval/strict/overall" in first["grpo"]
    assert first["grpo"]["eval/strict/overall"] == first["gcpo"]["eval/strict/overall"]
    before = (out / "gcpo" / "seed1" / "eval.json").stat().st_mtime_ns
    invoke(*args)  # finished runs are kept
    assert (out / "gcpo" / "seed1" / "eval.json").stat().st_mtime_ns == before


@pytest.mark.slow
def test_compare_with_two_jobs_trains_the_same_runs_side_by_side(tmp_path):
    """--jobs 2 trains each run in its own process, one thread each: the same runs, the same table."""
    model = tiny_policy_dir(tmp_path)
    common = ["compare", "--algos", "grpo,gcpo", "--seeds", "1", "--steps", "2", "--eval-every", "1",
              "--model", str(model), "--prompts", str(REPO / "prompts" / "shapeworld_train.jsonl"),
              "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=4",
              "--set", "eval_images_per_prompt=1", "--set", "sample_every=0"]  # fmt: skip
    invoke(*common, "--out", str(tmp_path / "one"))
    text = invoke(*common, "--jobs", "2", "--out", str(tmp_path / "two"))
    assert "| grpo |" in text and "| gcpo |" in text
    for algo in ("grpo", "gcpo"):
        run = tmp_path / "two" / algo / "seed0"
        assert (run / "train.log").is_file() and (run / "eval.json").is_file()
        a, b = (
            [
                json.loads(x)
                for x in (tmp_path / d / algo / "seed0" / "metrics.jsonl").read_text().splitlines()
            ]
            for d in ("one", "two")
        )
        assert [r["step"] for r in a] == [r["step"] for r in b]
        for x, y in zip(a, b):  # one thread vs two: float sums in another order, the same samples
            for k in x:
                if not k.startswith("time/") and x[k] is not None:
                    assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-6), (algo, x["step"], k)
