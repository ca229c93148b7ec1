"""`t2i-gcpo eval shapeworld`, `eval geneval --score-only` and `compare` from the command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from t2i_gcpo.cli import cli
from t2i_gcpo.resources import PROMPTS_DIR

from tiny_models import tiny_policy_dir


def invoke(*args: str):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_eval_shapeworld_then_score_only_gives_the_same_summary(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join((PROMPTS_DIR / "shapeworld_test.jsonl").read_text().splitlines(True)[:6]))
    out = invoke("eval", "shapeworld", "--prompts", str(prompts), "--n", "2", "--out", str(tmp_path / "ev"))
    assert "Overall score" in out and "partial credit" in out
    images = sorted((tmp_path / "ev" / "images").glob("*/samples/*.png"))
    assert len(images) == 12
    rows = [json.loads(x) for x in (tmp_path / "ev" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(0 <= r["partial"] <= 1 for r in rows)
    # "partial" is the RL reward's partial credit, the number training's evaluation reports
    import numpy as np
    from PIL import Image

    from t2i_gcpo.rewards.forms.shapeworld import ShapeWorldReward

    reward = ShapeWorldReward()
    for r in rows:
        expected = reward.score_image(
            np.asarray(Image.open(r["filename"]).convert("RGB")), json.loads(r["metadata"])
        )
        assert r["partial"] == pytest.approx(expected["partial"]), r["filename"]
    invoke(
        "eval",
        "geneval",
        "--score-only",
        str(tmp_path / "ev" / "images"),
        "--detector",
        "shapeworld",
        "--out",
        str(tmp_path / "ev2"),
    )
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
    r = runner.invoke(
        cli,
        [
            "eval",
            "geneval",
            "--score-only",
            str(tmp_path),
            "--detector",
            str(tmp_path / "nope"),
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert r.exit_code != 0 and "nope" in str(r.exception)


@pytest.mark.slow
def test_compare_two_algorithms_writes_table_plot_and_resumes(tmp_path):
    model = tiny_policy_dir(tmp_path)
    out = tmp_path / "cmp"
    args = [
        "compare",
        "--algos",
        "grpo,gcpo",
        "--seeds",
        "2",
        "--steps",
        "2",
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
    ]
    text = invoke(*args)
    assert "| grpo |" in text and "| gcpo |" in text and "steps to grpo's final" in text  # no dapo: the first
    result = json.loads((out / "comparison.json").read_text())
    assert set(result["table"]) == {"grpo", "gcpo"} and result["table"]["grpo"]["overall"][3] == 2
    assert result["baseline"] == "grpo" and set(result["paired"]) == {"gcpo"}
    gcpo = result["paired"]["gcpo"]
    assert set(gcpo["per_seed"]) == {"0", "1"} and gcpo["paired"][3] == 2
    assert "paired Δ vs grpo" in text
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
    common = [
        "compare",
        "--algos",
        "grpo,gcpo",
        "--seeds",
        "1",
        "--steps",
        "2",
        "--eval-every",
        "1",
        "--model",
        str(model),
        "--prompts",
        str(PROMPTS_DIR / "shapeworld_train.jsonl"),
        "--set",
        "rollout.prompts_per_step=2",
        "--set",
        "rollout.group_size=4",
        "--set",
        "eval_images_per_prompt=1",
        "--set",
        "sample_every=0",
    ]
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


@pytest.mark.slow
def test_a_terminated_compare_stops_its_runs_and_they_keep_a_checkpoint(tmp_path):
    """SIGTERM to `compare --jobs 2` (a scheduler, `kill`) stops both training children, each saving a
    checkpoint, before compare exits: no run is left training on its own."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "cmp"
    cmd = [
        sys.executable,
        "-m",
        "t2i_gcpo.cli",
        "compare",
        "--algos",
        "dapo,gcpo",
        "--seeds",
        "1",
        "--steps",
        "100000",
        "--eval-every",
        "100000",
        "--jobs",
        "2",
        "--out",
        str(out),
        "--model",
        str(tiny_policy_dir(tmp_path)),
        "--prompts",
        str(PROMPTS_DIR / "shapeworld_train.jsonl"),
        "--set",
        "rollout.prompts_per_step=2",
        "--set",
        "rollout.group_size=4",
        "--set",
        "eval_images_per_prompt=1",
        "--set",
        "sample_every=0",
    ]
    parent = subprocess.Popen(
        cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stderr=subprocess.PIPE, text=True
    )
    runs = [out / algo / "seed0" for algo in ("dapo", "gcpo")]

    def trained(run) -> bool:
        path = run / "metrics.jsonl"
        return path.is_file() and '"time/step"' in path.read_text()

    deadline = time.monotonic() + 240
    while not all(trained(r) for r in runs):
        assert parent.poll() is None and time.monotonic() < deadline, parent.stderr.read()
        time.sleep(0.5)
    parent.send_signal(signal.SIGTERM)
    _, err = parent.communicate(timeout=120)
    assert parent.returncode != 0
    assert "run the same command again to resume" in err
    left = [p for p in os.listdir("/proc") if p.isdigit() and str(out) in _cmdline(p)]
    assert left == [], "training children outlived compare"
    for run in runs:
        assert (run / "checkpoints" / "latest").is_file(), run
        assert not (run / "eval.json").exists()


