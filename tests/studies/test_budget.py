"""`compare --match-budget samples`: the matched baseline arm, and the equal-sample and equal-time
readings of a comparison (t2i_gcpo/studies/budget.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from t2i_gcpo.cli import cli
from t2i_gcpo.resources import PROMPTS_DIR
from t2i_gcpo.studies import budget as B

from tiny_models import tiny_policy_dir

T2 = 12.706205  # t_{0.975, 1}


def test_matched_size_scales_group_or_prompts_never_below_the_run():
    assert B.matched_size(92.0, 8, 2, "group") == ("rollout.group_size", 46)
    assert B.matched_size(92.0, 8, 2, "prompts") == ("rollout.prompts_per_step", 12)  # 11.5 → 12
    assert B.matched_size(10.0, 8, 2, "group") == ("rollout.group_size", 8)


def test_the_plan_resizes_once_by_what_the_first_size_drew(monkeypatch):
    """vine scores 448 a step; dapo sized to 448 in one round (group 56) draws 1.4 rounds → group 40."""
    drawn = {"vine": 448.0, "dapo": 627.2}
    monkeypatch.setattr(B, "probe_samples_per_step", lambda algo, flags, overrides, **kw: drawn[algo])
    plan = B.plan_match("vine", "dapo", {}, (), "group")
    assert plan["first_size"] == 56 and plan["set"] == "rollout.group_size=40"


def test_a_token_plan_scales_the_baselines_group_by_the_tokens_it_spends(monkeypatch):
    """tree samples 30,000 tokens a step; dapo at its own group of 8 samples 12,000 → first 20; at 20 it
    samples 40,000 (more rounds) → 20 × 30,000 / 40,000 = 15."""
    seen = []

    def probe(algo, flags, overrides, metric=B.M.BUDGET_SAMPLES, **kw):
        seen.append((algo, overrides, metric))
        return {"tree": 30_000.0, "dapo": 40_000.0 if overrides else 12_000.0}[algo]

    monkeypatch.setattr(B, "probe_samples_per_step", probe)
    plan = B.plan_match("tree", "dapo", {}, (), "group", unit="tokens")
    assert (plan["unit"], plan["tokens_per_step"], plan["first_size"]) == ("tokens", 30_000.0, 20)
    assert plan["set"] == "rollout.group_size=15" and {m for *_, m in seen} == {"budget/tokens"}
    assert B.matched_name("dapo", "tree", "tokens") == "dapo-at-tree-tokens"
    assert B.samples_extra("tree") and B.samples_extra("pods") and not B.samples_extra("gcpo")


def test_training_clock_and_totals_count_each_step_once():
    rows = [
        {"step": 0, "eval/strict/overall": 0.3},
        {"step": 1, "time/step": 2.0, "budget/samples_total": 10},
        {"step": 2, "time/step": 9.0, "budget/samples_total": 99},  # interrupted, redone on resume
        {"step": 2, "time/step": 3.0, "budget/samples_total": 20, "budget/tokens_total": 640},
        {"step": 2, "eval/strict/overall": 0.5},
    ]
    assert B.training_clock(rows) == {0: 0.0, 1: 2.0, 2: 5.0}
    t = B.totals(rows)
    assert t["seconds"] == 5.0 and t["budget/samples"] == 20 and t["budget/tokens"] == 640
    assert math.isnan(t["budget/reward_calls"])
    curve = [(0, 0.3), (2, 0.5)]
    assert B.score_at(curve, B.training_clock(rows), 4.9) == 0.3
    assert B.score_at(curve, B.training_clock(rows), 5.0) == 0.5


# per arm and seed: (held-out at steps 0, 10, 20), seconds a step, samples a step
RUNS = {
    "dapo": {0: ((0.3, 0.4, 0.5), 1.0, 64), 1: ((0.2, 0.3, 0.45), 1.0, 64)},
    "vine": {0: ((0.3, 0.5, 0.6), 2.0, 448), 1: ((0.2, 0.4, 0.5), 2.0, 448)},
    "dapo-at-vine-budget": {0: ((0.3, 0.45, 0.58), 4.0, 461), 1: ((0.2, 0.45, 0.54), 4.0, 461)},  # 1.03×
}


def fake_runs(out: Path) -> None:
    """Finished runs of 20 steps, a step's time and samples constant, evaluations at 0, 10 and 20."""
    for algo, seeds in RUNS.items():
        for seed, (curve, seconds, samples) in seeds.items():
            run = out / algo / f"seed{seed}"
            run.mkdir(parents=True)
            rows = [{"step": 0, "eval/strict/overall": curve[0]}]
            for step in range(1, 21):
                rows.append(
                    {
                        "step": step,
                        "time/step": seconds,
                        "budget/samples_total": samples * step,
                        "budget/tokens_total": 64 * samples * step,
                        "budget/reward_calls_total": step,
                    }
                )
                if step % 10 == 0:
                    rows.append({"step": step, "eval/strict/overall": curve[step // 10]})
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (run / "eval.json").write_text(json.dumps({"eval/strict/overall": curve[2]}))
    (out / "budget.json").write_text(json.dumps({"arms": {"dapo-at-vine-budget": {"of": "vine"}}}))


def test_equal_sample_and_equal_time_readings_on_hand_written_runs(tmp_path):
    from t2i_gcpo.studies.compare import summarise

    fake_runs(tmp_path)
    result = summarise(tmp_path, list(RUNS), [0, 1])
    assert result["budget"]["vine"]["budget/samples"] == 448 * 20
    assert result["budget"]["dapo-at-vine-budget"]["seconds"] == 80.0
    # equal samples, within the 5 % tolerance (448 and 461 a step): the last evaluations, +0.02 and −0.04
    eq = result["equal_samples"]["vine"]
    half = T2 * math.sqrt(((0.02 + 0.01) ** 2 + (-0.04 + 0.01) ** 2) / 1) / math.sqrt(2)
    assert eq["against"] == "dapo-at-vine-budget" and eq["ahead"] == 1
    assert eq["paired"] == pytest.approx((-0.01, -0.01 - half, -0.01 + half, 2))
    assert eq["final"][0] == pytest.approx(-0.01) and eq["spent_ratio"] == pytest.approx(461 / 448)
    # equal time: dapo's 20 s; vine read at step 10 (20 s), the matched arm at step 0 (its step 10 is 40 s)
    t = result["equal_time"]
    assert t["seconds"] == {"0": 20.0, "1": 20.0}
    assert t["paired"]["vine"]["paired"][0] == pytest.approx((0.0 - 0.05) / 2)  # vs dapo's final
    assert t["paired"]["dapo-at-vine-budget"]["paired"][0] == pytest.approx((-0.2 - 0.25) / 2)
    md = (tmp_path / "comparison.md").read_text()
    assert "| vine | 8,960 | 573,440 | 20 | 40 |" in md
    assert "**At equal samples**" in md and "| vine | dapo-at-vine-budget | -0.010 ± " in md
    assert "| 20 / 20 | 1/2 | -0.010 ± " in md and "| 1.03× |" in md
    assert "**At equal training time**" in md and "seed 0: 20 s" in md


def test_an_arm_matched_by_tokens_is_read_at_equal_tokens(tmp_path):
    from t2i_gcpo.studies.compare import summarise

    fake_runs(tmp_path)
    (tmp_path / "budget.json").write_text(
        json.dumps({"arms": {"dapo-at-vine-budget": {"of": "vine", "unit": "tokens"}}})
    )
    result = summarise(tmp_path, list(RUNS), [0, 1])
    assert (
        "equal_samples" not in result and result["equal_tokens"]["vine"]["against"] == "dapo-at-vine-budget"
    )
    # tokens are 64 × samples in these runs: the same reading as at equal samples
    assert result["equal_tokens"]["vine"]["paired"][0] == pytest.approx(-0.01)
    assert "**At equal tokens**" in (tmp_path / "comparison.md").read_text()


def test_equal_samples_reads_the_bigger_spender_where_it_had_spent_the_others_total(tmp_path):
    """The matched arm drew twice the samples planned (dynamic sampling): the reading takes it at step 10,
    where it had scored what vine scored in its whole run."""
    from t2i_gcpo.studies.compare import summarise

    fake_runs(tmp_path)
    for seed in (0, 1):
        path = tmp_path / "dapo-at-vine-budget" / f"seed{seed}" / "metrics.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        for r in rows:
            if "budget/samples_total" in r:
                r["budget/samples_total"] *= 2
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    eq = summarise(tmp_path, list(RUNS), [0, 1])["equal_samples"]["vine"]
    # vine's final (0.6, 0.5) against the matched arm's step 10 (0.45, 0.45)
    assert eq["paired"][0] == pytest.approx((0.15 + 0.05) / 2) and eq["ahead"] == 2
    assert eq["read_at_step"] == {"vine": 20.0, "dapo-at-vine-budget": 10.0}
    assert eq["spent_ratio"] == pytest.approx(2 * 461 / 448) and eq["final"][0] == pytest.approx(-0.01)


def write_runs(out: Path, algo: str, curve: tuple[float, float, float], samples: int) -> None:
    """Finished runs of `algo`, seeds 0 and 1 (20 steps, evaluations at 0, 10, 20), as fake_runs."""
    for seed in (0, 1):
        run = out / algo / f"seed{seed}"
        run.mkdir(parents=True)
        rows = [{"step": 0, "eval/strict/overall": curve[0]}]
        for step in range(1, 21):
            rows.append({"step": step, "time/step": 1.0, "budget/samples_total": samples * step})
            if step % 10 == 0:
                rows.append({"step": step, "eval/strict/overall": curve[step // 10] + 0.01 * seed})
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "eval.json").write_text(json.dumps({"eval/strict/overall": curve[2] + 0.01 * seed}))


SAME_PLAN = {"unit": "samples", "samples_per_step": 144.0, "set": "rollout.group_size=16"}


@pytest.mark.slow  # a long end-to-end run (the default tier keeps its lighter siblings)
def test_matched_arms_with_the_same_setting_are_one_set_of_runs(tmp_path, monkeypatch):
    """pods and knapsack both matched by groups of 16: compare trains those runs once (only the first arm's
    folder exists here) and reads them under both names; a matched arm of another size is its own runs."""
    from t2i_gcpo.studies import compare as C
    from t2i_gcpo.train import run as R

    write_runs(tmp_path, "dapo", (0.3, 0.4, 0.5), 64)
    write_runs(tmp_path, "pods", (0.3, 0.45, 0.52), 144)
    write_runs(tmp_path, "knapsack", (0.3, 0.5, 0.6), 144)
    write_runs(tmp_path, "dapo-at-pods-budget", (0.3, 0.45, 0.55), 144)
    arms = {
        "dapo-at-pods-budget": {"of": "pods", **SAME_PLAN},
        "dapo-at-knapsack-budget": {"of": "knapsack", **SAME_PLAN},
    }
    key = {"match": "samples", "by": "group", "baseline": "dapo", "model": "arithmetic", "overrides": []}
    (tmp_path / "budget.json").write_text(json.dumps({**key, "arms": arms}))
    seeds = {a: [0, 1] for a in [*arms, "dapo", "pods", "knapsack"]}
    assert C.shared_runs(tmp_path, ["dapo", "pods", *arms, "knapsack"], seeds) == {
        "dapo-at-knapsack-budget": "dapo-at-pods-budget"
    }
    assert C.shared_runs(tmp_path, ["dapo", *arms], {**seeds, "dapo-at-knapsack-budget": [0, 2]}) == {}

    trained = []
    monkeypatch.setattr(R, "prepare", lambda **kw: trained.append(kw))
    monkeypatch.setattr(R, "run", lambda prepared: None)
    result = C.run_comparison(
        ["dapo", "pods", "knapsack"],
        [0, 1],
        20,
        tmp_path,
        "arithmetic_train.jsonl",
        model="arithmetic",
        eval_every=10,
        match_budget="samples",
    )
    assert trained == [] and not (tmp_path / "dapo-at-knapsack-budget").exists()
    assert list(result["table"]) == [
        "dapo",
        "pods",
        "dapo-at-pods-budget",
        "knapsack",
        "dapo-at-knapsack-budget",
    ]
    assert result["same_runs"] == {"dapo-at-knapsack-budget": "dapo-at-pods-budget"}
    both = result["paired"]
    assert both["dapo-at-knapsack-budget"]["paired"][0] == pytest.approx(0.05)  # the pods-matched runs
    assert result["equal_samples"]["knapsack"]["against"] == "dapo-at-knapsack-budget"
    assert result["equal_samples"]["knapsack"]["paired"][0] == pytest.approx(0.05)  # 0.6 − 0.55
    assert result["equal_samples"]["pods"]["paired"][0] == pytest.approx(-0.03)  # 0.52 − 0.55
    md = (tmp_path / "comparison.md").read_text()
    assert "dapo-at-knapsack-budget: the runs of dapo-at-pods-budget (the same settings and seeds" in md


def test_match_budget_without_an_arm_that_samples_extra_is_one_line(tmp_path):
    r = CliRunner().invoke(
        cli,
        [
            "compare",
            "--algos",
            "dapo,gcpo",
            "--match-budget",
            "samples",
            "--seeds",
            "1",
            "--steps",
            "1",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert r.exit_code != 0 and "no compared algorithm scores extra samples" in str(r.exception)
    r = CliRunner().invoke(
        cli,
        [
            "compare",
            "--algos",
            "vine,gcpo",
            "--baseline",
            "vine",
            "--match-budget",
            "samples",
            "--seeds",
            "1",
            "--steps",
            "1",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert r.exit_code != 0 and "the baseline vine scores extra samples itself" in str(r.exception)


@pytest.mark.slow
def test_compare_trains_dapo_at_vines_measured_budget_and_resumes_without_probing(tmp_path):
    model = tiny_policy_dir(tmp_path)
    out = tmp_path / "cmp"
    args = [
        "compare",
        "--algos",
        "dapo,vine",
        "--match-budget",
        "samples",
        "--seeds",
        "1",
        "--steps",
        "1",
        "--eval-every",
        "1",
        "--model",
        str(model),
        "--prompts",
        str(PROMPTS_DIR / "shapeworld_train.jsonl"),
        "--out",
        str(out),
        "--set",
        "rollout.prompts_per_step=2",
        "--set",
        "rollout.group_size=4",
        "--set",
        "eval_images_per_prompt=1",
        "--set",
        "sample_every=0",
        "--set",
        "branching.k=4",
    ]
    r = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    plan = json.loads((out / "budget.json").read_text())["arms"]["dapo-at-vine-budget"]
    assert plan["of"] == "vine" and plan["samples_per_step"] > 8  # vine scores more than its 2 × 4 roots
    assert plan["first_size"] == round(plan["samples_per_step"] / 2)
    group = max(4, round(plan["first_size"] * plan["samples_per_step"] / plan["first_size_drew"]))
    assert plan["set"] == f"rollout.group_size={group}"
    cfg = yaml.safe_load((out / "dapo-at-vine-budget" / "seed0" / "config.yaml").read_text())
    assert cfg["algo"] == "dapo" and cfg["rollout"]["group_size"] == group
    assert cfg["credit"]["scheme"] == "uniform"
    result = json.loads((out / "comparison.json").read_text())
    assert set(result["equal_samples"]) == {"vine"} and "equal_time" in result
    plan["samples_per_step"] = -1.0  # a resumed comparison reads budget.json instead of probing again
    (out / "budget.json").write_text(
        json.dumps({**json.loads((out / "budget.json").read_text()), "arms": {"dapo-at-vine-budget": plan}})
    )
    r = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert (
        r.exit_code == 0
        and json.loads((out / "budget.json").read_text())["arms"]["dapo-at-vine-budget"]["samples_per_step"]
        == -1.0
    )
    changed = [*args, "--match-by", "prompts"]
    r = CliRunner().invoke(cli, changed)
    assert r.exit_code != 0 and "use another --out" in str(r.exception)
