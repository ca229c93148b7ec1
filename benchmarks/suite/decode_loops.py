"""Section `decode_loops`: the autoregressive decode loops (rollout.decode: eager, static, compile) per token
step, with the kernels one step launches and what compiling costs — on this device (policies/decode_loop.py).

Models: the shipped ShapeWorld AR prior (``load_policy("shapeworld")``: 4 layers, d 256, 64 tokens) at 64
images (8 prompts × 8), and a Janus at a mid shape built in memory (tests/tiny_models.py `make_janus`: Llama d
1024, 4 layers, 8 heads, MLP 2816, 16 × 16 = 256 image tokens, codebook 16,384; random N(0, 0.02) weights) at
8 images (2 prompts × 4), both with CFG, float32 (and, where the device multiplies bf16 natively, the AR prior
under bf16 autocast). Each loop: one first pass (compile: the compilation included), then the best of the
repeats, the loops interleaved (eager, static, compile, eager, …: they share the machine's busy moments
alike); ms per token step = a rollout's seconds / T (prefill included). CPU seconds (this process, so without
inductor's compile workers) beside the wall seconds: on a machine shared with other jobs they vary less.

Kernels per token step: one rollout under torch.profiler, the kernels counted inside each step (eager: the
adapter's one-token forward and its sample step; static: `StaticDecodeLoop.step`; compile: each compiled
region, inductor's generated kernels profiled; inductor's caches fresh, so the first pass compiles). A kernel:
an aten op that computes (views, allocations and metadata ops excluded), counted at its innermost computing
op, or one inductor kernel. The column "CUDA est." counts the same step as the decoder runs it on CUDA
(`F.rms_norm` and `scaled_dot_product_attention`, one kernel each; on the CPU the decoder computes both with
plain ops), profiled on the CPU with that path forced.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import gc
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.suite.common import Context, load_average, shared_cpu_note
from t2i_gcpo.hardware import native_bf16

TITLE = "Decode loops: eager, static and compiled token steps, kernels per step (`decode_loops`)"
LOOPS = ("eager", "static", "compile")
META = {
    "aten::as_strided",
    "aten::view",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::empty",
    "aten::empty_strided",
    "aten::_unsafe_view",
    "aten::result_type",
    "aten::alias",
    "aten::resize_",
    "aten::expand",
    "aten::transpose",
    "aten::t",
    "aten::numpy_T",
    "aten::permute",
    "aten::reshape",
    "aten::select",
    "aten::slice",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::split",
    "aten::chunk",
    "aten::detach",
    "aten::lift_fresh",
    "aten::contiguous",
    "aten::split_with_sizes",
    "aten::narrow",
    "aten::unbind",
    "aten::expand_as",
    "aten::view_as",
    "aten::_reshape_alias",
    "aten::empty_like",
    "aten::unflatten",
    "aten::flatten",
    "aten::to",
    "aten::unfold",
    "aten::type_as",
    "aten::_to_copy",
}
FUSED_ON_CUDA = {"aten::rms_norm", "aten::_fused_rms_norm"}  # one kernel on CUDA, a composite on the CPU


def kernels(event: Any) -> int:
    """Kernels under a profiler event: its innermost computing ops (module docstring)."""
    if "cpp_fused" in event.name or "triton_" in event.name or event.name in FUSED_ON_CUDA:
        return 1
    inner = sum(kernels(c) for c in event.cpu_children)
    if inner:
        return inner
    return int(event.name.startswith("aten::") and event.name not in META)


def kernels_per_step(fn: Callable[[], Any], regions: list[tuple[Any, str]], compiled: bool) -> float:
    """Run `fn` (one rollout) under the profiler and count the kernels per call of the `regions` ((owner,
    name) of each callable a token step is made of; each wrapped in a profiler range) or, `compiled`, per
    compiled region. → kernels per token step."""
    from torch.profiler import ProfilerActivity, profile, record_function

    originals = [(owner, name, getattr(owner, name)) for owner, name in regions]
    for owner, name, real in originals:
        label = f"step:{name}"

        def wrapped(*args, _real=real, _label=label, **kwargs):
            with record_function(_label):
                return _real(*args, **kwargs)

        setattr(owner, name, wrapped)
    try:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, *cuda_activity()]) as prof:
            fn()
    finally:
        for owner, name, real in originals:
            setattr(owner, name, real)
    counts, calls = collections.Counter(), collections.Counter()
    for e in prof.events():
        key = "compiled" if compiled and e.name.startswith("Torch-Compiled Region") else None
        key = key or (e.name if e.name.startswith("step:") else None)
        if key and not (e.cpu_parent and e.cpu_parent.name == e.name):
            counts[key] += kernels(e)
            calls[key] += 1
    return sum(counts[k] / max(calls[k], 1) for k in counts)


@contextlib.contextmanager
def cuda_kernels() -> Any:
    """Fused decoders built meanwhile take CUDA's path on the CPU (`FusedLlamaDecoder.fused_kernels`)."""
    from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder

    real = FusedLlamaDecoder.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.fused_kernels = True

    FusedLlamaDecoder.__init__ = init
    try:
        yield
    finally:
        FusedLlamaDecoder.__init__ = real


