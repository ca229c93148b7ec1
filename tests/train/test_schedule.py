"""Learning-rate schedules (optim.lr_scheduler, warmup_steps, min_lr_rate): the lr of each step against
hand-computed values, the logged `lr`, and a cosine-with-floor run killed with SIGKILL that resumes
bit-identically."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.config import OptimConfig, describe, load_config
from t2i_gcpo.errors import UserError
from t2i_gcpo.train.checkpoint import latest_checkpoint, load_scheduler
from t2i_gcpo.train.run import ResumeOptions, prepare, run
from t2i_gcpo.train.schedule import build_scheduler, current_lr, restore_scheduler, step_schedule

from repo_paths import TESTS
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

TRUST = ResumeOptions(trust_run_code=True)  # these runs' rewards are test modules of ours


def lrs(optim: OptimConfig, steps: int, lr: float = 1.0) -> list[float]:
    """The lr of steps 1 … `steps` as the trainer sees them (read before the update, stepped after)."""
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = build_scheduler(optim, opt, steps)
    out = []
    for _ in range(steps):
        out.append(current_lr(sched))
        opt.step()
        sched.step()
    return out


def test_hand_computed_values():
    # cosine to a floor of 0.1 over 10 steps after 2 warmup steps (transformers: warmup k / w for k < w, then
    # 0.1 + 0.9 · ½(1 + cos(π (k − w) / (n − w))), k = step − 1)
    got = lrs(OptimConfig(lr_scheduler="cosine_with_min_lr", warmup_steps=2, min_lr_rate=0.1), 10, lr=1e-3)
    assert got[0] == 0.0  # step 1: warmup starts at 0
    assert got[1] == pytest.approx(0.5e-3, rel=1e-12)
    assert got[2] == pytest.approx(1e-3, rel=1e-12)  # warmup done: the cosine starts at the top
    assert got[3] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 8))), rel=1e-12)
    assert got[6] == pytest.approx(0.55e-3, rel=1e-12)  # half-way down: the floor plus half the rest
    assert got[9] == pytest.approx(1e-3 * (0.1 + 0.45 * (1 + math.cos(7 * math.pi / 8))), rel=1e-12)
    assert min(got[2:]) > 1e-4  # the floor itself would be step 11's
    # linear: warmup from 0, then down to 0 at step n + 1
    assert lrs(OptimConfig(lr_scheduler="linear", warmup_steps=2), 6) == pytest.approx(
        [0.0, 0.5, 1.0, 0.75, 0.5, 0.25]
    )
    # cosine to 0 without warmup: ½(1 + cos(π k / n))
    assert lrs(OptimConfig(lr_scheduler="cosine"), 4) == pytest.approx(
        [1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4))]
    )
    assert lrs(OptimConfig(), 3) == [1.0, 1.0, 1.0]  # constant: the default, as before schedules
    assert lrs(OptimConfig(warmup_steps=2), 4) == pytest.approx([0.0, 0.5, 1.0, 1.0])


def test_steps_without_an_update_keep_the_schedule_and_warn_nothing():
    """A step that makes no update (dynamic sampling, equal rewards) still moves the schedule one step:
    the lrs are those of a run that updated every step, and torch's "lr_scheduler.step() before
    optimizer.step()" warning, which plain `scheduler.step()` gives there, is not raised."""
    optim = OptimConfig(lr_scheduler="cosine_with_min_lr", warmup_steps=2, min_lr_rate=0.1)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(optim, opt, 6)
    got = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in range(6):
            got.append(current_lr(sched))
            if k in (2, 4):  # updates at steps 3 and 5 only; steps 1 and 2 make none
                opt.step()
            step_schedule(sched)
    assert got == lrs(optim, 6)
    plain = build_scheduler(optim, torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 6)
    with pytest.warns(UserWarning, match="before `optimizer.step"):
        plain.step()


def test_resume_state_and_older_checkpoints():
    """A restored scheduler continues where it stopped; a checkpoint without a saved schedule (written
    before runs had one) replays the steps; a longer run follows the schedule over its new length."""
    optim = OptimConfig(lr_scheduler="cosine_with_min_lr", warmup_steps=1, min_lr_rate=0.05)
    whole = lrs(optim, 8)
    for state in ("saved", None):
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        first = build_scheduler(optim, opt, 8)
        for _ in range(3):
            opt.step()
            first.step()
        saved = first.state_dict() if state == "saved" else None
        opt2 = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        opt2.load_state_dict(opt.state_dict())
        again = build_scheduler(optim, opt2, 8)
        restore_scheduler(again, saved, 3)
        rest = []
        for _ in range(5):
            rest.append(current_lr(again))
            opt2.step()
            again.step()
        assert rest == whole[3:], state  # exactly: the same float arithmetic
    longer = build_scheduler(optim, torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 16)
    restore_scheduler(longer, first.state_dict(), 3)
    assert current_lr(longer) == lrs(optim, 16)[3]


