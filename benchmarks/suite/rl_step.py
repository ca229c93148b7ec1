"""Section `rl_step`: one RL step per algorithm, split into rollout / decode + reward / update.

Trainers are built and stepped by benchmarks/bench_train_step.py (`make_trainer`, `round_robin`): the
shipped ShapeWorld prior, its prompts, dynamic sampling off (so every algorithm samples exactly one
batch of P prompts × 8 per step), the k-th step of every algorithm back to back. Times are the
trainer's own (``time/rollout``, ``time/reward`` = decode + reward, ``time/update``) and the wall time
of `Trainer.train_step`, median over the timed steps after the warm-up.

Peak memory per phase: the policy's ``rollout`` and the trainer's reward are wrapped so that the
phases rollout → reward (decode + score) → update (advantages, credit, loss, backward, optimizer) are
delimited; each phase's peak growth above its start is measured by `PeakMemory` (CPU: resident-set
high-water mark via /proc/self/clear_refs; CUDA: ``max_memory_allocated``); max over the timed steps.

Update FLOP/s: forward + backward ≈ 3 teacher-forced forwards of the trained context (2 rows per sample
for ``rollout.train_logp=cfg``), + 1 forward of the frozen reference when loss.beta > 0 (GRPO's KL) or
the scheme needs reference distributions (DGPO), + 2 single-row forwards when the GCPO contrast is
recomputed; × update_epochs (benchmarks/suite/flops.py for the forward count).
"""

from __future__ import annotations

import statistics
import tempfile
from typing import Any

from benchmarks.suite.common import Context, PeakMemory, PhaseMemory, plural
from benchmarks.suite.flops import teacher_forced_flops
from benchmarks.suite.samplers import shape_of
from t2i_gcpo.hardware import native_bf16

TITLE = "RL step per algorithm (`rl_step`)"
PHASES = ("rollout", "reward", "update")
TARGETS = {"gcpo": 1.05, "dgpo": 1.3}  # step time / DAPO's
FP32 = "dapo fp32"
FP32_SETS = ["rollout.autocast=none", "optim.autocast=none"]


class _ThenCall:
    """A reward that calls `then()` after scoring (everything else passes through)."""

    def __init__(self, inner: Any, then: Any) -> None:
        from t2i_gcpo.rewards.combine import reward_name

        self.__dict__.update(inner=inner, then=then, name=reward_name(inner))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        self.then()
        return out

    def __getattr__(self, key: str) -> Any:
        return getattr(self.__dict__["inner"], key)


def instrument(trainer: Any, device: str) -> PhaseMemory:
    """Delimit the step's phases: rollout starts with ``policy.rollout``, reward when it returns, update
    when the reward returns; the step's end closes it (`PhaseMemory.take`)."""
    from t2i_gcpo.train.distributed import unwrap

    meter = PhaseMemory(device)
    policy = unwrap(trainer.policy)
    inner = policy.rollout

    def rollout(*args: Any, **kwargs: Any) -> Any:
        meter.enter("rollout")
        out = inner(*args, **kwargs)
        meter.enter("reward")
        return out

    policy.rollout = rollout  # an instance attribute: this trainer's policy only
    trainer.reward = _ThenCall(trainer.reward, lambda: meter.enter("update"))
    return meter


def update_flops(trainer: Any) -> float:
    """≈ FLOPs of one step's update (see the module docstring)."""
    from t2i_gcpo.core.schemes import get_scheme
    from t2i_gcpo.train.distributed import unwrap

    cfg, policy = trainer.cfg, unwrap(trainer.policy)
    samples = trainer.collector.local_prompts * cfg.rollout.group_size
    one = teacher_forced_flops(shape_of(policy), policy.prefix_len, policy.num_tokens, samples)
    rows = 2 if cfg.rollout.train_logp == "cfg" else 1
    needs = get_scheme(cfg.credit.scheme).needs
    forwards = 3 * rows + rows * (cfg.loss.beta > 0) + rows * ("ref_dists" in needs)
    forwards += 2 * ("contrast" in needs and cfg.credit.contrast == "recompute")
    return cfg.optim.update_epochs * forwards * one


