"""How far are the log-probs the sampler records from the update's teacher-forced forward of the same weights?

GCPO reuses the recorded log-probs as π_old (rollout.old_logprobs=recorded). For each model and
precision, one seeded rollout of `--prompts-per-model` prompts × `--group-size` samples with the model's
default sampling; then every recorded context (pos, neg, guided) is scored again teacher-forced, without
gradient, under the update's autocast, and compared with what was recorded: the mean k3 and the max
|Δ log p| over valid tokens (core.losses.rollout_mismatch; the trainer logs the same two numbers for the
trained context every step as mismatch/k3_<ctx>, mismatch/max_abs_<ctx>). Precisions: `fp32` (both
float32) and `auto` (what rollout.autocast/optim.autocast 'auto' resolve to on this machine: bf16 where
it is native, the rollout only for samplers checked for it). Prints a table, writes
benchmarks/results/mismatch.json.

    python benchmarks/bench_mismatch.py --model shapeworld --model shapeworld-masked --model arithmetic \\
        --model runs/x/checkpoints/step_000040/model --model tiny-janus --model tiny-amused
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

import torch

from t2i_gcpo.config import TrainConfig
from t2i_gcpo.core.losses import rollout_mismatch
from t2i_gcpo.hardware import native_bf16
from t2i_gcpo.policies.base import PromptRecord
from t2i_gcpo.policies.registry import load_policy
from t2i_gcpo.tasks.loop import group_generators
from t2i_gcpo.tasks.registry import get_task
from t2i_gcpo.train.run_settings import resolve_autocast

REPO = Path(__file__).resolve().parents[1]
TINY_PROMPTS = [
    "a photo of a cat",
    "a photo of two dogs",
    "a photo of a red cat",
    "a photo of a dog left of a cat",
]


def build(spec: str, scratch: Path) -> tuple[str, list[PromptRecord] | None]:
    """A spec load_policy takes, and prompts when the model's task has no prompt file for it. `tiny-janus`
    and `tiny-amused` are the test suite's random checkpoints (tests/tiny_models.py), built in `scratch`."""
    if spec not in ("tiny-janus", "tiny-amused"):
        return spec, None
    sys.path.insert(0, str(REPO / "tests"))
    if spec == "tiny-janus":
        from tiny_models import build_tiny_janus

        build_tiny_janus(scratch / "janus")
        return f"janus:{scratch / 'janus'}", [PromptRecord(p) for p in TINY_PROMPTS]
    from tiny_models import build_tiny_amused

    build_tiny_amused(str(scratch / "amused"))
    return f"amused:{scratch / 'amused'}", [PromptRecord(p) for p in TINY_PROMPTS]


def measure(spec: str, label: str, prompts: list[PromptRecord] | None, precision: str, args) -> dict:
    policy = load_policy(spec).eval().to(args.device)
    if prompts is None:
        task = get_task(policy.default_task, policy)
        prompts = task.load_prompts(task.default_train_prompts())
    prompts = prompts[: args.prompts_per_model]
    cfg = TrainConfig()
    if precision == "fp32":
        cfg.rollout.autocast = cfg.optim.autocast = "none"
    resolve_autocast(cfg, args.device, policy)
    sampling = policy.default_sampling()
    sampling = type(sampling)(**{**sampling.__dict__, "autocast": cfg.rollout.autocast})
    gens = group_generators(args.seed, "train", list(range(len(prompts))))
    with torch.no_grad():
        ro = policy.rollout(prompts, args.group_size, sampling, gens)
        row = {
            "model": label,
            "precision": precision,
            "rollout_autocast": cfg.rollout.autocast,
            "update_autocast": cfg.optim.autocast,
            "tokens": int(ro.mask.sum()),
        }
        for ctx, recorded in ro.logp.items():
            with torch.autocast(args.device, dtype=torch.bfloat16, enabled=cfg.optim.autocast == "bf16"):
                logp = policy(ro, context=ctx)
            k3, gap = rollout_mismatch(logp.float(), recorded, ro.loss_mask)
            row[f"k3_{ctx}"], row[f"max_abs_{ctx}"] = float(k3), float(gap)
    return row


