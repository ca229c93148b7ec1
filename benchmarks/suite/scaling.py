"""Section `scaling`: step time against group size and against image tokens.

- Group size G at fixed prompts: GCPO trainers on the shipped ShapeWorld prior (benchmarks/
  bench_train_step.py's `make_trainer` / `round_robin`, dynamic sampling off), P prompts × G images per
  step; rollout, decode + reward and update times from the trainer, the step's wall time, peak memory
  growth of the update (rl_step's phase instrumentation).
- Image tokens T = 64 → 256 → 576 (8×8, 16×16, 24×24 grids): the ShapeWorld AR architecture with
  random weights (benchmarks/bench_sampler.py's `random_policy`), one rollout of P × G images with CFG 3
  and one update of the policy on it — teacher-forced log-probs, the clipped loss of
  t2i_gcpo/core/losses.py with random advantages, backward, an AdamW step. No reward: speed does not
  depend on it.
"""

from __future__ import annotations

import statistics
import tempfile

import torch

from benchmarks.suite.common import Context, PeakMemory, plural, timed
from benchmarks.suite.flops import teacher_forced_flops
from benchmarks.suite.samplers import shape_of

TITLE = "Scaling with group size and image tokens (`scaling`)"
PROMPT = "a photo of a red circle and a blue square"


def group_sweep(ctx: Context, sizes: list[int], prompts: int, steps: int) -> list[dict]:
    from benchmarks.bench_train_step import make_trainer, round_robin
    from benchmarks.suite.rl_step import instrument, update_flops

    with tempfile.TemporaryDirectory() as tmp:
        trainers, meters = {}, {}
        for g in sizes:
            over = [f"rollout.prompts_per_step={prompts}", f"rollout.group_size={g}"]
            trainers[g] = make_trainer("gcpo", "shapeworld", 1 + steps, over, f"{tmp}/g{g}")
            meters[g] = instrument(trainers[g], ctx.device)

        def after(g: int, row: dict) -> None:
            row["mem/update"] = meters[g].take().get("update")

        per_step = round_robin(trainers, steps, 1, after)
        flops = {g: update_flops(t) for g, t in trainers.items()}
    rows = []
    for g, rs in per_step.items():
        med = {
            p: statistics.median(r[f"time/{p}"] for r in rs) for p in ("rollout", "reward", "update", "step")
        }
        rows.append(
            {
                "sweep": "group size G",
                "value": g,
                "images": prompts * g,
                "tokens": 64,
                **{f"{p}_s": v for p, v in med.items()},
                "ms_per_image": 1000 * med["step"] / (prompts * g),
                "update_mb": max((r["mem/update"] or 0.0) for r in rs),
                "update_gflops": flops[g] / med["update"] / 1e9,
            }
        )
    return rows


