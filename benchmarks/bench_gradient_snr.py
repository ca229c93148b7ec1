"""How much of one RL step's gradient is signal? Gradient agreement across independent batches.

Question: token credit exists to cut the noise that a sequence-level advantage spreads over every
token. How noisy is one training step's gradient on ShapeWorld, and how much does each credit
scheme clean it? Measure: draw `--batches` independent rollout batches the way training does
(P prompts from the train set × G samples, CFG 3, T = 1, one generator per prompt), compute the
clipped-loss gradient at ratio 1 (one on-policy step, token-mean) under each scheme, and report the
mean pairwise cosine c between the batches' gradients. With per-batch gradient g = μ + noise,
c ≈ |μ|² / (|μ|² + σ²/B), so c is the fraction of a step that points the same way as the next step,
and B·(1 − c)/c is the number of samples whose averaged gradient would be half signal.

Schemes come from the credit registry (t2i_gcpo/core/schemes.py) with the schema's default options,
fetched the way the train step fetches them (t2i_gcpo/train/credit.py): uniform (GRPO/DAPO), gcpo
(hist), stage, critical (critical-token credit, zghhui/GCPO — not this package's gcpo), and
`object` — an oracle that puts all credit on the tokens covering the prompt's detected objects
(ShapeWorld ground truth; not an algorithm, a reference for what perfect spatial credit would buy).
Trained distribution (rollout.train_logp): cond (the positive context) or cfg (the guided one).

    python benchmarks/bench_gradient_snr.py [--model shapeworld] [--batches 10]

Writes benchmarks/results/gradient_snr.json (`--out` to write elsewhere).
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

from t2i_gcpo.config import REPO_PROMPTS, CreditConfig  # noqa: E402
from t2i_gcpo.core.advantages import group_advantages  # noqa: E402
from t2i_gcpo.core.losses import policy_loss  # noqa: E402
from t2i_gcpo.policies.base import SamplingParams  # noqa: E402
from t2i_gcpo.policies.registry import load_policy  # noqa: E402
from t2i_gcpo.rewards.shapeworld import ShapeWorldReward  # noqa: E402
from t2i_gcpo.tasks.loop import group_generators, sample_and_score  # noqa: E402
from t2i_gcpo.tasks.registry import get_task  # noqa: E402
from t2i_gcpo.train.credit import TRAIN_CONTEXT, compute_weights  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "gradient_snr.json"
VARIANTS = [("uniform", "cond"), ("gcpo", "cond"), ("stage", "cond"), ("critical", "cond"), ("object", "cond"),
            ("uniform", "cfg"), ("gcpo", "cfg"), ("critical", "cfg")]  # fmt: skip


def object_weights(ro, details: list[dict]) -> torch.Tensor:
    """The oracle: all credit on the tokens covering detected prompt objects, mass-preserving."""
    grid = torch.stack([torch.as_tensor(d["object_grid"]).reshape(-1) for d in details]).float()  # [B, T]
    grid = grid.to(ro.mask.device) * ro.mask
    return grid * ro.mask.sum(-1, keepdim=True) / grid.sum(-1, keepdim=True).clamp_min(1)


def weights(scheme: str, credit: CreditConfig, policy, ro, adv: torch.Tensor, details: list[dict],
            context: str, dists) -> torch.Tensor:  # fmt: skip
    if scheme == "object":
        return object_weights(ro, details)
    return compute_weights(credit, ro, adv, policy, None, context, dists, name=scheme)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="shapeworld")
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--prompts-per-batch", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--cfg", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    if args.batches < 3:
        ap.error("--batches must be at least 3 (the spread of the pairwise cosines needs 2+ pairs)")

    policy = load_policy(args.model)
    reward = ShapeWorldReward(grid=tuple(policy.layout.grid))
    credit = CreditConfig()  # every scheme's default options (gcpo: the official hist schedule)
    sampling = SamplingParams(temperature=1.0, guidance_scale=args.cfg)
    params = [p for n, p in policy.named_parameters() if p.requires_grad and not n.startswith("vq.")]
    prompts = get_task("shapeworld").load_prompts(REPO_PROMPTS / "shapeworld_train.jsonl")
    rng = random.Random(args.seed)
    grads: dict[tuple[str, str], list[torch.Tensor]] = {v: [] for v in VARIANTS}
    rewards = []
    for b in range(args.batches):
        batch = rng.sample(prompts, args.prompts_per_batch)
        gens = group_generators(args.seed, "bench_gradient_snr", [(b, i) for i in range(len(batch))])
        scored = sample_and_score(policy, reward, batch, args.group, sampling, gens)
        ro, out = scored.rollout, scored.reward
        rewards.append(out.scores.mean().item())
        adv = group_advantages(out.scores, args.group)
        # one forward per trained context: log-probs with gradient and its full distributions
        forwards = {c: policy(ro, context=TRAIN_CONTEXT[c], dists=True) for c in {c for _, c in VARIANTS}}
        for scheme, ctx in VARIANTS:
            logp, dists = forwards[ctx]
            w = weights(scheme, credit, policy, ro, adv, out.details, TRAIN_CONTEXT[ctx], dists)
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
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "config": {k: v for k, v in vars(args).items() if k != "out"},
                "mean_reward": statistics.mean(rewards),
                "variants": rows,
            },
            indent=1,
        )
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
