"""A run folder from someone else runs no code and redirects no write (issue 45, security): the code its
config.yaml names is imported on --resume only when named again or trusted (and then only as recorded),
nothing the tool writes in its folders goes through a link or hangs on a FIFO, and a checkpoint folder
never runs its own Python through transformers. Each attack is an end-to-end repro: the target is
unchanged, the command exits 2 with one line."""

from __future__ import annotations

import builtins
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.core.schemes import USER_SCHEMES
from t2i_gcpo.errors import UserError
from t2i_gcpo.outdir import LOCK_NAME, RUN_MARKER, lock_output

from cli_helpers import cli, error_line
from repo_paths import TESTS
from train_fixtures import copy_run, train_tiny_run

CREDIT = """
def weights(inputs):
    return inputs.mask.float()
"""


def payload(marker: Path) -> str:
    """A credit scheme (or reward) whose import writes `marker`: what a crafted run folder could hold."""
    return f"open({str(marker)!r}, 'w').write('ran')\ndef f(inputs):\n    return inputs.mask.float()\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 1-step run (in `root/base`) trained with a credit scheme from a file of the user's."""
    root = tmp_path_factory.mktemp("sec")
    (root / "my_credit.py").write_text(CREDIT)
    return {
        **train_tiny_run(root, "--credit", f"{root / 'my_credit.py'}:weights"),
        "credit": root / "my_credit.py",
    }


@pytest.fixture(autouse=True)
def no_report(monkeypatch):
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)  # matplotlib: seconds per run


def fresh(trained, where: Path) -> Path:
    return copy_run(trained["base"], where)


