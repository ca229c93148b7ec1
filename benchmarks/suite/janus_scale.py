"""Section `janus_scale`: the Janus rollout at Janus-Pro's shape — the captured decode loop against the eager
loops and transformers' `generate` — and steps of the Janus-Pro-1B recipe with their peak memory.

Models: a Janus built in memory from a config (tests/tiny_models.py `make_janus`; random N(0, 0.02)
weights, a tiny vision tower and VQ decoder, nothing downloaded). On CUDA at Janus-Pro-1B's shape (Llama
d 2048, 24 layers, 16 heads, MLP 5632, vocabulary 102,400, 24 × 24 = 576 image tokens, codebook 16,384;
1.49 B parameters) and, in the full run, at Janus-Pro-7B's (d 4096, 30 layers, 32 heads, MLP 11008; the
graph loop only, 16 images). On the CPU at a tiny shape (d 64, 2 layers, 8 × 8 tokens, K 64): there the
section only keeps its code alive, and its numbers say nothing about a GPU.

Rollouts: bf16 weights, CFG 5, temperature 1, B images (B/4 prompts × 4), ours recording the pos, neg and
guided log-prob of every token. Loops: `graph` (rollout.decode=graph: the static step of
policies/decode_loop.py captured as CUDA graphs and replayed; on the CPU `static`, the same step
uncaptured), `eager` (the fused decoder stepped from Python), `transformers loop` (the adapter's loop
through transformers' layers and StaticCache: what Janus sampled through before the fused decoder) and
`generate` (transformers' CFG image ``generate`` on the same prompt ids; it records nothing). ms per
token step: the rollout's seconds / T (prefill included). Roofline: the bytes one step must read — the
matmul weights of the language model and the generation head and aligner once, and both CFG rows' KV
cache at the mean context L + T/2 once — over this device's copy bandwidth (a device-to-device copy of
1 GiB on CUDA, 2 bytes moved per byte copied; best of 5). The graph loop: best of the repeats after one
warm-up; the slow loops (launch-bound, so flat in the batch) one call each, after the graph loop's
warm-up, at the smallest and largest batch only.

The recipe: t2i_gcpo/configs/recipes/janus_pro_1b_geneval.yaml as shipped (8 prompts × 16 images,
rollout.autocast and rollout.decode 'auto'), the 1B-shape model in float32 as its model_options say, a
Python reward (how red each image is), dynamic sampling off so a step samples one batch, two steps through
`Trainer.train_step` (no checkpoint written); reported: the second step's time/rollout, time/reward
(decode + score), time/update and wall time, each phase's peak memory (rl_step's `PhaseMemory`), the peak
of ``torch.cuda.max_memory_allocated`` over both steps, and the mismatch/* metrics (the rollout's
recorded log-probs against the update's). Variants on CUDA: the recipe with gradient checkpointing.
On the CPU: the same recipe at the tiny shape, 2 prompts × 2.
"""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.suite.common import (
    REPO,
    Context,
    PeakMemory,
    linear_params,
    load_average,
    plural,
    shared_cpu_note,
)

TITLE = "Janus at Janus-Pro's shape: decode loops and the recipe step (`janus_scale`)"
GROUP = 4
SCALE = 5.0
PROMPT = "a photo of a red cat"
RECIPE = REPO / "t2i_gcpo" / "configs" / "recipes" / "janus_pro_1b_geneval.yaml"
STEP_PROMPTS = [
    "a photo of a red cat",
    "a photo of two blue dogs",
    "a photo of a green cat",
    "a photo of a yellow dog",
    "a photo of a cat",
    "a photo of a dog left of a cat",
    "a photo of three cats",
    "a photo of a white dog",
]
LOOPS = ("graph", "eager", "transformers loop", "generate")
TARGET_MS = {64: 5.0, 128: 9.0}  # issue 46: ms per token step at 1B shape, by images


def tiny_models() -> Any:
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))
    import tiny_models

    return tiny_models