def _cmdline(pid: str) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------
# compare: seeds, baseline and the paired table, on run folders written by hand
# ---------------------------------------------------------------------------------------------


def test_seeds_are_a_count_or_a_list():
    from t2i_gcpo.commands.compare import parse_seeds
    from t2i_gcpo.errors import UserError

    assert parse_seeds("3") == [0, 1, 2] and parse_seeds(" 1") == [0]
    assert parse_seeds("0,1,2,7") == [0, 1, 2, 7] and parse_seeds("7, 2") == [7, 2]
    assert parse_seeds("7,") == [7]  # one seed: a list needs its comma
    for bad in ("0", "-1", "", "x", "1.5", "1,x", "1,-2", "1,1", ",", "²"):
        with pytest.raises(UserError, match="--seeds"):
            parse_seeds(bad)
    with pytest.raises(UserError, match="seed 0 alone: '0,'"):  # the one count that reads like a seed
        parse_seeds("0")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "0,x"], "--seeds"),
        (["--seeds", "0"], "--seeds"),
        (["--algos", "dapo,gcpo", "--baseline", "grpo"], "--baseline grpo is not among"),
        (["--algos", "dapo,gcpo@4", "--seeds", "3"], "NAME@N must be a count from 1 to 3"),
        (["--algos", "dapo,ppo"], "unknown algorithm 'ppo'"),
    ],
)
def test_compare_rejects_bad_seeds_and_an_untrained_baseline_in_one_line(tmp_path, capsys, args, message):
    from t2i_gcpo.cli import main

    out = tmp_path / "cmp"
    with pytest.raises(SystemExit) as e:
        main(["compare", *args, "--steps", "1", "--out", str(out)])
    assert e.value.code != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err
    assert not out.exists(), "nothing is trained"


def test_algos_take_a_seed_count_each():
    from t2i_gcpo.commands.compare import parse_algos
    from t2i_gcpo.errors import UserError

    names, seeds = parse_algos("dapo, gcpo,stage@2,critical@1,", [4, 0, 9])
    assert names == ["dapo", "gcpo", "stage", "critical"]
    assert seeds == {"dapo": [4, 0, 9], "gcpo": [4, 0, 9], "stage": [4, 0], "critical": [4]}
    for bad in ("dapo,dapo@2", "stage@0", "stage@x", "stage@", "ppo", ","):
        with pytest.raises(UserError):
            parse_algos(bad, [4, 0, 9])


def test_compare_defaults_to_the_train_prompts_of_the_models_world(tmp_path):
    from t2i_gcpo.commands.compare import default_train_prompts
    from t2i_gcpo.errors import UserError

    shapeworld = PROMPTS_DIR / "shapeworld_train.jsonl"
    for model in ("shapeworld", "shapeworld-64", "shapeworld-masked", str(tiny_policy_dir(tmp_path))):
        assert Path(default_train_prompts(model)) == shapeworld, model
    assert Path(default_train_prompts("arithmetic")) == PROMPTS_DIR / "arithmetic_train.jsonl"
    for model in ("janus:/some/where", "amused:/some/where", "text:/some/where"):
        with pytest.raises(UserError, match="give --prompts"):
            default_train_prompts(model)


def test_the_baseline_is_dapo_when_compared_else_the_first_algorithm():
    from t2i_gcpo.errors import UserError
    from t2i_gcpo.studies.compare import check_baseline

    assert check_baseline(["grpo", "gcpo", "dapo"], None) == "dapo"
    assert check_baseline(["grpo", "gcpo"], None) == "grpo"
    assert check_baseline(["grpo", "gcpo", "dapo"], "gcpo") == "gcpo"
    with pytest.raises(UserError):
        check_baseline(["grpo", "gcpo"], "dapo")


