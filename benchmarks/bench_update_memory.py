"""Peak memory of one update's log-probs on a text-sized vocabulary: [B, T, V] logits with gradient
(the trainer before the contract issue) against `chunked_logprobs` (the head run on chunks of T under
activation checkpointing, so at most one [B, t, V] block is alive).

Question: what does the update's token log-prob cost in memory at B = 4, T = 1024, V = 32 768? Each
variant runs in a fresh process: hidden states [B, T, D] with gradient → log π(y_t) → a loss →
backward; we report the process's peak resident memory above its baseline (after building the
inputs) and the time of one forward + backward.

    python benchmarks/bench_update_memory.py [--batch 4 --tokens 1024 --vocab 32768 --hidden 512]

Writes benchmarks/results/update_memory.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "update_memory.json"


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(variant: str, B: int, T: int, V: int, D: int) -> dict:
    import torch

    from t2i_gcpo.policies.sampling import chunked_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(D, V, bias=False)
    hidden = torch.randn(B, T, D, requires_grad=True)
    tokens = torch.randint(0, V, (B, T))
    adv = torch.randn(B, 1)
    base = peak_mb()
    tic = time.perf_counter()
    if variant == "full":  # what the trainer did before: [B, T, V] logits with gradient
        logp = head(hidden).log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    else:
        logp = chunked_logprobs(hidden, head, tokens, V)
    (-(logp * adv).mean()).backward()
    return {
        "variant": variant,
        "peak_mb_above_baseline": peak_mb() - base,
        "seconds": time.perf_counter() - tic,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    dims = (args.batch, args.tokens, args.vocab, args.hidden)
    if args.child:
        print(json.dumps(child(args.child, *dims)))
        return
    rows = []
    for variant in ("full", "chunked"):
        cmd = [
            sys.executable,
            __file__,
            "--child",
            variant,
            "--batch",
            str(args.batch),
            "--tokens",
            str(args.tokens),
            "--vocab",
            str(args.vocab),
            "--hidden",
            str(args.hidden),
        ]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    one = 4 * args.batch * args.tokens * args.vocab / 2**20
    print(
        f"B={args.batch} T={args.tokens} V={args.vocab} D={args.hidden}; one fp32 [B, T, V] "
        f"tensor = {one:.0f} MB"
    )
    print(f"{'variant':10s} {'peak MB above baseline':>24s} {'fwd+bwd s':>10s}")
    for r in rows:
        print(f"{r['variant']:10s} {r['peak_mb_above_baseline']:24.0f} {r['seconds']:10.2f}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps({"config": vars(args) | {"child": None}, "one_logits_mb": one, "rows": rows}, indent=1)
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