def build(shape: str, device: str, dtype: torch.dtype) -> tuple[Any, Any]:
    """(JanusForConditionalGeneration, tokenizer) at `shape` ('tiny', '1b', '7b'), built on `device`."""
    tm = tiny_models()
    tok = tm.build_tiny_janus_tokenizer()
    if shape == "tiny":
        kw = dict(grid=8)
    else:
        kw = dict(grid=24, upsample=4, shape=tm.JANUS_PRO_1B if shape == "1b" else tm.JANUS_PRO_7B, std=0.02)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in `dtype`: a 7B model is never materialised in float32
    try:
        return tm.make_janus(tok, device=device, **kw), tok
    finally:
        torch.set_default_dtype(default)


def janus_policy(model: Any, tok: Any, trainable: bool = False) -> Any:
    from t2i_gcpo.policies.janus import JanusPolicy

    policy = JanusPolicy(model, tok, chat_template=tok.chat_template)
    if trainable:  # as JanusPolicy.from_pretrained's default: the vision tower and VQ frozen
        policy._set_trainable(("vision", "vq"), None)
    else:
        policy.requires_grad_(False)
    return policy.eval()


def copy_bandwidth(device: str) -> float:
    """Bytes per second a device-to-device copy moves (read + write), best of 5."""
    n = (1 << 28) if device == "cuda" else (1 << 24)  # float32 elements: 1 GiB on CUDA, 64 MiB on the CPU
    a, b = torch.ones(n, device=device), torch.empty(n, device=device)
    best = float("inf")
    for i in range(6):
        if device == "cuda":
            torch.cuda.synchronize()
        tic = time.perf_counter()
        b.copy_(a)
        if device == "cuda":
            torch.cuda.synchronize()
        if i:
            best = min(best, time.perf_counter() - tic)
    return 2 * n * 4 / best


def roofline_ms(policy: Any, images: int, prompt_len: int, bandwidth: float) -> float:
    """ms per token step if a step only read the decode weights once and the KV cache at the mean context
    once (module docstring), in the weights' dtype."""
    m = policy.model.model
    size = next(m.language_model.parameters()).element_size()
    weights = linear_params(m.language_model, m.generation_head, m.generation_aligner) * size
    c = m.language_model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    context = prompt_len + policy.num_image_tokens / 2
    kv = 2 * c.num_hidden_layers * 2 * images * (c.num_key_value_heads or c.num_attention_heads) * head_dim
    return 1e3 * (weights + kv * context * size) / bandwidth


def rollout_fn(policy: Any, loop: str, images: int, device: str) -> Any:
    """A call `fn(seed)` that samples `images` images through `loop`."""
    from t2i_gcpo.policies.base import PromptRecord, SamplingParams
    from t2i_gcpo.tasks.loop import group_generators

    prompts = [PromptRecord(PROMPT)] * (images // GROUP)
    if loop == "generate":
        ids, mask = policy.pad_left(policy.prompt_ids([PROMPT] * images))

        def generate(seed: int) -> None:
            torch.manual_seed(seed)
            policy.model.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_mode="image",
                do_sample=True,
                guidance_scale=SCALE,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
            )

        return generate
    decode = ("graph" if device == "cuda" else "static") if loop == "graph" else "eager"
    sampling = SamplingParams(guidance_scale=SCALE, decode=decode)

    def ours(seed: int) -> None:
        policy.fused_sampler = loop != "transformers loop"
        policy.rollout(prompts, GROUP, sampling, group_generators(seed, "bench", range(len(prompts))))

    return ours


def timed_calls(ctx: Context, fn: Any, calls: int) -> list[float]:
    out = []
    for r in range(calls):
        ctx.sync()
        tic = time.perf_counter()
        with torch.no_grad():
            fn(r)
        ctx.sync()
        out.append(time.perf_counter() - tic)
    return out


