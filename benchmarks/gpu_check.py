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
4b. `llamagen` (benchmarks/suite/llamagen.py): LlamaGen-T2I at GPT-XL shape, the graph and
eager loops beside the
   port of the reference's own loop at 16 / 64 images, and their agreement (prefill logits, greedy tokens).
5. `compile`: rollout.decode=compile on the AR prior (seconds to compile; tokens against static; one
   compilation for the run).
6. `failure_paths`: each way this check's machinery can fail, made to fail on purpose, and that it recorded
   the failure and went on: a decode-step capture that fails (on CUDA inside the real capture, by a host
   sync CUDA does not allow there, which invalidates it as a real failure does; --tiny: the test suite's
   stand-in, tests/capture_standin.py, failing as `capture_end` does) samples what the uncaptured step
   samples, puts the stream back and leaves the allocator usable (`empty_cache` and an allocation after
   it); a Janus `generate` that raises TypeError (as transformers 5.17's does) costs the
   `janus_scale` rows of that loop only, skipped with the reason after its first failure; a recipe step that
   raises is a row with its error; a part that raises is recorded and the next part runs.
7. `study` (only with --study): the pre-registered study's left-out cells (docs/study.md#prereg-left-out:
   `tree`, `pods` and `knapsack` against DAPO on ShapeWorld-32 AR and masked), `t2i-gcpo compare` runs side
   by side (--study-jobs), in a scratch folder (--study-dir, resumable: a later call goes on where the budget
   stopped this one); their comparison.md / .json and each run's metrics.jsonl are copied under OUT/study.

