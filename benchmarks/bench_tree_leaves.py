"""How much do a tree group's leaves tell apart from independent samples? Agreement of leaves with their root.

Question (docs/study.md#pre-registered): the `tree` preset trains on every leaf of a prefix tree — per
prompt G₀ roots, each branched at k points with n continuations, G₀·(1 + k·n) leaves — and at equal
samples it lost to DAPO with groups of that size. A continuation re-makes only the decisions after its
branch point, so its reward tends to be its root's. Measure, on the preset's own sampling and branching:

- how often a continuation's reward equals its root's, against how often two independent samples of the
  same prompt agree (binary rewards: arithmetic; on other worlds "equal" is equal to 1e-6);
- the intraclass correlation ρ of rewards within a root's family (the root and its k·n continuations,
  one-way ANOVA estimator, prompt means removed) and the design effect 1 + (m − 1)ρ, m = 1 + k·n: a tree
  group of N leaves carries about as much information about its prompt's pass rate as N / (1 + (m − 1)ρ)
  independent samples;
- the share of groups with reward spread (what an advantage needs): tree groups against groups of as
  many independent samples.

    python benchmarks/bench_tree_leaves.py [--model arithmetic] [--batches 6] [--out FILE]

Writes benchmarks/results/tree_leaves.json (`--out` to write elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from t2i_gcpo.config import load_config  # noqa: E402
from t2i_gcpo.policies.base import SamplingParams  # noqa: E402
from t2i_gcpo.policies.registry import load_policy  # noqa: E402
from t2i_gcpo.rewards.registry import build_reward  # noqa: E402
from t2i_gcpo.tasks.loop import group_generators, sample_and_score  # noqa: E402
from t2i_gcpo.tasks.registry import get_task  # noqa: E402
from t2i_gcpo.train.branches import grow_leaves  # noqa: E402
from t2i_gcpo.train.credit import TRAIN_CONTEXT  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "tree_leaves.json"


def family_icc(families: list[list[float]]) -> float:
    """One-way ANOVA intraclass correlation of equal-sized families (rows: one family's rewards)."""
    m, g = len(families[0]), len(families)
    means = [statistics.fmean(f) for f in families]
    grand = statistics.fmean(means)
    msb = m * sum((x - grand) ** 2 for x in means) / (g - 1)
    msw = sum((r - mu) ** 2 for f, mu in zip(families, means) for r in f) / (g * (m - 1))
    return (msb - msw) / (msb + (m - 1) * msw) if msb + (m - 1) * msw > 0 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="arithmetic")
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--prompts-per-batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64, help="As the study's arithmetic runs.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()

    cfg = load_config("tree")
    policy = load_policy(args.model)
    task = get_task(policy.default_task, policy)
    prompts = task.load_prompts(task.default_train_prompts())
    reward = build_reward(task.default_reward, grid=policy.layout.grid)
    sampling = SamplingParams(temperature=cfg.rollout.temperature, max_new_tokens=args.max_new_tokens)
    G0, n, k = cfg.rollout.group_size, cfg.branching.continuations, cfg.branching.k
    m = 1 + k * n  # a root's family: the root and its continuations
    rng = random.Random(args.seed)
    same_root, same_indep, families, spread_tree, spread_indep = [], [], [], [], []
    for b in range(args.batches):
        batch = rng.sample(prompts, args.prompts_per_batch)
        P = len(batch)
        gens = group_generators(args.seed, "bench_tree_leaves", [(b, i) for i in range(P)])
        roots = sample_and_score(policy, reward, batch, G0, sampling, gens)
        grown = grow_leaves(
            policy,
            reward,
            roots.rollout,
            roots.outputs,
            roots.reward,
            [b * P + i for i in range(P)],
            cfg.branching,
            args.seed,
            sampling,
            TRAIN_CONTEXT[cfg.rollout.train_logp],
        )
        G = grown.rollout.group_size
        scores = grown.reward.scores.float().cpu().view(P, G)
        root_of = grown.leaves.root.view(P, G)
        is_root = grown.leaves.point.view(P, G) < 0
        fresh = sample_and_score(
            policy,
            reward,
            batch,
            G,
            sampling,
            group_generators(args.seed, "bench_tree_leaves/fresh", [(b, i) for i in range(P)]),
        )
        fresh_scores = fresh.reward.scores.float().cpu().view(P, G)
        for p in range(P):
            spread_tree.append(bool(scores[p].std() > 1e-6))
            spread_indep.append(bool(fresh_scores[p].std() > 1e-6))
            centre = scores[p].mean().item()  # the prompt's mean removed: ρ is about roots, not prompts
            for r in range(G0):
                fam = scores[p][root_of[p] == r]
                if len(fam) == m:
                    root = scores[p][(root_of[p] == r) & is_root[p]]
                    same_root += ((fam[1:] - root).abs() < 1e-6).tolist()
                    families.append([x - centre for x in fam.tolist()])
            f = fresh_scores[p]
            same_indep += [abs(f[i] - f[j]).item() < 1e-6 for i in range(G) for j in range(i + 1, G)]
        print(
            f"batch {b + 1}/{args.batches}: root reward {roots.reward.scores.float().mean():.3f}, "
            f"{grown.samples} continuations",
            flush=True,
        )
    rho = family_icc(families)
    result = {
        "model": args.model,
        "preset": "tree",
        "roots_per_prompt": G0,
        "points": k,
        "continuations": n,
        "leaves_per_group": G0 * m,
        "batches": args.batches,
        "prompts_per_batch": args.prompts_per_batch,
        "continuation_equals_root": statistics.fmean(same_root),
        "independent_pair_equal": statistics.fmean(same_indep),
        "family_icc": rho,
        "design_effect": 1 + (m - 1) * rho,
        "effective_samples_per_group": G0 * m / (1 + (m - 1) * rho),
        "groups_with_spread_tree": statistics.fmean(spread_tree),
        "groups_with_spread_independent": statistics.fmean(spread_indep),
        "torch_threads": torch.get_num_threads(),
    }
    print(
        f"\n{args.model}, tree preset ({G0} roots × (1 + {k}·{n}) = {G0 * m} leaves a prompt), "
        f"{len(spread_tree)} groups:\n"
        f"  a continuation's reward equals its root's: {result['continuation_equals_root']:.3f} "
        f"(two independent samples of a prompt: {result['independent_pair_equal']:.3f})\n"
        f"  within-family correlation ρ = {rho:.3f}; design effect {result['design_effect']:.2f}: "
        f"{G0 * m} leaves ≈ {result['effective_samples_per_group']:.1f} independent samples\n"
        f"  groups with reward spread: tree {result['groups_with_spread_tree']:.3f}, "
        f"{G0 * m} independent samples {result['groups_with_spread_independent']:.3f}"
    )
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