def race(
    ctx: Context,
    shape: str,
    batches: list[int],
    slow: list[int],
    loops: tuple[str, ...],
    repeats: int,
    bandwidth: float,
) -> list[dict]:
    """One row per (batch, loop) at `shape`: seconds, ms per token step, images/s, share of the roofline. A
    loop that fails records its error in its row and the others go on; transformers' loops (the adapter's loop
    through transformers' layers, `generate`) that raise anything but out-of-memory are broken in this
    transformers version (5.17's Janus `generate` raises TypeError): their later rows are skipped with that
    reason."""
    import transformers

    model, tok = build(shape, ctx.device, torch.bfloat16 if ctx.device == "cuda" else torch.float32)
    policy = janus_policy(model, tok)
    T = policy.num_image_tokens
    prompt_len = len(policy.prompt_ids([PROMPT])[0])
    rows, broken = [], {}
    for images in batches:
        seconds, stats, why = {}, {}, {}
        for loop in loops:
            if loop != "graph" and images not in slow:
                continue
            if loop in broken:
                seconds[loop], why[loop] = None, {"skipped": broken[loop]}
                continue
            fn = rollout_fn(policy, loop, images, ctx.device)
            try:
                if loop == "graph":  # one warm-up, then the best of the repeats
                    seconds[loop] = min(timed_calls(ctx, fn, repeats + 1)[1:])
                    # the captures of the run's loop (the timed passes replay what the warm-up captured)
                    stats = {**policy.last_decode, "captures": policy.decode_session.stats["captures"]}
                else:
                    seconds[loop] = timed_calls(ctx, fn, 1)[0]
            except torch.OutOfMemoryError as e:
                seconds[loop], why[loop] = None, {"error": f"out of memory: {e}"[:300]}
            except Exception as e:  # a row records its own failure; the race goes on
                error = f"{type(e).__name__}: {e}"[:300]
                seconds[loop], why[loop] = None, {"error": error}
                if loop in ("transformers loop", "generate"):
                    broken[loop] = f"transformers {transformers.__version__}: {loop} raised {error}"
            finally:
                policy.fused_sampler = True
                if ctx.device == "cuda":
                    torch.cuda.empty_cache()
        roof = roofline_ms(policy, images, prompt_len, bandwidth)
        for loop, s in seconds.items():
            row = {"shape": shape, "images": images, "loop": loop, "seconds": s, **why.get(loop, {})}
            if s is not None:
                ms = 1e3 * s / T
                row.update(ms_per_step=ms, images_per_s=images / s, roofline_pct=100 * roof / ms)
                if seconds.get("generate"):
                    row["vs_generate"] = seconds["generate"] / s
            if loop == "graph" and stats:
                row.update(mode=stats["mode"], captures=stats["captures"], fallback=stats["fallback"] or None)
            rows.append(row)
        print(
            f"  janus_scale {shape} {images} images: "
            + ", ".join(f"{k} {v:.2f} s" if v else f"{k} failed" for k, v in seconds.items()),
            flush=True,
        )
    policy.fused_sampler = True
    del policy, model
    gc.collect()
    if ctx.device == "cuda":
        torch.cuda.empty_cache()
    return rows