# held-out overall at steps 0 / 10 / 20 (the last: eval.json), per algorithm and seed (seeds 0, 3, 5)
CURVES = {
    "grpo": {0: [0.30, 0.35, 0.40], 3: [0.30, 0.50, 0.65], 5: [0.30, 0.40, 0.55]},
    "dapo": {0: [0.30, 0.45, 0.50], 3: [0.30, 0.55, 0.60], 5: [0.30, 0.62, 0.70]},
    "gcpo": {0: [0.30, 0.45, 0.52], 3: [0.30, 0.60, 0.63], 5: [0.30, 0.65, 0.71]},
}
LIFT = {"grpo": 1.0, "dapo": 1.0, "gcpo": 1.5}  # training mean of credit_lift (gcpo logs 1.4 and 1.6)


def fake_runs(out: Path) -> None:
    """<out>/<algo>/seed<k>/ with the metrics.jsonl rows and eval.json a finished image run writes."""
    for algo, seeds in CURVES.items():
        for seed, curve in seeds.items():
            run = out / algo / f"seed{seed}"
            run.mkdir(parents=True)
            lifts = [1.4, 1.6] if algo == "gcpo" else [1.0, 1.0]
            rows = [{"step": 0, "eval/strict/overall": curve[0], "eval/strict/counting": curve[0]}]
            rows += [{"step": 10, "credit_lift": lifts[0], "eval/strict/overall": curve[1]}]
            rows += [{"step": 20, "credit_lift": lifts[1]}, {"step": 20, "eval/strict/overall": curve[2]}]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            final = {"eval/strict/overall": curve[2], "eval/strict/counting": curve[2] / 2}
            (run / "eval.json").write_text(json.dumps(final))


def test_paired_table_on_hand_written_runs(tmp_path):
    from t2i_gcpo.studies.compare import summarise

    fake_runs(tmp_path)
    result = summarise(tmp_path, ["grpo", "dapo", "gcpo"], [0, 3, 5])
    assert result["baseline"] == "dapo" and result["seeds"] == [0, 3, 5]
    assert result["columns"] == ["counting", "credit lift (training mean)", "overall"]
    for algo, lift in LIFT.items():
        assert result["table"][algo]["credit lift (training mean)"][0] == pytest.approx(lift)
    # dapo ends at 0.6 on average: gcpo reaches it at step 10 on seeds 3 and 5 (never on seed 0), grpo
    # at step 20 on seed 3 only, dapo itself at 20 (seed 3) and 10 (seed 5)
    assert result["steps_to_baseline_final"] == {"grpo": 20.0, "dapo": 15.0, "gcpo": 10.0}
    assert result["seeds_reaching_baseline_final"] == {"grpo": [1, 3], "dapo": [2, 3], "gcpo": [2, 3]}
    assert set(result["paired"]) == {"grpo", "gcpo"}
    gcpo = result["paired"]["gcpo"]
    assert gcpo["per_seed"] == pytest.approx({"0": 0.02, "3": 0.03, "5": 0.01})
    half = 4.302653 * 0.01 / math.sqrt(3)  # t_{0.975, 2} · s / √n, s = 0.01
    assert gcpo["paired"] == pytest.approx((0.02, 0.02 - half, 0.02 + half, 3))
    # unpaired: the same difference, but the seed-to-seed spread (0.1) swamps it
    assert gcpo["unpaired"] == pytest.approx(welch_ci95(CURVES["gcpo"], CURVES["dapo"]))
    assert gcpo["unpaired"][0] == pytest.approx(0.02) and gcpo["unpaired"][2] - gcpo["unpaired"][1] > 8 * half
    grpo = result["paired"]["grpo"]
    assert grpo["per_seed"] == pytest.approx({"0": -0.10, "3": 0.05, "5": -0.15}) and grpo["paired"][3] == 3
    saved = json.loads((tmp_path / "comparison.json").read_text())
    assert saved["paired"]["gcpo"]["paired"] == pytest.approx(list(gcpo["paired"]))
    md = (tmp_path / "comparison.md").read_text()
    assert "| algorithm | counting | credit lift (training mean) | overall | steps to dapo's final |" in md
    assert "| gcpo | 0.310 ± " in md and "| 1.500 ± 0.000 | 0.620 ± " in md
    assert "| 20 (1/3 seeds) |" in md and "| 15 (2/3 seeds) |" in md and "| 10 (2/3 seeds) |" in md
    unpaired_half = (gcpo["unpaired"][2] - gcpo["unpaired"][1]) / 2
    assert f"| gcpo | +0.020 ± {half:.3f} | +0.020 ± {unpaired_half:.3f} | 3/3 |" in md
    assert "| grpo | -0.067 ± " in md and "| 1/3 |" in md
    assert "over 3 seed(s) (0, 3, 5)" in md and "Paired:" in md
    # every evaluation: per run, and paired (step 0 is the pairing's own check: the same
    # start, the same draws)
    assert "| run | step 0 | step 10 | step 20 |" in md and "| gcpo seed 3 | 0.300 | 0.600 | 0.630 |" in md
    by_step = result["paired_by_step"]["gcpo"]
    assert by_step[0] == (0.0, 0.0, 0.0, 3)
    assert by_step[10][0] == pytest.approx((0.0 + 0.05 + 0.03) / 3) and by_step[20] == pytest.approx(
        gcpo["paired"]
    )
    assert result["gain_over_start"]["dapo"] == pytest.approx((0.3, 0.3 - 10 * half, 0.3 + 10 * half, 3))
    assert "| gcpo | +0.000 ± 0.000 | +0.027 ± " in md and "| +0.320 ± " in md
    assert f"| dapo | — | — | — | +0.300 ± {10 * half:.3f} |" in md
    assert (tmp_path / "curves.png").stat().st_size > 1000
    # another baseline: the signs turn round
    other = summarise(tmp_path, ["grpo", "dapo", "gcpo"], [0, 3, 5], baseline="gcpo")
    assert set(other["paired"]) == {"grpo", "dapo"}
    assert other["paired"]["dapo"]["per_seed"] == pytest.approx({"0": -0.02, "3": -0.03, "5": -0.01})