The correctness part also checks the decode loop kept for a run (one capture per span a run: a second pass
after an optimizer step captures nothing and draws what a fresh eager pass draws), Janus continuations under
bf16 (the branched rollouts every branching scheme makes) and LoRA through the fused decoder (tokens of
peft's own layers).

Also written: OUT/suite.json and OUT/performance.md, the suite's JSON and page for the janus_scale,
llamagen and branch_cost sections measured here (merge them into benchmarks/results/suite.json with
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
    out = {
        "tokens_equal": bool(equal.all()),
        "token_share_equal": float(equal.float().mean()),
        "rows_equal_share": float(rows_equal.float().mean()),
    }
    if same:
        out["mask_equal"] = bool(torch.equal(a.mask, b.mask))
        for c in CONTEXTS:
            if c in a.logp and c in b.logp and rows_equal.any():
                gap = (a.logp[c] - b.logp[c])[rows_equal].abs().max()
                out[f"max_abs_logp_{c}"] = float(gap)
    return out


def autocast(precision: str) -> Any:
    return torch.autocast(DEV, dtype=torch.bfloat16, enabled=precision == "bf16")


def loops_agree(
    policy: Any, prompts: list[str], group: int, sampling: Any, precision: str, modes: tuple[str, ...]
) -> dict[str, Any]:
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
            outs[mode] = policy.rollout(
                records,
                group,
                dataclasses.replace(sampling, decode=decode),
                group_generators(0, "gpu_check", range(len(records))),
            )
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
    shapes = [
        "a photo of a red circle",
        "a photo of two blue squares",
        "a photo of a green triangle left of a yellow cross",
        "a photo of three bars",
    ]
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
                ro = policy.rollout(
                    records,
                    4,
                    dataclasses.replace(sampling, decode=BASE),
                    group_generators(1, "gpu_check", range(len(records))),
                )
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
        for name, sets in (
            ("recipe", []),
            ("recipe + gradient checkpointing", ["model_options.gradient_checkpointing=true"]),
        ):
            steps.append(js.recipe_step_or_error(ctx, name, sets, shape, tmp))
            report.put("janus_scale_steps", steps)
    section = js.section(ctx, rows, steps, shape, bandwidth, 2)
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


def llamagen(report: Report, tiny: bool) -> dict[str, Any]:
    from benchmarks.suite import llamagen as lg

    ctx = suite_ctx(quick=tiny)
    section = lg.run(ctx)
    write_suite(report, "llamagen", section, ctx)
    agreement = section["summary"]["agreement"]
    return {"rows": section["rows"], "agreement": agreement, "reading": section["reading"]}


def compile_mode() -> dict[str, Any]:
    from t2i_gcpo.policies.base import PromptRecord, SamplingParams
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.tasks.loop import group_generators

    prior = load_policy("shapeworld").eval().to(DEV)
    shapes = ["a photo of a red circle", "a photo of two blue squares"]
    tic = time.perf_counter()
    out = loops_agree(prior, shapes, 8, SamplingParams(guidance_scale=3.0), "fp32", ("compile",))
    out["seconds_with_compilation"] = time.perf_counter() - tic
    # another pass of the run (fewer rows, another guidance scale): the same compilation and graphs
    tic = time.perf_counter()
    with torch.no_grad():
        prior.rollout(
            [PromptRecord(shapes[0])],
            4,
            SamplingParams(guidance_scale=5.0, decode="compile"),
            group_generators(1, "gpu_check", [0]),
        )
    out["second_pass_s"] = time.perf_counter() - tic
    out["second_pass"] = dict(prior.last_decode)
    out["run"] = dict(prior.decode_session.stats)
    out["one_compilation"] = out["run"]["compiles"] == out["decode_stats"]["compile"]["compiles"]
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
    section["run"] = {
        "command": meta["command"],
        "date": meta["machine"]["date"],
        "quick": ctx.quick,
        "threads": ctx.threads,
        "device": ctx.device,
        "seconds": report.elapsed(),
    }
    path = report.out / "suite.json"
    data = suite_report.merge(suite_report.load(path), {name: section}, meta, SECTIONS)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    (report.out / "performance.md").write_text(suite_report.render(data))


# ------------------------------------------------------------------- 1b. the run's loop, bf16 branching, LoRA


def run_loop_checks(tiny: bool) -> dict[str, Any]:
    """One capture a run (two graph passes with an optimizer step between them: the second captures nothing
    and draws the eager loop's tokens), Janus continuations under bf16 autocast (they ran transformers'
    StaticCache, which raised), and Janus with LoRA through the fused decoder against peft's own layers."""
    from benchmarks.suite.janus_scale import janus_policy, tiny_models
    from t2i_gcpo.policies.base import PromptRecord, SamplingParams
    from t2i_gcpo.policies.branching import continuation_keys
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.tasks.loop import group_generators

    out: dict[str, Any] = {}
    shapes = ["a photo of a red circle", "a photo of two blue squares"]
    records = [PromptRecord(p) for p in shapes]
    prior = load_policy("shapeworld").eval().to(DEV)
    sampling = SamplingParams(guidance_scale=3.0, top_k=50, decode=BASE)
    gens = lambda seed: group_generators(seed, "gpu_check", range(len(records)))  # noqa: E731
    with torch.no_grad():
        prior.rollout(records, 8, sampling, gens(0))
    first = dict(prior.decode_session.stats)
    ro = prior.rollout(records, 8, sampling, gens(0))
    opt = torch.optim.AdamW([p for p in prior.parameters() if p.requires_grad], lr=1e-3)
    (-prior.logprobs(ro, "guided").mean()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        again = prior.rollout(records, 8, sampling, gens(1))
        fresh = prior.rollout(records, 8, dataclasses.replace(sampling, decode="eager"), gens(1))
    stats = dict(prior.decode_session.stats)
    out["one_capture_a_run"] = {
        "first_pass": first,
        "after": stats,
        "second_pass": dict(prior.last_decode),
        **compare(again, fresh),
    }
    del prior, opt
    tm = tiny_models()
    tok = tm.build_tiny_janus_tokenizer()
    if tiny:
        model = tm.make_janus(tok, grid=8, device=DEV)
    else:
        model = tm.make_janus(
            tok,
            grid=24,
            upsample=4,
            shape=dataclasses.replace(tm.JANUS_PRO_1B, layers=2),
            std=0.02,
            device=DEV,
        )
    janus = janus_policy(model, tok)
    prompts = [
        PromptRecord(p) for p in ["a photo of a red cat", "a photo of two blue dogs left of a green cat"]
    ]
    js = SamplingParams(guidance_scale=5.0, autocast="bf16", decode=BASE)
    points = torch.tensor([[0], [7]])
    with torch.no_grad(), torch.autocast(DEV, dtype=torch.bfloat16):
        ro = janus.rollout(prompts, 1, js, group_generators(0, "gpu_check", range(2)))
        br = janus.branch(ro, points, 1, group_generators(0, "gpu_check", range(2)))
    assert [k[0] for k in continuation_keys([0, 1], 1, points, 1)] == [0, 1]
    out["janus_bf16_branching"] = {
        "ran": True,
        "from_point_0_equals_rollout": bool(torch.equal(br.rollout.tokens[0], ro.tokens[0])),
        "prefix_kept": bool(torch.equal(br.rollout.tokens[1, :7], ro.tokens[1, :7])),
    }
    janus._add_lora({"r": 8})
    with torch.no_grad():
        for name, p in janus.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    fp32 = SamplingParams(guidance_scale=5.0, decode=BASE)
    with torch.no_grad():
        fused = janus.rollout(prompts, 2, fp32, group_generators(0, "gpu_check", range(2)))
        janus.fused_sampler = False
        theirs = janus.rollout(
            prompts, 2, dataclasses.replace(fp32, decode="eager"), group_generators(0, "gpu_check", range(2))
        )
        janus.fused_sampler = True
    out["janus_lora"] = {
        "samples_fused": janus.samples_fused,
        "decode": dict(janus.last_decode),
        **compare(fused, theirs),
    }
    one = out["one_capture_a_run"]
    out["checks"] = {
        "second pass captured nothing": one["after"]["captures"] == one["first_pass"]["captures"],
        "second pass = fresh eager tokens": one["tokens_equal"],
        "weights refreshed in place": one["after"]["refreshes"] >= 1 and one["after"]["allocations"] == 1,
        "janus bf16 branching ran": out["janus_bf16_branching"]["prefix_kept"],
        "lora fused = peft tokens": out["janus_lora"]["tokens_equal"],
    }
    out["checks"]["all"] = all(out["checks"].values())
    return out


# ---------------------------------------------------------------------------- 6. failure paths


def failure_paths(report: Report, tiny: bool) -> dict[str, Any]:
    """Each way this check's machinery can fail, made to fail on purpose (module docstring, part 6)."""
    out = {"capture": failing_capture(), "janus_scale_rows": broken_generate(), "recipe_step": failing_step()}
    sub = Report(report.out / "failure_paths", budget=60)
    sub.part("raises", 0, lambda: 1 / 0)
    sub.part("after", 0, lambda: {"ran": True})
    out["part"] = {"recorded": sub.data["raises"].get("error"), "next_part_ran": sub.data["after"].get("ran")}
    rows = out["janus_scale_rows"]["rows"]
    by = {(r["images"], r["loop"]): r for r in rows}
    out["checks"] = {
        "capture failure: same tokens": out["capture"]["tokens_equal"],
        "capture failure: recorded": bool(out["capture"]["fallback"]),
        "capture failure: stream put back": out["capture"]["stream_restored"],
        "capture failure: allocator usable": out["capture"]["allocator_usable"] is True,
        "generate raising: its row has the error": "TypeError" in (by[(4, "generate")].get("error") or ""),
        "generate raising: later rows skipped with the reason": "TypeError"
        in (by[(8, "generate")].get("skipped") or ""),
        "generate raising: the other loops measured": all(by[(b, "graph")]["seconds"] for b in (4, 8)),
        "recipe step raising: recorded": "injected" in (out["recipe_step"].get("error") or ""),
        "part raising: recorded, next part ran": bool(out["part"]["recorded"])
        and out["part"]["next_part_ran"],
    }
    out["checks"]["all"] = all(out["checks"].values())
    return out


def failing_capture() -> dict[str, Any]:
    """The AR prior sampled with its first span's capture failing: on CUDA an error raised inside the real
    `torch.cuda.graph` capture, on the CPU the stand-in's; against the uncaptured step's tokens."""
    import contextlib

    from t2i_gcpo.policies import ar as ar_adapter
    from t2i_gcpo.policies.base import PromptRecord, SamplingParams
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.tasks.loop import group_generators

    prior = load_policy("shapeworld").eval().to(DEV)
    records = [PromptRecord("a photo of a red circle"), PromptRecord("a photo of two blue squares")]
    sampling = SamplingParams(guidance_scale=3.0, top_k=50)
    gens = lambda: group_generators(0, "gpu_check", range(2))  # noqa: E731
    with torch.no_grad():
        want = prior.rollout(records, 4, dataclasses.replace(sampling, decode="static"), gens())
    with contextlib.ExitStack() as stack:
        if CUDA:
            real = torch.cuda.graph

            @contextlib.contextmanager
            def failing(*args, **kwargs):
                with real(*args, **kwargs):
                    # a host sync inside the capture: CUDA refuses it and invalidates the capture, so that
                    # capture_end's cudaStreamEndCapture fails before the allocator stops using the pool
                    torch.zeros(2, device=DEV).sum().item()
                yield

            stack.enter_context(patched(torch.cuda, "graph", failing))
            before = torch.cuda.current_stream()
            restored = lambda: torch.cuda.current_stream() == before  # noqa: E731
        else:
            sys.path.insert(0, str(REPO / "tests"))
            from capture_standin import StandInCuda

            fake = stack.enter_context(StandInCuda(fail_at=0).installed(span=16))
            stack.enter_context(patched(ar_adapter, "resolve_mode", lambda *args: "graph"))
            restored = lambda: fake.current is fake.default  # noqa: E731
        with torch.no_grad():
            got = prior.rollout(records, 4, dataclasses.replace(sampling, decode="graph"), gens())
        ok = restored()
        try:  # what Report.part does after every part, and an allocation after it
            torch.cuda.empty_cache()
            if CUDA:
                torch.ones(1 << 20, device=DEV).sum().item()
            usable = True
        except Exception as e:
            usable = f"{type(e).__name__}: {e}"[:300]
    return {
        "fallback": prior.last_decode["fallback"],
        "stream_restored": ok,
        "allocator_usable": usable,
        "fallbacks_counted": prior.decode_session.stats["fallbacks"],
        **compare(got, want),
    }


def broken_generate() -> dict[str, Any]:
    """`janus_scale`'s race at the tiny shape with Janus `generate` raising TypeError."""
    from transformers import JanusForConditionalGeneration

    from benchmarks.suite import janus_scale as js

    def broken(self, *args, **kwargs):
        raise TypeError(
            "injected: JanusForConditionalGeneration.generate() got an unexpected keyword argument"
        )

    with patched(JanusForConditionalGeneration, "generate", broken):
        rows = js.race(suite_ctx(quick=True), "tiny", [4, 8], [4, 8], js.LOOPS, 1, 1e10)
    return {"rows": rows}


def failing_step() -> dict[str, Any]:
    """A recipe step that raises, through the row-or-error wrapper `janus_scale_1b` uses."""
    from benchmarks.suite import janus_scale as js
    from t2i_gcpo.train.trainer import Trainer

    def boom(self, step):
        raise RuntimeError("injected: CUDA out of memory (stand-in)")

    with tempfile.TemporaryDirectory() as tmp, patched(Trainer, "train_step", boom):
        return js.recipe_step_or_error(suite_ctx(quick=True), "recipe (failure injected)", [], "tiny", tmp)


def patched(owner: Any, name: str, value: Any) -> Any:
    """`owner.name = value` for a `with` block."""
    import contextlib

    @contextlib.contextmanager
    def scope():
        old = getattr(owner, name)
        setattr(owner, name, value)
        try:
            yield
        finally:
            setattr(owner, name, old)

    return scope()


# ---------------------------------------------------------------------------- 7. the study's left-out cells

STUDY_CELLS = {  # docs/study.md#prereg-left-out: the commands of the arithmetic regime on ShapeWorld
    "sw32-ar-tree": [
        "--model",
        "shapeworld",
        "--algos",
        "dapo,tree",
        "--match-budget",
        "samples,tokens",
        "--steps",
        "150",
        "--eval-every",
        "25",
    ],
    "sw32-ar-alloc": [
        "--model",
        "shapeworld",
        "--algos",
        "dapo,pods,knapsack",
        "--match-budget",
        "samples",
        "--steps",
        "150",
        "--eval-every",
        "25",
    ],
    "sw32-masked-tree": [
        "--model",
        "shapeworld-masked",
        "--algos",
        "dapo,tree",
        "--match-budget",
        "samples,tokens",
        "--steps",
        "60",
        "--eval-every",
        "20",
        "--set",
        "rollout.reveal_order=random",
        "--set",
        "optim.lr=3e-5",
    ],
    "sw32-masked-alloc": [
        "--model",
        "shapeworld-masked",
        "--algos",
        "dapo,pods,knapsack",
        "--match-budget",
        "samples",
        "--steps",
        "60",
        "--eval-every",
        "20",
        "--set",
        "rollout.reveal_order=random",
        "--set",
        "optim.lr=3e-5",
    ],
}


def study_command(cell: str, seeds: str, jobs: int, out: Path, tiny: bool) -> list[str]:
    """The `t2i-gcpo compare` command of a left-out cell (--tiny: 1 step, 1 seed, no matched arms)."""
    args = list(STUDY_CELLS[cell])
    if tiny:
        keep = {"--model": args[args.index("--model") + 1]}
        args = [
            "--model",
            keep["--model"],
            "--algos",
            "dapo,tree",
            "--steps",
            "1",
            "--eval-every",
            "1",
            "--set",
            "eval_images_per_prompt=1",
        ]
        seeds = "1"
    return [
        sys.executable,
        "-m",
        "t2i_gcpo.cli",
        "compare",
        *args,
        "--seeds",
        seeds,
        "--jobs",
        str(jobs),
        "--set",
        "sample_every=0",
        "--report-to",
        "none",
        "--out",
        str(out),
    ]


def study(
    report: Report, cells: list[str], seeds: str, jobs: int, scratch: Path, tiny: bool
) -> dict[str, Any]:
    """Run the left-out cells one after the other within the budget left (module docstring, part 7)."""
    import shutil
    import subprocess

    out: dict[str, Any] = {}
    for cell in cells:
        left = report.budget - report.elapsed() - 30  # room to copy and write the results
        if left < 60:
            out[cell] = {"skipped": f"{left:.0f} s of the budget left"}
            continue
        runs = scratch / cell
        cmd = study_command(cell, seeds, jobs, runs, tiny)
        tic = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=REPO, timeout=left, capture_output=True, text=True)
            rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
        except subprocess.TimeoutExpired as e:
            rc, tail = "timeout", (str(e.stdout or "") + str(e.stderr or ""))[-3000:]
        dest = report.out / "study" / cell
        dest.mkdir(parents=True, exist_ok=True)
        for f in list(runs.glob("comparison.*")) + list(runs.glob("*/seed*/metrics.jsonl")):
            target = dest / f.relative_to(runs)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
        finished = sorted(str(p.parent.relative_to(runs)) for p in runs.glob("*/seed*/metrics.jsonl"))
        out[cell] = {
            "command": " ".join(cmd),
            "returncode": rc,
            "seconds": time.perf_counter() - tic,
            "runs_with_metrics": finished,
            "compared": (runs / "comparison.json").exists(),
            "tail": tail,
        }
        report.put("study_progress", out)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--out", type=Path, required=True, help="folder for gpu_check.json, suite.json, performance.md"
    )
    ap.add_argument("--budget", type=float, default=420.0, help="seconds; later parts are skipped past it")
    ap.add_argument("--tiny", action="store_true", help="tiny models on the CPU: a dry run of the script")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip")
    ap.add_argument("--study", action="store_true", help="also run the study's left-out cells (part 7)")
    ap.add_argument("--study-cells", default=",".join(STUDY_CELLS), help=f"of {', '.join(STUDY_CELLS)}")
    ap.add_argument("--study-seeds", default="5", help="compare --seeds (a count or a list)")
    ap.add_argument("--study-jobs", type=int, default=16, help="compare --jobs: runs side by side")
    ap.add_argument(
        "--study-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "gpu_check_study",
        help="the runs' folder (resumable: a later call goes on where this one stopped)",
    )
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    report = Report(args.out, args.budget)
    cuda = CUDA
    if not cuda and not args.tiny:
        raise SystemExit("no CUDA device: run with --tiny for a dry run on the CPU")
    import transformers

    report.put(
        "device",
        {
            "gpu": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformers": transformers.__version__,
            "bf16": cuda and torch.cuda.is_bf16_supported(),
            "memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None,
        },
    )
    skip = set(args.skip.split(","))
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 in the comparisons
    # (part, seconds it needs at least on an H200, function, args)
    parts = [
        ("correctness", 30, correctness, args.tiny),
        ("janus_scale_1b", 120, janus_1b, report, args.tiny),
        ("branch_cost", 40, branch_cost, report),
        ("janus_scale_7b", 60, janus_7b, args.tiny),
        ("llamagen", 60, llamagen, report, args.tiny),
        ("compile", 90, compile_mode),
        ("failure_paths", 20, failure_paths, report, args.tiny),
    ]
    parts.insert(1, ("decode_session", 20, run_loop_checks, args.tiny))
    if args.study:
        cells = [c for c in args.study_cells.split(",") if c]
        unknown = [c for c in cells if c not in STUDY_CELLS]
        if unknown:
            raise SystemExit(f"unknown study cell(s) {unknown}: choose from {', '.join(STUDY_CELLS)}")
        parts.append(
            ("study", 120, study, report, cells, args.study_seeds, args.study_jobs, args.study_dir, args.tiny)
        )
    for name, needs, fn, *fargs in parts:
        if name in skip:
            report.put(name, {"skipped": "asked"})
            continue
        report.part(name, needs, fn, *fargs)
    report.put("done", {"elapsed_s": report.elapsed()})


if __name__ == "__main__":
    main()