def cost(spec: str, args) -> dict:
    """Seconds of the update's pieces on one rollout batch (P·G samples, `auto` precision), the variants
    interleaved repeat by repeat so that a busy machine slows them alike; medians over `--repeats`:
    the update's forward + backward with the recorded π_old; the same with `recompute` + TIS at one
    epoch (π_old = the forward detached, weights min(π_old/π_rollout, 2)); and the no-grad forward
    that `recompute` adds before the update when optim.update_epochs > 1."""
    import statistics
    import time

    from t2i_gcpo.core.losses import policy_loss, tis_weights

    policy = load_policy(spec).to(args.device)
    task = get_task(policy.default_task, policy)
    prompts = task.load_prompts(task.default_train_prompts())[: args.prompts_per_model]
    cfg = TrainConfig()
    resolve_autocast(cfg, args.device, policy)
    sampling = policy.default_sampling()
    sampling = type(sampling)(**{**sampling.__dict__, "autocast": cfg.rollout.autocast})
    with torch.no_grad():
        ro = policy.rollout(
            prompts,
            args.group_size,
            sampling,
            group_generators(args.seed, "train", list(range(len(prompts)))),
        )
    adv = torch.randn(len(ro), generator=torch.Generator().manual_seed(0)).to(args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    bf16 = cfg.optim.autocast == "bf16"

    def update(tis: bool) -> None:
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=bf16):
            logp = policy(ro, context="pos")
        old = logp.detach() if tis else ro.logp["pos"]
        w = tis_weights(old, ro.logp["pos"], 2.0) if tis else None
        loss, _ = policy_loss(logp, old, adv, ro.loss_mask, aggregation="token-mean", is_weights=w)
        loss.backward()
        policy.zero_grad(set_to_none=True)

    def recompute_pass() -> None:
        with torch.no_grad(), torch.autocast(args.device, dtype=torch.bfloat16, enabled=bf16):
            policy(ro, context="pos")

    variants = {
        "update_recorded": lambda: update(False),
        "update_recompute_tis": lambda: update(True),
        "recompute_pass": recompute_pass,
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for rep in range(args.repeats + 1):
        for name, fn in variants.items():
            sync()
            tic = time.perf_counter()
            fn()
            sync()
            if rep:  # the first round is warm-up
                times[name].append(time.perf_counter() - tic)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["samples"], out["precision"] = len(ro), cfg.optim.autocast
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model", action="append", required=True, help="load_policy spec, tiny-janus or tiny-amused"
    )
    ap.add_argument("--label", action="append", help="a name per --model for the table (default: the spec)")
    ap.add_argument("--prompts-per-model", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "mismatch.json"))
    ap.add_argument(
        "--cost", action="store_true", help="time the update with and without recompute/TIS instead"
    )
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="where the policy runs (default cpu)"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.cost:
        res = cost(args.model[0], args)
        print(json.dumps(res, indent=1))
        Path(args.out).write_text(
            json.dumps(
                {
                    "machine": platform.processor() or platform.machine(),
                    "device": args.device,
                    "torch": torch.__version__,
                    "cost": res,
                },
                indent=1,
            )
        )
        return
    labels = args.label or args.model
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for spec, label in zip(args.model, labels):
            resolved, prompts = build(spec, Path(scratch))
            for precision in ("auto", "fp32"):
                row = measure(resolved, label, prompts, precision, args)
                rows.append(row)
                cells = "  ".join(
                    f"{c}: k3 {row[f'k3_{c}']:.2e} max {row[f'max_abs_{c}']:.2e}"
                    for c in ("pos", "neg", "guided")
                    if f"k3_{c}" in row
                )
                print(
                    f"{label:28s} {precision:4s} (rollout {row['rollout_autocast']}, update "
                    f"{row['update_autocast']}): {cells}",
                    flush=True,
                )
    result = {
        "machine": platform.processor() or platform.machine(),
        "native_bf16": native_bf16(args.device),
        "device": args.device,
        "torch": torch.__version__,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