def test_an_algorithm_with_fewer_seeds_is_paired_on_the_seeds_it_has(tmp_path):
    from t2i_gcpo.studies.compare import summarise

    fake_runs(tmp_path)
    seeds = {"grpo": [0, 3, 5], "dapo": [0, 3, 5], "gcpo": [3, 5]}
    result = summarise(tmp_path, ["grpo", "dapo", "gcpo"], seeds)
    assert result["seeds"] == [0, 3, 5] and result["seeds_of"]["gcpo"] == [3, 5]
    gcpo = result["paired"]["gcpo"]
    assert gcpo["per_seed"] == pytest.approx({"3": 0.03, "5": 0.01}) and gcpo["paired"][3] == 2
    assert gcpo["unpaired"][0] == pytest.approx((0.63 + 0.71) / 2 - 0.6)  # its 2 seeds against dapo's 3
    assert result["table"]["gcpo"]["overall"][3] == 2 and result["table"]["dapo"]["overall"][3] == 3
    md = (tmp_path / "comparison.md").read_text()
    assert "over 3 seed(s) (0, 3, 5); gcpo: 2 (3, 5)" in md and "| 2/2 |" in md


def welch_ci95(a: dict, b: dict):
    """The module's Welch interval on two algorithms' final scores (the last point of each curve)."""
    from t2i_gcpo.stats import welch_ci95 as welch

    return welch([c[-1] for c in a.values()], [c[-1] for c in b.values()])


def test_summarise_rejects_a_baseline_it_was_not_given(tmp_path):
    from t2i_gcpo.errors import UserError
    from t2i_gcpo.studies.compare import summarise

    fake_runs(tmp_path)
    with pytest.raises(UserError, match="--baseline critical"):
        summarise(tmp_path, ["dapo", "gcpo"], [0, 3, 5], baseline="critical")


def test_comparison_json_is_strict_json_with_null_for_missing_values(tmp_path):
    """A value with no number (one seed: no interval; grpo never logs credit_lift here) is written as null,
    not bare NaN, and the table built from the file read back is the one built from the result itself."""
    from t2i_gcpo.studies.compare import format_table, summarise

    fake_runs(tmp_path)
    for seed in (0, 3, 5):  # grpo's runs log no credit_lift: its training mean is NaN
        rows = tmp_path / "grpo" / f"seed{seed}" / "metrics.jsonl"
        kept = [r for r in rows.read_text().splitlines() if "credit_lift" not in r]
        rows.write_text("".join(r + "\n" for r in kept))
    result = summarise(tmp_path, ["grpo", "dapo", "gcpo"], [0, 3, 5])
    assert math.isnan(result["table"]["grpo"]["credit lift (training mean)"][0])

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    text = (tmp_path / "comparison.json").read_text()
    saved = json.loads(text, parse_constant=refuse)  # NaN / Infinity would raise here
    assert saved["table"]["grpo"]["credit lift (training mean)"] == [None, None, None, 0]
    assert format_table(saved) == format_table(result)
    assert "| grpo | " in format_table(saved) and "| — |" in format_table(saved)