def edit_config(run: Path, **changes) -> None:
    data = yaml.safe_load((run / "config.yaml").read_text())
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    (run / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


# --------------------------------------------------------------- 1. a run folder runs no Python of its own


def test_resume_never_imports_code_the_run_folder_names(trained, tmp_path, capsys, monkeypatch):
    """The issue's repro: run/notes.py creates a file at import; config.yaml names it; --resume (of a
    finished run, and from inside the folder by a relative path) must not run it, and says how to opt in."""
    run, marker = fresh(trained, tmp_path), tmp_path / "PWNED"
    (run / "notes.py").write_text(payload(marker))
    monkeypatch.chdir(tmp_path)
    edit_config(run, credit__scheme="run/notes.py:f")
    code, _, err = cli(capsys, "train", "--resume", "run")
    line = error_line(err)
    assert code == 2 and "--credit run/notes.py:f" in line and "--trust-run-code" in line, line
    code, _, err = cli(capsys, "train", "--resume", "run", "--steps", "2")  # not finished: the same
    assert code == 2 and "--credit run/notes.py:f" in error_line(err)

    edit_config(run, credit__scheme="./notes.py:f")  # next to config.yaml, resumed from inside the folder
    monkeypatch.chdir(run)
    code, _, err = cli(capsys, "train", "--resume", ".", "--steps", "2")
    assert code == 2 and "--credit ./notes.py:f" in error_line(err)
    # --trust-run-code runs only the code the run started with
    code, _, err = cli(capsys, "train", "--resume", ".", "--trust-run-code")
    assert code == 2 and "not code the run started with" in error_line(err)

    edit_config(run, credit__scheme="gcpo", reward="./notes.py:f")  # a reward, a module on sys.path: the same
    code, _, err = cli(capsys, "train", "--resume", ".", "--steps", "2")
    assert code == 2 and "names the reward './notes.py:f'" in error_line(err)
    monkeypatch.syspath_prepend(str(run))
    edit_config(run, reward="notes:f")
    code, _, err = cli(capsys, "train", "--resume", ".", "--steps", "2")
    assert code == 2 and "add --reward notes:f" in error_line(err)
    assert "notes" not in sys.modules
    assert not marker.exists(), "the run folder's code never ran"

    # named again, it is the user's choice: it runs (the finished run then has nothing to do)
    edit_config(run, reward="shapeworld", credit__scheme="./notes.py:f")
    code, _, err = cli(capsys, "train", "--resume", ".", "--credit", "./notes.py:f")
    assert code == 0, err
    assert marker.read_text() == "ran"
    assert not (run / "__pycache__").exists(), "no bytecode written next to the file"
    code, _, err = cli(capsys, "train", "--resume", ".", "--credit", "other.py:f")  # another: a new run
    assert code == 2 and "was trained with the credit scheme './notes.py:f'" in error_line(err)


def test_trust_runs_only_the_recorded_code_unchanged_and_a_changed_file_needs_consent(
    trained, tmp_path, capsys, monkeypatch
):
    run, credit, marker = fresh(trained, tmp_path), trained["credit"], tmp_path / "PWNED"
    spec = f"{credit}:weights"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["credit"]["scheme"] == spec and saved["prompts"] == trained["prompts"], "absolute paths"
    recorded = {e["path"]: e for e in json.loads((run / "input_files.json").read_text())["files"]}
    assert recorded[str(credit)]["role"] == "credit" and recorded[trained["prompts"]]["role"] == "prompts"
    monkeypatch.chdir(tmp_path)  # another working directory: the recorded paths find the files
    USER_SCHEMES.clear()
    code, _, err = cli(capsys, "train", "--resume", run)
    assert code == 2 and f"add --credit {spec}" in error_line(err)
    code, out, err = cli(capsys, "train", "--resume", run, "--trust-run-code")
    assert code == 0 and "already finished" in out, err

    original = credit.read_text()
    try:
        credit.write_text(payload(marker).replace("def f(", "def weights("))
        code, _, err = cli(capsys, "train", "--resume", run, "--trust-run-code")
        line = error_line(err)
        assert (
            code == 2
            and f"{credit} changed since the run started" in line
            and "--allow-changed-inputs" in line
        )
        assert not marker.exists(), "a changed file is refused before it runs"
        # named again: the user's code as it is now, trained on and recorded
        code, _, err = cli(capsys, "train", "--resume", run, "--credit", spec, "--steps", "2")
        assert code == 0, err
        assert marker.exists()
        now = {e["path"]: e["sha256"] for e in json.loads((run / "input_files.json").read_text())["files"]}
        assert now[str(credit)] != recorded[str(credit)]["sha256"], "the new content is recorded"
        marker.unlink()
        code, _, err = cli(capsys, "train", "--resume", run, "--trust-run-code", "--steps", "3")
        assert code == 0 and marker.exists(), err  # trusted: the content recorded last
    finally:
        credit.write_text(original)


def test_an_edited_prompt_file_is_refused_on_resume_unless_allowed(trained, tmp_path, capsys):
    run, prompts = fresh(trained, tmp_path), Path(trained["prompts"])
    spec = f"{trained['credit']}:weights"
    original = prompts.read_text()
    try:
        lines = original.splitlines()
        prompts.write_text("\n".join(lines[1:] + lines[:1]) + "\n")  # the same prompts, another order
        code, _, err = cli(capsys, "train", "--resume", run, "--credit", spec, "--steps", "2")
        line = error_line(err)
        assert code == 2 and f"{prompts} changed since the run started (its prompts file)" in line, line
        assert "--allow-changed-inputs" in line and not (run / "checkpoints" / "step_000002").exists()
        code, _, err = cli(
            capsys, "train", "--resume", run, "--credit", spec, "--steps", "2", "--allow-changed-inputs"
        )
        assert code == 0 and (run / "checkpoints" / "step_000002").is_dir(), err
        code, out, err = cli(capsys, "train", "--resume", run, "--credit", spec, "--steps", "3")
        assert code == 0, err  # the new content was recorded: the next resume checks against it
    finally:
        prompts.write_text(original)


def test_flags_that_only_a_resume_takes_are_refused_on_a_new_run(trained, tmp_path, capsys):
    code, _, err = cli(capsys, "train", "--prompts", trained["prompts"], "--trust-run-code")
    assert code == 2 and "--trust-run-code goes with --resume" in error_line(err)
    assert not (tmp_path / "runs").exists()


def test_compare_resumes_its_runs_without_their_folders_code(trained, tmp_path, capsys):
    comparison, marker = tmp_path / "cmp", tmp_path / "PWNED"
    run = comparison / "gcpo" / "seed0"
    shutil.copytree(trained["base"], run)
    (run / "eval.json").unlink(missing_ok=True)
    (run / "notes.py").write_text(payload(marker))
    edit_config(run, credit__scheme=str(run / "notes.py") + ":f")
    code, _, err = cli(
        capsys,
        "compare",
        "--algos",
        "gcpo",
        "--seeds",
        1,
        "--steps",
        2,
        "--model",
        trained["model"],
        "--prompts",
        trained["prompts"],
        "--out",
        comparison,
    )
    line = error_line(err, ignore="%|")
    assert code == 2 and "names the credit scheme" in line and "a file inside the run folder" in line, line
    assert "--trust-run-code" not in line and f"remove {run} and run the same command again" in line, line
    assert not marker.exists()


def test_compare_side_by_side_resumes_a_run_naming_only_its_own_code(tmp_path):
    """--jobs N resumes each run as `t2i-gcpo train --resume`: with the code the comparison names."""
    from t2i_gcpo.studies.compare import named_code, train_command

    named = named_code("mine.py:score", ("eval_every=5", "credit.scheme=my_credit.py:f"))
    assert train_command("gcpo", tmp_path, True, {}, 4, (), named) == [
        "train",
        "--resume",
        str(tmp_path),
        "--steps",
        "4",
        "--credit",
        "my_credit.py:f",
        "--reward",
        "mine.py:score",
    ]
    assert train_command("gcpo", tmp_path, True, {}, 4, (), named_code(None, ())) == [
        "train",
        "--resume",
        str(tmp_path),
        "--steps",
        "4",
    ]


# --------------------------------------------------------------- 3. no write follows a link


def test_a_planted_lock_link_overwrites_nothing(trained, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = fresh(trained, tmp_path)
    (run / LOCK_NAME).symlink_to(victim)
    code, _, err = cli(capsys, "train", "--resume", run, "--trust-run-code")
    line = error_line(err)
    assert code == 2 and f"{run / LOCK_NAME} is a symbolic link" in line, line
    new = tmp_path / "new"
    new.mkdir()
    (new / LOCK_NAME).symlink_to(victim)
    code, _, err = cli(
        capsys, "train", "--prompts", trained["prompts"], "--model", trained["model"], "--out", new
    )
    assert code == 2 and "is a symbolic link" in error_line(err)
    assert victim.read_text() == "precious\n" and (run / LOCK_NAME).is_symlink()


def test_a_planted_run_marker_or_metrics_link_overwrites_nothing(trained, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    new = tmp_path / "new"
    new.mkdir()
    (new / RUN_MARKER).symlink_to(victim)
    code, _, err = cli(
        capsys, "train", "--prompts", trained["prompts"], "--model", trained["model"], "--out", new
    )
    line = error_line(err)
    assert (
        code == 2
        and f"{new / RUN_MARKER} is a symbolic link" in line
        and "does not write through links" in line
    )
    run = fresh(trained, tmp_path)
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(victim)
    code, _, err = cli(capsys, "train", "--resume", run, "--trust-run-code", "--steps", "2")
    assert code == 2 and "metrics.jsonl is a symbolic link" in error_line(err)
    assert victim.read_text() == "precious\n"


def test_a_checkpoints_link_neither_receives_saves_nor_loses_its_folders(trained, tmp_path, capsys):
    run, elsewhere = fresh(trained, tmp_path), tmp_path / "elsewhere"
    shutil.move(run / "checkpoints", elsewhere)
    (elsewhere / "step_000000").mkdir()  # what a save would prune there
    (run / "checkpoints").symlink_to(elsewhere)
    before = sorted(str(p.relative_to(elsewhere)) for p in elsewhere.rglob("*"))
    code, _, err = cli(capsys, "train", "--resume", run, "--trust-run-code", "--steps", "3")
    assert code == 2 and "checkpoints is a symbolic link" in error_line(err)
    assert sorted(str(p.relative_to(elsewhere)) for p in elsewhere.rglob("*")) == before


def test_saving_refuses_a_checkpoints_link_made_after_the_check(tmp_path):
    """The save itself never writes through (nor prunes behind) a link, whenever it appears."""
    from t2i_gcpo.train.checkpoint import save_checkpoint

    target = tmp_path / "target"
    (target / "step_000001").mkdir(parents=True)
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(target)
    with pytest.raises(UserError, match="checkpoints is a symbolic link"):
        save_checkpoint(run, 5, None, {}, {}, keep=1)
    assert [p.name for p in target.iterdir()] == ["step_000001"]


def test_a_fifo_or_a_folder_as_the_lock_is_one_line_not_a_hang(trained, tmp_path, capsys):
    run = fresh(trained, tmp_path)
    os.mkfifo(run / LOCK_NAME)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(
        [sys.executable, "-m", "t2i_gcpo.cli", "train", "--resume", str(run), "--trust-run-code"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and f"{run / LOCK_NAME} is a FIFO" in error_line(p.stderr), p.stderr
    (run / LOCK_NAME).unlink()
    (run / LOCK_NAME).mkdir()
    code, _, err = cli(capsys, "train", "--resume", run, "--trust-run-code")
    assert code == 2 and f"{run / LOCK_NAME} is a directory" in error_line(err)


def test_every_output_command_refuses_a_folder_holding_a_link_or_a_fifo(tmp_path):
    """lock_output is the door of every command's output folder (sample, eval, credit-map, compare)."""
    victim = tmp_path / "victim.png"
    victim.write_bytes(b"precious")
    out = tmp_path / "out" / "00000" / "samples"
    out.mkdir(parents=True)
    (out / "0000.png").symlink_to(victim)
    with pytest.raises(UserError, match=r"0000.png is a symbolic link \(to .*victim.png\)"):
        lock_output(tmp_path / "out")
    (out / "0000.png").unlink()
    os.mkfifo(out / "0000.png")
    with pytest.raises(UserError, match="0000.png is a FIFO"):
        lock_output(tmp_path / "out")
    assert not (tmp_path / "out" / LOCK_NAME).exists(), "a refused folder keeps no lock file"
    (out / "0000.png").unlink()
    with lock_output(tmp_path / "out"):  # plain files and folders: taken
        pass
    link = tmp_path / "chosen"
    link.symlink_to(tmp_path / "out")  # the folder named on the command line may itself be a link
    with lock_output(link):
        pass


# --------------------------------------------------------------- 4. a checkpoint runs no code of its own

EVIL_MODULE = """
open({marker!r}, "w").write("ran")
from transformers import PreTrainedTokenizerFast

class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def test_a_text_checkpoint_naming_its_own_code_never_runs_it(tmp_path, monkeypatch):
    """A tokenizer_config.json with `auto_map`: without trust_remote_code=False transformers asks on a
    terminal, and "y" runs the folder's code."""
    from t2i_gcpo.policies.registry import load_policy

    from tiny_models import build_tiny_text_lm

    folder, marker = tmp_path / "lm", tmp_path / "PWNED"
    build_tiny_text_lm(folder)
    (folder / "evil.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(auto_map={"AutoTokenizer": [None, "evil.EvilTokenizer"]}, tokenizer_class="EvilTokenizer")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    asked = []
    monkeypatch.setattr(builtins, "input", lambda *a: asked.append(a) or "y")  # a user who answers yes
    with pytest.raises(UserError) as e:
        load_policy(f"text:{folder}")
    assert "never runs a checkpoint's code" in str(e.value) and "\n" not in str(e.value)
    assert not asked and not marker.exists()


def test_a_text_checkpoint_holding_only_a_pickle_is_refused_unread(tmp_path):
    import torch
    from safetensors.torch import load_file

    from t2i_gcpo.policies.registry import load_policy

    from tiny_models import build_tiny_text_lm

    folder = tmp_path / "lm"
    build_tiny_text_lm(folder)
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    with pytest.raises(UserError, match=r"pytorch_model.bin: weights saved as a pickle .* does not read"):
        load_policy(f"text:{folder}")
