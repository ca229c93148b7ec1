"""Section `branch_cost`: what a branched continuation costs next to a fresh sample (Policy.branch,
docs/concepts/tree_credit.md#branched-rollouts).

Per model — the ShapeWorld AR prior (``load_policy("shapeworld")``, T = 64 tokens), the masked prior
(``"shapeworld-masked"``, S = 8 reveal steps) and the arithmetic text model (``"arithmetic"``) — one
fresh ``policy.rollout`` of B samples (B/8 prompts × 8) is the root batch; then ``policy.branch`` makes
one continuation per root (n = 1, the same B rows) from the point t = T/4, T/2, 3T/4 (masked: s = S/4,
S/2, 3S/4 in reveal steps; text: a quarter, a half, three quarters of each root's own length L). A
continuation's cost is its branch call's seconds over the fresh rollout's, set beside the share of the
decisions it re-makes: (T − t)/T, (S − s)/S, or the roots' mean (L − t)/L. The AR prior's continuations
fork the rollout's own KV cache (the trainer asks to keep it, `SamplingParams.keep_cache`): no prefill. Text
continuations start with one prefill of [context; root tokens] shared by a root's continuations: its seconds
(the decoder's multi-token forwards inside the branch call) are given as a share of the branch call. The
masked prior caches nothing (every step re-reads the canvas): no prefill.

Sampling as the trainer does it for a scheme that branches: bf16 autocast where the device multiplies bf16
natively and the sampler declares it (rollout.autocast = auto), the negative context not scored
(``score_negative=False``), the rollout's cache kept (``keep_cache=True``). One warm-up of every call, then
the median of the repeats, the fresh rollout and the three points interleaved in each repeat, each
repeat with new roots.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Iterator

import torch

from benchmarks.suite.common import Context, load_average, plural, shared_cpu_note
from benchmarks.suite.text_vs_generate import questions
from t2i_gcpo.hardware import native_bf16

TITLE = "Branched continuations vs fresh samples (`branch_cost`)"
GROUP = 8
FRACTIONS = (0.25, 0.5, 0.75)
PROMPT = "a photo of a red circle and a blue square"


@contextlib.contextmanager
def prefill_clock(ctx: Context, spent: list[float]) -> Iterator[None]:
    """Add the seconds of every multi-token forward of a `FusedLlamaDecoder` (its prefill) to `spent`."""
    from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder

    inner = FusedLlamaDecoder.forward

    def forward(self, ids, start, *args, **kwargs):
        if ids.shape[1] == 1:
            return inner(self, ids, start, *args, **kwargs)
        ctx.sync()
        tic = time.perf_counter()
        out = inner(self, ids, start, *args, **kwargs)
        ctx.sync()
        spent.append(time.perf_counter() - tic)
        return out

    FusedLlamaDecoder.forward = forward
    try:
        yield
    finally:
        FusedLlamaDecoder.forward = inner


def models(ctx: Context) -> list[tuple[str, object, object, list]]:
    """(label, policy, sampling, registry name) per model, sampling as the trainer would on this device."""
    from t2i_gcpo.policies.registry import load_policy

    out = []
    for name, label in (
        ("shapeworld", "AR prior"),
        ("shapeworld-masked", "masked prior"),
        ("arithmetic", "text (arithmetic)"),
    ):
        policy = load_policy(name).eval().to(ctx.device)
        bf16 = native_bf16(ctx.device) and policy.capabilities.bf16_sampling
        sampling = dataclasses.replace(
            policy.default_sampling(),
            autocast="bf16" if bf16 else "none",
            score_negative=False,
            keep_cache=True,
        )
        out.append((label, policy, sampling, name))
    return out


def prompts_for(name: str, count: int) -> list:
    from t2i_gcpo.policies.base import PromptRecord

    if name == "arithmetic":
        return [PromptRecord(q) for q in questions(count)]
    return [PromptRecord(PROMPT)] * count


def points_at(ro, fraction: float, masked: bool, steps: int) -> torch.Tensor:
    """[B, 1] branch points: `fraction` of the decisions (masked: of the S reveal steps; else of each
    root's own length), kept inside 1 … length − 1."""
    from t2i_gcpo.policies.branching import decision_steps

    length = torch.full((ro.mask.shape[0],), steps) if masked else decision_steps(ro).cpu()
    return (length * fraction).long().clamp(min=1).minimum(length - 1)[:, None]


def measure(ctx: Context, policy, sampling, name: str, batch: int, repeats: int) -> dict:
    """Median seconds of the fresh rollout and of each point's branch call, the prefill seconds inside
    the branch calls, and each point's re-made share of the decisions (module docstring)."""
    from t2i_gcpo.policies.branching import decision_steps
    from t2i_gcpo.tasks.loop import group_generators, sampler_precision

    masked = hasattr(policy, "resolve_steps")
    steps = policy.resolve_steps(sampling) if masked else policy.num_tokens if name != "arithmetic" else None
    prompts = prompts_for(name, batch // GROUP)
    fresh, branch, prefill, share = [], {f: [] for f in FRACTIONS}, {f: [] for f in FRACTIONS}, {}
    distinct: dict[float, list[int]] = {f: [] for f in FRACTIONS}
    for r in range(repeats + 1):  # r = 0: warm-up
        gens = group_generators(r, "bench", range(len(prompts)))
        with torch.no_grad(), sampler_precision(policy, sampling):
            ctx.sync()
            tic = time.perf_counter()
            ro = policy.rollout(prompts, GROUP, sampling, gens)
            ctx.sync()
            if r:
                fresh.append(time.perf_counter() - tic)
            length = decision_steps(ro).cpu().double()
            for f in FRACTIONS:
                points = points_at(ro, f, masked, steps)
                todo = (steps - points[:, 0]) / steps if masked else (length - points[:, 0]) / length
                share[f] = float(todo.mean())
                distinct[f].append(len(points.unique()))  # each distinct t is decoded as its own batch
                keys = [(b, int(points[b, 0]), 0) for b in range(len(ro))]
                spent: list[float] = []
                with prefill_clock(ctx, spent):
                    ctx.sync()
                    tic = time.perf_counter()
                    policy.branch(ro, points, 1, group_generators(r, "branch", keys))
                    ctx.sync()
                if r:
                    branch[f].append(time.perf_counter() - tic)
                    prefill[f].append(sum(spent))
    out = {"fresh_s": statistics.median(fresh), "length": float(length.mean()), "points": {}}
    for f in FRACTIONS:
        cost = statistics.median(branch[f])
        out["points"][f] = {
            "branch_s": cost,
            "share": share[f],
            "prefill_s": statistics.median(prefill[f]),
            "distinct": statistics.median(distinct[f]),
        }
    return out


def scale_of(policy, sampling, name: str) -> str:
    """What a branch point is a fraction of: 'S = 8 steps', 'T = 64 tokens' or 'L (root length)'."""
    if hasattr(policy, "resolve_steps"):
        return f"S = {policy.resolve_steps(sampling)} steps"
    return "L (root length)" if name == "arithmetic" else f"T = {policy.num_tokens} tokens"


def run(ctx: Context) -> dict:
    load = load_average()
    batch = ctx.pick(16, 64)
    repeats = ctx.pick(2, 5)
    rows, precision, lengths = [], {}, {}
    for label, policy, sampling, name in models(ctx):
        got = measure(ctx, policy, sampling, name, batch, repeats)
        precision[label] = "bf16" if sampling.autocast == "bf16" else "float32"
        lengths[label] = got["length"]
        for f, p in got["points"].items():
            rows.append(
                {
                    "model": label,
                    "precision": precision[label],
                    "batch": batch,
                    "point": f"{f:g} · {scale_of(policy, sampling, name)}",
                    "fresh_s": got["fresh_s"],
                    "branch_s": p["branch_s"],
                    "measured": p["branch_s"] / got["fresh_s"],
                    "expected": p["share"],
                    "prefill_pct": 100 * p["prefill_s"] / p["branch_s"],
                    "without_prefill": (p["branch_s"] - p["prefill_s"]) / got["fresh_s"],
                    "distinct": p["distinct"],
                }
            )
    by_model: dict[str, list[dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    parts = []
    for label, rs in by_model.items():
        ratios = ", ".join(f"{r['measured']:.2f} (share {r['expected']:.2f})" for r in rs)
        over = statistics.mean(r["measured"] - r["expected"] for r in rs)
        line = (
            f"{label} ({rs[0]['precision']}, fresh batch {rs[0]['fresh_s']:.2f} s): {ratios}, on average "
            f"{abs(over):.2f} of a fresh batch {'above' if over > 0 else 'below'} the share"
        )
        if any(r["prefill_pct"] > 0 for r in rs):
            line += (
                f"; its prefill takes {min(r['prefill_pct'] for r in rs):.0f}–"
                f"{max(r['prefill_pct'] for r in rs):.0f} % of the continuation (growing with t, the prefix "
                f"it re-reads), and without it a continuation costs "
                + ", ".join(f"{r['without_prefill']:.2f}" for r in rs)
            )
        parts.append(line)
    text = by_model.get("text (arithmetic)")
    text_note = (
        f" The text roots are {lengths['text (arithmetic)']:.1f} tokens long on average, and a point a "
        f"fraction of each root's own length puts the {batch} continuations on "
        f"{min(r['distinct'] for r in text):.0f}–{max(r['distinct'] for r in text):.0f} distinct t "
        f"(median per call): the branch call decodes each distinct t as its own batch, one after another, "
        f"each until its longest row ends, so it pays the per-step overhead of the tiny model that many "
        f"times. The AR and masked rows branch every root at the same t (one batch), as `every_k` "
        f"does for text too."
        if text and max(r["distinct"] for r in text) > 1
        else ""
    )
    reading = (
        f"One continuation per root (B = {batch}) from a quarter, a half and three quarters of the "
        f"decisions, its cost as a fraction of a fresh batch of B samples next to the share of "
        f"decisions it re-makes: "
        + "; ".join(parts)
        + ". What a continuation pays beyond its share is fixed per branch call: re-feeding the "
        "prefix's last token, copying the cached rows, drawing the uniforms and assembling the rows; the AR "
        "prior forks the rollout's own KV cache, text still prefills [context; root prefix] (one forward "
        "over the roots' prefixes, which its rollout computed already and does not hand on). The masked "
        "prior caches nothing: each remaining reveal step is one forward of the doubled batch, as in "
        "the fresh rollout." + text_note
    )
    if ctx.device == "cpu":
        reading += shared_cpu_note(load)
    return {
        "title": TITLE,
        "timing": f"median of {plural(repeats, 'repeat')} after one warm-up; each repeat samples new "
        f"roots, then branches them at the three points",
        "columns": [
            ("model", "model"),
            ("precision", "precision"),
            ("batch", "samples"),
            ("point", "branch point"),
            ("distinct", "distinct t"),
            ("fresh_s", "fresh s"),
            ("branch_s", "continuation s"),
            ("measured", "continuation / fresh"),
            ("expected", "re-made share"),
            ("prefill_pct", "prefill % of continuation"),
            ("without_prefill", "continuation without prefill / fresh"),
        ],
        "rows": rows,
        "summary": {
            "ratios": {
                f"{r['model']} @ {r['point']}": {"measured": r["measured"], "expected": r["expected"]}
                for r in rows
            },
            "precision": precision,
            "mean_root_length": lengths,
        },
        "reading": reading,
    }
