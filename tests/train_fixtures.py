"""Prompt files and scripted rewards for fast training tests (the tiny models are in tests/tiny_models.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.worlds.shapeworld import generate_metadata


def write_prompt_file(path: Path, n: int = 8) -> Path:
    path.write_text("".join(json.dumps(m) + "\n" for m in generate_metadata(n, seed=3)))
    return path


def redness(images, prompts, metadata):
    """Mean red minus mean green/blue: a smooth reward that random samples vary on."""
    img = torch.as_tensor(images)
    score = img[:, 0].mean((1, 2)) - 0.5 * (img[:, 1].mean((1, 2)) + img[:, 2].mean((1, 2)))
    return RewardOutput(
        score, [{"strict": bool(s > 0), "tag": m.get("tag", "all")} for s, m in zip(score, metadata)]
    )


def nan_reward(images, prompts, metadata):
    out = redness(images, prompts, metadata)
    out.scores[0] = float("nan")
    return out


REWARD_CALLS: list[list[str]] = []  # prompts scored by each call of `flat_single_object`


def flat_single_object(images, prompts, metadata):
    """`redness`, but constant on single_object prompts (groups without signal); records its calls."""
    REWARD_CALLS.append(list(prompts))
    out = redness(images, prompts, metadata)
    flat = torch.tensor([m.get("tag") == "single_object" for m in metadata])
    out.scores[flat] = 0.0
    return out


HUGE_FROM_CALL = {"call": 0, "from": 4}  # `huge_from_call` counts its calls here


def huge_from_call(images, prompts, metadata):
    """`redness` until call HUGE_FROM_CALL["from"], then finite rewards of ±3e38 whose group mean
    overflows float32: the advantages, hence the loss, become NaN (the trainer's NaN guard)."""
    HUGE_FROM_CALL["call"] += 1
    out = redness(images, prompts, metadata)
    if HUGE_FROM_CALL["call"] >= HUGE_FROM_CALL["from"]:
        out.scores[:] = 3e38
        out.scores[1::4] = -3e38
    return out


def train_tiny_run(root: Path, *args: str) -> dict:
    """A finished 1-step run of the tiny prior in `root/base`, trained through `t2i-gcpo train ARGS…` (no
    HTML report: matplotlib takes seconds): {"root", "base", "model", "prompts"}. For module fixtures,
    which copy the folder for each test."""
    import t2i_gcpo.train.trainer as trainer_mod
    from t2i_gcpo.cli import main

    from tiny_models import tiny_policy_dir

    model, prompts = str(tiny_policy_dir(root)), str(write_prompt_file(root / "p.jsonl"))
    argv = [
        "train",
        "--prompts",
        prompts,
        "--model",
        model,
        "--out",
        str(root / "base"),
        "--steps",
        "1",
        "--report-to",
        "none",
        "--set",
        "rollout.prompts_per_step=2",
        "--set",
        "rollout.group_size=4",
        "--set",
        "rollout.cfg_scale=2",
        "--set",
        "optim.lr=3e-3",
        "--set",
        "sample_every=0",
        "--set",
        "eval_every=-1",
        "--set",
        "save_every=1",
        *args,
    ]
    report = trainer_mod.Trainer._report
    trainer_mod.Trainer._report = lambda self: None
    try:
        main(argv)
    except SystemExit as e:
        assert e.code in (0, None), e
    finally:
        trainer_mod.Trainer._report = report
    return {"root": root, "base": root / "base", "model": model, "prompts": prompts}


def copy_run(run: Path, where: Path) -> Path:
    """A copy of the run folder `run` as `where/run` (a test's own, to damage at will)."""
    import shutil

    return Path(shutil.copytree(run, where / "run"))
