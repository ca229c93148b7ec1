"""Every output folder records the settings that made it (`outdir.write_settings_record`) and refuses work
made with other settings in one line, exit 2, nothing written — whatever the order of the options: compare,
sample, credit-map, pretrain and eval (issue 45, "Silent wrong results")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t2i_gcpo.errors import UserError
from t2i_gcpo.outdir import (
    SETTINGS_RECORD,
    check_settings_record,
    describe_differences,
    settings_differences,
    write_settings_record,
)
from t2i_gcpo.resources import PROMPTS_DIR

from cli_helpers import cli, error_line
from tiny_models import tiny_policy_dir


def files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- the record


def test_settings_compare_whatever_the_order_and_name_what_differs(tmp_path):
    a = {"--steps": 200, "--set": {"optim.lr": 1e-3, "rollout.group_size": 8}, "--reward": None}
    b = {"--reward": None, "--set": {"rollout.group_size": 8, "optim.lr": 0.001}, "--steps": 200}
    assert settings_differences(a, b) == []
    c = {"--steps": 100, "--set": {"rollout.group_size": 8}, "--reward": "mine.py:f"}
    assert settings_differences(a, c) == ["--steps", "--reward", ("--set", "optim.lr")]
    assert describe_differences(a, c) == (
        "--steps 200, --reward (default), --set optim.lr=0.001 "
        "(this command: --steps 100, --reward mine.py:f, no --set optim.lr)"
    )
    assert not check_settings_record(tmp_path, "compare", a), "no record: nothing to compare with"
    write_settings_record(tmp_path, "compare", a)
    assert not check_settings_record(tmp_path, "compare", c), "a record alone: the command made nothing"
    (tmp_path / "dapo").mkdir()  # its first output
    assert check_settings_record(tmp_path, "compare", b)
    with pytest.raises(UserError, match=r"made by `compare` with --steps 200.*give --again to redo"):
        check_settings_record(tmp_path, "compare", c, redo="--again")
    with pytest.raises(UserError, match=r"holds the output of `t2i-gcpo compare`, not `sample`"):
        check_settings_record(tmp_path, "sample", a)
    (tmp_path / SETTINGS_RECORD).write_text("[1]")
    with pytest.raises(UserError, match="not a settings record"):
        check_settings_record(tmp_path, "compare", a)


# ----------------------------------------------------------------------------- compare


def test_compare_refuses_runs_made_with_other_settings_whatever_the_order_of_set(tmp_path, capsys):
    """Issue 45: re-running compare with another --steps or --set reused the old runs and exited 0."""
    out = tmp_path / "cmp"
    base = [
        "compare",
        "--algos",
        "grpo",
        "--seeds",
        "1",
        "--eval-every",
        "1",
        "--model",
        tiny_policy_dir(tmp_path),
        "--prompts",
        PROMPTS_DIR / "shapeworld_train.jsonl",
        "--out",
        out,
    ]
    sets = [
        "--set",
        "rollout.prompts_per_step=2",
        "--set",
        "rollout.group_size=4",
        "--set",
        "sample_every=0",
        "--set",
        "eval_images_per_prompt=1",
    ]
    code, _, err = cli(capsys, *base, "--steps", 1, *sets)
    assert code == 0, err
    finished = files(out / "grpo")
    code, _, err = cli(capsys, *base, "--steps", 2, *sets)
    line = error_line(err)
    assert code == 2 and "with --steps 1 (this command: --steps 2)" in line and "another --out" in line, line
    code, _, err = cli(capsys, *base, "--steps", 1, *sets, "--set", "optim.lr=1e-3")
    line = error_line(err)
    assert code == 2 and "no --set optim.lr (this command: --set optim.lr=0.001)" in line, line
    assert files(out / "grpo") == finished, "nothing trained or rewritten"
    swapped = [*sets[4:], *sets[:4], "--set", "rollout.group_size=4"]  # same values, another order
    code, out_text, err = cli(capsys, *base, "--steps", 1, *swapped)
    assert code == 0 and "| grpo |" in out_text, err
    assert files(out / "grpo") == finished, "the finished run is kept"

    (out / "grpo" / "seed0" / "eval.json").unlink()  # a run folder without its final scores
    code, _, err = cli(capsys, *base, "--steps", 1, *sets)
    assert code == 2 and "seed0 has no eval.json" in err.splitlines()[-1] and "Traceback" not in err


# ----------------------------------------------------------------------------- pretrain


@pytest.mark.slow  # a long end-to-end run (the default tier keeps its lighter siblings)
def test_pretrain_locks_its_folder_and_refuses_runs_other_settings_and_foreign_files(tmp_path, capsys):
    """Issue 45: pretrain had no lock and no folder check — it wrote into a run directory, and two at once
    both exited 0."""
    from t2i_gcpo.outdir import RUN_MARKER, lock_output

    args = ["pretrain", "--world", "arithmetic", "--steps", 1, "--no-eval", "--threads", 1, "--out"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("steps: 1\n")
    (run / RUN_MARKER).write_text("")
    before = files(run)
    code, _, err = cli(capsys, *args, run)
    assert code == 2 and "holds a training run" in error_line(err)
    assert files(run) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    code, _, err = cli(capsys, *args, mine)
    assert code == 2 and "not empty (it holds notes.txt)" in error_line(err)
    out = tmp_path / "model"
    with lock_output(out, "t2i-gcpo pretrain --out model"):
        code, _, err = cli(capsys, *args, out)
        assert code == 2 and "is in use by pid" in error_line(err)
    code, _, err = cli(capsys, "pretrain", "--world", "arithmetic", "--minutes", "nan", "--out", out)
    assert code == 2 and "--minutes must be a finite number" in error_line(err)
    assert not out.exists()

    code, _, err = cli(capsys, *args, out)
    assert code == 0, err
    model = files(out)
    code, _, err = cli(capsys, *args[:4], 2, *args[5:], out)
    line = error_line(err)
    assert code == 2 and "made by `pretrain` with --steps 1 (this command: --steps 2)" in line, line
    assert files(out) == model
    code, _, err = cli(capsys, *args, out)  # the same settings: built again in place
    assert code == 0, err


# ----------------------------------------------------------------------------- sample and eval


def test_sample_and_eval_refuse_each_others_folders_and_a_run(tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a photo of a red circle\n")
    out = tmp_path / "s"
    sample = ["sample", "--prompts", prompts, "--n", 1, "--out"]
    assert cli(capsys, *sample, out)[0] == 0
    before = files(out)
    for args in (
        ["eval", "shapeworld", "--prompts", prompts, "--n", 1, "--out", out],
        ["credit-map", "--prompt", "a photo of a red circle", "--out", out],
        ["eval", "geneval", "--score-only", out, "--detector", "shapeworld", "--out", out],
    ):
        code, _, err = cli(capsys, *args)
        line = error_line(err)
        assert code == 2 and "holds the output of `t2i-gcpo sample`" in line, (args[:2], line)
    assert files(out) == before
    code, _, err = cli(capsys, *sample, tmp_path / "r", "--seed", 10**23)  # train refuses this seed too
    assert code == 2 and "--seed must be" in error_line(err) and not (tmp_path / "r").exists()
    code, _, err = cli(capsys, *sample, tmp_path / "r", "--temperature", "nan")
    assert code == 2 and "--temperature must be a finite number" in error_line(err)
    code, _, err = cli(capsys, *sample, tmp_path / "r", "--grid-scale", 100000)
    assert code == 2 and "--grid-scale" in err and not (tmp_path / "r").exists()


def test_eval_geneval_refuses_scores_of_another_source(tmp_path, capsys):
    from PIL import Image

    from t2i_gcpo.eval.layout import write_prompt_folder

    sources = []
    for name in ("a", "b"):
        root = tmp_path / name
        meta = {
            "tag": "single_object",
            "include": [{"class": "circle", "count": 1}],
            "prompt": "a photo of a circle",
        }
        write_prompt_folder(root, 0, meta, [Image.new("RGB", (32, 32), "white")])
        sources.append(root)
    out = tmp_path / "scores"
    args = ["eval", "geneval", "--detector", "shapeworld", "--out", out, "--score-only"]
    assert cli(capsys, *args, sources[0])[0] == 0
    before = files(out)
    code, _, err = cli(capsys, *args, sources[1])
    line = error_line(err)
    assert code == 2 and "made by `eval geneval` with --score-only" in line and "--overwrite" in line, line
    assert files(out) == before


def test_a_matched_comparison_resumes_whatever_the_order_of_set(tmp_path, monkeypatch):
    """budget.json's guard compared the --set options as a list: another order was "other settings"."""
    import t2i_gcpo.studies.budget as B
    from t2i_gcpo.studies.compare import plan_matches

    monkeypatch.setattr(B, "plan_match", lambda *a, **k: pytest.fail("probed again"))
    arm = {"of": "vine", "samples_per_step": 48.0, "set": "rollout.group_size=12"}
    saved = {
        "match": "samples",
        "by": "group",
        "baseline": "dapo",
        "model": "shapeworld",
        "overrides": ["optim.lr=1e-4", "rollout.prompts_per_step=4"],
        "arms": {"dapo-at-vine-budget": arm},
    }
    (tmp_path / "budget.json").write_text(json.dumps(saved))
    flags = {"prompts": "prompts/shapeworld_train.jsonl", "model": "shapeworld", "reward": None, "steps": 10}
    plan = plan_matches(
        tmp_path,
        ["dapo", "vine"],
        {"dapo": [0], "vine": [0]},
        "dapo",
        flags,
        ("rollout.prompts_per_step=4", "optim.lr=1e-4"),
        "group",
    )
    assert plan == {"dapo-at-vine-budget": arm}
    with pytest.raises(UserError, match="other settings"):
        plan_matches(tmp_path, ["dapo", "vine"], {"dapo": [0], "vine": [0]}, "dapo", flags, (), "prompts")
