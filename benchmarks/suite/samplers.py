"""Section `samplers`: images/s of the shipped ShapeWorld samplers, and their FLOP/s against the peak.

The AR prior (``load_policy("shapeworld")``: 64 tokens, its fused KV-cache loop) and the masked prior
(``"shapeworld-masked"``: its default 8 MaskGIT steps), both with CFG at the checkpoint's scale, each
timed as one ``policy.rollout`` of B images (B/8 prompts × 8 samples; decoding to pixels excluded) by
benchmarks/bench_masked_vs_ar.py's `time_rollouts`: one warm-up, then best of the repeats, the two
samplers interleaved. Achieved FLOP/s counts the useful FLOPs of benchmarks/suite/flops.py:

    AR:     2 rows (CFG) × B × [2·N·S + 4·L·d·S(S+1)/2],  S = P + T − 1
    masked: 2 rows (CFG) × B × steps × [2·N·S + 4·L·d·S²],  S = P + T

with N the matmul weights (Llama layers + codebook head), L layers, d width, P prefix, T = 64 tokens.
The AR prior's default loop (policies/fused_llama.py) is also timed against the same loop through
transformers' layers and StaticCache at the largest batch (benchmarks/bench_sampler.py's `time_generate`).
"""

from __future__ import annotations

from dataclasses import replace

from benchmarks.bench_masked_vs_ar import time_rollouts
from benchmarks.bench_sampler import time_generate
from benchmarks.suite.common import Context, linear_params
from benchmarks.suite.flops import Shape, ar_sampling_flops, masked_sampling_flops
from t2i_gcpo.hardware import native_bf16

TITLE = "Samplers: images/s and FLOP/s (`samplers`)"
GROUP = 8


def shape_of(policy) -> Shape:
    """The FLOP shape of a built-in ShapeWorld prior (ARPolicy or MaskedPolicy)."""
    return Shape(
        linear_params(policy.llama, policy.head), policy.config.num_layers, policy.config.hidden_size
    )


def rollout_flops(policy, sampling, images: int) -> float:
    shape = shape_of(policy)
    if hasattr(policy, "resolve_steps"):  # masked
        steps = policy.resolve_steps(sampling)
        return masked_sampling_flops(shape, policy.prefix_len, policy.num_tokens, steps, images)
    return ar_sampling_flops(shape, policy.prefix_len, policy.num_tokens, images)


def run(ctx: Context) -> dict:
    from t2i_gcpo.policies.registry import load_policy

    ar = load_policy("shapeworld").eval().to(ctx.device)
    masked = load_policy("shapeworld-masked").eval().to(ctx.device)
    ms = masked.default_sampling()
    configs = [
        ("AR (KV cache)", ar, ar.default_sampling()),
        (f"masked ({masked.resolve_steps(ms)} steps)", masked, ms),
    ]
    if native_bf16(ctx.device):  # rollout.autocast=bf16 (emulated bf16 would take minutes: not timed)
        configs += [(f"{label}, bf16", p, replace(s, autocast="bf16")) for label, p, s in configs]
    batches = ctx.pick([16, 32], [16, 64, 128])
    repeats = ctx.pick(2, 3)
    peak = ctx.fp32_peak()
    rows = []
    for batch in batches:
        secs = time_rollouts(configs, batch, GROUP, repeats)
        for label, policy, sampling in configs:
            gflops = rollout_flops(policy, sampling, batch) / secs[label] / 1e9
            rows.append(
                {
                    "sampler": label,
                    "batch": batch,
                    "seconds": secs[label],
                    "images_per_s": batch / secs[label],
                    "gflops": gflops,
                    "peak_pct": 100 * gflops / peak,
                }
            )
    loops = time_generate(ar, batches[-1], ["fused", "static"], repeats)
    fused_vs_static = loops["static"] / loops["fused"]
    by = {(r["sampler"], r["batch"]): r for r in rows}
    a_label, m_label = configs[0][0], configs[1][0]
    lo, hi = batches[0], batches[-1]
    a_hi, m_hi, a_lo = by[(a_label, hi)], by[(m_label, hi)], by[(a_label, lo)]
    params = {label: shape_of(p).params for label, p, _ in configs}
    flops_ratio = rollout_flops(masked, ms, 1) / rollout_flops(ar, configs[0][2], 1)
    low = [
        f"{label} {by[(label + ', bf16', hi)]['images_per_s'] / by[(label, hi)]['images_per_s']:.2f}×"
        for label in (a_label, m_label)
        if (label + ", bf16", hi) in by
    ]
    reading = (
        f"At batch {hi} the AR sampler makes {a_hi['images_per_s']:.0f} images/s and the masked sampler "
        f"{m_hi['images_per_s']:.0f} ({m_hi['images_per_s'] / a_hi['images_per_s']:.1f}× the AR rate), at "
        f"{a_hi['peak_pct']:.1f} % and {m_hi['peak_pct']:.1f} % of the fp32 matmul peak ({peak:.0f} "
        f"GFLOP/s). The AR prior ({params[a_label] / 1e6:.2f} M matmul weights) runs {ar.num_tokens} "
        f"sequential steps whose matmuls have only 2B rows, so per-step overhead (Python, small element-wise "
        f"ops, the cache update, the sample step) weighs most at small batch: going from batch {lo} to {hi} "
        f"raises its rate {a_hi['images_per_s'] / a_lo['images_per_s']:.1f}×. Its loop runs the Llama maths "
        f"on the model's weights with fused q|k|v and gate|up projections: {fused_vs_static:.2f}× the rate "
        f"of the same loop through transformers' layers and StaticCache at batch {hi} "
        f"({loops['fused']:.2f} s vs {loops['static']:.2f} s). The masked prior "
        f"({params[m_label] / 1e6:.2f} M) makes {masked.resolve_steps(ms)} full-sequence forwards instead "
        f"of {ar.num_tokens} single-token ones: {flops_ratio:.1f}× the AR prior's FLOPs per image "
        f"(every step attends over all {masked.prefix_len + masked.num_tokens} positions) in far fewer "
        f"sequential steps, with matmuls of 2B·{masked.prefix_len + masked.num_tokens} rows that "
        + (
            "come closer to the peak."
            if m_hi["peak_pct"] > a_hi["peak_pct"]
            else "here reach no larger share of the peak."
        )
        + (
            f" Sampling under bf16 autocast (`rollout.autocast=bf16`: bf16 matmuls and KV cache, fp32 sample "
            f"step and log-probs) changes the rate at batch {hi} by: {', '.join(low)} (FLOP/s of the "
            f"bf16 rows are still given as a share of the fp32 peak)."
            if low
            else ""
        )
    )
    return {
        "title": TITLE,
        "timing": f"best of {repeats} rollouts after one warm-up, the samplers interleaved",
        "columns": [
            ("sampler", "sampler"),
            ("batch", "images"),
            ("seconds", "seconds"),
            ("images_per_s", "images/s"),
            ("gflops", "GFLOP/s"),
            ("peak_pct", "% of fp32 peak"),
        ],
        "rows": rows,
        "summary": {
            **{f"{r['sampler']} @ {r['batch']}": r["images_per_s"] for r in rows},
            f"AR fused loop / transformers StaticCache loop @ {batches[-1]}": fused_vs_static,
        },
        "reading": reading,
    }
