"""How long does `t2i-gcpo pretrain` take, per stage?

Reads the statistics a pretrain run writes (``MODEL/pretrain.json``; default: the shipped
checkpoint, whose file is the record of the run that built it), or runs a fresh pretrain with
``--run``, and writes benchmarks/results/pretrain.json with per-stage seconds, step rates, the
machine's load while it ran, and the held-out strict score.

    python benchmarks/bench_pretrain.py                       # summarise the shipped model's run
    python benchmarks/bench_pretrain.py --run --model /tmp/m  # time a fresh run (≈ 10–15 min idle)
"""

from __future__ import annotations

import argparse
import json
import os

from t2i_gcpo.policies.families.ar import SHIPPED


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=SHIPPED["shapeworld"], help="checkpoint folder holding pretrain.json")
    ap.add_argument("--run", action="store_true", help="run a fresh pretrain into --model first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "pretrain.json"))
    args = ap.parse_args()
    if args.run:
        import torch

        from t2i_gcpo.pretrain.shapeworld_ar import pretrain
        from t2i_gcpo.tasks.geneval import evaluate_shapeworld, format_table

        def evaluate(policy, test, images_per_prompt, seed):  # as `t2i-gcpo pretrain` scores the model
            result = evaluate_shapeworld(policy, test, images_per_prompt, seed=seed, progress=True)
            print(format_table(result))
            return result

        torch.set_num_threads(args.threads)
        pretrain(args.model, evaluate=evaluate)
    with open(os.path.join(args.model, "pretrain.json")) as f:
        s = json.load(f)
    vq, prior = s["vq"], s["prior"]
    summary = {
        "question": "wall-clock time of t2i-gcpo pretrain per stage",
        "torch_threads": s.get("torch_threads"),
        "load_average": s.get("load_average"),
        "data_seconds": s["data"]["seconds"],
        "vq_seconds": vq.get("seconds"),
        "vq_steps_per_s": vq["steps"] / vq["seconds"] if "seconds" in vq else None,
        "prior_seconds": prior["seconds"],
        "prior_steps_per_s": prior["steps"] / prior["seconds"],
        "train_seconds": s["train_seconds"],
        "eval_seconds": s.get("eval", {}).get("seconds"),
        "total_seconds": s["total_seconds"],
        "strict_overall": s.get("eval", {}).get("strict"),
        "source": os.path.join(args.model, "pretrain.json"),
    }
    for k, v in summary.items():
        print(f"{k:<20} {v:.2f}" if isinstance(v, float) else f"{k:<20} {v}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({**summary, "stats": s}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
