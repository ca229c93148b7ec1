"""A run survives what happens to real runs: --steps extensions and crashes, finished runs resumed,
runs started in the same second, unwritable --out, damaged model files, NaN config values, SIGTERM,
half-written metrics lines and a damaged `latest` pointer. Tiny random model; a few steps each."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

import t2i_gcpo.train.run_dir as run_dir_mod
import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.cli import cli
from t2i_gcpo.config import from_dict, load_config
from t2i_gcpo.errors import UserError, check_writable_dir
from t2i_gcpo.policies.registry import load_policy
from t2i_gcpo.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_carry,
    load_optimizer,
    save_checkpoint,
)
from t2i_gcpo.train.run import ResumeOptions, prepare, run

from repo_paths import TESTS
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

FAST = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=2",
    "optim.lr=3e-3",
    "sample_every=0",
    "save_every=1",
    "eval_every=-1",
]

TRUST = ResumeOptions(trust_run_code=True)  # these runs' rewards are test modules of ours


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {
        "root": root,
        "model": str(tiny_policy_dir(root)),
        "prompts": str(write_prompt_file(root / "p.jsonl")),
        "eval": str(write_prompt_file(root / "eval.jsonl", n=2)),
    }


@pytest.fixture(autouse=True)
def no_html_report(monkeypatch):
    """The HTML report (matplotlib, seconds per run) is not what these tests are about."""
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)


def flags(tiny, out, steps, reward="train_fixtures:redness"):
    return dict(
        prompts=tiny["prompts"],
        model=tiny["model"],
        reward=reward,
        out=None if out is None else str(out),
        steps=steps,
        seed=0,
    )


def train(tiny, out, steps, extra=()):
    run(prepare(algo="gcpo", flags=flags(tiny, out, steps), overrides=(*FAST, *extra)))


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def kinds(run_dir: Path) -> list[tuple[int, str]]:
    """(step, 'train' | 'eval') per metrics row: eval rows hold only eval/* keys."""
    return [
        (r["step"], "eval" if all(k == "step" or k.startswith("eval/") for k in r) else "train")
        for r in rows(run_dir)
    ]


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def params(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(
        str(run_dir / "checkpoints" / f"step_{step:06d}" / "model" / "prior" / "model.safetensors")
    )


def assert_same_run(a: Path, b: Path, step: int) -> None:
    ra, rb = rows(a), rows(b)
    assert [r["step"] for r in ra] == [r["step"] for r in rb]
    for x, y in zip(ra, rb):
        for k in x:
            if not k.startswith("time/"):
                assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-7), (x["step"], k)
    pa, pb = params(a, step), params(b, step)
    assert all(torch.equal(pa[k], pb[k]) for k in pa), "resumed weights are bit-identical"


# ---------------------------------------------------------------------------------------- 1. --steps


def test_extended_run_crashes_then_plain_resume_finishes_it(tiny, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    evals = ("eval_every=0", f"eval_prompts={tiny['eval']}", "eval_images_per_prompt=2")
    train(tiny, out, steps=2, extra=evals)  # finished: final eval row at step 2
    real_step = trainer_mod.Trainer.train_step

    def crash_at_4(t, step):
        if step == 4:
            raise RuntimeError("simulated crash at step 4")
        return real_step(t, step)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", crash_at_4)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(
            prepare(resume_options=TRUST, resume_dir=out, steps=5)
        )  # extend to 5 steps; checkpoint at 3, then the crash
    assert yaml.safe_load((out / "config.yaml").read_text())["steps"] == 5, "the new total is saved"
    assert not (out / "eval.json").exists(), "eval.json of step 2 no longer describes the run"
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", real_step)

    run(
        prepare(resume_options=TRUST, resume_dir=out)
    )  # plain --resume: continues to 5 from the checkpoint at 3
    assert kinds(out) == [
        (1, "train"),
        (2, "train"),
        (2, "eval"),
        (3, "train"),
        (4, "train"),
        (5, "train"),
        (5, "eval"),
    ]
    assert json.loads((out / "eval.json").read_text()) == {
        k: v for k, v in rows(out)[-1].items() if k != "step"
    }

    # resuming the finished run: one line, nothing written (before: a second final eval row)
    before = snapshot(out)
    capsys.readouterr()
    result = run(prepare(resume_options=TRUST, resume_dir=out))
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and "already finished" in printed[0], printed
    assert result == json.loads((out / "eval.json").read_text())
    assert snapshot(out) == before

    res = CliRunner().invoke(cli, ["train", "--resume", str(out), "--trust-run-code"])
    assert res.exit_code == 0 and "already finished" in res.output, res.output
    assert snapshot(out) == before

    with pytest.raises(UserError, match="trained 5 steps"):  # shortening below the checkpoint
        prepare(resume_options=TRUST, resume_dir=out, steps=3)


def test_a_run_extended_with_resume_steps_is_the_longer_run(tiny, tmp_path):
    """`train --resume DIR --steps 4` on a finished 2-step run trains what a 4-step run does: the same
    training rows and, at step 4, bit-identical weights (how the study extends its runs)."""
    short, long = tmp_path / "short", tmp_path / "long"
    train(tiny, short, steps=2)
    run(prepare(resume_options=TRUST, resume_dir=short, steps=4))
    train(tiny, long, steps=4)
    assert [r["step"] for r in rows(short)] == [r["step"] for r in rows(long)] == [1, 2, 3, 4]
    assert_same_run(short, long, 4)


def test_resume_refuses_a_checkpoint_past_the_saved_steps(tiny, tmp_path):
    """A run directory written before the fix: --steps 4 was not saved, the checkpoint is at 4."""
    out = tmp_path / "old"
    train(tiny, out, steps=4)
    (out / "config.yaml").write_text((out / "config.yaml").read_text().replace("steps: 4", "steps: 2"))
    before = snapshot(out)
    with pytest.raises(UserError, match="--steps N with N ≥ 4"):
        run(prepare(resume_options=TRUST, resume_dir=out))
    assert snapshot(out) == before


def test_resume_after_the_last_checkpoint_but_before_the_end_writes_the_final_eval_once(
    tiny, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "tail"
    evals = ("eval_every=0", f"eval_prompts={tiny['eval']}", "eval_images_per_prompt=2")

    def killed(self):
        raise KeyboardInterrupt  # e.g. killed while reporting: after the eval row, before the end

    monkeypatch.setattr(trainer_mod.Trainer, "_report", killed)
    with pytest.raises(KeyboardInterrupt):
        train(tiny, out, steps=2, extra=evals)
    assert kinds(out)[-1] == (2, "eval")
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)
    run(
        prepare(resume_options=TRUST, resume_dir=out)
    )  # not finished: the final evaluation is done again, not appended
    assert kinds(out) == [(1, "train"), (2, "train"), (2, "eval")]
    with pytest.raises(UserError, match="trained 2 steps"):
        prepare(resume_options=TRUST, resume_dir=out, steps=1)
    capsys.readouterr()
    run(prepare(resume_options=TRUST, resume_dir=out))
    assert "already finished" in capsys.readouterr().out


# ------------------------------------------------------------------------------------- 2. run dirs


def test_default_run_directories_never_collide(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_dir_mod.time, "strftime", lambda fmt, *a: "20261123-120000")  # same second
    for _ in range(2):
        train(tiny, None, steps=1)
    dirs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert dirs == ["gcpo-20261123-120000", "gcpo-20261123-120000-2"]
    for d in dirs:
        assert [r["step"] for r in rows(tmp_path / "runs" / d)] == [1], "each run has its own metrics"
        assert yaml.safe_load((tmp_path / "runs" / d / "config.yaml").read_text())["out"] == f"runs/{d}"


# ------------------------------------------------------------------------------------------ 3. --out


def test_out_that_is_a_file_or_unwritable_fails_before_any_work(tiny, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = [
        (afile, "is a file"),
        (afile / "sub", "is a file"),
        (Path("/proc/t2i-gcpo-test"), "not writable"),
    ]
    for out, needle in cases:
        args = ["train", "--prompts", tiny["prompts"], "--model", tiny["model"], "--out", str(out)]
        err = CliRunner().invoke(cli, args).exception
        assert isinstance(err, UserError) and needle in str(err), (out, err)
        assert "\n" not in str(err)
    assert afile.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_pretrain_out_unwritable_fails_at_once():
    tic = time.perf_counter()
    args = [
        "pretrain",
        "--out",
        "/proc/t2i-gcpo-test",
        "--vq-steps",
        "1",
        "--steps",
        "1",
        "--scenes",
        "100",
        "--no-eval",
    ]
    err = CliRunner().invoke(cli, args).exception
    assert isinstance(err, UserError) and "not writable" in str(err), err
    assert time.perf_counter() - tic < 5, "checked before rendering and training"


def test_check_writable_dir_creates_nothing(tmp_path):
    assert check_writable_dir(tmp_path, "--out") == tmp_path
    assert check_writable_dir(tmp_path / "a" / "b", "--out") == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("")
    with pytest.raises(UserError, match=r"^--out .*/f is a file, not a directory$"):
        check_writable_dir(tmp_path / "f", "--out")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UserError, match="broken symbolic link"):
        check_writable_dir(tmp_path / "link" / "x", "--out")


