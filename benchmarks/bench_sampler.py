"""How much does the KV cache buy the built-in AR sampler?

Images/s of `ARPolicy.generate` with CFG (model batch 2B) at the shipped size (64 image tokens),
with our fused decode loop (the default: policies/fused_llama.py), transformers' static and dynamic
KV caches, and with no cache (the whole prefix is recomputed every step). Warm-up excluded; best of
`--repeats`. Prints a table and writes benchmarks/results/sampler.json.

    python benchmarks/bench_sampler.py [--batch 32] [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

from t2i_gcpo.policies.ar import ARConfig, ARPolicy
from t2i_gcpo.policies.base import SamplingParams
from t2i_gcpo.policies.families.ar import SHIPPED
from t2i_gcpo.policies.prompt_tokenizer import PromptTokenizer
from t2i_gcpo.tokenizers.vq import VQConfig, VQTokenizer

PROMPT = "a photo of a red circle and a blue square"


def random_policy(grid_side: int = 8, seed: int = 0) -> ARPolicy:
    """The shipped architecture with random weights and a `grid_side`² token grid (8: the shipped 64
    tokens; the VQ's image is 4·grid_side px, two stride-2 stages). Speed does not depend on weights."""
    torch.manual_seed(seed)
    words = "a photo of and red blue circle square left two three four".split()
    tok = PromptTokenizer(words, max_len=12)
    return ARPolicy(ARConfig(prompt_len=12), tok, VQTokenizer(VQConfig(image_size=4 * grid_side))).eval()


def build(args: argparse.Namespace) -> ARPolicy:
    """The shipped architecture (loaded if present, else random weights: speed does not depend on them)."""
    if os.path.isdir(SHIPPED["shapeworld"]) and not args.random:
        return ARPolicy.from_pretrained(SHIPPED["shapeworld"])
    return random_policy()


def time_generate(policy: ARPolicy, batch: int, caches: list[str], repeats: int) -> dict[str, float]:
    """Best-of-`repeats` seconds per cache kind; kinds interleaved so they share the machine's load."""
    pid = policy.encode_prompts([PROMPT] * batch)
    sampling = SamplingParams(temperature=1.0, guidance_scale=3.0)
    gen = torch.Generator().manual_seed(0)
    uniforms = torch.rand((batch, policy.num_tokens), generator=gen)  # the draws: one per row and token
    for cache in caches:
        policy.generate(pid[:2], sampling, uniforms[:2], cache=cache)  # warm-up
    best = dict.fromkeys(caches, float("inf"))
    for _ in range(repeats):
        for cache in caches:
            t = time.perf_counter()
            policy.generate(pid, sampling, uniforms, cache=cache)
            best[cache] = min(best[cache], time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--random", action="store_true", help="random weights even if the shipped model exists")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "sampler.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    policy = build(args)
    n_params = sum(p.numel() for n, p in policy.named_parameters() if not n.startswith("vq."))
    secs = time_generate(policy, args.batch, ["fused", "static", "dynamic"], args.repeats)
    secs.update(time_generate(policy, args.batch, ["none"], 1))  # ≈ 15× slower: one timed run
    rows = [{"cache": c, "seconds": s, "images_per_s": args.batch / s} for c, s in secs.items()]
    base = rows[0]["images_per_s"]
    print(
        f"AR sampler, batch {args.batch} with CFG (model batch {2 * args.batch}), {policy.num_tokens} "
        f"tokens, {n_params / 1e6:.2f} M params, {args.threads} threads"
    )
    print(f"{'cache':<9} {'seconds':>8} {'images/s':>9} {'vs fused':>10}")
    for r in rows:
        print(
            f"{r['cache']:<9} {r['seconds']:>8.3f} {r['images_per_s']:>9.2f} "
            f"{r['images_per_s'] / base:>10.3f}"
        )
    speedup = base / rows[-1]["images_per_s"]
    fused_vs_static = base / rows[1]["images_per_s"]
    print(f"fused loop vs transformers' StaticCache loop: {fused_vs_static:.2f}×")
    print(f"KV cache speed-up over recompute: {speedup:.1f}×")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(
            {
                "question": "images/s of the AR CFG sampler with and without a KV cache",
                "batch": args.batch,
                "tokens": policy.num_tokens,
                "prior_params": n_params,
                "threads": args.threads,
                "torch": torch.__version__,
                "machine": platform.processor() or platform.machine(),
                "load_average_1min": load,
                "results": rows,
                "kv_cache_speedup": speedup,
                "fused_vs_static": fused_vs_static,
            },
            f,
            indent=2,
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