def cuda_activity() -> list:
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CUDA] if torch.cuda.is_available() else []


def janus_mid(device: str) -> Any:
    from benchmarks.suite.janus_scale import janus_policy, tiny_models

    tm = tiny_models()
    tok = tm.build_tiny_janus_tokenizer()
    shape = tm.JanusShape(hidden=1024, layers=4, heads=8, kv_heads=8, intermediate=2816, codebook=16384)
    return janus_policy(tm.make_janus(tok, grid=16, upsample=1, shape=shape, std=0.02, device=device), tok)


@dataclasses.dataclass
class Case:
    label: str
    policy: Any
    prompts: list[str]
    group: int
    sampling: Any
    steps: int  # T
    eager_regions: list[tuple[Any, str]]
    autocast: bool = False


def cases(ctx: Context) -> list[Case]:
    from t2i_gcpo.policies import ar as ar_adapter
    from t2i_gcpo.policies import janus as janus_adapter
    from t2i_gcpo.policies.registry import load_policy

    ar = load_policy("shapeworld").eval().to(ctx.device)
    shapes = [
        "a photo of a red circle",
        "a photo of two blue squares",
        "a photo of a green triangle",
        "a photo of three bars",
    ] * 2
    ar_regions = [(type(ar), "decode_one_token"), (ar_adapter, "sample_step")]
    out = [
        Case(
            "ShapeWorld AR prior, 64 images, fp32",
            ar,
            shapes,
            8,
            ar.default_sampling(),
            ar.num_tokens,
            ar_regions,
        )
    ]
    if native_bf16(ctx.device):
        out.append(dataclasses.replace(out[0], label="ShapeWorld AR prior, 64 images, bf16", autocast=True))
    if not ctx.quick:
        janus = janus_mid(ctx.device)
        j_regions = [(type(janus), "_decode_one_token"), (janus_adapter, "sample_step")]
        out.append(
            Case(
                "Janus mid shape (d 1024, 4 layers, 256 tokens), 8 images, fp32",
                janus,
                ["a photo of a red cat", "a photo of two blue dogs left of a green cat"],
                4,
                dataclasses.replace(janus.default_sampling()),
                janus.num_image_tokens,
                j_regions,
            )
        )
    return out


def timed(ctx: Context, fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall, this process's CPU) seconds of one call."""
    ctx.sync()
    wall, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        fn()
    ctx.sync()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(ctx: Context, case: Case, repeats: int) -> list[dict]:
    from t2i_gcpo.policies.base import PromptRecord
    from t2i_gcpo.policies.decode_loop import DecodeSession, StaticDecodeLoop
    from t2i_gcpo.tasks.loop import group_generators

    records = [PromptRecord(p) for p in case.prompts]
    images = len(records) * case.group
    modes = {loop: "graph" if loop == "static" and ctx.device == "cuda" else loop for loop in LOOPS}
    case.policy.decode_session = DecodeSession()  # one loop, its graphs and its compilation, for every mode
    torch._dynamo.reset()

    def rollout(mode: str, seed: int = 0) -> Any:
        sampling = dataclasses.replace(case.sampling, decode=mode)
        with torch.autocast(ctx.device, dtype=torch.bfloat16, enabled=case.autocast):
            return case.policy.rollout(
                records, case.group, sampling, group_generators(seed, "bench", range(len(records)))
            )

    first, times, errors = {}, collections.defaultdict(list), {}
    for loop, mode in modes.items():  # first passes (compile: its compilation)
        try:
            first[loop] = timed(ctx, functools.partial(rollout, mode))
        except Exception as e:  # a loop that fails records why; the others go on
            errors[loop] = f"{type(e).__name__}: {e}"[:300]
    compiles = case.policy.decode_session.stats["compiles"]
    for r in range(repeats):  # then the loops interleaved, so that they share the machine's moments alike
        for loop, mode in modes.items():
            if loop not in errors:
                times[loop].append(timed(ctx, functools.partial(rollout, mode, r + 1)))
    rows = []
    for loop, mode in modes.items():
        row: dict[str, Any] = {"case": case.label, "loop": mode, "images": images}
        if loop in errors:
            rows.append({**row, "error": errors[loop]})
            continue
        wall, cpu = min(t[0] for t in times[loop]), min(t[1] for t in times[loop])
        regions = case.eager_regions if loop == "eager" else [(StaticDecodeLoop, "step")]
        # a captured step's kernels are counted uncaptured (a replay shows as one launch)
        counted = functools.partial(rollout, "static" if mode == "graph" else mode)
        count = kernels_per_step(counted, [] if loop == "compile" else regions, compiled=loop == "compile")
        cuda = None
        if loop != "compile":  # the same step as CUDA runs it: F.rms_norm and SDPA, one kernel each
            with cuda_kernels():
                session, case.policy.decode_session = case.policy.decode_session, DecodeSession()
                cuda = kernels_per_step(counted, regions, compiled=False)
                case.policy.decode_session = session
        row.update(
            first_s=first[loop][0],
            seconds=wall,
            cpu_s=cpu,
            ms_per_step=1e3 * wall / case.steps,
            cpu_ms_per_step=1e3 * cpu / case.steps,
            kernels=count,
            kernels_cuda=cuda,
            compiles=compiles if loop == "compile" else None,
        )
        rows.append(row)
        print(
            f"  decode_loops {case.label} {mode}: first {first[loop][0]:.2f} s, best {wall:.2f} s "
            f"({row['ms_per_step']:.1f} ms / step, CPU {row['cpu_ms_per_step']:.1f}), "
            f"{count:.0f} kernels / step",
            flush=True,
        )
    case.policy.decode_session = DecodeSession()
    gc.collect()
    return rows


def run(ctx: Context) -> dict:
    import torch._inductor.config as inductor_config

    load = load_average()
    inductor_config.cpp.enable_kernel_profile = True  # inductor's CPU kernels as profiler events
    # compile's first pass compiles: no graph nor C++ kernel cached by an earlier run
    inductor_config.fx_graph_cache = False
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="decode_loops_inductor_")
    repeats = ctx.pick(1, 3)
    rows = []
    for case in cases(ctx):
        rows += measure(ctx, case, repeats)
    return section(ctx, rows, repeats, load)