# ------------------------------------------------------------------------------------- 4. model files


def _zero(p: Path) -> None:
    p.write_bytes(b"")


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _nan(p: Path) -> None:
    state = load_file(str(p))
    key = sorted(state)[0]
    state[key].view(-1)[3] = float("nan")  # one flipped exponent is enough
    save_file(state, str(p))


def _inf(p: Path) -> None:
    state = load_file(str(p))
    key = sorted(state)[-1]
    state[key].view(-1)[0] = float("inf")
    save_file(state, str(p))


def _bad_json(p: Path) -> None:
    p.write_text(p.read_text()[:-7])


def _as_directory(p: Path) -> None:
    p.unlink()
    p.mkdir()


DAMAGE = [
    ("prior/model.safetensors", _zero, "cannot read the weights"),
    ("prior/model.safetensors", _truncate, "cannot read the weights"),
    ("prior/model.safetensors", _nan, "NaN/inf"),
    ("prior/model.safetensors", _as_directory, "is a directory"),
    ("prior/config.json", _bad_json, "not valid JSON"),
    ("prior/config.json", _as_directory, "is a directory"),
    ("prior/vocab.json", _bad_json, "vocab.json"),
    ("vq/model.safetensors", _zero, "cannot read the weights"),
    ("vq/model.safetensors", _truncate, "cannot read the weights"),
    ("vq/model.safetensors", _inf, "NaN/inf"),
    ("vq/config.json", _bad_json, "not valid JSON"),
]


