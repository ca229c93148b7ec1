"""No write follows a link, ever (issue 52, "a write that follows a link planted after the up-front check"):
every file the tool writes goes through one writer (outdir.write_file / append_text) that opens the folders
down to it without following a link at the moment of writing; a lock or file rewritten in place with a
second hard link is refused; a full disk is one line and leaves nothing half-made; user code named by a
received config is located without importing anything, and under --trust-run-code every package
``__init__.py`` on the way is recorded and hashed."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

import t2i_gcpo.outdir as outdir
import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.errors import UserError
from t2i_gcpo.outdir import LOCK_NAME, WriteError, append_text, lock_output, open_append, write_file

from cli_helpers import cli, error_line
from tiny_models import tiny_policy_dir
from train_fixtures import copy_run, train_tiny_run, write_prompt_file


@pytest.fixture(autouse=True)
def no_report(monkeypatch):
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)  # matplotlib: seconds per run


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("writes")
    return {
        "root": root,
        "model": str(tiny_policy_dir(root)),
        "prompts": str(write_prompt_file(root / "p.jsonl")),
        "eval": str(write_prompt_file(root / "eval.jsonl", n=1)),
    }


def run_args(tiny: dict, out: Path, steps: int = 1, *extra: str, sample_every: int = 0) -> list:
    args = [
        "train",
        "--prompts",
        tiny["prompts"],
        "--model",
        tiny["model"],
        "--out",
        out,
        "--steps",
        steps,
        "--reward",
        "train_fixtures:redness",
        "--report-to",
        "none",
    ]
    for s in (
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.cfg_scale=2",
        f"sample_every={sample_every}",
        "save_every=1",
        "eval_every=0",
        "eval_images_per_prompt=1",
        f"eval_prompts={tiny['eval']}",
    ):
        args += ["--set", s]
    return [*args, *extra]


def plant_after_first_row(monkeypatch, plant) -> None:
    """Call `plant()` once metrics.jsonl holds its first row: a link made while the run trains."""
    real, done = trainer_mod.append_text, []

    def append(path, text, within=None):
        real(path, text, within)
        if path.name == "metrics.jsonl" and not done:
            done.append(plant())

    monkeypatch.setattr(trainer_mod, "append_text", append)


def victims(tmp_path: Path) -> tuple[Path, Path]:
    victim = tmp_path / "victim.json"
    victim.write_text("precious\n")
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return victim, folder


# ---------------------------------------------------------------- the repro: links planted while a run trains


def test_a_link_planted_at_eval_json_or_processes_json_is_replaced_not_written_through(
    tiny, tmp_path, capsys, monkeypatch
):
    """`race/eval.json` linked elsewhere once metrics.jsonl exists: the run wrote the link's target."""
    out, (victim, _) = tmp_path / "race", victims(tmp_path)
    plant_after_first_row(
        monkeypatch, lambda: [(out / n).symlink_to(victim) for n in ("eval.json", "processes.json")]
    )
    code, _, err = cli(capsys, *run_args(tiny, out))
    assert code == 0, err
    assert victim.read_text() == "precious\n"
    for name in ("eval.json", "processes.json"):
        assert not (out / name).is_symlink() and isinstance(json.loads((out / name).read_text()), dict)


@pytest.mark.parametrize("folder", ["samples", "credit_maps"])
def test_a_link_planted_at_a_picture_folder_is_one_line_and_writes_nothing_there(
    tiny, tmp_path, capsys, monkeypatch, folder
):
    """`race/samples` linked elsewhere: the sample grid (a PIL save) and the credit maps (matplotlib's
    savefig) were written into the link's target."""
    out, (_, elsewhere) = tmp_path / "race", victims(tmp_path)
    plant_after_first_row(monkeypatch, lambda: (out / folder).symlink_to(elsewhere, target_is_directory=True))
    code, _, err = cli(capsys, *run_args(tiny, out, sample_every=1))
    line = error_line(err, ignore="%|")
    assert code == 2 and f"{out / folder} is a symbolic link" in line and "remove it" in line, line
    assert list(elsewhere.iterdir()) == []