def section(ctx: Context, rows: list[dict], repeats: int, load: Any) -> dict:
    by = {(r["case"], r["loop"]): r for r in rows if "error" not in r}
    parts, static_vs_eager = [], []
    for case in dict.fromkeys(r["case"] for r in rows):
        eager, static = by.get((case, "eager")), by.get((case, "static")) or by.get((case, "graph"))
        comp = by.get((case, "compile"))
        bits = []
        if eager and static:
            bits.append(
                f"eager {eager['ms_per_step']:.1f} ms per token step ({eager['kernels']:.0f} kernels), "
                f"static {static['ms_per_step']:.1f} ({static['kernels']:.0f})"
            )
            static_vs_eager.append(f"{static['cpu_ms_per_step'] / eager['cpu_ms_per_step']:.2f}× ({case})")
        if comp and static:
            cost = comp["first_s"] - static["seconds"]
            bits.append(
                f"compiled {comp['ms_per_step']:.1f} ({comp['kernels']:.0f} kernels, "
                f"{comp['compiles']} graph{'s' if (comp['compiles'] or 0) > 1 else ''}): after a first pass "
                f"of {comp['first_s']:.0f} s ({cost:.0f} s of compiling) "
                f"{comp['cpu_ms_per_step'] / static['cpu_ms_per_step']:.2f}× the static step's CPU time"
            )
        parts.append(f"{case}: " + "; ".join(bits) + ".")
    failed = [f"{r['case']} {r['loop']}: {r['error']}" for r in rows if "error" in r]
    if failed:
        parts.append("Failed: " + "; ".join(failed) + ".")
    reading = " ".join(parts)
    if ctx.device != "cuda" and static_vs_eager:
        reading += (
            " The static step exists to be captured on CUDA, where `rollout.decode: auto` runs it (on the "
            "CPU auto is eager); it attends over spans of 128 cache slots where the eager loop reads the "
            "filled slots only, and its CPU time is " + ", ".join(static_vs_eager) + " the eager loop's. "
            "Kernels per step: computing ops counted with the profiler; the CUDA estimate counts the step "
            "as CUDA runs it (RMS norm and attention one kernel each)." + shared_cpu_note(load)
        )
    return {
        "title": TITLE,
        "timing": f"one first pass each, then the best of {repeats}, the loops interleaved; kernels: one "
        f"profiled rollout",
        "columns": [
            ("case", "model, images, precision"),
            ("loop", "loop"),
            ("ms_per_step", "ms / token step"),
            ("cpu_ms_per_step", "CPU ms / token step"),
            ("first_s", "first pass s"),
            ("kernels", "kernels / step"),
            ("kernels_cuda", "CUDA est."),
        ],
        "rows": rows,
        "summary": {f"{r['case']} | {r['loop']}": r.get("ms_per_step") for r in rows},
        "reading": reading,
    }