@pytest.mark.parametrize("name,damage,needle", DAMAGE, ids=[f"{n}-{d.__name__[1:]}" for n, d, _ in DAMAGE])
def test_damaged_model_files_are_one_line_errors_naming_the_file(tiny, tmp_path, name, damage, needle):
    model = tmp_path / "model"
    shutil.copytree(tiny["model"], model)
    damage(model / name)
    with pytest.raises(UserError) as e:
        load_policy(str(model))
    msg = str(e.value)
    assert str(model / name) in msg and needle in msg and "\n" not in msg, msg


def test_nan_weights_create_no_run_directory(tiny, tmp_path, monkeypatch):
    model = tmp_path / "model"
    shutil.copytree(tiny["model"], model)
    _nan(model / "prior" / "model.safetensors")
    monkeypatch.chdir(tmp_path)
    err = CliRunner().invoke(cli, ["train", "--prompts", tiny["prompts"], "--model", str(model)]).exception
    assert isinstance(err, UserError) and "NaN/inf" in str(err), err
    assert not (tmp_path / "runs").exists()


def test_a_file_where_a_directory_belongs_and_back(tiny, tmp_path):
    with pytest.raises(UserError, match="is a file, expected a checkpoint directory"):
        load_policy(tiny["prompts"])
    with pytest.raises(UserError, match="is a directory"):
        load_config(config_file=tmp_path)
    with pytest.raises(UserError, match="is a file, not a run directory"):
        prepare(resume_options=TRUST, resume_dir=Path(tiny["prompts"]))


# ---------------------------------------------------------------------------------------- 5. NaN config


@pytest.mark.parametrize(
    "override",
    [
        "rollout.cfg_scale=nan",
        "rollout.cfg_scale=.inf",
        "optim.lr=inf",
        "advantage.eps=nan",
        "optim.grad_clip=nan",
        "loss.beta=.inf",
        "credit.gcpo.tau=inf",
        "credit.dgpo.kappa=nan",
        "optim.weight_decay=-inf",
    ],
)
def test_non_finite_config_values_are_refused_naming_the_key(override):
    key = override.split("=")[0]
    with pytest.raises(UserError, match=f"'{key}' must be a finite number"):
        load_config(overrides=[override])
    data: dict = {}  # a hand-edited config.yaml is checked the same way
    section, _, leaf = key.rpartition(".")
    node = data
    for part in section.split(".") if section else []:
        node = node.setdefault(part, {})
    node[leaf] = float(override.split("=")[1].lstrip("."))
    with pytest.raises(UserError, match="must be a finite number"):
        from_dict(data)


