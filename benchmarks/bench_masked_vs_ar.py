"""Masked vs autoregressive sampling on ShapeWorld: speed at equal batch, and what the speed buys.

For the shipped AR prior (static KV cache, 64 sequential steps) and the shipped masked prior at
several decoding step counts S, both with CFG at each checkpoint's own scale:

- images/s of `policy.rollout` (sampling only, decoding to pixels excluded) at batch `--batch`
  (P prompts × G samples), warm-up excluded, best of `--repeats`, configurations interleaved;
- the held-out strict score (76 test prompts × `--images` images, evaluation seed 0) and the strict
  score per second of sampling one image (strict × images/s): what a second of sampling buys.

Prints a table and writes benchmarks/results/masked_vs_ar.json.

    python benchmarks/bench_masked_vs_ar.py [--batch 32] [--steps 4,8,12] [--images 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time

import torch

from t2i_gcpo.policies.base import PromptRecord
from t2i_gcpo.policies.registry import load_policy
from t2i_gcpo.tasks.loop import group_generators, sampler_precision
from t2i_gcpo.worlds.shapeworld import make_splits

PROMPT = "a photo of a red circle and a blue square"


def configurations(steps: list[int]) -> list[tuple[str, object, object]]:
    """(label, policy, sampling) per sampler."""
    ar = load_policy("shapeworld").eval()
    masked = load_policy("shapeworld-masked").eval()
    rows = [("AR, 64 steps (KV cache)", ar, ar.default_sampling())]
    for s in steps:
        rows.append((f"masked, {s} steps", masked, dataclasses.replace(masked.default_sampling(), steps=s)))
    return rows


def time_rollouts(configs, batch: int, group: int, repeats: int) -> dict[str, float]:
    """Best-of-`repeats` seconds of one rollout of `batch` images (batch // group prompts × group) per
    (label, policy, sampling) configuration; one warm-up rollout each; configurations interleaved."""
    prompts = [PromptRecord(PROMPT)] * (batch // group)
    best = {label: float("inf") for label, _, _ in configs}
    with torch.no_grad():
        for _, policy, sampling in configs:  # warm-up
            with sampler_precision(policy, sampling):
                policy.rollout(prompts[:1], 2, sampling, group_generators(0, "bench", range(1)))
        for r in range(repeats):
            for label, policy, sampling in configs:
                gens = group_generators(r, "bench", range(len(prompts)))
                t = time.perf_counter()
                with sampler_precision(policy, sampling):  # sampling.autocast="bf16": the bf16 sampler
                    policy.rollout(prompts, group, sampling, gens)
                if policy.device.type == "cuda":
                    torch.cuda.synchronize()
                best[label] = min(best[label], time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32, help="images per rollout (prompts × group)")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--steps", default="4,8,12", help="masked decoding steps to compare")
    ap.add_argument("--images", type=int, default=4, help="images per held-out prompt for the score")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "masked_vs_ar.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    configs = configurations([int(s) for s in args.steps.split(",")])
    secs = time_rollouts(configs, args.batch, args.group, args.repeats)
    _, test = make_splits()
    rows = []
    for label, policy, sampling in configs:
        res = evaluate_at(policy, test, args.images, sampling)
        ips = args.batch / secs[label]
        rows.append(
            {
                "sampler": label,
                "steps": sampling.steps or policy.num_tokens,
                "cfg": sampling.guidance_scale,
                "seconds": secs[label],
                "images_per_s": ips,
                "strict": res["strict"],
                "partial": res["partial"],
                "strict_per_sampling_second": res["strict"] * ips,
            }
        )
    print(
        f"ShapeWorld samplers, batch {args.batch} with CFG, {args.threads} threads; held-out strict at "
        f"{args.images} images × {len(test)} prompts"
    )
    print(f"{'sampler':<26} {'images/s':>9} {'strict':>7} {'partial':>8} {'strict·images/s':>16}")
    for r in rows:
        print(
            f"{r['sampler']:<26} {r['images_per_s']:>9.1f} {r['strict']:>7.3f} {r['partial']:>8.3f} "
            f"{r['strict_per_sampling_second']:>16.1f}"
        )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(
            {
                "question": "masked vs AR sampling: images/s at equal batch and held-out strict per "
                "second of sampling",
                "batch": args.batch,
                "group": args.group,
                "images_per_prompt": args.images,
                "threads": args.threads,
                "torch": torch.__version__,
                "machine": platform.processor() or platform.machine(),
                "load_average_1min": os.getloadavg()[0],
                "results": rows,
            },
            f,
            indent=2,
        )
    print(f"wrote {args.out}")


def evaluate_at(policy, test, images: int, sampling) -> dict:
    """The task's held-out evaluation (seed 0) at explicit sampling settings (decoding steps included)."""
    from t2i_gcpo.rewards.forms.shapeworld import ShapeWorldReward
    from t2i_gcpo.tasks.geneval import GenEvalTask

    task = GenEvalTask("shapeworld", "shapeworld", default_reward="shapeworld")
    prompts = [PromptRecord(m["prompt"], meta=m) for m in test]
    reward = ShapeWorldReward(grid=tuple(policy.layout.grid))
    return task.evaluate(policy, reward, prompts, images, sampling, 0, None, False, 16)


if __name__ == "__main__":
    main()
