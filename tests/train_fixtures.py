"""A tiny random ARPolicy saved to disk and scripted rewards, for fast training tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from t2i_gcpo.policies.ar import ARConfig, ARPolicy
from t2i_gcpo.policies.prompt_tokenizer import PromptTokenizer
from t2i_gcpo.resources import PROMPTS_DIR
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.tokenizers.vq import VQConfig, VQTokenizer
from t2i_gcpo.worlds.shapeworld import generate_metadata

# the vocabulary covers every shipped ShapeWorld prompt, so the tiny model takes the real prompt files
PROMPTS = [m["prompt"] for m in generate_metadata(24, seed=3)] + [
    line
    for f in ("shapeworld_train.txt", "shapeworld_test.txt")
    for line in (PROMPTS_DIR / f).read_text().splitlines()
]


def tiny_policy_dir(root: Path, seed: int = 0) -> Path:
    """Save a random 2-layer, d=32 prior over a random 16×16-px VQ (4×4 tokens) to root/tiny."""
    torch.manual_seed(seed)
    vq = VQTokenizer(VQConfig(image_size=16, channels=(16, 32), num_down=2, codebook_size=16, code_dim=8))
    tok = PromptTokenizer.build(PROMPTS + ["a photo of four hearts"], max_len=12)
    cfg = ARConfig(
        prompt_len=12,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
    )
    policy = ARPolicy(cfg, tok, vq)
    path = root / "tiny"
    policy.save_pretrained(str(path))
    return path


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
