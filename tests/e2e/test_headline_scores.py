"""What a new user reads as the result: `eval shapeworld` ends on the strict score with its interval (the
partial credit labelled as the reward's, not GenEval's), output paths print clean, the held-out score's
standard error, and the reward ranges the report clips its bands to."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from t2i_gcpo.cli import cli
from t2i_gcpo.resources import PROMPTS_DIR
from t2i_gcpo.stats import proportions_se


def test_proportions_se_by_hand():
    assert proportions_se([(0.5, 100)]) == pytest.approx(0.05)  # √(0.25 / 100)
    # two tags: √(0.8·0.2/100 + 0.5·0.5/50) / 2 = √(0.0016 + 0.005) / 2
    assert proportions_se([(0.8, 100), (0.5, 50)]) == pytest.approx(math.sqrt(0.0066) / 2)
    assert proportions_se([(1.0, 10), (0.0, 10)]) == 0.0
    assert math.isnan(proportions_se([])) and math.isnan(proportions_se([(0.5, 0)]))


def test_the_held_out_summary_logs_the_standard_error():
    from t2i_gcpo import metrics as M
    from t2i_gcpo.tasks.arithmetic import summarize as arithmetic_summary
    from t2i_gcpo.tasks.geneval import summarize

    rows = [("colors", 1.0, 1.0)] * 3 + [("colors", 0.0, 0.5)] + [("counting", 1.0, 1.0)] * 2
    metrics = summarize(rows)["metrics"]
    assert metrics[M.EVAL_STRICT] == pytest.approx((0.75 + 1.0) / 2)
    assert metrics[M.EVAL_STRICT_SE] == pytest.approx(math.sqrt(0.75 * 0.25 / 4) / 2)
    assert not any(k.startswith("eval/strict/") and k.endswith("_se") for k in metrics)  # no tag of that name
    text = arithmetic_summary([(0, 1.0, 1.0, 10), (0, 0.0, 1.0, 12), (1, 1.0, 1.0, 9), (1, 1.0, 1.0, 9)], 2)
    assert text["metrics"][M.EVAL_ACCURACY_SE] == pytest.approx(math.sqrt(0.75 * 0.25 / 4))


def test_reward_ranges():
    from t2i_gcpo.rewards.combine import Checked, FunctionReward, WeightedSum, reward_bounds
    from t2i_gcpo.rewards.forms.arithmetic import ArithmeticReward
    from t2i_gcpo.rewards.forms.shapeworld import ShapeWorldReward

    assert reward_bounds(Checked(ShapeWorldReward())) == (0.0, 1.0)
    assert reward_bounds(ShapeWorldReward(variant="flow_grpo")) is None  # over-counts go negative
    assert reward_bounds(ShapeWorldReward(mode="strict", variant="flow_grpo")) == (0.0, 1.0)
    assert reward_bounds(ArithmeticReward()) == (0.0, 1.0)
    assert reward_bounds(ArithmeticReward(0.1, 256, 64)) == (-1.0, 1.1)  # overlong ∈ [−1, 0], + 0.1 format
    assert reward_bounds(WeightedSum([(ShapeWorldReward(), 2.0), (ArithmeticReward(0.5), -1.0)])) == (
        -1.5,
        2.0,
    )
    user = FunctionReward(lambda images, prompts, metadata: [0.0] * len(prompts))
    assert (
        reward_bounds(user) is None
        and reward_bounds(WeightedSum([(ShapeWorldReward(), 1), (user, 1)])) is None
    )


def test_eval_shapeworld_ends_on_the_strict_score_and_prints_clean_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text(
        "".join((PROMPTS_DIR / "shapeworld_test.jsonl").read_text().splitlines(True)[:4])
    )
    result = CliRunner().invoke(
        cli, ["eval", "shapeworld", "--prompts", "p.jsonl", "--n", "2", "--out", "ev/"]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("strict score (GenEval's overall): ")
    assert " ± " in lines[-1] and lines[-1].endswith("(95 % interval over the images sampled)")
    partial = next(ln for ln in lines if ln.startswith("partial credit"))
    assert (
        "the reward's score, not GenEval's" in partial
        and "mean of the tags" in partial
        and "overall" not in partial
    )
    assert "results: ev/results.jsonl  summary: ev/summary.txt" in result.output and "//" not in result.output


def test_sample_prints_its_folder_once_slashed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.txt").write_text("a photo of a red circle\n")
    result = CliRunner().invoke(cli, ["sample", "--prompts", "p.txt", "--n", "1", "--out", "samples/"])
    assert result.exit_code == 0, result.output
    assert "wrote 1 image(s) to samples/ (1 prompts × 1; grid: samples/grid.png)" in result.output
