"""The examples printed by `--help` work as printed: a newcomer's first command must not be refused.

Every example line of every help (the group's, each command's, each subcommand's), read from the help a
terminal shows: each is one whole command line; each parses (click, and the config it resolves to); and
each one this machine can run runs, shrunk to tiny settings (`shrink`), from an empty folder as a user
of a clone would. Those that need what is not here (a GPU pair, a Janus or aMUSEd checkpoint) are
checked as far as that goes, and `EXTERNAL` says why."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from t2i_gcpo.cli import cli

from cli_helpers import cli as run_cli
from repo_paths import REPO


def help_lines() -> list[list[str]]:
    """Every command line whose help a user can ask for: the group, each command, each subcommand."""
    from t2i_gcpo.cli import COMMANDS

    lines = [[]]
    for name in COMMANDS:
        lines.append([name])
        command = cli.get_command(click.Context(cli), name)
        lines += [[name, sub] for sub in getattr(command, "commands", {})]
    return lines


def examples_of(args: list[str]) -> list[str]:
    """The example command lines in `t2i-gcpo ARGS --help` as a terminal shows it (continuation lines
    joined, comments kept)."""
    text = CliRunner().invoke(cli, [*args, "--help"], terminal_width=300).output
    text = re.sub(r"\\\n\s*", "", text)
    return [
        ln.strip() for ln in text.splitlines() if ln.strip().startswith(("t2i-gcpo ", "accelerate launch "))
    ]


ALL = [(" ".join(args), example) for args in help_lines() for example in examples_of(args)]

# examples that name what a CPU machine does not have: checked up to that point (they parse, and a
# train example's config resolves), with the reason
EXTERNAL = {
    "/models/": "an aMUSEd checkpoint and a CLIP model on disk",
    "/ckpt/": "a Janus-Pro checkpoint and the GenEval / DPG-Bench scorers on disk",
    "--multi_gpu": "two GPUs",
    "--port 8100": (
        "a reward server, which serves until it is stopped (tests/rewards/test_server.py runs one)"
    ),
    "--judge http": (
        "a judge model behind an OpenAI-compatible server (tests/eval/test_judge_suites.py "
        "runs a loopback one)"
    ),
    "runs/dapo-seed0": "two runs with held-out evaluations (tests/e2e/test_eval_compare_cli.py compares two)",
}
# helps whose every example needs a benchmark's data, which is not shipped (its licence), and a VLM or a judge
NONE_RUNS_HERE = {"eval geneval2", "eval judge", "eval compbench"}


def external(example: str) -> str | None:
    return next((why for key, why in EXTERNAL.items() if key in example), None)


def command_args(example: str) -> list[str]:
    """The arguments after `t2i-gcpo` (after `-m t2i_gcpo.cli` under accelerate), comments dropped."""
    words = shlex.split(example, comments=True)
    return words[words.index("t2i_gcpo.cli") + 1 :] if words[0] == "accelerate" else words[1:]


def test_there_are_examples_and_each_is_one_whole_line():
    """A continuation lost in the source (a backslash-newline inside a Python string) prints two
    command lines as one with a run of spaces in the middle."""
    by_help = {where for where, _ in ALL}
    assert {"", "train", "credit-map", "sample", "eval", "compare", "pretrain"} <= by_help
    for _, example in ALL:
        command = example.split(" #")[0].rstrip()
        assert "   " not in command, example
        assert command_args(example), example


@pytest.mark.parametrize("where,example", ALL, ids=[e[:70] for _, e in ALL])
def test_every_example_parses_and_its_config_resolves(where, example):
    from t2i_gcpo.config import load_config
    from t2i_gcpo.resources import prompt_file

    args = command_args(example)
    command, rest = args[0], args[1:]
    if "--help-config" in rest:
        return
    group = cli.get_command(click.Context(cli), command)
    if isinstance(group, click.Group):
        command, rest = rest[0], rest[1:]
        group = group.get_command(click.Context(group), command)
    params = group.make_context(command, list(rest)).params  # unknown options and bad values raise here
    if params.get("prompts") and not external(example):
        assert prompt_file(params["prompts"]).is_file(), example
    if command == "train" and not params.get("resume"):
        flags = {"credit.scheme": params["credit"], "steps": params["steps"], "seed": params["seed"]}
        load_config(params["algo"], params["config_file"], flags, params["overrides"])


# --- running them -------------------------------------------------------------------------------------

TINY_TRAIN = [
    "--set",
    "rollout.prompts_per_step=2",
    "--set",
    "rollout.group_size=2",
    "--set",
    "eval_every=-1",
    "--set",
    "sample_every=0",
]


def _with(args: list[str], option: str, value: str) -> list[str]:
    """`args` with `option` set to `value` (replaced where given, else appended)."""
    if option in args:
        i = args.index(option)
        return [*args[: i + 1], value, *args[i + 2 :]]
    return [*args, option, value]


def shrink(args: list[str], run_dir: Path) -> list[str]:
    """An example's arguments at tiny settings: the same command and options, far fewer steps, images,
    seeds and algorithms (the first two of --algos, and each NAME@N); the placeholders of a run
    directory replaced by `run_dir`, a finished 1-step run. The prompt files are small ones of the
    same names in the current folder (a user's own file wins over the shipped one)."""
    args = [a.replace("runs/gcpo-20261121-120000", str(run_dir)) for a in args]
    args = [
        re.sub(r"runs/gcpo-…/checkpoints/step_\d+", str(run_dir / "checkpoints/step_000001"), a) for a in args
    ]
    command = args[0]
    if command == "train" and "--resume" in args:
        return _with(args, "--steps", "2") if "--steps" in args else args
    if command == "train" and "--help-config" not in args:
        return [*_with(args, "--steps", "1"), *TINY_TRAIN]
    if command == "credit-map":
        return [*(_with(args, "--limit", "2") if "--limit" in args else args), "--group", "2"]
    if command == "sample":
        return _with(args, "--n", "1")
    if command == "eval" and args[1] == "compare":
        return args
    if command == "eval":  # shapeworld: the held-out prompts' file by its name, so the small one
        return _with(_with(args, "--n", "1"), "--prompts", "prompts/shapeworld_test.jsonl")
    if command == "compare":
        algos = args[args.index("--algos") + 1].split(",")
        seeds = "0,1" if "," in args[args.index("--seeds") + 1] else "1"
        algos = algos[:2] + [re.sub(r"@\d+$", "@1", a) for a in algos[2:] if "@" in a or a == "vine"]
        world = "arithmetic" if "arithmetic" in args else "shapeworld"
        args = _with(_with(_with(args, "--algos", ",".join(algos)), "--seeds", seeds), "--steps", "1")
        held_out = ["eval_every=0", "eval_images_per_prompt=1", f"eval_prompts=prompts/{world}_test.jsonl"]
        return [*args, *TINY_TRAIN[:4], *(x for kv in held_out for x in ("--set", kv))]
    if command == "pretrain":
        args = _with(args, "--steps", "2")
        return args if "arithmetic" in args else [*args, "--scenes", "100", "--no-eval"]
    return args


def small_prompt_files(folder: Path, lines: int = 2) -> None:
    """`folder/prompts/NAME`: the first `lines` lines of each shipped prompt file NAME."""
    from t2i_gcpo.resources import PROMPTS_DIR

    (folder / "prompts").mkdir()
    for shipped in PROMPTS_DIR.iterdir():
        head = shipped.read_text().splitlines()[:lines]
        (folder / "prompts" / shipped.name).write_text("\n".join(head) + "\n")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished 1-step run: what the examples' `runs/gcpo-…` stand for."""
    from t2i_gcpo.api import train

    out = tmp_path_factory.mktemp("run") / "gcpo-20261121-120000"
    overrides = {"rollout.prompts_per_step": 2, "rollout.group_size": 2, "eval_every": -1, "sample_every": 0}
    train(prompts=Path("prompts/shapeworld_train.txt"), steps=1, out=out, overrides=overrides)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("where", sorted({w for w, _ in ALL}), ids=lambda w: w or "t2i-gcpo")
def test_every_example_runs_at_tiny_settings(where, finished_run, tmp_path, monkeypatch, capsys):
    """From an empty folder (with the clone's examples/ beside it, as at the clone's root), in the
    order printed: pretrain's examples use the model the one before wrote."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    small_prompt_files(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")  # --report-to wandb without an account
    ran = []
    for example in [e for w, e in ALL if w == where]:
        if external(example):
            continue
        if "wandb" in example:
            pytest.importorskip("wandb")
        args = shrink(command_args(example), finished_run)
        if args[:2] == [
            "eval",
            "compare",
        ]:  # two evaluations to compare, made as `eval shapeworld` makes them
            for folder in (a for a in args[2:4] if not Path(a).exists()):
                made = ["eval", "shapeworld", "--model", "shapeworld", "--out", folder]
                assert run_cli(capsys, *shrink(made, finished_run))[0] == 0, folder
        code, out, err = run_cli(capsys, *args)
        assert code == 0, f"{example}\n→ t2i-gcpo {shlex.join(args)}\n{err[-3000:]}"
        ran.append(example)
    assert ran or where in NONE_RUNS_HERE, where  # every other help with examples has one that runs here


def test_every_shapeworld_prompt_in_credit_map_help_is_accepted_by_the_shipped_model():
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.worlds.shapeworld.parse import parse_prompt

    examples = [command_args(e) for w, e in ALL if w == "credit-map" and "arithmetic" not in e]
    prompts = [a[a.index("--prompt") + 1] for a in examples if "--prompt" in a]
    assert prompts and re.search(r"left of|right of|above|below", prompts[0])
    policy = load_policy("shapeworld")
    for prompt in prompts:
        parse_prompt(prompt)  # raises UserError on a prompt outside the grammar or the classes
        policy.check_prompts([prompt])  # raises UserError on unknown words or a prompt longer than its length


def test_the_first_credit_map_example_runs(tmp_path):
    args = command_args(next(e for w, e in ALL if w == "credit-map"))
    args = args[: args.index("--out")] + ["--out", str(tmp_path / "maps"), "--group", "2"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "maps" / "credit_maps.html").is_file() and (tmp_path / "maps" / "00000.png").is_file()
