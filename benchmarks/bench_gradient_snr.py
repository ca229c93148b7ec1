"""How much of one RL step's gradient is signal? Gradient agreement across independent batches.

Question: token credit exists to cut the noise that a sequence-level advantage spreads over every
token. How noisy is one training step's gradient, and how much does each credit scheme clean it?
Measure: draw `--batches` independent rollout batches the way training does (P prompts from the
train set × G samples, the preset's sampling: CFG from the checkpoint, T = 1, one generator per
prompt), compute the clipped-loss gradient at ratio 1 (one on-policy step, token-mean) under each
scheme, and report the mean pairwise cosine c between the batches' gradients. With per-batch gradient
g = μ + noise, c ≈ |μ|² / (|μ|² + σ²/B), so c is the fraction of a step that points the same way as
the next step, and B·(1 − c)/c is the number of samples whose averaged gradient would be half signal.

Schemes are the presets of the credit study (configs/<algo>.yaml: each preset's credit options and
trained distribution, fetched the way the train step fetches them, t2i_gcpo/train/credit.py): dapo
(uniform), gcpo, dgpo, stage, critical (critical-token credit, zghhui/GCPO — not this package's gcpo),
and the tree-credit presets eg-grpo, tempo and vine (docs/concepts/tree_credit.md; balanced is dapo's
credit with another minibatch split, which one gradient at ratio 1 cannot tell apart: not measured).
A scheme that returns token advantages (tempo, vine) gives the loss Â [B, T], as the train step's
update does. Vine branches the batch the way the train step does (the groups with signal, through
train/branches.grow, the continuations keyed by the batch's group keys) and scores extra samples: each
row reports the samples scored per batch S (continuations included) and S·(1 − c)/c, the scored
samples for half signal, which compares signal per scored sample across schemes. And `oracle`, a
reference for what perfect credit would buy, not an algorithm: on ShapeWorld all credit on the tokens
covering the prompt's detected objects (ground truth), on arithmetic all of a wrong solution's credit
on its first wrong step (correct solutions uniform). With CFG the uniform and gcpo schemes are also
measured training the guided distribution (`/cfg`).

Any model the trainer takes: the shipped ones (shapeworld, shapeworld-masked, arithmetic) or a
checkpoint folder, e.g. a study run's last step, with the model it started from as `--reference`
(DGPO's Hellinger deviation is zero while the policy is its reference: on the base model DGPO's
weights are its entropy gate alone).

    python benchmarks/bench_gradient_snr.py [--model shapeworld] [--batches 10]
    python benchmarks/bench_gradient_snr.py --model arithmetic --batches 10 --out /tmp/snr_text.json
    python benchmarks/bench_gradient_snr.py --model shapeworld-masked --reveal-order random \
        --out /tmp/snr_masked.json
    python benchmarks/bench_gradient_snr.py --model runs/study/sw32-ar/dapo/seed0/checkpoints/latest/model \
        --reference shapeworld --batches 10 --out /tmp/snr_trained.json

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

from t2i_gcpo.config import load_config  # noqa: E402
from t2i_gcpo.core.advantages import dynamic_sampling_filter, group_advantages  # noqa: E402
from t2i_gcpo.core.losses import policy_loss  # noqa: E402
from t2i_gcpo.core.schemes import get_scheme  # noqa: E402
from t2i_gcpo.core.tree import Tree  # noqa: E402
from t2i_gcpo.policies.base import SamplingParams  # noqa: E402
from t2i_gcpo.policies.registry import load_policy  # noqa: E402
from t2i_gcpo.policies.sampling import resolve_guidance_scale  # noqa: E402
from t2i_gcpo.rewards.registry import build_reward  # noqa: E402
from t2i_gcpo.stats import standard_error  # noqa: E402
from t2i_gcpo.tasks.arithmetic import first_wrong_step_mask  # noqa: E402
from t2i_gcpo.tasks.geneval import object_grids  # noqa: E402
from t2i_gcpo.tasks.loop import group_generators, sample_and_score  # noqa: E402
from t2i_gcpo.tasks.registry import get_task  # noqa: E402
from t2i_gcpo.train.branches import Grown, grow  # noqa: E402
from t2i_gcpo.train.credit import TRAIN_CONTEXT, compute_weights, returns_advantages  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "gradient_snr.json"
PRESETS = ("dapo", "gcpo", "dgpo", "stage", "critical", "eg-grpo", "tempo", "vine")


def oracle_target(task, ro, details: list[dict]) -> torch.Tensor | None:
    """[B, T] bool: the tokens perfect credit would pick (module docstring); None if the task has none."""
    grid = object_grids(details, ro.tokens.shape[1])
    if grid is None and task.name == "arithmetic":
        grid = first_wrong_step_mask(task.tokenizer, ro, details)
        grid[~grid.any(-1)] = True  # correct solutions (and ones with no located mistake): uniform
    return grid


def oracle_weights(target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """All credit on `target`, mass-preserving: each sequence's weights sum to its token count."""
    grid = target.to(mask.device).float() * mask
    return grid * mask.sum(-1, keepdim=True) / grid.sum(-1, keepdim=True).clamp_min(1)


