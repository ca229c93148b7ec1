"""What do the memory options of a Janus step save? Measured on the CPU at a mid shape (the at-shape figures
on a GPU come from benchmarks/gpu_check.py).

A Janus built in memory (tests/tiny_models.py `make_janus`): Llama d 1024, 4 layers, 8 heads, MLP 2816,
a 16 × 16 grid (T = 256 image tokens), codebook 16,384, float32 weights. Each quantity is the peak growth
of the process's resident set over a phase (benchmarks/suite/common.py `PeakMemory`):

- the frozen reference: a deep copy of the policy as the trainer makes it, in float32
  (loss.reference_dtype=same) and converted to bf16 (loss.reference_dtype=bfloat16): the peak while it
  is made (the float32 copy exists before its conversion) and what it holds afterwards, through every
  step (resident-set growth, the allocator's free memory trimmed first);
- a rollout of B images (CFG: 2B rows in the KV cache) in one pass, and in passes of B/2
  (model_options.max_rollout_batch), float32; also under bf16 autocast where the CPU multiplies bf16
  natively (elsewhere bf16 is emulated and too slow to wait for).

    python benchmarks/bench_janus_memory.py [--images 16]

Prints a table and writes benchmarks/results/janus_memory.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.suite.common import PeakMemory, _proc_status_kb, _trim, machine  # noqa: E402
from benchmarks.suite.janus_scale import janus_policy, tiny_models  # noqa: E402
from t2i_gcpo.hardware import native_bf16  # noqa: E402
from t2i_gcpo.policies.base import PromptRecord, SamplingParams  # noqa: E402
from t2i_gcpo.tasks.loop import group_generators, sampler_precision  # noqa: E402


def peak_mb(fn) -> tuple[float | None, object]:
    meter = PeakMemory("cpu")
    meter.start()
    out = fn()
    return meter.stop(), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "janus_memory.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    tm = tiny_models()
    tok = tm.build_tiny_janus_tokenizer()
    shape = tm.JanusShape(hidden=1024, layers=4, heads=8, kv_heads=8, intermediate=2816, codebook=16384)
    policy = janus_policy(tm.make_janus(tok, grid=16, upsample=1, shape=shape, std=0.02), tok, trainable=True)
    params = sum(p.numel() for p in policy.parameters())
    rows = []
    for dtype in ("same", "bfloat16"):

        def reference(dtype=dtype):
            ref = copy.deepcopy(policy).eval().requires_grad_(False)
            return ref.to(torch.bfloat16) if dtype == "bfloat16" else ref

        _trim()
        before = _proc_status_kb("VmRSS")
        mb, ref = peak_mb(reference)
        _trim()
        held = (_proc_status_kb("VmRSS") - before) / 1024
        rows.append(
            {"what": f"frozen reference, loss.reference_dtype={dtype}", "peak_mb": mb, "held_mb": held}
        )
        del ref
    prompts = [PromptRecord("a photo of a red cat"), PromptRecord("a photo of two blue dogs")]
    group = args.images // len(prompts)
    precisions = ["none", "bf16"] if native_bf16("cpu") else ["none"]
    for autocast in precisions:
        for per_pass in (None, args.images // 2):
            policy.max_rollout_batch = per_pass
            sampling = SamplingParams(guidance_scale=5.0, autocast=autocast)

            def rollout(sampling=sampling):
                with torch.no_grad(), sampler_precision(policy, sampling):
                    return policy.rollout(prompts, group, sampling, group_generators(0, "mem", range(2)))

            mb, _ = peak_mb(rollout)
            label = "all at once" if per_pass is None else f"model_options.max_rollout_batch={per_pass}"
            rows.append(
                {"what": f"rollout of {args.images} images, {label}, autocast {autocast}", "peak_mb": mb}
            )
    T, L = policy.num_image_tokens, len(policy.prompt_ids([prompts[1].text])[0])
    kv_mb = 2 * shape.layers * 2 * args.images * shape.hidden * (L + T) * 4 / 2**20
    meta = {
        "machine": machine("cpu", 1),
        "parameters": params,
        "image_tokens": T,
        "prompt_tokens": L,
        "kv_cache_mb_float32_arithmetic": kv_mb,
        "weights_mb_float32": params * 4 / 2**20,
    }
    for r in rows:
        held = f", held {r['held_mb']:.1f} MB" if "held_mb" in r else ""
        print(f"{r['what']:<72} peak {r['peak_mb']:>7.1f} MB{held}")
    print(
        f"(arithmetic: float32 weights {meta['weights_mb_float32']:.0f} MB, KV cache of one "
        f"pass {kv_mb:.0f} MB)"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
