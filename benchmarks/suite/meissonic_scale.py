"""Section `meissonic_scale`: Meissonic's transformer at the released shape — a reveal step of the sampler,
one row of the update's forward and backward, and the activation memory the update holds per row.

Model: policies/meissonic_transformer.py built from the release's transformer config (MeissonFlow/Meissonic:
14 two-stream + 28 one-stream blocks, 8 heads × 128, 1,006,946,304 parameters) with random N(0, 0.02) weights,
nothing downloaded; the text encoder is not built (random [77, 1024] states and a [1024] pooled embedding
stand in for CLIP ViT-H/14's: the section measures the transformer). A canvas of 64 × 64 tokens (1024 px) half
masked, the timestep of a mid-schedule step.

Rows:
- ``reveal step``: one forward of the CFG pair of B images (2B rows: what the sampler runs each of its 64
  steps), no gradient; ``rollout s / image`` = 64 × seconds / B, the sampler's transformer time for one image.
- ``update row``: one row's forward and backward (the teacher-forced log-probs of one replayed step or one
  re-mask, summed, backward through the transformer), with ``model_options.gradient_checkpointing`` on and (on
  CUDA) off. The remask estimator of configs/recipes/meissonic_geneval.yaml takes 6 such rows a sample.
- activations: the bytes autograd saves for the backward of one row
  (``torch.autograd.graph.saved_tensors_hooks`` over every tensor saved, counted once per storage), counted on
  models of one and two blocks of each kind and extended to the release's 14 and 28; with checkpointing, each
  block saves its inputs only.

Peak memory: each row's growth above its start (benchmarks/suite/common.PeakMemory). Float32 weights on the
CPU (bf16 would be emulated on a CPU without native bf16); on CUDA float32 weights under bf16 autocast, as the
recipe runs (optim.autocast / rollout.autocast bf16). CPU rows at the real shape take a few minutes on 2
cores: run them alone (`flock /work/heavy.lock python -m benchmarks --only meissonic_scale`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from benchmarks.suite.common import Context, PeakMemory, load_average, shared_cpu_note

TITLE = "Meissonic at its released shape: a reveal step, an update row, activation memory (`meissonic_scale`)"
STEPS = 64  # the sampler's reveal steps (inference.py; the recipe)
REMASKS = 6  # the recipe's re-masks a sample
TEXT = 77  # CLIP ids a prompt


def build(config: Any, device: str, std: float = 0.02) -> Any:
    """The transformer of `config` with random N(0, std) weights (norms 1), built on `device` in float32."""
    from t2i_gcpo.policies.meissonic_transformer import MeissonicTransformer

    with torch.device(device):
        model = MeissonicTransformer(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name.endswith(".weight"):
                p.fill_(1.0)
            else:
                p.normal_(0, std)
    return model.eval()


def inputs(config: Any, side: int, rows: int, device: str) -> dict[str, torch.Tensor]:
    """A half-masked canvas [rows, side, side], micro-conditioning, text states and a
    mid-schedule timestep."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.codebook_size, (rows, side, side), generator=gen)
    masked = torch.rand((rows, side, side), generator=gen) < 0.5
    ids = torch.where(masked, config.vocab_size - 1, ids)
    micro = torch.tensor([[16.0 * side, 16.0 * side, 0, 0, 6]]).expand(rows, -1)
    return {
        "ids": ids.to(device),
        "micro_conds": micro.to(device),
        "pooled_projections": torch.randn(rows, config.pooled_projection_dim, generator=gen).to(device),
        "encoder_hidden_states": torch.randn(rows, TEXT, config.joint_attention_dim, generator=gen).to(
            device
        ),
        "timestep": torch.full((rows,), STEPS // 2, dtype=torch.float32).to(device),
    }


def autocast(ctx: Context) -> Any:
    return torch.autocast("cuda", dtype=torch.bfloat16) if ctx.device == "cuda" else contextlib.nullcontext()


def timed_row(ctx: Context, fn: Any) -> tuple[float, float | None]:
    """(seconds, peak MB) of one call, after one warm-up call on CUDA (on the CPU a call of this size has no
    warm-up to speak of, and each takes minutes)."""
    if ctx.device == "cuda":
        fn()
    meter = PeakMemory(ctx.device)
    meter.start()
    ctx.sync()
    tic = time.perf_counter()
    fn()
    ctx.sync()
    return time.perf_counter() - tic, meter.stop()


def saved_bytes(model: Any, batch: dict[str, torch.Tensor]) -> int:
    """Bytes autograd saves for the backward of one forward (each storage counted once)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (e.g. a view of a wrapper)
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.features(**batch).float().sum()
    return sum(seen.values())


def activation_gib(config: Any, side: int, device: str, checkpointing: bool) -> float:
    """Saved activations of one row at `config`'s depth, counted on models of one and two blocks of each kind:
    the first block of a kind also saves what every later one shares (the RoPE tables, the adaptive-norm
    embedding), so the depth is reached by adding the second block's share, (L − 1) and (S − 1) times."""
    import dataclasses

    if config.num_layers < 1 or config.num_single_layers < 1:
        raise ValueError("the count needs at least one block of each kind")
    sizes = {}
    for joint, single in ((1, 1), (2, 1), (1, 2)):
        cfg = dataclasses.replace(config, num_layers=joint, num_single_layers=single)
        model = build(cfg, device)
        model.gradient_checkpointing = checkpointing
        model.train()
        sizes[joint, single] = saved_bytes(model, inputs(cfg, side, 1, device))
        del model
    base = sizes[1, 1]
    total = (
        base
        + (config.num_layers - 1) * (sizes[2, 1] - base)
        + (config.num_single_layers - 1) * (sizes[1, 2] - base)
    )
    return total / 2**30


def measure(ctx: Context, config: Any, side: int, batches: list[int]) -> tuple[list[dict], dict]:
    """The rows at `config` on a `side` × `side` canvas (module docstring)."""
    from t2i_gcpo.policies.meissonic_transformer import parameter_count

    rows: list[dict] = []
    model = build(config, ctx.device)
    for b in batches:
        batch = inputs(config, side, 2 * b, ctx.device)

        def step(batch=batch) -> None:
            with torch.no_grad(), autocast(ctx):
                model.features(**batch)

        seconds, peak = timed_row(ctx, step)
        rows.append(
            {
                "what": "reveal step",
                "images": b,
                "rows": 2 * b,
                "checkpointing": None,
                "seconds": seconds,
                "rollout_s_per_image": STEPS * seconds / b,
                "peak_mb": peak,
            }
        )
    model.train().requires_grad_(True)
    one = inputs(config, side, 1, ctx.device)
    for checkpointing in [True, False] if ctx.device == "cuda" else [True]:
        model.gradient_checkpointing = checkpointing

        def update(one=one) -> None:
            model.zero_grad(set_to_none=True)
            with autocast(ctx):
                h = model.features(**one)
            head = model.mlm_layer.conv2.weight.flatten(1).float()
            torch.einsum("bdhw,kd->bhwk", h.float(), head).log_softmax(-1)[..., 0].sum().backward()

        seconds, peak = timed_row(ctx, update)
        rows.append(
            {
                "what": "update row",
                "images": None,
                "rows": 1,
                "checkpointing": checkpointing,
                "seconds": seconds,
                "update_s_per_sample": REMASKS * seconds,
                "peak_mb": peak,
            }
        )
    model.zero_grad(set_to_none=True)
    model = None  # the weights freed before the activation count builds its one-block models
    summary = {
        "parameters": parameter_count(config),
        "canvas": f"{side}×{side}",
        "sequence": TEXT
        + (side // 2 if config.downsample else side) ** 2,  # text + image tokens in the blocks
        "activations_gib_per_row": {
            str(c): activation_gib(config, side, ctx.device, c) for c in (False, True)
        },
        "memory": PeakMemory.what(ctx.device),
        "dtype": "float32 weights, bf16 autocast" if ctx.device == "cuda" else "float32",
    }
    return rows, summary


def run(ctx: Context) -> dict:
    from t2i_gcpo.policies.meissonic_transformer import MeissonicTransformerConfig

    load = load_average()
    batches = [1] if ctx.device != "cuda" else ctx.pick([1, 8], [1, 8, 16])
    rows, summary = measure(ctx, MeissonicTransformerConfig(), 64, batches)
    return section(ctx, rows, summary, load)


def section(ctx: Context, rows: list[dict], summary: dict, load: float | None) -> dict:
    step = next(r for r in rows if r["what"] == "reveal step")
    upd = next(r for r in rows if r["what"] == "update row" and r["checkpointing"])
    act = summary["activations_gib_per_row"]
    parts = [
        (
            f"{summary['parameters'] / 1e9:.3f} B parameters ({summary['dtype']}). One reveal step of "
            f"{step['images']} image(s) (its CFG pair, {step['rows']} rows of {summary['sequence']} tokens, "
            f"{TEXT} of them text) took {step['seconds']:.2f} s: {step['rollout_s_per_image']:.0f} s of "
            f"transformer time per image for a {STEPS}-step rollout. One update row's forward and backward "
            f"with gradient checkpointing took {upd['seconds']:.2f} s ({upd['update_s_per_sample']:.0f} s a "
            f"sample for the recipe's {REMASKS} re-masks). Autograd saves {act['False']:.2f} GiB per row "
            f"without checkpointing and {act['True']:.2f} GiB with it."
        ),
    ]
    if ctx.device != "cuda":
        parts.append(
            "CPU rows: what a GPU run needs is their CUDA counterpart, `python -m benchmarks --only "
            "meissonic_scale --device cuda` (bf16 autocast, batches 1–16, checkpointing on and off): "
            "pending a GPU run."
        )
    note = shared_cpu_note(load) if ctx.device != "cuda" else ""
    return {
        "title": TITLE,
        "timing": "one call per row (on CUDA after one warm-up call)",
        "columns": [
            ("what", "what"),
            ("images", "images"),
            ("rows", "rows"),
            ("checkpointing", "checkpointing"),
            ("seconds", "s"),
            ("rollout_s_per_image", f"rollout s / image ({STEPS} steps)"),
            ("update_s_per_sample", f"update s / sample ({REMASKS} re-masks)"),
            ("peak_mb", "peak MB"),
        ],
        "rows": rows,
        "summary": summary,
        "reading": " ".join(parts) + note,
    }
