"""How much of one RL step's gradient is signal? Gradient agreement across independent batches.

Question: token credit exists to cut the noise that a sequence-level advantage spreads over every
token. How noisy is one training step's gradient on ShapeWorld, and how much does each credit
scheme clean it? Measure: draw `--batches` independent rollout batches the way training does
(P prompts from the train set × G samples, CFG 3, T = 1), compute the clipped-loss gradient at
ratio 1 (one on-policy step, token-mean) under each scheme, and report the mean pairwise cosine c
between the batches' gradients. With per-batch gradient g = μ + noise, c ≈ |μ|² / (|μ|² + σ²/B),
so c is the fraction of a step that points the same way as the next step, and B·(1 − c)/c is the
number of samples whose averaged gradient would be half signal.

Schemes: uniform (GRPO/DAPO), gcpo (hist), stage, and `object` — an oracle that puts all credit on
the tokens covering the prompt's detected objects (ShapeWorld ground truth; not an algorithm, a
reference for what perfect spatial credit would buy). Trained distribution: cond (default) or cfg.

    python benchmarks/bench_gradient_snr.py [--model shapeworld] [--batches 10]

Writes benchmarks/results/gradient_snr.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from t2i_gcpo.config import (
    REPO_PROMPTS,  # noqa: E402
    GCPOConfig,  # noqa: E402
)
from t2i_gcpo.core.advantages import group_advantages  # noqa: E402
from t2i_gcpo.core.credit import gcpo_weights, stage_weights, uniform_weights  # noqa: E402
from t2i_gcpo.core.losses import policy_loss  # noqa: E402
from t2i_gcpo.policies.registry import load_policy  # noqa: E402
from t2i_gcpo.rewards.shapeworld import ShapeWorldReward  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "gradient_snr.json"
VARIANTS = [("uniform", "cond"), ("gcpo", "cond"), ("stage", "cond"), ("object", "cond"),
            ("uniform", "cfg"), ("gcpo", "cfg")]  # fmt: skip


def weights(scheme: str, policy, ro, adv: torch.Tensor, details: list[dict], group: int) -> torch.Tensor:
    if scheme == "uniform":
        return uniform_weights(ro.mask)
    if scheme == "gcpo":  # the preset's settings (official hist schedule)
        g = GCPOConfig()
        return gcpo_weights(
            ro.logp_cond, ro.logp_uncond, ro.mask, g.normalization, g.top_fraction, g.top_mass, g.tau
        )
    if scheme == "stage":
        return stage_weights(policy.code_embeddings(ro), adv, group, ro.mask)
    grid = torch.stack([torch.as_tensor(d["object_grid"]).reshape(-1) for d in details]).float()  # [B, T]
    return grid * ro.mask.sum(-1, keepdim=True) / grid.sum(-1, keepdim=True).clamp_min(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="shapeworld")
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--prompts-per-batch", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--cfg", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.batches < 3:
        ap.error("--batches must be at least 3 (the spread of the pairwise cosines needs 2+ pairs)")

    policy = load_policy(args.model)
    reward = ShapeWorldReward()
    params = [p for n, p in policy.named_parameters() if p.requires_grad and not n.startswith("vq.")]
    meta = [json.loads(line) for line in (REPO_PROMPTS / "shapeworld_train.jsonl").read_text().splitlines()]
    rng = random.Random(args.seed)
    grads: dict[tuple[str, str], list[torch.Tensor]] = {v: [] for v in VARIANTS}
    rewards = []
    for b in range(args.batches):
        batch = rng.sample(meta, args.prompts_per_batch)
        g = torch.Generator().manual_seed(args.seed * 1000 + b)
        with torch.no_grad():
            ro = policy.rollout([m["prompt"] for m in batch], args.group, args.cfg, 1.0, generator=g)
            out = reward(policy.decode(ro), ro.prompts, [m for m in batch for _ in range(args.group)])
        rewards.append(out.scores.mean().item())
        adv = group_advantages(out.scores, args.group)
        logps = {ctx: policy(ro, context=ctx) for ctx in {c for _, c in VARIANTS}}  # one forward per context
        for scheme, ctx in VARIANTS:
            w = weights(scheme, policy, ro, adv, out.details, args.group)
            logp = logps[ctx]
            loss, _ = policy_loss(logp, logp.detach(), adv, ro.mask, weights=w, aggregation="token-mean")
            gs = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
            grads[(scheme, ctx)].append(
                torch.cat(
                    [(x if x is not None else torch.zeros_like(p)).flatten() for x, p in zip(gs, params)]
                )
            )
        print(f"batch {b + 1}/{args.batches}: reward {rewards[-1]:.3f}", flush=True)

    n = args.prompts_per_batch * args.group
    rows = {}
    print(f"\n{n} samples per batch, {args.batches} batches, {args.batches * (args.batches - 1) // 2} pairs")
    print(f"{'scheme':10s} {'trains':6s} {'cos mean':>9s} {'± s.e.':>7s} {'samples for half signal':>24s}")
    for scheme, ctx in VARIANTS:
        cos = [torch.nn.functional.cosine_similarity(a, b, 0).item()
               for a, b in itertools.combinations(grads[(scheme, ctx)], 2)]  # fmt: skip
        c = statistics.mean(cos)
        se = statistics.stdev(cos) / len(cos) ** 0.5
        need = n * (1 - c) / c if c > 0 else float("inf")
        rows[f"{scheme}/{ctx}"] = {
            "cos_mean": c,
            "cos_se": se,
            "samples_for_half_signal": need,
            "pairs": len(cos),
        }
        print(f"{scheme:10s} {ctx:6s} {c:9.4f} {se:7.4f} {need:24.0f}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"config": vars(args), "mean_reward": statistics.mean(rewards), "variants": rows}, indent=1
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