def test_config_keys_and_their_checks():
    keys = {k for k, _, _ in describe()}
    assert {"optim.lr_scheduler", "optim.warmup_steps", "optim.min_lr_rate"} <= keys
    cfg = load_config(config_file="configs/recipes/janus_pro_7b_geneval.yaml")
    assert (cfg.steps, cfg.optim.lr_scheduler, cfg.optim.min_lr_rate) == (1600, "cosine_with_min_lr", 0.05)
    for bad, needle in [
        ("optim.lr_scheduler=step", "optim.lr_scheduler"),
        ("optim.warmup_steps=-1", "optim.warmup_steps"),
        ("optim.min_lr_rate=1.5", "optim.min_lr_rate"),
        ("optim.min_lr_rate=0.1", "cosine_with_min_lr only"),
    ]:
        with pytest.raises(UserError, match=needle):
            load_config(overrides=[bad])


# ------------------------------------------------------------------------------ a run, killed with -9

FAST = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=2",
    "optim.lr=3e-3",
    "sample_every=0",
    "save_every=1",
    "eval_every=-1",
    "optim.lr_scheduler=cosine_with_min_lr",
    "optim.warmup_steps=2",
    "optim.min_lr_rate=0.1",
]

SLOW_REWARD = """
import os, time
from train_fixtures import redness

def slow_redness(images, prompts, metadata):
    if os.environ.get("T2I_TEST_SLOW_REWARD"):
        time.sleep(0.3)  # steps long enough for the kill to land in one
    return redness(images, prompts, metadata)
"""


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # a real process killed with SIGKILL mid-run
def test_cosine_with_floor_resumes_bit_identically_after_kill_9(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)
    (tmp_path / "slowfix.py").write_text(SLOW_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(
        sys.modules, "slowfix", raising=False
    )  # another test's module of that name is not ours
    model, prompts = str(tiny_policy_dir(tmp_path)), str(write_prompt_file(tmp_path / "p.jsonl"))
    steps = 6
    flags = dict(prompts=prompts, model=model, reward="slowfix:slow_redness", steps=steps, seed=0)
    full = tmp_path / "full"
    run(prepare(algo="gcpo", flags={**flags, "out": str(full)}, overrides=FAST))
    logged = [r["lr"] for r in rows(full)]
    assert logged == lrs(
        OptimConfig(lr_scheduler="cosine_with_min_lr", warmup_steps=2, min_lr_rate=0.1), steps, lr=3e-3
    )
    assert logged[0] == 0.0 and logged[2] == pytest.approx(3e-3) and logged[-1] > 3e-4

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
        prompts,
        "--model",
        model,
        "--reward",
        "slowfix:slow_redness",
        "--out",
        str(part),
        "--steps",
        str(steps),
        "--seed",
        "0",
    ]
    for s in FAST:
        args += ["--set", s]
    p = subprocess.Popen(
        [sys.executable, "-m", "t2i_gcpo.cli", "train", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        if latest_checkpoint(part) is not None and int(latest_checkpoint(part).name[5:]) >= 3:
            break
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)  # no handler, no last save: whatever is on disk is all there is
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, err[-2000:]
    saved = latest_checkpoint(part)
    done = int(saved.name[5:])
    assert 3 <= done < steps
    assert load_scheduler(saved)["last_epoch"] == done  # the schedule's position is in the checkpoint

    run(prepare(resume_options=TRUST, resume_dir=part))
    a, b = rows(full), rows(part)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, steps + 1))
    assert [r["lr"] for r in b] == logged, "the same lr at every step, to the bit"
    for x, y in zip(a, b):
        for k in x:
            if not k.startswith("time/"):
                assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-7), (x["step"], k)
    weights = [
        load_file(str(r / "checkpoints" / f"step_{steps:06d}" / "model" / "prior" / "model.safetensors"))
        for r in (full, part)
    ]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0]), "bit-identical weights"
