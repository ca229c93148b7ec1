"""Section `llamagen`: LlamaGen-T2I at GPT-XL shape — our decode loops (eager, static, and on CUDA the
captured graph) side by side with a port of the reference's own sampling loop — and how far the two agree.

Model: a LlamaGenPolicy built in memory (policies/llamagen.py) at GPT-XL's shape (dim 1280, 36 layers, 20
heads of 64, SwiGLU 3584, caption L = 120 × C = 2048, codebook 16,384, 16 × 16 = 256 tokens, 256 px; 775 M
parameters), random N(0, 0.02) weights, float32 on the CPU and bf16 on CUDA, with a tiny random T5 encoder of
width 2048 (its features are computed once per prompt and are no part of a token step) and a tiny VQ (decoding
is not timed). `--quick`, or `SHAPE = "tiny"`, takes the test suite's tiny GPT
(tests/llamagen_fixtures.py) instead.

Loops, each sampling every image's tokens with CFG s = 7.5 (one doubled batch [cond; null]), temperature 1,
top-k 1000 (sample_t2i.py's defaults):
- `ours eager` (rollout.decode=eager: the fused decoder stepped from Python), `ours static` (the static step,
  uncaptured) and, on CUDA, `ours graph` (that step captured as CUDA graphs): `LlamaGenPolicy.rollout`, which
  also records every token's pos / neg / guided log-prob;
- `reference loop`: autoregressive/models/generate.py's ``generate`` ported here (`reference_generate`) —
  per-layer KV caches [B, H, S, hd] written at ``input_pos``, the mask taken as rows of a full causal [B, S,
  S] matrix with the caption's padding zeroed and the diagonal kept, the pair-wise rotary embedding, CFG on
  the prefill and every step, ``top_k_top_p_filtering`` and ``torch.multinomial`` — over the same weights (the
  GPT's own modules). It records nothing.

Timing. CPU: the first `CPU_TOKENS` tokens of each image (a full 256-token image at XL shape is minutes on two
threads); the setup (building the decoder: our fused weight copies, the reference's caches) and the prefill
are clocked apart (`PhaseClock`), and ms per token step = (seconds − setup − prefill) / (tokens − 1), the
token steps after the first draw, in wall seconds and in this process's CPU seconds (which other processes on
a shared machine disturb less); one warm-up, then the repeat with the least CPU time, the loops interleaved.
CUDA: whole images (256 tokens) at 16 and 64 images, ms per token step = seconds / 256 (prefill included),
images/s; the graph loop after one warm-up pass (its captures), the others one call after theirs.

Agreement (one row per shape): the prefill's guided logits of ours (the fused decoder) against the reference
port's (max |Δ|, float32), and greedy tokens (top-k 1) of both over the first tokens: how many agree.
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.suite.common import REPO, Context, load_average, shared_cpu_note

TITLE = "LlamaGen-T2I at GPT-XL shape: our decode loops and the reference's loop (`llamagen`)"
SCALE, TOP_K = 7.5, 1000
PROMPTS = [
    "a photo of a red cat",
    "a photo of two blue dogs left of a green bench",
    "a photo of a yellow car",
    "a photo of a white clock above a black dog",
]
CPU_TOKENS = 8  # tokens per image on the CPU
CPU_IMAGES = (1, 2)
CUDA_IMAGES = (16, 64)
SHAPE = "xl"


def fixtures() -> Any:
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))
    import llamagen_fixtures

    return llamagen_fixtures


def build(shape: str, device: str, dtype: torch.dtype) -> Any:
    """A LlamaGenPolicy at `shape` ('xl' or 'tiny') with random weights, on `device`, its GPT in `dtype`."""
    from transformers import T5Config, T5EncoderModel

    from t2i_gcpo.policies.llamagen import LlamaGenPolicy
    from t2i_gcpo.policies.llamagen_gpt import GPTConfig, LlamaGenGPT, ffn_width
    from t2i_gcpo.policies.llamagen_t5 import T5Captions
    from t2i_gcpo.tokenizers.llamagen_vq import build_vq

    fx = fixtures()
    if shape == "xl":
        config = GPTConfig(
            size="GPT-XL",
            dim=1280,
            layers=36,
            heads=20,
            kv_heads=20,
            ffn=ffn_width(1280),
            vocab=16384,
            caption_len=120,
            caption_dim=2048,
            grid=16,
        )
    else:
        fx.register_tiny_size()
        config = GPTConfig(
            size=fx.TINY_SIZE,
            dim=fx.DIM,
            layers=fx.LAYERS,
            heads=fx.HEADS,
            kv_heads=fx.HEADS,
            ffn=fx.FFN,
            vocab=fx.CODES,
            caption_len=fx.CAPTION_LEN,
            caption_dim=fx.CAPTION_DIM,
            grid=fx.GRID,
        )
    torch.manual_seed(0)
    with torch.device(device):
        gpt = LlamaGenGPT(config)
    with torch.no_grad():
        for p in gpt.parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else p.fill_(1.0)
        gpt.cls_embedding.uncond_embedding.normal_(0.0, config.caption_dim**-0.5)
    gpt = gpt.to(dtype).eval().requires_grad_(False)
    tok = fx.t5_tokenizer()
    t5 = T5Config(
        vocab_size=len(tok),
        d_model=config.caption_dim,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_heads=4,
        feed_forward_proj="gated-gelu",
        pad_token_id=0,
        eos_token_id=1,
    )
    encoder = T5EncoderModel(t5).to(device).eval()
    vq = build_vq(fx.vq_state(codes=config.vocab), "the benchmark's VQ").to(device)
    policy = LlamaGenPolicy(gpt, vq, T5Captions(encoder, tok, config.caption_len), Path("."))
    return policy.eval()


# ----------------------------------------------------------------------------------------- the reference loop
def _reference_freqs(config: Any, device: torch.device) -> torch.Tensor:
    """gpt.py's precompute_freqs_cis_2d: [L + grid², hd/2, 2], zeros for the caption."""
    half = config.head_dim // 2
    freqs = 1.0 / (10000 ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    t = torch.outer(torch.arange(config.grid, device=freqs.device).float(), freqs)
    grid = torch.concat(
        [t[:, None, :].expand(-1, config.grid, -1), t[None, :, :].expand(config.grid, -1, -1)], -1
    )
    cache = torch.stack([torch.cos(grid), torch.sin(grid)], dim=-1).flatten(0, 1)
    return torch.cat([torch.zeros(config.caption_len, half, 2), cache]).to(device)


def _reference_rotary(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """gpt.py's apply_rotary_emb: x [B, S, H, hd], freqs [S, hd/2, 2]."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    f = freqs.view(1, xs.size(1), 1, xs.size(3), 2)
    out = torch.stack(
        [xs[..., 0] * f[..., 0] - xs[..., 1] * f[..., 1], xs[..., 1] * f[..., 0] + xs[..., 0] * f[..., 1]],
        dim=-1,
    )
    return out.flatten(3).type_as(x)


class ReferenceGPT:
    """gpt.py's Transformer.forward with its KV caches (``setup_caches``), over a LlamaGenGPT's modules."""

    def __init__(self, gpt: Any, batch: int, max_seq: int) -> None:
        c = gpt.config
        self.gpt, self.c = gpt, c
        max_seq = -(-max_seq // 8) * 8  # find_multiple(max_seq_length, 8)
        dev, dtype = gpt.tok_embeddings.weight.device, gpt.tok_embeddings.weight.dtype
        self.k = [
            torch.zeros(batch, c.heads, max_seq, c.head_dim, device=dev, dtype=dtype) for _ in gpt.layers
        ]
        self.v = [torch.zeros_like(k) for k in self.k]
        self.causal_mask = torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool, device=dev))[
            None
        ].repeat(batch, 1, 1)
        self.freqs = _reference_freqs(c, dev)

    def forward(
        self, idx: torch.Tensor | None, cond: torch.Tensor | None, input_pos: torch.Tensor
    ) -> torch.Tensor:
        gpt, c = self.gpt, self.c
        h = (
            gpt.cls_embedding.cap_proj(cond)[:, : c.caption_len]
            if cond is not None
            else gpt.tok_embeddings(idx)
        )
        bs = h.shape[0]
        mask = self.causal_mask[:bs, None, input_pos]
        freqs = self.freqs[input_pos]
        for i, layer in enumerate(gpt.layers):
            x = layer.attention_norm(h)
            b, s, _ = x.shape
            q, k, v = layer.attention.wqkv(x).split([c.dim, c.dim, c.dim], dim=-1)
            q = _reference_rotary(q.view(b, s, c.heads, c.head_dim), freqs).transpose(1, 2)
            k = _reference_rotary(k.view(b, s, c.heads, c.head_dim), freqs).transpose(1, 2)
            v = v.view(b, s, c.heads, c.head_dim).transpose(1, 2)
            self.k[i][:, :, input_pos], self.v[i][:, :, input_pos] = k, v
            out = F.scaled_dot_product_attention(q, self.k[i], self.v[i], attn_mask=mask)
            h = h + layer.attention.wo(out.transpose(1, 2).contiguous().view(b, s, c.dim))
            f = layer.ffn_norm(h)
            h = h + layer.feed_forward.w2(F.silu(layer.feed_forward.w1(f)) * layer.feed_forward.w3(f))
        return gpt.output(gpt.norm(h)).float()


def _reference_sample(
    logits: torch.Tensor, temperature: float, top_k: int, gen: torch.Generator
) -> torch.Tensor:
    """generate.py's sample(): logits / T, top-k filtering (top-p 1: off), softmax, multinomial
    (top-k 1: greedy)."""
    logits = logits[:, -1, :] / max(temperature, 1e-5)
    if top_k > 0:
        k = min(top_k, logits.size(-1))
        logits = logits.masked_fill(logits < torch.topk(logits, k)[0][..., -1, None], float("-inf"))
    probs = F.softmax(logits, dim=-1)
    if top_k == 1:
        return probs.topk(1, dim=-1)[1]
    return torch.multinomial(probs, num_samples=1, generator=gen)


@torch.no_grad()
def reference_generate(
    gpt: Any,
    cond: torch.Tensor,
    emb_masks: torch.Tensor,
    max_new_tokens: int,
    cfg_scale: float = SCALE,
    temperature: float = 1.0,
    top_k: int = TOP_K,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """generate.py's ``generate`` for a text-to-image GPT (CFG > 1): tokens [B, max_new_tokens] and the
    prefill's guided logits [B, K]."""
    gen = torch.Generator(device=cond.device).manual_seed(seed)
    T = cond.shape[1]
    cond_null = torch.zeros_like(cond) + gpt.cls_embedding.uncond_embedding
    cond_combined = torch.cat([cond, cond_null])
    model = ReferenceGPT(gpt, 2 * cond.shape[0], T + max_new_tokens)
    model.causal_mask[:, :, :T] = (
        model.causal_mask[:, :, :T] & torch.cat([emb_masks, emb_masks]).bool()[:, None]
    )
    eye = torch.eye(model.causal_mask.size(1), dtype=torch.bool, device=cond.device)
    model.causal_mask[:] = model.causal_mask | eye

    def guided(logits: torch.Tensor) -> torch.Tensor:
        c, u = torch.split(logits, len(logits) // 2, dim=0)
        return u + (c - u) * cfg_scale

    first = guided(model.forward(None, cond_combined, torch.arange(0, T, device=cond.device)))
    token = _reference_sample(first, temperature, top_k, gen)
    tokens = [token]
    input_pos = torch.tensor([T], device=cond.device, dtype=torch.int)
    for _ in range(max_new_tokens - 1):
        logits = guided(model.forward(torch.cat([token, token]), None, input_pos))
        input_pos += 1
        token = _reference_sample(logits, temperature, top_k, gen)
        tokens.append(token)
    return torch.cat(tokens, dim=1), first[:, -1]


# ---------------------------------------------------------------------------------------------- the race
def loop_fn(policy: Any, loop: str, images: int, device: str) -> Any:
    """`fn(seed)` sampling `images` images (of `policy.num_image_tokens` tokens) through `loop`."""
    import dataclasses

    from t2i_gcpo.policies.base import PromptRecord, SamplingParams
    from t2i_gcpo.tasks.loop import group_generators

    texts = [PROMPTS[i % len(PROMPTS)] for i in range(images)]
    if loop == "reference loop":

        def reference(seed: int) -> None:
            feats, mask = policy.captions(texts)
            reference_generate(
                policy.gpt,
                feats.to(policy.gpt.tok_embeddings.weight.dtype),
                mask,
                policy.num_image_tokens,
                seed=seed,
            )

        return reference
    mode = {"ours eager": "eager", "ours static": "static", "ours graph": "graph"}[loop]
    sampling = dataclasses.replace(SamplingParams(guidance_scale=SCALE, top_k=TOP_K), decode=mode)

    def ours(seed: int) -> None:
        policy.rollout(
            [PromptRecord(t) for t in texts], 1, sampling, group_generators(seed, "bench", range(images))
        )

    return ours


def timed(ctx: Context, fn: Any, seed: int) -> tuple[float, float]:
    """(wall, this process's CPU) seconds of one call."""
    ctx.sync()
    tic, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        fn(seed)
    ctx.sync()
    return time.perf_counter() - tic, time.process_time() - cpu


class PhaseClock:
    """Wall and CPU seconds spent, while installed, in the setup of a sampling call (building a decoder: ours
    copy the fused weights, the reference allocates its caches) and in its prefill (forwards of more than one
    position: ours through the fused decoder, the reference port's caption forward), the device
    synchronised around each."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.wall = {"setup": 0.0, "prefill": 0.0}
        self.cpu = {"setup": 0.0, "prefill": 0.0}

    def _wrap(self, real: Any, phase: Any) -> Any:
        clock = self

        def timed_call(obj, *args, **kwargs):
            name = phase(*args)
            if name is None:
                return real(obj, *args, **kwargs)
            clock.ctx.sync()
            tic, cpu = time.perf_counter(), time.process_time()
            out = real(obj, *args, **kwargs)
            clock.ctx.sync()
            clock.wall[name] += time.perf_counter() - tic
            clock.cpu[name] += time.process_time() - cpu
            return out

        return timed_call

    def __enter__(self) -> PhaseClock:
        from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder

        patches = [
            (FusedLlamaDecoder, "__init__", lambda *a: "setup"),
            (FusedLlamaDecoder, "forward", lambda ids, *a: "prefill" if ids.shape[1] > 1 else None),
            (ReferenceGPT, "__init__", lambda *a: "setup"),
            (ReferenceGPT, "forward", lambda idx, cond, *a: "prefill" if cond is not None else None),
        ]
        self.saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
        for owner, name, phase in patches:
            setattr(owner, name, self._wrap(getattr(owner, name), phase))
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, real in self.saved:
            setattr(owner, name, real)


def race_cpu(ctx: Context, policy: Any, loops: tuple[str, ...], repeats: int) -> list[dict]:
    """CPU rows: per loop and image count, `CPU_TOKENS` tokens of each image, the setup and the prefill
    clocked apart (module docstring)."""
    full, rows = policy.num_image_tokens, []
    tokens = min(CPU_TOKENS, full)
    policy.num_image_tokens = tokens  # the first tokens of each image
    try:
        for images in ctx.pick(CPU_IMAGES[:1], CPU_IMAGES):
            best: dict[str, dict] = {}
            for r in range(repeats + 1):  # r = 0: warm-up; the loops interleaved
                for loop in loops:
                    with PhaseClock(ctx) as clock:
                        wall, cpu = timed(ctx, loop_fn(policy, loop, images, ctx.device), r)
                    steps_wall = wall - clock.wall["setup"] - clock.wall["prefill"]
                    steps_cpu = cpu - clock.cpu["setup"] - clock.cpu["prefill"]
                    if r and steps_cpu < best.get(loop, {"steps_cpu": float("inf")})["steps_cpu"]:
                        best[loop] = {
                            "setup_s": clock.wall["setup"],
                            "prefill_s": clock.wall["prefill"],
                            "seconds": wall,
                            "steps_wall": steps_wall,
                            "steps_cpu": steps_cpu,
                        }
            for loop in loops:
                b = best[loop]
                rows.append(
                    {
                        "images": images,
                        "loop": loop,
                        "tokens": tokens,
                        "setup_s": b["setup_s"],
                        "prefill_s": b["prefill_s"],
                        "seconds": b["seconds"],
                        "ms_per_step": 1e3 * b["steps_wall"] / (tokens - 1),
                        "cpu_ms_per_step": 1e3 * b["steps_cpu"] / (tokens - 1),
                    }
                )
            print(
                f"  llamagen {images} images: "
                + ", ".join(
                    f"{r['loop']} {r['ms_per_step']:.0f} ms/step (CPU {r['cpu_ms_per_step']:.0f})"
                    for r in rows
                    if r["images"] == images
                ),
                flush=True,
            )
    finally:
        policy.num_image_tokens = full
    return rows


def race_cuda(ctx: Context, policy: Any, loops: tuple[str, ...], repeats: int) -> list[dict]:
    """CUDA rows: whole images at each batch (module docstring); a loop that fails records why."""
    T, rows = policy.num_image_tokens, []
    for images in ctx.pick(CUDA_IMAGES[:1], CUDA_IMAGES):
        for loop in loops:
            fn = loop_fn(policy, loop, images, ctx.device)
            row: dict[str, Any] = {"images": images, "loop": loop, "tokens": T}
            try:
                timed(ctx, fn, 0)  # warm-up (graph: its captures)
                seconds = min(timed(ctx, fn, r + 1)[0] for r in range(repeats if loop == "ours graph" else 1))
                row.update(seconds=seconds, ms_per_step=1e3 * seconds / T, images_per_s=images / seconds)
                if loop == "ours graph":
                    row.update(
                        captures=policy.decode_session.stats["captures"],
                        fallback=policy.last_decode.get("fallback") or None,
                    )
            except Exception as e:  # a row records its own failure; the race goes on
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            finally:
                torch.cuda.empty_cache()
            rows.append(row)
        print(
            f"  llamagen {images} images: "
            + ", ".join(
                f"{r['loop']} {r.get('ms_per_step', float('nan')):.2f} ms/step"
                for r in rows
                if r["images"] == images
            ),
            flush=True,
        )
    return rows


@torch.no_grad()
def agreement(policy: Any, tokens: int) -> dict:
    """Ours against the reference port on one prompt: the prefill's guided logits and greedy tokens."""
    from t2i_gcpo.policies.base import PromptRecord, SamplingParams
    from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder
    from t2i_gcpo.tasks.loop import group_generators

    feats, mask = policy.captions(PROMPTS[:1])
    embeds, mask2 = policy._prefix(feats, mask, cfg=True)
    L = policy.caption_len
    decoder = FusedLlamaDecoder(policy.fused, 2, L + 8)
    logits = policy._head(
        decoder.forward(embeds, 0, positions=torch.arange(L, device=mask.device).expand(2, L), key_mask=mask2)
    )
    ours = logits[1] + SCALE * (logits[0] - logits[1])
    full = policy.num_image_tokens
    policy.num_image_tokens = tokens
    try:
        greedy = policy.rollout(
            [PromptRecord(PROMPTS[0])],
            1,
            SamplingParams(guidance_scale=SCALE, top_k=1),
            group_generators(0, "bench", [0]),
        ).tokens
    finally:
        policy.num_image_tokens = full
    ref_tokens, ref_first = reference_generate(
        policy.gpt, feats.to(policy.gpt.tok_embeddings.weight.dtype), mask, tokens, top_k=1
    )
    return {
        "prefill_max_abs_diff": float((ours - ref_first[0]).abs().max()),
        "logit_scale": float(ours.abs().max()),
        "greedy_equal": int((greedy[0] == ref_tokens[0]).sum()),
        "greedy_tokens": tokens,
    }


def run(ctx: Context) -> dict:
    load = load_average()
    cuda = ctx.device == "cuda"
    shape = "tiny" if ctx.quick and not cuda else SHAPE
    policy = build(shape, ctx.device, torch.bfloat16 if cuda else torch.float32)
    loops = (
        ("ours graph", "ours eager", "reference loop")
        if cuda
        else ("ours eager", "ours static", "reference loop")
    )
    repeats = ctx.pick(1, 2)
    rows = race_cuda(ctx, policy, loops, repeats) if cuda else race_cpu(ctx, policy, loops, repeats)
    agree = agreement(policy, min(CPU_TOKENS, policy.num_image_tokens))
    config = policy.config
    del policy
    gc.collect()
    return section(ctx, rows, agree, config, shape, repeats, load)


def section(
    ctx: Context, rows: list[dict], agree: dict, config: Any, shape: str, repeats: int, load: Any
) -> dict:
    by = {(r["images"], r["loop"]): r for r in rows if "ms_per_step" in r}
    key, unit = ("cpu_ms_per_step", "CPU ms") if ctx.device != "cuda" else ("ms_per_step", "ms")
    parts = []
    for images in sorted({r["images"] for r in rows}):
        ref = by.get((images, "reference loop"))
        bits = []
        for loop in ("ours graph", "ours static", "ours eager"):
            r = by.get((images, loop))
            if r and ref and r[key] > 0:
                bits.append(
                    f"{loop} {r[key]:.0f} {unit} per token step ({ref[key] / r[key]:.2f}× the speed of the "
                    f"reference loop's {ref[key]:.0f})"
                )
        if bits:
            parts.append(f"{images} image{'s' if images > 1 else ''}: " + ", ".join(bits) + ".")
    failed = [f"{r['loop']} at {r['images']} images ({r['error']})" for r in rows if "error" in r]
    if failed:
        parts.append("Failed: " + "; ".join(failed) + ".")
    parts.append(
        f"Against the reference port: the prefill's guided logits differ by at most "
        f"{agree['prefill_max_abs_diff']:.2g} (logits up to {agree['logit_scale']:.2g}); greedy tokens agree "
        f"on {agree['greedy_equal']} of the first {agree['greedy_tokens']}."
    )
    if ctx.device != "cuda":
        parts.append(
            f"CPU rows: the first {rows[0]['tokens'] if rows else CPU_TOKENS} tokens of each image, the "
            f"setup (our decoders' fused weight copies, built per call in the eager loop and once in the "
            f"static one) and the prefill ({config.caption_len} caption positions, both CFG halves) timed "
            f"apart; ours records every token's pos, neg and guided log-probs, the reference records "
            f"nothing. The CUDA rows (whole 256-token images at 16 and 64 images, the captured graph loop) "
            f"come from `python -m benchmarks --only llamagen --device cuda`: not measured yet."
            + shared_cpu_note(load)
        )
    return {
        "title": TITLE,
        "timing": (
            f"best of {repeats} after a warm-up, the loops interleaved"
            if ctx.device != "cuda"
            else f"graph: best of {repeats} after a warm-up pass; others: one call after theirs"
        ),
        "columns": [
            ("images", "images"),
            ("loop", "loop"),
            ("tokens", "tokens / image"),
            ("setup_s", "setup s"),
            ("prefill_s", "prefill s"),
            ("seconds", "s"),
            ("ms_per_step", "ms / token step"),
            ("cpu_ms_per_step", "CPU ms / token step"),
            ("images_per_s", "images / s"),
        ],
        "rows": rows,
        "summary": {
            "shape": shape,
            "gpt": config.size,
            "dim": config.dim,
            "layers": config.layers,
            "agreement": agree,
            **{f"{i} | {lp}": r["ms_per_step"] for (i, lp), r in by.items()},
        },
        "reading": " ".join(parts),
    }