def branched_groups(
    cfg, policy, reward, ro, scores: torch.Tensor, batch_key: int, seed: int, sampling: SamplingParams
) -> tuple[torch.Tensor, Grown]:
    """(rows, continuations) of a scheme that needs branches, as the train step collects them
    (train/collect.py): the groups with signal when the preset samples dynamically, each branched with
    the run's branching settings, the continuations keyed by the batch's group keys (batch_key, group)."""
    G = ro.group_size
    keep = (
        dynamic_sampling_filter(scores, G)[0]
        if cfg.advantage.dynamic_sampling
        else torch.ones_like(scores, dtype=torch.bool)
    )
    rows = keep.nonzero().flatten()
    slots = [(batch_key, g) for g in (rows[::G] // G).tolist()]
    if not len(rows):  # no group with signal: nothing branched, nothing trained
        return rows, Grown(Tree.empty(0, cfg.branching.continuations), 0, 0)
    return rows, grow(
        policy,
        reward,
        ro.select(rows),
        slots,
        cfg.branching,
        seed,
        sampling,
        TRAIN_CONTEXT[cfg.rollout.train_logp],
    )


def token_credit(
    cfg,
    ro,
    adv: torch.Tensor,
    scores: torch.Tensor,
    policy,
    reference,
    ctx: str,
    dists,
    branched: tuple[torch.Tensor, Grown] | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(advantages, weights) that the train step's update (train/update.py) hands the loss for preset
    `cfg`: (A_i, w_it) for a weighting scheme, (Â_it, None) for one returning token advantages; a
    branching scheme's rows outside `branched` (groups without signal) are not trained: Â = 0."""
    cc = cfg.credit
    if branched is None:
        out = compute_weights(cc, ro, adv, policy, reference, ctx, dists, name=cc.scheme, rewards=scores)
    else:
        rows, grown = branched
        out = torch.zeros_like(ro.loss_mask, dtype=torch.float32)
        if len(rows):
            out[rows] = compute_weights(
                cc,
                ro.select(rows),
                adv[rows],
                policy,
                reference,
                ctx,
                name=cc.scheme,
                rewards=scores[rows],
                tree=grown.tree,
            ).to(out)
    return (out, None) if returns_advantages(cc.scheme) else (adv, out)


def variants(presets: dict, guided: bool) -> list[tuple[str, str]]:
    """(scheme, trained distribution) pairs: every preset on its own distribution, the oracle, and with
    CFG uniform and gcpo on the guided one."""
    out = [(algo, cfg.rollout.train_logp) for algo, cfg in presets.items()] + [("oracle", "cond")]
    return out + ([("dapo", "cfg"), ("gcpo", "cfg")] if guided else [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="shapeworld", help="Any --model the trainer takes.")
    ap.add_argument("--reference", default=None, help="DGPO's reference model [default: --model itself].")
    ap.add_argument(
        "--prompts", default=None, help="Training prompts [default: the task's shipped train set]."
    )
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--prompts-per-batch", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--cfg", type=float, default=None, help="Guidance scale [default: the checkpoint's].")
    ap.add_argument(
        "--reveal-order",
        choices=("confidence", "random"),
        default=None,
        help="Masked models: which positions each step reveals [default: the model's own].",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    if args.batches < 3:
        ap.error("--batches must be at least 3 (the spread of the pairwise cosines needs 2+ pairs)")

    policy = load_policy(args.model)
    reference = load_policy(args.reference) if args.reference else policy
    if args.reveal_order and not hasattr(policy, "resolve_reveal_order"):
        ap.error(f"--reveal-order applies to masked models only, not to --model {args.model}")
    task = get_task(policy.default_task, policy)
    train_file = args.prompts or task.default_train_prompts()
    if train_file is None:
        ap.error(f"give --prompts: there is no shipped train set for task {task.name!r}")
    prompts = task.load_prompts(train_file)
    reward = build_reward(task.default_reward, grid=policy.layout.grid)
    presets = {algo: load_config(algo) for algo in PRESETS}
    rollout_cfg = presets["dapo"].rollout
    guidance_scale = resolve_guidance_scale(policy, args.cfg)
    sampling = SamplingParams(
        temperature=rollout_cfg.temperature,
        guidance_scale=guidance_scale,
        max_new_tokens=rollout_cfg.max_new_tokens,
        reveal_order=args.reveal_order,
    )
    schemes = variants(presets, guided=guidance_scale != 1.0)
    params = [p for n, p in policy.named_parameters() if p.requires_grad and not n.startswith("vq.")]
    rng = random.Random(args.seed)
    grads: dict[tuple[str, str], list[torch.Tensor]] = {v: [] for v in schemes}
    scored_samples: dict[str, list[int]] = {s: [] for s, _ in schemes}  # per batch, continuations included
    rewards = []
    for b in range(args.batches):
        batch = rng.sample(prompts, args.prompts_per_batch)
        gens = group_generators(args.seed, "bench_gradient_snr", [(b, i) for i in range(len(batch))])
        scored = sample_and_score(policy, reward, batch, args.group, sampling, gens)
        ro, out = scored.rollout, scored.reward
        rewards.append(out.scores.mean().item())
        adv = group_advantages(out.scores, args.group)
        target = oracle_target(task, ro, out.details)
        branched = {  # presets whose scheme needs continuations (vine): their rows and tree
            algo: branched_groups(cfg, policy, reward, ro, out.scores, b, args.seed, sampling)
            for algo, cfg in presets.items()
            if "branches" in get_scheme(cfg.credit.scheme).needs
        }
        for scheme in scored_samples:
            extra = branched[scheme][1].samples if scheme in branched else 0
            scored_samples[scheme].append(len(ro) + extra)
        # one forward per trained context, one context at a time: its graph is freed before the next
        # (a masked model's trajectory forward holds the activations of every decoding step)
        for ctx in dict.fromkeys(c for _, c in schemes):
            logp, dists = policy.logprobs_and_dists(ro, TRAIN_CONTEXT[ctx])
            for scheme in (s for s, c in schemes if c == ctx):
                if scheme == "oracle":
                    if target is None:
                        continue
                    a, w = adv, oracle_weights(target, ro.loss_mask)
                else:
                    a, w = token_credit(
                        presets[scheme],
                        ro,
                        adv,
                        out.scores,
                        policy,
                        reference,
                        TRAIN_CONTEXT[ctx],
                        dists,
                        branched.get(scheme),
                    )
                loss, _ = policy_loss(
                    logp, logp.detach(), a, ro.loss_mask, weights=w, aggregation="token-mean"
                )
                gs = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
                grads[(scheme, ctx)].append(
                    torch.cat(
                        [(x if x is not None else torch.zeros_like(p)).flatten() for x, p in zip(gs, params)]
                    )
                )
            del logp, dists
        extra = "".join(f", {s} {grown.samples} continuations" for s, (_, grown) in branched.items())
        print(f"batch {b + 1}/{args.batches}: reward {rewards[-1]:.3f}{extra}", flush=True)

    n = args.prompts_per_batch * args.group
    rows = {}
    print(
        f"\n{args.model}: {n} samples per batch, {args.batches} batches, "
        f"{args.batches * (args.batches - 1) // 2} pairs, mean reward {statistics.mean(rewards):.3f}"
    )
    print(
        f"{'scheme':10s} {'trains':6s} {'cos mean':>9s} {'± s.e.':>7s} {'samples for half signal':>24s} "
        f"{'scored per batch':>17s} {'scored for half signal':>23s}"
    )
    for (scheme, ctx), g in grads.items():
        if len(g) < 2:  # the oracle on a task without one
            continue
        cos = [torch.nn.functional.cosine_similarity(a, b, 0).item() for a, b in itertools.combinations(g, 2)]
        c = statistics.mean(cos)
        se = standard_error(cos)
        need = n * (1 - c) / c if c > 0 else float("inf")
        scored = statistics.mean(scored_samples[scheme])  # = n unless the scheme branches
        scored_need = scored * (1 - c) / c if c > 0 else float("inf")
        rows[f"{scheme}/{ctx}"] = {
            "cos_mean": c,
            "cos_se": se,
            "samples_for_half_signal": need,
            "scored_per_batch": scored,
            "scored_for_half_signal": scored_need,
            "pairs": len(cos),
        }
        print(f"{scheme:10s} {ctx:6s} {c:9.4f} {se:7.4f} {need:24.0f} {scored:17.1f} {scored_need:23.0f}")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k != "out"} | {"cfg": guidance_scale, "task": task.name}
    path.write_text(
        json.dumps({"config": config, "mean_reward": statistics.mean(rewards), "variants": rows}, indent=1)
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