def redness(images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
    """How red each image is (any cheap score: the step's reward time is then decode time)."""
    x = images.float()
    return x[:, 0].mean((1, 2)) - x[:, 1:].mean((1, 2, 3))


def recipe_steps(ctx: Context, variant: str, overrides: list[str], shape: str, tmp: str) -> dict:
    """Two steps of the 1B recipe at `shape` through `Trainer.train_step` (module docstring) → one row."""
    from benchmarks.suite.rl_step import instrument
    from t2i_gcpo.config import load_config
    from t2i_gcpo.rewards.combine import Checked, FunctionReward
    from t2i_gcpo.train.run import PYTHON_OBJECT, prepare
    from t2i_gcpo.train.trainer import Trainer

    gc.collect()  # an earlier variant's trainer (cycles through accelerate) must not count here
    if ctx.device == "cuda":
        torch.cuda.empty_cache()
    base_gib = torch.cuda.memory_allocated() / 2**30 if ctx.device == "cuda" else None
    model, tok = build(shape, ctx.device, torch.float32)  # the recipe's model_options.dtype
    policy = janus_policy(model, tok, trainable=True)
    if "model_options.gradient_checkpointing=true" in overrides:  # a loader option: applied here
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    prompt_file = Path(tmp) / "prompts.txt"
    prompt_file.write_text("\n".join(STEP_PROMPTS) + "\n")
    flags = {
        "prompts": str(prompt_file),
        "model": f"{PYTHON_OBJECT}:JanusPolicy",
        "reward": f"{PYTHON_OBJECT}:redness",
        "out": f"{tmp}/{variant.replace(' ', '_')}",
        "steps": 2,
    }
    sets = [
        "eval_every=-1",
        "sample_every=0",
        "advantage.dynamic_sampling=false",
        "report_to=none",
        *overrides,
    ]
    if shape == "tiny":
        sets += ["rollout.group_size=2", "rollout.prompts_per_step=2", "optim.minibatches=1"]
    cfg = load_config(config_file=str(RECIPE), flags=flags, overrides=sets)
    if ctx.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    job = prepare(cfg=cfg, policy=policy, reward=Checked(FunctionReward(redness)))
    trainer = Trainer(job.cfg, job.run_dir, job.prompts, job.policy, job.reward, job.task, eval_prompts=None)
    meter = instrument(trainer, ctx.device)
    try:
        rows = []
        for step in (1, 2):
            ctx.sync()
            tic = time.perf_counter()
            row = trainer.train_step(step)
            ctx.sync()
            row["wall_s"] = time.perf_counter() - tic
            row["phase_mb"] = meter.take()
            rows.append(row)
    finally:
        trainer._shutdown()
    last = rows[-1]
    out = {
        "variant": variant,
        "images": cfg.rollout.prompts_per_step * cfg.rollout.group_size,
        "rollout_autocast": cfg.rollout.autocast,
        "optim_autocast": cfg.optim.autocast,
        "step_s": last["wall_s"],
        "rollout_s": last["time/rollout"],
        "reward_s": last["time/reward"],
        "update_s": last["time/update"],
        "first_step_s": rows[0]["wall_s"],
        "decode": dict(getattr(policy, "last_decode", {}) or {}) or None,
        "allocated_before_gib": base_gib,
    }
    for phase in ("rollout", "reward", "update"):
        mbs = [r["phase_mb"].get(phase) for r in rows if r["phase_mb"].get(phase) is not None]
        out[f"{phase}_peak_gib"] = max(mbs) / 1024 if mbs else None
    out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if ctx.device == "cuda" else None
    out.update({k: v for k, v in last.items() if k.startswith("mismatch/")})
    del trainer, job, policy, model
    gc.collect()
    if ctx.device == "cuda":
        torch.cuda.empty_cache()
    print(
        f"  janus_scale recipe {variant}: step {out['step_s']:.1f} s, peak {out['peak_gib']} GiB", flush=True
    )
    return out


def recipe_step_or_error(ctx: Context, variant: str, overrides: list[str], shape: str, tmp: str) -> dict:
    """`recipe_steps`, or the row of its failure (an out-of-memory step is a result too)."""
    try:
        return recipe_steps(ctx, variant, overrides, shape, tmp)
    except Exception as e:
        gc.collect()
        if ctx.device == "cuda":
            torch.cuda.empty_cache()
        return {"variant": variant, "error": f"{type(e).__name__}: {e}"[:500]}


def run(ctx: Context) -> dict:
    load = load_average()
    cuda = ctx.device == "cuda"
    bandwidth = copy_bandwidth(ctx.device)
    if cuda:
        shape, batches, slow = "1b", ctx.pick([16, 64], [16, 64, 128]), ctx.pick([64], [16, 128])
    else:
        shape, batches, slow = "tiny", [4, 8], [4, 8]
    repeats = ctx.pick(1, 2)
    rows = race(ctx, shape, batches, slow, LOOPS, repeats, bandwidth)
    if cuda and not ctx.quick:
        try:
            rows += race(ctx, "7b", [16], [], ("graph",), 1, bandwidth)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
    variants = [("recipe", [])]
    if cuda and not ctx.quick:
        variants.append(("recipe + gradient checkpointing", ["model_options.gradient_checkpointing=true"]))
    with tempfile.TemporaryDirectory() as tmp:
        steps = [recipe_step_or_error(ctx, name, sets, shape, tmp) for name, sets in variants]
    out = section(ctx, rows, steps, shape, bandwidth, repeats)
    out["reading"] += "" if cuda else shared_cpu_note(load)
    return out


def section(
    ctx: Context, rows: list[dict], steps: list[dict], shape: str, bandwidth: float, repeats: int
) -> dict:
    graph = {r["images"]: r for r in rows if r["loop"] == "graph" and r["shape"] == shape and r["seconds"]}
    parts = []
    if ctx.device != "cuda":
        parts.append(
            "On the CPU this section runs a tiny Janus only to keep its code alive (`graph` runs the static "
            "step uncaptured: CUDA graphs need a GPU); its seconds say nothing about a GPU. Built for "
            "CUDA and not yet measured there: the decode loop captured as CUDA graphs (rollout.decode), bf16 "
            "sampling with float32 master weights for Janus, and the memory options "
            "(docs/fast-sampling.md). The Janus-Pro-1B figures come from `python -m benchmarks --only "
            "janus_scale --device cuda` (benchmarks/gpu_check.py runs it with the correctness checks): "
            "pending a GPU run."
        )
    for images, r in sorted(graph.items()):
        target = TARGET_MS.get(images) if shape == "1b" else None
        bits = [
            f"{images} images: {r['ms_per_step']:.2f} ms per token step, {r['images_per_s']:.1f} images/s, "
            f"{r['roofline_pct']:.0f} % of the roofline"
        ]
        if r.get("vs_generate"):
            bits.append(f"{r['vs_generate']:.2f}× `generate`")
        if target:
            bits.append(f"target ≤ {target:g} ms: {'met' if r['ms_per_step'] <= target else 'NOT met'}")
        parts.append(f"The {r['mode']} loop at {shape} shape, " + ", ".join(bits) + ".")
    failed = [
        f"{r['loop']} at {r['images']} images ({r.get('error') or r.get('skipped')})"
        for r in rows
        if r["seconds"] is None
    ]
    if failed:
        parts.append("Not measured: " + "; ".join(failed) + ".")
    for s in steps:
        if "error" in s:
            parts.append(f"Recipe step ({s['variant']}) failed: {s['error']}.")
            continue
        peak = f", peak {s['peak_gib']:.1f} GiB" if s.get("peak_gib") else ""
        parts.append(
            f"Recipe step ({s['variant']}, {s['images']} images, rollout {s['rollout_autocast']}, update "
            f"{s['optim_autocast']}): {s['step_s']:.2f} s — rollout {s['rollout_s']:.2f}, reward "
            f"{s['reward_s']:.2f}, update {s['update_s']:.2f}{peak}."
        )
    return {
        "title": TITLE,
        "timing": f"graph: best of {plural(repeats, 'rollout')} after one warm-up; other loops one "
        f"call each; recipe: the second of two steps",
        "columns": [
            ("shape", "shape"),
            ("images", "images"),
            ("loop", "loop"),
            ("seconds", "s"),
            ("ms_per_step", "ms / token step"),
            ("images_per_s", "images/s"),
            ("roofline_pct", "% of roofline"),
            ("vs_generate", "× generate"),
        ],
        "rows": rows,
        "summary": {
            "shape": shape,
            "copy_bandwidth_gb_s": bandwidth / 1e9,
            "ms_per_step": {str(i): r["ms_per_step"] for i, r in graph.items()},
            "steps": steps,
            "memory": PeakMemory.what(ctx.device),
            "median_graph_roofline_pct": statistics.median(r["roofline_pct"] for r in graph.values())
            if graph
            else None,
        },
        "reading": " ".join(parts),
    }
