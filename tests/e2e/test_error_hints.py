"""Messages that lead somewhere (issue 52): every hint a command prints is a command that works — each test
here provokes one, follows it as printed, and checks the command then gets past the refusal — names files
inside a received folder as such, and never suggests a value it would refuse."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

import t2i_gcpo.studies.compare as compare_module
import t2i_gcpo.train.run as run_module
import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.config import load_config

from cli_helpers import cli, error_line
from tiny_models import tiny_policy_dir
from train_fixtures import copy_run, train_tiny_run, write_prompt_file


@pytest.fixture(autouse=True)
def no_report(monkeypatch):
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)


@pytest.fixture
def no_training(monkeypatch):
    """Training (and compare's table of finished runs) replaced by a note: following a hint must get past
    the plan, which is what these tests check."""
    trained = []

    def run(job):
        trained.append(job.cfg.algo)
        if job.lock is not None:
            job.lock.release()
        return {}

    monkeypatch.setattr(run_module, "run", run)
    monkeypatch.setattr(compare_module, "summarise", lambda *a, **k: {})
    monkeypatch.setattr(compare_module, "format_table", lambda result: "")
    return trained


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("hints"))


def command_in(line: str) -> list[str]:
    """The `t2i-gcpo …` command a message prints, as the shell would split it (up to a bracket or the end)."""
    found = re.search(r"t2i-gcpo (\S.*?)(?: \(|\)|,| or |$)", line)
    assert found, line
    return shlex.split(found.group(1))


def edit_config(run: Path, **changes) -> None:
    data = yaml.safe_load((run / "config.yaml").read_text())
    for dotted, value in changes.items():
        node, *parents = data, *dotted.split("__")[:-1]
        for p in parents:
            node = node[p]
        node[dotted.split("__")[-1]] = value
    (run / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


# ------------------------------------------------------------------ code a resumed run runs


def test_a_reward_sum_is_named_again_whole(finished, tmp_path, capsys, no_training):
    """A resumed run with a reward sum was told "add --reward notes.py:r", which --resume then refused."""
    run = copy_run(finished["base"], tmp_path)
    (run / "notes.py").write_text("def r(images, prompts, metadata):\n    return images.mean((1, 2, 3))\n")
    reward = f"0.5*shapeworld+0.5*{run / 'notes.py'}:r"
    edit_config(run, reward=reward)
    code, _, err = cli(capsys, "train", "--resume", run, "--steps", 2)
    line = error_line(err)
    assert code == 2 and "a file inside the run folder" in line, line
    given = re.search(r"add (--reward (?:'[^']*'|\S+))", line).group(1)
    assert shlex.split(given) == ["--reward", reward], line
    code, _, err = cli(capsys, "train", "--resume", run, "--steps", 2, *shlex.split(given))  # as printed
    assert code == 0 and no_training == ["gcpo"], err


def test_compare_is_told_what_it_can_do_and_it_works(finished, tmp_path, capsys, no_training):
    """compare was told to add --credit / --trust-run-code, options it lacks."""
    import shutil

    out = tmp_path / "cmp"
    run = out / "gcpo" / "seed0"
    shutil.copytree(finished["base"], run)
    (run / "eval.json").unlink(missing_ok=True)
    (run / "notes.py").write_text("def f(inputs):\n    return inputs.mask.float()\n")
    edit_config(run, credit__scheme=f"{run / 'notes.py'}:f")
    args = [
        "compare",
        "--algos",
        "gcpo",
        "--seeds",
        1,
        "--steps",
        2,
        "--model",
        finished["model"],
        "--prompts",
        finished["prompts"],
        "--out",
        out,
        "--report-to",
        "none",
    ]
    code, _, err = cli(capsys, *args)
    line = error_line(err, ignore="%|")
    assert code == 2 and "--credit" not in line and "--trust-run-code" not in line, line
    assert f"remove {run} and run the same command again" in line, line
    shutil.rmtree(run)  # followed
    code, _, err = cli(capsys, *args)
    assert code == 0 and no_training == ["gcpo"], err


def test_an_unknown_need_names_the_scheme_not_the_decorator(tmp_path, capsys):
    (tmp_path / "mine.py").write_text(
        "from t2i_gcpo import credit_scheme\n\n@credit_scheme(needs=('contrastt',))\n"
        "def late_tokens(inputs):\n    return inputs.mask.float()\n"
    )
    code, _, err = cli(
        capsys,
        "train",
        "--prompts",
        "prompts/shapeworld_train.txt",
        "--credit",
        f"{tmp_path / 'mine.py'}:late_tokens",
        "--out",
        tmp_path / "run",
    )
    line = error_line(err)
    assert code == 2 and "credit scheme 'late_tokens': unknown needs ['contrastt']" in line, line
    assert "'credit_scheme'" not in line and not (tmp_path / "run").exists()


# ------------------------------------------------------------------ how to continue a run


def test_the_nan_guards_line_ends_on_a_command_that_works_or_on_starting_over(finished, tmp_path, capsys):
    """The NaN guard's message at step 1 ended on a dangling "or"."""
    from types import SimpleNamespace

    run = copy_run(finished["base"], tmp_path)
    cfg = load_config("gcpo", overrides=["reward=train_fixtures:redness"])
    trainer = SimpleNamespace(run_dir=run, cfg=cfg)
    trainer._resume_command = lambda steps=None: trainer_mod.Trainer._resume_command(trainer, steps)
    tail = trainer_mod.Trainer._after_nan(trainer)
    assert tail.endswith(
        f"or start over with other settings (e.g. a lower optim.lr) in a new --out ({run} keeps this run)"
    ), tail
    command = command_in(tail)
    assert command[:4] == ["train", "--resume", str(run), "--steps"] and "--reward" in command, command
    edit_config(run, reward="train_fixtures:redness")
    code, out, err = cli(capsys, *command)
    assert code == 0 and "already finished" in out, err
    import shutil

    shutil.rmtree(run / "checkpoints")  # stopped at step 1: nothing to end the run at
    tail = trainer_mod.Trainer._after_nan(trainer)
    assert tail == (
        "no checkpoint was written before it: start over with other settings (e.g. a lower optim.lr) "
        f"in a new --out ({run} keeps this run)"
    )
    cfg.optim.warmup_steps, cfg.steps = 1, 4  # a warmup the end command would stop in: not suggested
    shutil.copytree(finished["base"] / "checkpoints", run / "checkpoints")
    assert "t2i-gcpo" not in trainer_mod.Trainer._after_nan(trainer)


def test_resume_hints_give_a_number_and_the_command_works(finished, tmp_path, capsys):
    run = copy_run(finished["base"], tmp_path)
    code, _, err = cli(capsys, "train", "--resume", run, "--steps", 0)  # fewer than it trained
    line = error_line(err)
    assert code == 2 and "give --steps N with N ≥ 1" in line, line
    code, out, err = cli(capsys, *command_in(line))  # "to end it there: …"
    assert code == 0 and "already finished" in out, err
    longer = command_in(out)  # finished: "train longer with: …"
    assert longer[-2:] == ["--steps", "2"], longer
    code, _, err = cli(capsys, *longer)
    assert code == 0 and (run / "checkpoints" / "step_000002").is_dir(), err


# ------------------------------------------------------------------ values: suggested only where accepted


def test_sample_never_suggests_a_cfg_it_would_refuse(finished, tmp_path, capsys):
    """`sample` suggested `--cfg nan` for a folder whose record says NaN."""
    prompts = write_prompt_file(tmp_path / "p.jsonl", n=1)
    out = tmp_path / "samples"
    base = ["sample", "--prompts", prompts, "--model", finished["model"], "--out", out, "--n", 1]
    code, _, err = cli(capsys, *base, "--cfg", 2)
    assert code == 0, err
    code, _, err = cli(capsys, *base, "--cfg", 3)
    line = error_line(err, ignore="GenEval generate")
    again = re.search(r"\((--cfg \S+) continues them\)", line).group(1)
    assert again == "--cfg 2.0", line
    assert cli(capsys, *base, *again.split())[0] == 0  # followed: it continues the folder
    record = out / "00000" / "generation.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "cfg_scale": float("nan")}))
    code, _, err = cli(capsys, *base, "--cfg", 3)
    line = error_line(err, ignore="GenEval generate")
    assert code == 2 and "cfg_scale=nan" in line and "--cfg nan" not in line and "--overwrite" in line, line


@pytest.mark.parametrize(
    "extra, hint",
    [
        (["--algo", "vine", "--set", "branching.k=16"], r"--set (branching\.k=\d+)"),
        (
            ["--algo", "tree", "--set", "branching.k=16", "--set", "branching.continuations=1"],
            r"--set (branching\.k=\d+)",
        ),
        (["--algo", "pods", "--set", "rollout.draw_factor=1.3"], r"--set (rollout\.draw_factor=\S+?)\)"),
    ],
    ids=["every_k-spacing", "tree-points", "pods-draws"],
)
def test_a_suggested_setting_plans(finished, tmp_path, capsys, no_training, extra, hint):
    base = [
        "train",
        "--prompts",
        finished["prompts"],
        "--model",
        finished["model"],
        "--out",
        tmp_path / "run",
        "--reward",
        "train_fixtures:redness",
        "--report-to",
        "none",
        "--set",
        "rollout.prompts_per_step=2",
        "--set",
        "rollout.cfg_scale=2",
    ]
    code, _, err = cli(capsys, *base, *extra)
    line = error_line(err)
    suggested = re.search(hint, line).group(1)
    code, _, err = cli(capsys, *base, *extra, "--set", suggested)
    assert code == 0 and no_training, (suggested, err)


def test_compares_held_out_hint_plans(finished, tmp_path, capsys, no_training):
    (tmp_path / "r.py").write_text("def ok(images, prompts, metadata):\n    return images.mean((1, 2, 3))\n")
    args = [
        "compare",
        "--algos",
        "dapo",
        "--seeds",
        1,
        "--steps",
        1,
        "--model",
        finished["model"],
        "--prompts",
        finished["prompts"],
        "--reward",
        f"{tmp_path / 'r.py'}:ok",
        "--out",
        tmp_path / "cmp",
        "--report-to",
        "none",
    ]
    code, _, err = cli(capsys, *args)
    line = error_line(err)
    suggested = re.search(r"--set (eval_prompts=\S+)", line).group(1)
    code, _, err = cli(capsys, *args, "--set", suggested)
    assert code == 0 and no_training == ["dapo"], err


def test_nothing_to_match_suggests_algorithms_that_plan(finished, tmp_path, capsys, no_training, monkeypatch):
    import t2i_gcpo.studies.budget as budget

    args = [
        "compare",
        "--algos",
        "dapo,gcpo",
        "--seeds",
        1,
        "--steps",
        1,
        "--model",
        finished["model"],
        "--prompts",
        finished["prompts"],
        "--match-budget",
        "samples",
        "--out",
        tmp_path / "cmp",
        "--report-to",
        "none",
        "--set",
        "rollout.prompts_per_step=2",
    ]
    code, _, err = cli(capsys, *args)
    line = error_line(err)
    suggested = re.search(r"--algos (\S+)\)", line).group(1)
    assert code == 2 and suggested == "dapo,gcpo,tree", line
    monkeypatch.setattr(
        budget,
        "plan_match",
        lambda arm, *a, **k: {"of": arm, "unit": "samples", "set": "rollout.group_size=20"},
    )
    code, _, err = cli(capsys, *[suggested if a == "dapo,gcpo" else a for a in args])
    assert code == 0 and no_training == ["dapo", "gcpo", "tree", "dapo"], err


def test_every_continue_line_names_the_runs_own_code(tmp_path):
    """resume_command: the one place that prints how to continue a run."""
    from t2i_gcpo.train.run_dir import resume_command

    run = tmp_path / "my run"
    run.mkdir()
    (run / "notes.py").write_text("def f(inputs):\n    return inputs.mask.float()\n")
    assert resume_command(run, "gcpo", "shapeworld") == f"t2i-gcpo train --resume '{run}'"
    line = resume_command(run, f"{run / 'notes.py'}:f", "0.5*shapeworld+0.5*train_fixtures:redness", steps=3)
    assert shlex.split(line.split(" (")[0])[1:] == [
        "train",
        "--resume",
        str(run),
        "--steps",
        "3",
        "--credit",
        f"{run / 'notes.py'}:f",
        "--reward",
        "0.5*shapeworld+0.5*train_fixtures:redness",
    ]
    assert "a file inside the run folder: read it first" in line
    assert resume_command(run, "<python>:mine", None).startswith("t2i_gcpo.train(resume=")
    assert Path(tiny_policy_dir(tmp_path)).is_dir()