def token_sweep(ctx: Context, sides: list[int], prompts: int, group: int, repeats: int) -> list[dict]:
    from benchmarks.bench_sampler import random_policy
    from t2i_gcpo.core.losses import policy_loss
    from t2i_gcpo.policies.base import PromptRecord, SamplingParams
    from t2i_gcpo.tasks.loop import group_generators

    sampling = SamplingParams(guidance_scale=3.0)
    meter = PeakMemory(ctx.device)
    rows = []
    for side in sides:
        policy = random_policy(side).to(ctx.device)
        opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-5)
        gen = torch.Generator().manual_seed(0)

        def rollout(p: int, seed: int, policy=policy):
            gens = group_generators(seed, "bench", range(p))
            return policy.rollout([PromptRecord(PROMPT)] * p, group, sampling, gens)

        def update(ro, policy=policy, opt=opt, gen=gen) -> None:
            policy.train()
            adv = torch.randn(len(ro), generator=gen).to(ctx.device)
            logp = policy.logprobs(ro, "pos")
            loss, _ = policy_loss(logp, ro.logp["pos"], adv, ro.mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            policy.eval()

        update(rollout(1, 0))  # warm-up: one small rollout and its update
        secs: dict[str, list[float]] = {"rollout": [], "update": []}
        mem = {"rollout": 0.0, "update": 0.0}
        for r in range(repeats):
            meter.start()
            s, ro = timed(lambda r=r: rollout(prompts, r + 1), ctx)
            secs["rollout"].append(s)
            mem["rollout"] = max(mem["rollout"], meter.stop() or 0.0)
            meter.start()
            s, _ = timed(lambda ro=ro: update(ro), ctx)
            secs["update"].append(s)
            mem["update"] = max(mem["update"], meter.stop() or 0.0)
        med = {k: statistics.median(v) for k, v in secs.items()}
        images, tokens = prompts * group, policy.num_tokens
        flops = 3 * teacher_forced_flops(shape_of(policy), policy.prefix_len, tokens, images)
        rows.append(
            {
                "sweep": "image tokens T",
                "value": tokens,
                "images": images,
                "tokens": tokens,
                "rollout_s": med["rollout"],
                "update_s": med["update"],
                "step_s": med["rollout"] + med["update"],
                "ms_per_image": 1000 * (med["rollout"] + med["update"]) / images,
                "update_mb": mem["update"],
                "update_gflops": flops / med["update"] / 1e9,
            }
        )
        del policy, opt
    return rows


def run(ctx: Context) -> dict:
    sizes = [4, 8, 16]
    prompts = ctx.pick(2, 4)
    g_rows = group_sweep(ctx, sizes, prompts, ctx.pick(1, 3))
    t_group = ctx.pick(2, 4)
    t_repeats = ctx.pick(1, 2)
    t_rows = token_sweep(ctx, [8, 16, 24], 2, t_group, t_repeats)
    rows = g_rows + t_rows
    g0, g1 = g_rows[0], g_rows[-1]
    t0, t1 = t_rows[0], t_rows[-1]
    ratio_t = t1["tokens"] / t0["tokens"]
    reading = (
        f"Group size: from G = {g0['value']} to {g1['value']} ({g0['images']} → {g1['images']} images "
        f"per step) the step time grows {g1['step_s'] / g0['step_s']:.1f}× for "
        f"{g1['images'] / g0['images']:.0f}× the images, so the time per image falls from "
        f"{g0['ms_per_image']:.0f} to {g1['ms_per_image']:.0f} ms: the batch amortises the sampler's "
        f"per-step overhead. Image tokens: from T = {t0['tokens']} to {t1['tokens']} ({ratio_t:.0f}× the "
        f"tokens, {t0['images']} images) the rollout grows {t1['rollout_s'] / t0['rollout_s']:.1f}× (T "
        f"sequential steps, step t attending over the P + t cached positions, so the cost per step grows "
        f"with T too) and the update {t1['update_s'] / t0['update_s']:.1f}× (one parallel forward + "
        f"backward; attention is quadratic in T, the rest linear); the update's peak memory growth goes from "
        f"{t0['update_mb']:.0f} to {t1['update_mb']:.0f} MB."
    )
    return {
        "title": TITLE,
        "timing": f"group size: median of {plural(ctx.pick(1, 3), 'GCPO step')} after 1 warm-up step, sizes "
        f"round-robin; image tokens: median of {t_repeats} × (rollout + update) after a warm-up rollout + "
        f"update of 2 images; memory: {PeakMemory.what(ctx.device)}",
        "columns": [
            ("sweep", "sweep"),
            ("value", "value"),
            ("images", "images"),
            ("tokens", "tokens/image"),
            ("rollout_s", "rollout s"),
            ("reward_s", "decode+reward s"),
            ("update_s", "update s"),
            ("step_s", "step s"),
            ("ms_per_image", "ms/image"),
            ("update_mb", "update peak MB"),
            ("update_gflops", "update GFLOP/s"),
        ],
        "rows": rows,
        "summary": {
            "group": {r["value"]: r["step_s"] for r in g_rows},
            "tokens": {r["value"]: r["step_s"] for r in t_rows},
        },
        "reading": reading,
    }
