"""Step time per algorithm (rollout / reward / update), warm-up excluded.

Question: what does each credit scheme cost? GCPO reuses the sampler's recorded pos/neg
log-probs, so its step should cost what DAPO's does (target: within 5 %); DGPO needs the frozen
reference's full distributions (one extra forward), so it costs more; critical (critical-token
credit, zghhui/GCPO) reads the entropies of the update's own forward and the VQ code vectors, so
its extra cost is the per-token entropy and the group similarity.

    python benchmarks/bench_train_step.py [--model shapeworld] [--steps 12] [--warmup 2]

Steps run round-robin across the algorithms (every algorithm's k-th step back to back), so
machine drift affects all alike. Prints a table and writes benchmarks/results/train_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from t2i_gcpo.resources import PROMPTS_DIR  # noqa: E402
from t2i_gcpo.train.run import prepare  # noqa: E402
from t2i_gcpo.train.trainer import Trainer  # noqa: E402

ALGOS = ["grpo", "dapo", "gcpo", "dgpo", "gcpo-official", "critical"]
PARTS = ["time/rollout", "time/reward", "time/update", "time/step"]


def make_trainer(
    algo: str, model: str, steps: int, overrides: list[str], tmp: str, name: str | None = None
) -> Trainer:
    flags = dict(
        prompts=str(PROMPTS_DIR / "shapeworld_train.jsonl"),
        model=model,
        out=f"{tmp}/{name or algo}",
        steps=steps,
    )
    # dynamic sampling would change how many rollouts a step makes: switch it off so every
    # algorithm does exactly one rollout of the same size per step
    job = prepare(
        algo=algo,
        flags=flags,
        overrides=(*overrides, "advantage.dynamic_sampling=false", "sample_every=0", "eval_every=-1"),
    )
    return Trainer(job.cfg, job.run_dir, job.prompts, job.policy, job.reward, job.task, eval_prompts=None)


def round_robin(
    trainers: dict[str, Trainer],
    steps: int,
    warmup: int,
    after_step: Callable[[str, dict], None] | None = None,
) -> dict[str, list[dict]]:
    """Each trainer's metrics rows of `steps` timed steps (after `warmup` untimed ones), the k-th step
    of every trainer run back to back so that machine drift hits all of them alike. `after_step(name,
    row)` may add to a row (it is called for warm-up steps too)."""
    rows: dict[str, list[dict]] = {a: [] for a in trainers}
    for step in range(1, warmup + steps + 1):
        for a, t in trainers.items():
            tic = time.perf_counter()
            row = t.train_step(step)
            row["time/step"] = time.perf_counter() - tic
            if after_step is not None:
                after_step(a, row)
            if step > warmup:
                rows[a].append(row)
    return rows


def bench(algos: list[str], model: str, steps: int, warmup: int, overrides: list[str]) -> dict:
    """Steps interleaved round-robin across algorithms, so machine drift hits all of them alike."""
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {a: make_trainer(a, model, steps, overrides, tmp) for a in algos}
        rows = round_robin(trainers, steps, warmup)
    return {a: {p: statistics.median(r[p] for r in rs) for p in PARTS} for a, rs in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="shapeworld")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--algos", default=",".join(ALGOS))
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "train_step.json"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    results = bench(args.algos.split(","), args.model, args.steps, args.warmup, args.overrides)
    base = results.get("dapo", {}).get("time/step")
    print(f"{'algo':<14}" + "".join(f"{p.split('/')[1]:>10}" for p in PARTS) + f"{'vs dapo':>10}")
    for a, r in results.items():
        rel = f"{100 * (r['time/step'] / base - 1):+.1f}%" if base else "—"
        print(f"{a:<14}" + "".join(f"{r[p]:>10.3f}" for p in PARTS) + f"{rel:>10}")
    meta = {
        "torch_threads": torch.get_num_threads(),
        "steps": args.steps,
        "warmup": args.warmup,
        "overrides": args.overrides,
        "model": args.model,
        "unit": "seconds (median per step)",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