def test_unbounded_clip_values_stay_allowed():
    cfg = load_config(overrides=["optim.grad_clip=inf", "loss.eps_high=.inf"])
    assert cfg.optim.grad_clip == float("inf") and cfg.loss.eps_high == float("inf")


# ------------------------------------------------------------------------------------------ 6. SIGTERM

SLOW_REWARD = """
import os, time
from train_fixtures import redness

def slow_redness(images, prompts, metadata):
    if os.environ.get("T2I_TEST_SLOW_REWARD"):
        time.sleep(0.4)  # a step lasts long enough to be interrupted in its middle
    return redness(images, prompts, metadata)
"""


@pytest.mark.slow  # a real process, stopped by SIGTERM in a step whose reward sleeps
def test_sigterm_finishes_the_step_saves_and_resumes_bit_identically(tiny, tmp_path, monkeypatch):
    (tmp_path / "slowfix.py").write_text(SLOW_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(
        sys.modules, "slowfix", raising=False
    )  # another test's module of that name is not ours
    common = (*FAST, "optim.lr=3e-3")
    full = tmp_path / "full"
    previous = signal.getsignal(signal.SIGTERM)
    run(prepare(algo="gcpo", flags=flags(tiny, full, 5, "slowfix:slow_redness"), overrides=common))
    assert signal.getsignal(signal.SIGTERM) == previous, "the previous SIGTERM handler is restored"

    part = tmp_path / "part"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "T2I_TEST_SLOW_REWARD": "1",
        "OMP_NUM_THREADS": str(torch.get_num_threads()),  # the same arithmetic as this process
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    args = [
        "--prompts",
        tiny["prompts"],
        "--model",
        tiny["model"],
        "--reward",
        "slowfix:slow_redness",
        "--out",
        str(part),
        "--steps",
        "5",
        "--seed",
        "0",
    ]
    for s in common:
        args += ["--set", s]
    p = subprocess.Popen(
        [sys.executable, "-m", "t2i_gcpo.cli", "train", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        if (part / "metrics.jsonl").is_file() and len((part / "metrics.jsonl").read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 143, (p.returncode, err[-3000:])
    assert "SIGTERM: finishing this step" in out + err and f"--resume {part}" in out + err
    saved = latest_checkpoint(part)
    step = int(saved.name.split("_")[1])
    assert 2 <= step < 5 and [r["step"] for r in rows(part)] == list(range(1, step + 1)), (
        "the step was finished"
    )

    run(prepare(resume_options=TRUST, resume_dir=part))
    assert_same_run(full, part, 5)


# ----------------------------------------------------------------------------- 7. metrics and `latest`


def test_half_written_metrics_line_is_dropped_on_resume(tiny, tmp_path):
    out = tmp_path / "run"
    train(tiny, out, steps=2)
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "reward/me')  # killed while writing step 3's row
    run(prepare(resume_options=TRUST, resume_dir=out, steps=3))
    assert [r["step"] for r in rows(out)] == [1, 2, 3]


def test_damaged_metrics_line_in_the_middle_is_a_user_error(tiny, tmp_path):
    out = tmp_path / "run"
    train(tiny, out, steps=2)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join(["{oops", *lines]) + "\n")
    with pytest.raises(UserError, match=r"metrics.jsonl:1"):
        run(prepare(resume_options=TRUST, resume_dir=out, steps=3))


class _Saved:
    def save_pretrained(self, path: str) -> None:
        os.makedirs(path)
        Path(path, "model_index.json").write_text("{}")


def _optimizer_state() -> dict:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1).state_dict()


def test_latest_pointer_falls_back_to_the_newest_complete_checkpoint(tmp_path):
    for step in (2, 4):
        save_checkpoint(tmp_path, step, _Saved(), _optimizer_state(), {})
    ckpts = tmp_path / "checkpoints"
    assert latest_checkpoint(tmp_path) == ckpts / "step_000004"
    assert (ckpts / "latest").read_text() == "step_000004\n"
    assert [p.name for p in ckpts.iterdir() if p.name.startswith(".")] == [], "no temporary file left"
    for damage in (
        lambda p: p.unlink(),
        lambda p: p.write_text(""),
        lambda p: p.write_bytes(b"\xff\x00step"),
    ):
        damage(ckpts / "latest")
        assert latest_checkpoint(tmp_path) == ckpts / "step_000004"
    (ckpts / "latest").write_text("step_000004\n")
    (ckpts / "step_000004" / "trainer_state.json").unlink()  # incomplete
    assert latest_checkpoint(tmp_path) == ckpts / "step_000002"
    (ckpts / "latest").write_text("step_000009\n")  # names nothing
    assert latest_checkpoint(tmp_path) == ckpts / "step_000002"
    shutil.rmtree(ckpts / "step_000002")
    assert latest_checkpoint(tmp_path) is None


def test_latest_pointer_is_replaced_atomically(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 2, _Saved(), _optimizer_state(), {})

    def crash(*a, **k):
        raise OSError("disk full")

    write_text = Path.write_text

    def half_written(self, text, *a, **k):  # the pointer's write stops half-way
        if self.name != "latest":
            return write_text(self, text, *a, **k)
        with open(self, "w") as f:
            f.write(text[:6])
        crash()

    monkeypatch.setattr(os, "fsync", crash)
    monkeypatch.setattr(Path, "write_text", half_written)
    with pytest.raises(CheckpointError, match="cannot write the checkpoint of step 4"):
        save_checkpoint(tmp_path, 4, _Saved(), _optimizer_state(), {})
    monkeypatch.undo()
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_000002\n"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("damage", [_zero, _truncate], ids=["empty", "truncated"])
def test_damaged_optimizer_or_carry_file_is_a_one_line_error_naming_it(tmp_path, damage):
    ckpt = save_checkpoint(tmp_path, 2, _Saved(), _optimizer_state(), {}, carry=[None, {"rows": [1, 2]}])
    assert load_carry(ckpt) == [None, {"rows": [1, 2]}]
    loaded = []
    load_optimizer(ckpt, loaded.append)
    assert loaded == [_optimizer_state()]
    for name, load, what in (
        ("optimizer", lambda: load_optimizer(ckpt, loaded.append), "the optimizer state"),
        ("carry", lambda: load_carry(ckpt), "the carried groups"),
    ):
        damage(ckpt / f"{name}.safetensors")
        with pytest.raises(UserError) as e:
            load()
        msg = str(e.value)
        assert str(ckpt / name) in msg and f"cannot read {what}" in msg and "\n" not in msg, msg


def test_an_optimizer_state_that_does_not_fit_is_a_user_error(tmp_path):
    ckpt = save_checkpoint(tmp_path, 2, _Saved(), _optimizer_state(), {})
    other = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(UserError, match="does not match the model"):
        load_optimizer(ckpt, other.load_state_dict)


def test_resume_keeps_the_groups_carried_into_the_next_step(tiny, tmp_path):
    """Dynamic sampling's surplus groups are part of the checkpoint: a run resumed at a step whose
    surplus feeds the next one continues exactly as the uninterrupted run."""
    reward, common = "train_fixtures:flat_single_object", (*FAST, "save_every=1")
    full = tmp_path / "full"
    run(prepare(algo="gcpo", flags=flags(tiny, full, 6, reward), overrides=common))
    carried = [r["step"] for r in rows(full) if r.get("groups_carried")]
    assert carried, "the prompt file must make some step carry groups"
    resume_at = carried[0] - 1  # the checkpoint holding the carried groups
    part = tmp_path / "part"
    run(prepare(algo="gcpo", flags=flags(tiny, part, resume_at, reward), overrides=common))
    assert (part / "checkpoints" / f"step_{resume_at:06d}" / "carry.safetensors").is_file()
    run(prepare(resume_options=TRUST, resume_dir=part, steps=6))
    assert_same_run(full, part, 6)


def test_resume_keeps_the_allocation_history(tiny, tmp_path):
    """Knapsack allocation sizes each prompt's draws from the prompt's reward history: a resumed run
    reads the history its checkpoint saved and continues exactly as the uninterrupted run."""
    # 4 prompts a step of the 8: steps 3 and 4 draw prompts steps 1 and 2 scored, whose
    # history sizes their draws
    common = (*FAST, "rollout.prompts_per_step=4", "rollout.allocation=knapsack", "rollout.draw_factor=2")
    full, part = tmp_path / "full", tmp_path / "part"
    run(prepare(algo="dapo", flags=flags(tiny, full, 4), overrides=common))
    run(prepare(algo="dapo", flags=flags(tiny, part, 2), overrides=common))
    state = json.loads((part / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    (history,) = state["history"]  # one process
    assert history and all(count > 0 for _, count in history.values())
    run(prepare(resume_options=TRUST, resume_dir=part, steps=4))
    assert_same_run(full, part, 4)