def test_tensorboards_folder_linked_before_the_trackers_start_receives_nothing(
    tiny, tmp_path, capsys, monkeypatch
):
    out, (_, elsewhere) = tmp_path / "race", victims(tmp_path)
    real = trainer_mod.start_trackers

    def start(accelerator, trackers, run_dir, *args, **kwargs):
        (run_dir / "tb").symlink_to(elsewhere, target_is_directory=True)  # after the lock's check
        return real(accelerator, trackers, run_dir, *args, **kwargs)

    monkeypatch.setattr(trainer_mod, "start_trackers", start)
    args = [a if a != "none" else "tensorboard" for a in run_args(tiny, out, 1)]
    code, _, err = cli(capsys, *args)
    line = error_line(err, ignore="%|")
    assert code == 2 and f"{out / 'tb'} is a symbolic link" in line, line
    assert list(elsewhere.iterdir()) == []


def test_tensorboards_event_file_is_written_once_opened_whatever_its_name_becomes(tmp_path):
    """The event file is opened once (never through a link) and kept open: a link planted at its name
    later sends nothing elsewhere."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from t2i_gcpo.train.event_file import EventFile

    victim, _ = victims(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    tracker = EventFile(run, purge_step=None)
    tracker.start()
    tracker.log({"reward/mean": 0.5}, step=1)
    (path,) = (run / "tb" / "t2i-gcpo").iterdir()
    kept = tmp_path / "kept"
    os.replace(path, kept)
    path.symlink_to(victim)  # planted at the name
    tracker.log({"reward/mean": 0.75}, step=2)
    tracker.finish()
    assert victim.read_text() == "precious\n"
    path.unlink()
    os.replace(kept, path)
    acc = EventAccumulator(str(path.parent))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [(1, 0.5), (2, 0.75)]


# ------------------------------------------------------------------ hard links, the writer itself


def test_a_hard_linked_lock_file_is_refused_not_truncated(tmp_path, capsys, tiny):
    victim, _ = victims(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    os.link(victim, out / LOCK_NAME)
    code, _, err = cli(capsys, *run_args(tiny, out, 1))
    line = error_line(err)
    assert code == 2 and f"{out / LOCK_NAME} is a hard link" in line, line
    assert victim.read_text() == "precious\n"


def test_an_append_refuses_a_hard_linked_file_and_a_rewrite_replaces_it(tmp_path):
    victim, _ = victims(tmp_path)
    os.link(victim, tmp_path / "metrics.jsonl")
    with pytest.raises(UserError, match="metrics.jsonl is a hard link"):
        append_text(tmp_path / "metrics.jsonl", "{}\n")
    write_file(tmp_path / "metrics.jsonl", "{}\n")  # a whole rewrite: a new file under the name
    assert victim.read_text() == "precious\n" and (tmp_path / "metrics.jsonl").read_text() == "{}\n"


def test_the_writer_replaces_a_link_and_refuses_a_link_on_the_way(tmp_path):
    victim, elsewhere = victims(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.png").symlink_to(victim)
    write_file(out / "a.png", b"\x89PNG new", within=out)
    assert victim.read_text() == "precious\n" and (out / "a.png").read_bytes() == b"\x89PNG new"
    (out / "maps").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(
        UserError, match="maps is a symbolic link .* where t2i-gcpo writes a folder of its own"
    ):
        write_file(out / "maps" / "deep" / "b.png", b"x", within=out)
    assert list(elsewhere.iterdir()) == []
    (out / "c.json").mkdir()
    with pytest.raises(UserError, match="c.json is a directory"):
        write_file(out / "c.json", "{}")
    link = tmp_path / "chosen"  # the folder named on the command line may itself be a link
    link.symlink_to(out, target_is_directory=True)
    write_file(link / "d.txt", "ok", within=link)
    assert (out / "d.txt").read_text() == "ok"


# ------------------------------------------------------------------ a full disk: one line, nothing half-made


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_when_the_lock_is_written_is_one_line_and_leaves_no_folder(
    tiny, tmp_path, capsys, monkeypatch
):
    """A disk already full when the lock is written: an OSError traceback, an empty folder left."""
    monkeypatch.setattr(outdir.os, "pwrite", enospc)
    out = tmp_path / "new" / "run"
    code, _, err = cli(capsys, *run_args(tiny, out, 1))
    line = error_line(err)
    assert code == 1 and "cannot write the lock file" in line and "No space left on device" in line, line
    assert not (tmp_path / "new").exists()


def test_a_full_disk_mid_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "eval.json"
    path.write_text('{"old": 1}')
    with pytest.raises(WriteError, match=f"cannot write {path}: No space left on device"):
        write_file(path, enospc)
    assert path.read_text() == '{"old": 1}' and sorted(p.name for p in tmp_path.iterdir()) == ["eval.json"]
    real = os.write

    def half(fd, data):  # the disk fills after half a line
        real(fd, data[: len(data) // 2])
        enospc()

    monkeypatch.setattr(outdir.os, "write", half)
    append = tmp_path / "metrics.jsonl"
    append.write_text('{"step": 1}\n')
    with pytest.raises(WriteError, match="No space left on device"):
        append_text(append, '{"step": 2, "reward/mean": 0.5}\n')
    assert append.read_text() == '{"step": 1}\n', "no half line left"


def test_a_full_disk_while_a_run_writes_eval_json_is_one_line(tiny, tmp_path, capsys, monkeypatch):
    real = outdir.os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1].startswith(".eval.json."):
            enospc()
        real(fd)

    monkeypatch.setattr(outdir.os, "fsync", fsync)
    out = tmp_path / "run"
    code, _, err = cli(capsys, *run_args(tiny, out, 1))
    line = error_line(err, ignore="%|")
    assert code == 1 and f"cannot write {out / 'eval.json'}: No space left on device" in line, line
    assert not [p for p in out.iterdir() if p.name.startswith(".eval.json")], "no temporary file left"


def test_open_append_writes_to_the_file_it_opened(tmp_path):
    victim, _ = victims(tmp_path)
    log = tmp_path / "train.log"
    with open_append(log) as f:
        log.unlink()
        log.symlink_to(victim)  # planted while a child process writes the log
        f.write("line\n")
    assert victim.read_text() == "precious\n"


def test_the_lock_of_a_folder_holding_a_hard_linked_lock_leaves_the_other_name_alone(tmp_path):
    victim, _ = victims(tmp_path)
    folder = tmp_path / "out"
    folder.mkdir()
    os.link(victim, folder / LOCK_NAME)
    with pytest.raises(UserError, match="hard link"):
        lock_output(folder)
    assert victim.read_text() == "precious\n"


# ------------------------------------------------------------------ user code: located without importing it

PACKAGE_INIT = "open({marker!r}, 'w').write('ran')\n"
MODULE = "def score(images, prompts, metadata):\n    return images.mean((1, 2, 3))\n"


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("trust"))


def test_trust_never_imports_a_received_folders_package_to_find_its_module(
    finished, tmp_path, capsys, monkeypatch
):
    """With --trust-run-code, a dotted module:function in a received config imported the run folder's
    __init__.py (importlib.util.find_spec imports parent packages) before the hash check refused it."""
    run, marker = copy_run(finished["base"], tmp_path), tmp_path / "PWNED"
    (run / "evilpkg").mkdir()
    (run / "evilpkg" / "__init__.py").write_text(PACKAGE_INIT.format(marker=str(marker)))
    (run / "evilpkg" / "rewards.py").write_text(MODULE)
    data = yaml.safe_load((run / "config.yaml").read_text())
    data["reward"] = "evilpkg.rewards:score"
    (run / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.syspath_prepend(str(run))
    code, _, err = cli(capsys, "train", "--resume", run, "--steps", 2, "--trust-run-code")
    line = error_line(err)
    assert code == 2 and "names the reward 'evilpkg.rewards:score'" in line, line
    assert "a file inside the run folder" in line and "not code the run started with" in line, line
    assert not marker.exists() and "evilpkg" not in sys.modules, "no code of the folder ran"


def test_a_module_rewards_package_init_is_recorded_and_checked_under_trust(
    tiny, tmp_path, capsys, monkeypatch
):
    package = tmp_path / "code" / "mypkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("# the package\n")
    (package / "rewards.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    out = tmp_path / "run"
    args = [a if a != "train_fixtures:redness" else "mypkg.rewards:score" for a in run_args(tiny, out, 1)]
    code, _, err = cli(capsys, *args)
    assert code == 0, err
    recorded = {e["path"]: e["role"] for e in json.loads((out / "input_files.json").read_text())["files"]}
    assert recorded[str((package / "__init__.py").resolve())] == "reward"
    assert recorded[str((package / "rewards.py").resolve())] == "reward"
    (package / "__init__.py").write_text("# the package, edited\n")
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        monkeypatch.delitem(sys.modules, name)
    code, _, err = cli(capsys, "train", "--resume", out, "--steps", 2, "--trust-run-code")
    line = error_line(err)
    assert code == 2 and f"{(package / '__init__.py').resolve()} changed since the run started" in line, line
    shutil.rmtree(tmp_path / "code")