def run(ctx: Context) -> dict:
    from benchmarks.bench_train_step import make_trainer, round_robin
    from t2i_gcpo.train.distributed import unwrap

    algos = ctx.pick(
        ["grpo", "dapo", "gcpo", "dgpo"], ["grpo", "dapo", "gcpo", "dgpo", "gcpo-official", "critical"]
    )
    prompts = ctx.pick(4, 8)
    steps, warmup = ctx.pick(2, 5), 1
    overrides = [f"rollout.prompts_per_step={prompts}"]
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {a: make_trainer(a, "shapeworld", warmup + steps, overrides, tmp) for a in algos}
        if native_bf16(ctx.device):  # the presets sample and update in bf16 here ('auto'): DAPO in fp32 too
            trainers[FP32] = make_trainer(
                "dapo", "shapeworld", warmup + steps, [*overrides, *FP32_SETS], tmp, FP32
            )
        meters = {a: instrument(t, ctx.device) for a, t in trainers.items()}

        def after(algo: str, row: dict) -> None:
            row.update({f"mem/{k}": v for k, v in meters[algo].take().items()})

        per_step = round_robin(trainers, steps, warmup, after)
        flops = {a: update_flops(t) for a, t in trainers.items()}
        group = trainers[algos[0]].cfg.rollout.group_size
        policy = unwrap(trainers[algos[0]].policy)
        tokens, params = policy.num_tokens, shape_of(policy).params
    peak = ctx.fp32_peak()
    rows = []
    for a, rs in per_step.items():
        med = {p: statistics.median(r[f"time/{p}"] for r in rs) for p in (*PHASES, "step")}
        mem = {p: max((r.get(f"mem/{p}") or 0.0) for r in rs) for p in PHASES}
        gflops = flops[a] / med["update"] / 1e9
        rows.append(
            {
                "algo": a,
                **{f"{p}_s": v for p, v in med.items()},
                **{f"{p}_mb": v for p, v in mem.items()},
                "update_gflops": gflops,
                "update_peak_pct": 100 * gflops / peak,
            }
        )
    by = {r["algo"]: r for r in rows}
    base = by.get("dapo", {}).get("step_s")
    checks = {}
    for r in rows:
        r["vs_dapo"] = r["step_s"] / base if base else None
    for a, target in TARGETS.items():
        if a in by and base:
            checks[a] = {"ratio": by[a]["vs_dapo"], "target": target, "pass": by[a]["vs_dapo"] <= target}
            print(
                f"    {a.upper()}/DAPO step time {by[a]['vs_dapo']:.3f}× (target ≤ {target}×): "
                f"{'PASS' if checks[a]['pass'] else 'FAIL'}",
                flush=True,
            )
    verdicts = "; ".join(
        f"{a.upper()}/DAPO {c['ratio']:.2f}× (target ≤ {c['target']}×: {'pass' if c['pass'] else 'FAIL'})"
        for a, c in checks.items()
    )
    d = by.get("dapo", rows[0])
    share = {p: d[f"{p}_s"] / d["step_s"] for p in PHASES}
    upd = ", ".join(f"{r['algo']} {r['update_s']:.2f} s" for r in rows)
    presets = [r for r in rows if r["algo"] != FP32]
    heaviest = max(presets, key=lambda r: r["update_mb"])
    full = by.get(FP32)
    precision_note = (
        f" The presets ran at their default precision, rollout.autocast and optim.autocast 'auto': bf16 "
        f"where native, as here. DAPO in float32 (`{' '.join('--set ' + x for x in FP32_SETS)}`): step "
        f"{full['step_s']:.2f} s, so the bf16 step takes {d['step_s'] / full['step_s']:.2f}× the float32 one "
        f"(rollout {full['rollout_s']:.2f} → {d['rollout_s']:.2f} s, update {full['update_s']:.2f} → "
        f"{d['update_s']:.2f} s)."
        if full and base
        else " The presets ran at their default precision: float32 here (no native bf16)."
    )
    reading = (
        f"Per step ({prompts} prompts × {group} images, dynamic sampling off): {verdicts}. For DAPO the "
        f"rollout takes {100 * share['rollout']:.0f} % of the step, decode + reward "
        f"{100 * share['reward']:.0f} % and the update {100 * share['update']:.0f} %. Updates: {upd}. GCPO "
        f"reads the pos / neg log-probs the sampler recorded (no extra forward); DGPO adds a forward of the "
        f"frozen reference for its full distributions and GRPO (and gcpo-official) one for the KL term. The "
        f"update reaches {min(r['update_peak_pct'] for r in presets):.0f}–"
        f"{max(r['update_peak_pct'] for r in presets):.0f} % of the fp32 peak on {prompts * group} sequences "
        f"of {tokens} image tokens through {params / 1e6:.2f} M matmul weights. The update is the phase that "
        f"needs memory (the rollout and the reward add little): its peak growth is largest for "
        f"{heaviest['algo']}, {heaviest['update_mb']:.0f} MB, against "
        f"{d['update_mb']:.0f} MB for DAPO." + precision_note
    )
    return {
        "title": TITLE,
        "timing": f"median of {plural(steps, 'step')} per algorithm after {plural(warmup, 'warm-up step')}, "
        f"algorithms round-robin; "
        f"memory: max over the timed steps of the {PeakMemory.what(ctx.device)}",
        "columns": [
            ("algo", "algo"),
            ("rollout_s", "rollout s"),
            ("reward_s", "decode+reward s"),
            ("update_s", "update s"),
            ("step_s", "step s"),
            ("vs_dapo", "step / DAPO"),
            ("rollout_mb", "rollout peak MB"),
            ("reward_mb", "reward peak MB"),
            ("update_mb", "update peak MB"),
            ("update_gflops", "update GFLOP/s"),
            ("update_peak_pct", "update % of fp32 peak"),
        ],
        "rows": rows,
        "summary": {"checks": checks, "images_per_step": prompts * group},
        "reading": reading,
    }
