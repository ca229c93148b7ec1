"""Pretrain the ShapeWorld masked prior (t2i_gcpo.policies.masked) on the AR prior's data and tokens.

1. Data: the AR pretraining's recipe, imported from `shapeworld_ar` (not copied): `n_scenes` prompts of
   `generate_metadata` minus every held-out test prompt, one `render_dataset` scene each, encoded to
   8×8 ids by the *shipped* VQ tokenizer (`encode_dataset`); the prompt vocabulary is the shipped
   masked prior's own (GenEval's six templates, 10 words: the AR prior's before it learned the
   compositional grammar), so a rebuild reads the words it was built with.
2. MaskGIT training (Chang et al. 2022, arXiv 2202.04200, §3.1): per row a time t ~ U(0, 1), the
   mask ratio γ(t) = cos(πt/2) of the sampler's cosine schedule, ⌈γ(t)·T⌉ positions (≥ 1) chosen
   uniformly and replaced by [MASK]; cross-entropy on the masked positions only. The prompt is
   replaced by the null prompt with probability `cfg_dropout` (CFG's unconditional branch,
   docs/worlds/shapeworld.md). AdamW, linear warm-up then cosine decay to 10 %, bf16 autocast where the
   CPU has native bf16.
3. Save (fp16 safetensors), reload from disk, score the reloaded model on the held-out test prompts
   through the `evaluate` callback (this module stays below tasks/, as `shapeworld_ar` does).

`pretrain_masked(out_dir, …)` returns the statistics it also writes to ``out_dir/pretrain.json``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from t2i_gcpo.errors import check_writable_dir
from t2i_gcpo.policies.families.masked import SHIPPED
from t2i_gcpo.policies.masked import AR_ASSETS, MaskedConfig, MaskedPolicy
from t2i_gcpo.policies.maskgen import mask_ratio
from t2i_gcpo.policies.prompt_tokenizer import PromptTokenizer
from t2i_gcpo.pretrain.optim import pretrain_optimizer, set_lr
from t2i_gcpo.pretrain.shapeworld_ar import encode_dataset, render_dataset, use_bf16
from t2i_gcpo.tokenizers.vq import VQTokenizer
from t2i_gcpo.worlds.shapeworld.prompts import generate_metadata, make_splits


@dataclass
class MaskedPretrainConfig:
    seed: int = 0
    image_size: int = 32
    n_scenes: int = 40_000  # prompts drawn; those equal to a test prompt (≈ 30 %) are dropped
    steps: int = 5_000  # AdamW steps at batch `batch` (2 000: held-out strict 0.32; 5 000: 0.45)
    batch: int = 32
    lr: float = 2e-3  # peak, linear warm-up then cosine decay to 10 %
    warmup: int = 50
    weight_decay: float = 0.05
    cfg_dropout: float = 0.1  # probability of training a row on the null prompt
    bf16: bool | None = None  # bf16 autocast for the forward; None: where the CPU has native bf16
    max_minutes: float | None = None  # wall-clock cap on training (None: run all steps)
    eval_images_per_prompt: int = 4
    vq_path: str | None = None  # VQ tokenizer folder (default: the shipped AR prior's)
    vocab_path: str | None = None  # folder with the prompt vocab.json (default: the shipped masked prior's)
    model: MaskedConfig | None = None  # prior shape; prompt_len is set from the vocabulary


def mask_batch(
    tokens: torch.Tensor, mask_id: int, gen: torch.Generator, schedule: str = "cosine"
) -> tuple[torch.Tensor, torch.Tensor]:
    """MaskGIT's training corruption: tokens [B, T] → (canvas [B, T] with ⌈γ(t)·T⌉ ≥ 1 uniformly
    chosen positions set to `mask_id`, t ~ U(0, 1) per row; masked bool [B, T])."""
    b, t_len = tokens.shape
    n = (mask_ratio(torch.rand(b, generator=gen), schedule) * t_len).ceil().clamp(1, t_len)  # [B]
    rank = torch.rand(b, t_len, generator=gen).argsort(-1).argsort(-1)
    masked = rank < n[:, None]
    return torch.where(masked, mask_id, tokens), masked


def train_masked_prior(
    policy: MaskedPolicy,
    prompt_ids: torch.Tensor,
    tokens: torch.Tensor,
    cfg: MaskedPretrainConfig,
    max_seconds: float | None = None,
) -> dict[str, float]:
    """Masked-token cross-entropy; prompt_ids [N, L], tokens [N, T]."""
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(cfg.seed + 1)
    params = [p for n, p in policy.named_parameters() if not n.startswith("vq.")]
    opt = pretrain_optimizer(params, cfg.lr, cfg.weight_decay)
    policy.train()
    t0, ema, step = time.time(), 0.0, 0
    bar = tqdm(range(cfg.steps), desc="masked prior")
    for step in bar:
        set_lr(opt, cfg.lr, step, cfg.steps, cfg.warmup)
        idx = torch.randint(0, tokens.shape[0], (cfg.batch,), generator=gen)
        y = tokens[idx]
        canvas, masked = mask_batch(y, policy.mask_id, gen, policy.config.mask_schedule)
        null = torch.rand(cfg.batch, generator=gen) < cfg.cfg_dropout  # [B] CFG dropout
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16(cfg.bf16)):
            logits = policy.logits(prompt_ids[idx], canvas, null=null)  # [B, T, K]
        loss = F.cross_entropy(logits.float()[masked], y[masked])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema = 0.95 * ema + 0.05 * loss.item() if step else loss.item()
        if step % 10 == 0:
            bar.set_postfix(loss=f"{ema:.3f}")
        if max_seconds is not None and time.time() - t0 > max_seconds:
            break
    policy.eval()
    return {"loss": ema, "steps": step + 1, "seconds": time.time() - t0}


def pretrain_masked(
    out_dir: str,
    cfg: MaskedPretrainConfig | None = None,
    evaluate: Callable[[MaskedPolicy, list[dict], int, int], dict] | None = None,
) -> dict[str, Any]:
    """Build, save to `out_dir` and (optionally) evaluate the ShapeWorld masked prior; the folder loads
    with ``MaskedPolicy.from_pretrained(out_dir)``. Returns statistics (timings, loss, evaluation),
    also written to ``out_dir/pretrain.json``.

    `evaluate(policy, test_metadata, images_per_prompt, seed)` scores the reloaded model on the
    held-out prompts (the command passes the ShapeWorld task's evaluation)."""
    cfg = cfg or MaskedPretrainConfig()
    check_writable_dir(out_dir, "output folder")
    torch.manual_seed(cfg.seed)
    t_start = time.time()
    stats: dict[str, Any] = {"config": asdict(cfg), "torch_threads": torch.get_num_threads()}
    stats["load_average"] = {"start": os.getloadavg()[0]}

    # ---- data: the AR pretraining's scenes, encoded by the shipped VQ ------------------------------
    t = time.time()
    vq = VQTokenizer.from_pretrained(cfg.vq_path or os.path.join(AR_ASSETS, "vq"))
    tokenizer = PromptTokenizer.load(cfg.vocab_path or os.path.join(SHIPPED["shapeworld-masked"], "prior"))
    _, test = make_splits()
    held_out = {m["prompt"] for m in test}
    meta = [m for m in generate_metadata(cfg.n_scenes, cfg.seed) if m["prompt"] not in held_out]
    tokenizer.check([m["prompt"] for m in meta] + [m["prompt"] for m in test])
    images = render_dataset(meta, cfg.image_size, cfg.seed)  # [N, H, W, 3] uint8
    tokens = encode_dataset(vq, images)  # [N, T]
    prompt_ids = tokenizer.encode([m["prompt"] for m in meta])  # [N, L]
    stats["data"] = {
        "scenes": len(meta),
        "unique_prompts": len({m["prompt"] for m in meta}),
        "codes_used": int(tokens.unique().numel()),
        "seconds": time.time() - t,
    }

    # ---- masked prior -----------------------------------------------------------------------------
    model_cfg = cfg.model or MaskedConfig()
    model_cfg.prompt_len = tokenizer.max_len
    policy = MaskedPolicy(model_cfg, tokenizer, vq)
    stats["prior_params"] = sum(p.numel() for n, p in policy.named_parameters() if not n.startswith("vq."))
    budget = None if cfg.max_minutes is None else max(cfg.max_minutes * 60 - (time.time() - t_start), 1.0)
    stats["prior"] = train_masked_prior(policy, prompt_ids, tokens, cfg, budget)
    stats["train_seconds"] = time.time() - t_start
    stats["load_average"]["after_prior"] = os.getloadavg()[0]

    # ---- save, reload (fp16 round trip), evaluate the reloaded model ------------------------------
    policy.save_pretrained(out_dir)
    if evaluate:
        t = time.time()
        shipped = MaskedPolicy.from_pretrained(out_dir)
        result = evaluate(shipped, test, cfg.eval_images_per_prompt, cfg.seed)
        stats["eval"] = {**result, "seconds": time.time() - t, "prompts": len(test)}
    stats["total_seconds"] = time.time() - t_start
    with open(os.path.join(out_dir, "pretrain.json"), "w") as f:
        json.dump(stats, f, indent=2)
    return stats
