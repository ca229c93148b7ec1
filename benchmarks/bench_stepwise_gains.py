"""Where does a masked sample's reward get decided, and what credit does `stepwise` hand out for it?

Question (docs/study.md#pre-registered): `stepwise` credits the tokens revealed at reveal step s with the gain
r(x̂_s) − r(x̂_{s−1}) of the model's full prediction x̂_s, standardised across the group at that step; DAPO gives
every token of a sample its one group-relative advantage. Measure, on the study's sampling (the masked
ShapeWorld-32 prior, random reveal order, groups of 8):

- per reveal step s: the share of samples whose prediction's reward changes at s (g_{i,s} ≠ 0), the share of
  groups whose gains at s differ (the only ones whose tokens get a non-zero stepwise advantage), and the
  share of the final spread decided there (mean |g_{i,s} − ḡ_s| over the sum over steps);
- how often x̂_0, the first prediction, already scores what the sample finally scores;
- the share of tokens with a non-zero advantage under each scheme, and how often a token's stepwise
  advantage has the sign of its sample's DAPO advantage (among the tokens where both are non-zero).

    python benchmarks/bench_stepwise_gains.py [--model shapeworld-masked] [--batches 6] [--out FILE]

Writes benchmarks/results/stepwise_gains.json (`--out` to write elsewhere).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from t2i_gcpo.config import load_config  # noqa: E402
from t2i_gcpo.core.advantages import group_advantages  # noqa: E402
from t2i_gcpo.core.stepwise import step_gains, stepwise_advantages  # noqa: E402
from t2i_gcpo.policies.registry import load_policy  # noqa: E402
from t2i_gcpo.policies.sampling import resolve_guidance_scale  # noqa: E402
from t2i_gcpo.rewards.registry import build_reward  # noqa: E402
from t2i_gcpo.tasks.loop import group_generators, sample_and_score  # noqa: E402
from t2i_gcpo.tasks.registry import get_task  # noqa: E402
from t2i_gcpo.train.credit import score_step_predictions  # noqa: E402
from t2i_gcpo.train.run_settings import resolve_autocast, sampling_params  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "stepwise_gains.json"


def step_statistics(step_rewards: torch.Tensor, group_size: int) -> dict[str, list[float]]:
    """Per reveal step s of r(x̂_s) [B, S]: the share of samples whose gain is non-zero, of groups whose gains
    differ, and the mean |centred gain| (the share of the spread decided at s, before normalising)."""
    B, S = step_rewards.shape
    g = step_gains(step_rewards, group_size).view(-1, group_size, S)  # [P, G, S]
    centred = (g - g.mean(dim=1, keepdim=True)).abs()
    return {
        "changes": (g.abs() > 1e-6).double().mean(dim=(0, 1)).tolist(),
        "groups_differ": (g.std(dim=1) > 1e-6).double().mean(dim=0).tolist(),
        "abs_centred_gain": centred.mean(dim=(0, 1)).tolist(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model", default="shapeworld-masked", help="A masked family (or its checkpoint folder)."
    )
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--prompts-per-batch", type=int, default=8)
    ap.add_argument("--reveal-order", default="random", help="As the study's masked runs.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()

    cfg = load_config("stepwise", overrides=(f"rollout.reveal_order={args.reveal_order}",))
    policy = load_policy(args.model)
    task = get_task(policy.default_task, policy)
    prompts = task.load_prompts(task.default_train_prompts())
    reward = build_reward(task.default_reward, grid=policy.layout.grid)
    cfg.rollout.cfg_scale = resolve_guidance_scale(policy, cfg.rollout.cfg_scale)  # as train/run.py
    resolve_autocast(
        cfg, "cuda" if torch.cuda.is_available() else "cpu", policy
    )  # 'auto': bf16 where the CPU has it natively (as a run here)
    sampling = dataclasses.replace(sampling_params(cfg), record_predictions=True)
    G = cfg.rollout.group_size
    rng = random.Random(args.seed)
    per_step: list[dict[str, list[float]]] = []
    first_is_final, nonzero_step, nonzero_dapo, agree = [], [], [], []
    for b in range(args.batches):
        batch = rng.sample(prompts, args.prompts_per_batch)
        P = len(batch)
        gens = group_generators(args.seed, "bench_stepwise_gains", [(b, i) for i in range(P)])
        scored = sample_and_score(policy, reward, batch, G, sampling, gens)
        ro, final = scored.rollout, scored.reward.scores.float().cpu()
        r, _, _ = score_step_predictions(policy, reward, ro, final)
        per_step.append(step_statistics(r, G))
        first_is_final += ((r[:, 0] - r[:, -1]).abs() < 1e-6).tolist()
        mask = ro.loss_mask.cpu().bool()
        a_step = stepwise_advantages(
            r, G, ro.step.cpu(), mask.float(), cfg.credit.options_for("stepwise")["normalisation"]
        )
        a_dapo = group_advantages(final, G)[:, None].expand_as(a_step)
        nz_s, nz_d = (a_step.abs() > 1e-9) & mask, (a_dapo.abs() > 1e-9) & mask
        nonzero_step.append(nz_s.sum().item() / mask.sum().item())
        nonzero_dapo.append(nz_d.sum().item() / mask.sum().item())
        both = nz_s & nz_d
        if both.any():
            agree.append(((a_step.sign() == a_dapo.sign()) & both).sum().item() / both.sum().item())
        print(
            f"batch {b + 1}/{args.batches}: reward {final.mean():.3f}, {r.shape[1]} reveal steps", flush=True
        )
    S = len(per_step[0]["changes"])
    mean_over = {k: [statistics.fmean(p[k][s] for p in per_step) for s in range(S)] for k in per_step[0]}
    total = sum(mean_over["abs_centred_gain"]) or float("nan")
    result = {
        "model": args.model,
        "reveal_order": args.reveal_order,
        "group_size": G,
        "reveal_steps": S,
        "batches": args.batches,
        "prompts_per_batch": args.prompts_per_batch,
        "normalisation": cfg.credit.options_for("stepwise")["normalisation"],
        "step_prediction_changes_reward": mean_over["changes"],
        "groups_with_differing_gains": mean_over["groups_differ"],
        "share_of_spread_decided": [x / total for x in mean_over["abs_centred_gain"]],
        "first_prediction_scores_final": statistics.fmean(first_is_final),
        "tokens_nonzero_stepwise": statistics.fmean(nonzero_step),
        "tokens_nonzero_dapo": statistics.fmean(nonzero_dapo),
        "sign_agrees_with_dapo": statistics.fmean(agree) if agree else float("nan"),
        "torch_threads": torch.get_num_threads(),
    }
    fmt = lambda xs: " ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    print(
        f"\n{args.model}, {args.reveal_order} order, groups of {G}, {S} reveal steps, "
        f"{args.batches * args.prompts_per_batch} groups:\n"
        f"  prediction's reward changes at step s:  {fmt(result['step_prediction_changes_reward'])}\n"
        f"  groups whose gains differ at s:         {fmt(result['groups_with_differing_gains'])}\n"
        f"  share of the spread decided at s:       {fmt(result['share_of_spread_decided'])}\n"
        f"  x̂_0 already scores the final reward: {result['first_prediction_scores_final']:.3f}\n"
        f"  tokens with a non-zero advantage: stepwise {result['tokens_nonzero_stepwise']:.3f}, "
        f"DAPO {result['tokens_nonzero_dapo']:.3f}; sign agrees with DAPO's "
        f"{result['sign_agrees_with_dapo']:.3f}"
    )
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
