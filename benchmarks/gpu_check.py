"""Everything issue 46 asks a lent GPU (H100 / H200) to check and measure, in one call.

    python -m benchmarks.gpu_check --out "$OUT"          # ≈ 6–8 min on an H200 (--budget 420 s by default)
    python -m benchmarks.gpu_check --out /tmp/x --tiny   # a dry run of the script on the CPU (tiny models)

Parts, in order of priority; each writes its result into OUT/gpu_check.json as soon as it is known, a part
that fails records its traceback and the script goes on, and a part is skipped when the time already spent
leaves it no room in --budget:

1. `correctness`: for fixed seeds, the captured loop (rollout.decode=graph) against the same static step
   uncaptured (`static`: the same kernels, so the same tokens and log-probs to the last bit, or close) and
   against the eager loop (`eager`: float32 → the same tokens; bf16 → the share of equal tokens, since a
   different kernel order rounds differently) for the ShapeWorld AR prior, the arithmetic text model
   (guided and not) and a Janus at Janus-Pro-1B's width (2 layers, 24 × 24 tokens); with the graphs'
   capture counts (0 with a fallback message = the capture failed and the loop ran uncaptured). Then the
   bf16 mismatch: that Janus sampled in bf16 (autocast; the fused decoder's bf16 weight copies) against
   the update's teacher-forced log-probs under bf16 autocast (mismatch/k3 and max |Δ log p|, as the
   trainer logs them), and the same in float32.
2. `janus_scale` at Janus-Pro-1B shape (benchmarks/suite/janus_scale.py): the graph, eager and
   transformers loops and `generate` at 16 / 64 / 128 images, then two steps of the 1B recipe as shipped
   (peak memory per phase and overall) and with gradient checkpointing.
3. `branch_cost` (benchmarks/suite/branch_cost.py, quick): continuations against fresh samples for the
   ShapeWorld AR prior, the masked prior and the arithmetic model on this device.
4. `janus_scale` at Janus-Pro-7B shape: the graph loop at 16 images (bf16 weights).
5. `compile`: rollout.decode=compile on the AR prior (seconds to compile; tokens against static).

Also written: OUT/suite.json and OUT/performance.md, the suite's JSON and page for the janus_scale and
branch_cost sections measured here (merge them into benchmarks/results/suite.json with
``python -m benchmarks`` conventions, or copy the rows into docs/performance.md), and OUT/log.txt.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONTEXTS = ("pos", "neg", "guided")
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
BASE = "graph" if CUDA else "static"  # the dry run on the CPU checks the uncaptured step in its place
PRECISIONS = ("fp32", "bf16") if CUDA else ("fp32",)  # bf16 is emulated on most CPUs: too slow here


class Report:
    """The JSON under --out, rewritten after every record; a log line per record."""

    def __init__(self, out: Path, budget: float) -> None:
        self.out, self.budget, self.start = out, budget, time.perf_counter()
        self.data: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "budget_s": budget}
        out.mkdir(parents=True, exist_ok=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.data["elapsed_s"] = self.elapsed()
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=1, default=str))
        line = f"[{self.elapsed():6.1f} s] {key}: {json.dumps(value, default=str)[:400]}"
        print(line, flush=True)
        with open(self.out / "log.txt", "a") as f:
            f.write(line + "\n")

    def part(self, name: str, needs_s: float, fn: Any, *args: Any) -> Any:
        """Run part `name` if `needs_s` seconds remain in the budget; record its result or its failure."""
        left = self.budget - self.elapsed()
        if left < needs_s:
            self.put(name, {"skipped": f"{left:.0f} s left of the budget, the part needs ≈ {needs_s:.0f} s"})
            return None
        tic = time.perf_counter()
        try:
            result = fn(*args)
        except Exception as e:
            result = {"error": f"{type(e).__name__}: {e}"[:500], "traceback": traceback.format_exc()[-4000:]}
        if isinstance(result, dict):
            result["part_s"] = time.perf_counter() - tic
        self.put(name, result)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return result


# ---------------------------------------------------------------------------- 1. correctness


def compare(a: Any, b: Any) -> dict[str, Any]:
    """Tokens equal (all / share), masks equal, and the largest log-prob gap over tokens both drew alike."""
    same = a.tokens.shape == b.tokens.shape
    equal = (a.tokens == b.tokens) if same else torch.zeros(1, dtype=torch.bool)
    rows_equal = equal.all(1) if same else equal
    out = {"tokens_equal": bool(equal.all()), "token_share_equal": float(equal.float().mean()),
           "rows_equal_share": float(rows_equal.float().mean())}  # fmt: skip
    if same:
        out["mask_equal"] = bool(torch.equal(a.mask, b.mask))
        for c in CONTEXTS:
            if c in a.logp and c in b.logp and rows_equal.any():
                gap = (a.logp[c] - b.logp[c])[rows_equal].abs().max()
                out[f"max_abs_logp_{c}"] = float(gap)
    return out


def autocast(precision: str) -> Any:
    return torch.autocast(DEV, dtype=torch.bfloat16, enabled=precision == "bf16")


def loops_agree(policy: Any, prompts: list[str], group: int, sampling: Any, precision: str,
                modes: tuple[str, ...]) -> dict[str, Any]:  # fmt: skip
    """Rollouts of the same seeds through `BASE` (graph) and each mode; BASE against each other mode."""
    from t2i_gcpo.policies.base import PromptRecord
    from t2i_gcpo.tasks.loop import group_generators

    records = [PromptRecord(p) for p in prompts]
    outs, stats = {}, {}
    modes = (BASE, *(m for m in modes if m != BASE))
    for mode in modes:
        if hasattr(policy, "fused_sampler"):
            policy.fused_sampler = mode != "transformers"
        decode = "eager" if mode == "transformers" else mode
        with torch.no_grad(), autocast(precision):
            outs[mode] = policy.rollout(records, group, dataclasses.replace(sampling, decode=decode),
                                        group_generators(0, "gpu_check", range(len(records))))  # fmt: skip
        if mode in ("graph", "static", "compile"):
            stats[mode] = dict(policy.last_decode)
    if hasattr(policy, "fused_sampler"):
        policy.fused_sampler = True
    result: dict[str, Any] = {"precision": precision, "decode_stats": stats}
    for mode in modes[1:]:
        result[f"{BASE}_vs_{mode}"] = compare(outs[BASE], outs[mode])
    return result


def correctness(tiny: bool) -> dict[str, Any]:
    from benchmarks.suite.janus_scale import janus_policy, tiny_models
    from t2i_gcpo.policies.base import SamplingParams
    from t2i_gcpo.policies.registry import load_policy

    out: dict[str, Any] = {}
    shapes = ["a photo of a red circle", "a photo of two blue squares",
              "a photo of a green triangle left of a yellow cross", "a photo of three bars"]  # fmt: skip
    prior = load_policy("shapeworld").eval().to(DEV)
    sampling = SamplingParams(guidance_scale=3.0, top_k=50, top_p=0.95)
    for precision in PRECISIONS:
        out[f"ar_prior_{precision}"] = loops_agree(prior, shapes, 8, sampling, precision, ("static", "eager"))
    del prior
    text = load_policy("arithmetic").eval().to(DEV)
    sums = ["4*14*10=?", "16*7+12*12=?", "3+4*5=?", "99-9*9=?"]
    for name, sp in (("plain", SamplingParams()), ("guided", SamplingParams(guidance_scale=2.0, top_k=20))):
        out[f"text_{name}_fp32"] = loops_agree(text, sums, 8, sp, "fp32", ("static", "eager"))
    del text
    # Janus at 1B's width with 2 layers (real head sizes, vocabulary and codebook; a fast build)
    tm = tiny_models()
    tok = tm.build_tiny_janus_tokenizer()
    if tiny:
        model = tm.make_janus(tok, grid=8, device=DEV)
    else:
        shape = dataclasses.replace(tm.JANUS_PRO_1B, layers=2)
        model = tm.make_janus(tok, grid=24, upsample=4, shape=shape, std=0.02, device=DEV)
    janus = janus_policy(model, tok)
    prompts = ["a photo of a red cat", "a photo of two blue dogs left of a green cat"]  # left padding
    js = SamplingParams(guidance_scale=5.0)
    for precision in PRECISIONS:
        out[f"janus_{precision}"] = loops_agree(
            janus, prompts, 4, js, precision, ("static", "eager", "transformers")
        )
    out["janus_mismatch"] = mismatch(janus, prompts, js)
    out["checks"] = verdicts(out)
    return out


def verdicts(out: dict[str, Any]) -> dict[str, bool]:
    """What must hold: every graph run captured (no fallback) and, in float32, drew the tokens of the
    uncaptured step, of the eager loop and (Janus) of transformers' loop. In bf16 the comparisons are
    reported only: kernels chosen differently (a cuBLAS workspace under capture, another reduction order
    in the eager loop) round differently, and one flipped draw changes the rest of its row."""
    checks = {}
    for case, r in out.items():
        if not isinstance(r, dict) or "decode_stats" not in r:
            continue
        base = r["decode_stats"].get(BASE, {})
        if CUDA:
            checks[f"{case}: captured"] = base.get("captures", 0) > 0 and not base.get("fallback")
        if r["precision"] == "fp32":
            for key, cmp in r.items():
                if key.startswith(f"{BASE}_vs_"):
                    checks[f"{case}: {key} tokens equal"] = cmp["tokens_equal"]
    checks["all"] = all(checks.values())
    return checks


def mismatch(policy: Any, prompts: list[str], sampling: Any) -> dict[str, Any]:
    """Recorded log-probs against the teacher-forced ones of the same weights (what the trainer logs as
    mismatch/*): sampled and scored in float32, and sampled in bf16 (graph) and scored under bf16
    autocast (the defaults on a GPU)."""
    from t2i_gcpo.core.losses import rollout_mismatch
    from t2i_gcpo.policies.base import PromptRecord
    from t2i_gcpo.tasks.loop import group_generators

    records = [PromptRecord(p) for p in prompts]
    out = {}
    for precision in PRECISIONS:
        with torch.no_grad():
            with autocast(precision):
                ro = policy.rollout(records, 4, dataclasses.replace(sampling, decode=BASE),
                                    group_generators(1, "gpu_check", range(len(records))))  # fmt: skip
            row = {}
            for c in CONTEXTS:
                with autocast(precision):
                    tf = policy.logprobs(ro, c).float()
                k3, gap = rollout_mismatch(tf, ro.logp[c], ro.mask)
                row[c] = {"k3": float(k3), "max_abs": float(gap)}
        out[precision] = row
    return out


# ---------------------------------------------------------------------------- 2–5. measurements


def suite_ctx(quick: bool) -> Any:
    from benchmarks.suite.common import Context

    return Context(quick=quick, threads=torch.get_num_threads(), device=DEV)


def janus_1b(report: Report, tiny: bool) -> dict[str, Any]:
    from benchmarks.suite import janus_scale as js

    ctx = suite_ctx(quick=False)
    bandwidth = js.copy_bandwidth(ctx.device)
    shape = "tiny" if tiny else "1b"
    batches, slow = ([4, 8], [4, 8]) if tiny else ([16, 64, 128], [16, 128])
    rows = js.race(ctx, shape, batches, slow, js.LOOPS, 2, bandwidth)
    report.put("janus_scale_rows", rows)
    steps = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, sets in (("recipe", []),
                           ("recipe + gradient checkpointing", ["model_options.gradient_checkpointing=true"])):  # fmt: skip
            try:
                steps.append(js.recipe_steps(ctx, name, sets, shape, tmp))
            except Exception as e:  # an out-of-memory step is a result too
                steps.append({"variant": name, "error": f"{type(e).__name__}: {e}"[:500]})
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            report.put("janus_scale_steps", steps)
    ok_steps = [s for s in steps if "error" not in s]
    section = js.section(ctx, rows, ok_steps, shape, bandwidth, 2)
    write_suite(report, "janus_scale", section, ctx)
    return {"rows": rows, "steps": steps, "reading": section["reading"]}


def janus_7b(tiny: bool) -> dict[str, Any]:
    from benchmarks.suite import janus_scale as js

    ctx = suite_ctx(quick=False)
    return {
        "rows": js.race(ctx, "tiny" if tiny else "7b", [16], [], ("graph",), 1, js.copy_bandwidth(ctx.device))
    }


def branch_cost(report: Report) -> dict[str, Any]:
    from benchmarks.suite import branch_cost as bc

    ctx = suite_ctx(quick=True)
    section = bc.run(ctx)
    write_suite(report, "branch_cost", section, ctx)
    return {"rows": section["rows"], "reading": section["reading"]}


def compile_mode() -> dict[str, Any]:
    from t2i_gcpo.policies.base import SamplingParams
    from t2i_gcpo.policies.registry import load_policy

    prior = load_policy("shapeworld").eval().to(DEV)
    shapes = ["a photo of a red circle", "a photo of two blue squares"]
    tic = time.perf_counter()
    out = loops_agree(prior, shapes, 8, SamplingParams(guidance_scale=3.0), "fp32", ("compile",))
    out["seconds_with_compilation"] = time.perf_counter() - tic
    return out


def write_suite(report: Report, name: str, section: dict, ctx: Any) -> None:
    from benchmarks.suite import SECTIONS
    from benchmarks.suite import report as suite_report
    from benchmarks.suite.common import machine

    meta = {
        "command": "python -m benchmarks.gpu_check",
        "quick": False,
        "machine": machine(ctx.device, ctx.threads),
    }
    section["run"] = {"command": meta["command"], "date": meta["machine"]["date"], "quick": ctx.quick,
                      "threads": ctx.threads, "device": ctx.device, "seconds": report.elapsed()}  # fmt: skip
    path = report.out / "suite.json"
    data = suite_report.merge(suite_report.load(path), {name: section}, meta, SECTIONS)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    (report.out / "performance.md").write_text(suite_report.render(data))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument(
        "--out", type=Path, required=True, help="folder for gpu_check.json, suite.json, performance.md"
    )
    ap.add_argument("--budget", type=float, default=420.0, help="seconds; later parts are skipped past it")
    ap.add_argument("--tiny", action="store_true", help="tiny models on the CPU: a dry run of the script")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    report = Report(args.out, args.budget)
    cuda = CUDA
    if not cuda and not args.tiny:
        raise SystemExit("no CUDA device: run with --tiny for a dry run on the CPU")
    import transformers

    report.put("device", {"gpu": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                          "cuda": torch.version.cuda, "transformers": transformers.__version__,
                          "bf16": cuda and torch.cuda.is_bf16_supported(),
                          "memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None})  # fmt: skip
    skip = set(args.skip.split(","))
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 in the comparisons
    # (part, seconds it needs at least on an H200, function, args)
    parts = [
        ("correctness", 30, correctness, args.tiny),
        ("janus_scale_1b", 120, janus_1b, report, args.tiny),
        ("branch_cost", 40, branch_cost, report),
        ("janus_scale_7b", 60, janus_7b, args.tiny),
        ("compile", 90, compile_mode),
    ]
    for name, needs, fn, *fargs in parts:
        if name in skip:
            report.put(name, {"skipped": "asked"})
            continue
        report.part(name, needs, fn, *fargs)
    report.put("done", {"elapsed_s": report.elapsed()})


if __name__ == "__main__":
    main()
