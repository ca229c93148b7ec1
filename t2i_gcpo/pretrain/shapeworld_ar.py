"""Rebuild the shipped ShapeWorld model from scratch: VQ tokenizer, then the text-conditioned prior.

1. Data: `n_scenes` prompts drawn by `generate_metadata` — at 32 px a uniform tag among GenEval's six
   and the eight compositional ones (`ALL_TAGS`), at 64 px GenEval's six — with every prompt that
   asks for the content of a held-out test prompt removed (`make_splits()[1]` and
   `compositional_test()`), each rendered once by `sample_scene` + `render`.
2. VQ-VAE (t2i_gcpo.tokenizers.vq) on those renders, or at 32 px the shipped one (`vq_path`: the
   prompts grew, the images did not, so the image tokens stay those of every earlier run); every
   render is then encoded to 8×8 ids (16×16 at 64 px).
3. Prior (t2i_gcpo.policies.ar): next-token cross-entropy on the image tokens, prompt replaced by
   the null prompt with probability `cfg_dropout` (the unconditional branch of CFG,
   docs/worlds/shapeworld.md). Its prompt length is that of the longest prompt the grammar accepts
   (`longest_prompt_words`), so it reads every prompt `parse_prompt` takes.
4. Save (fp16 safetensors), reload from disk, score the reloaded model on the template and the
   compositional test prompts.

The shipped model is deliberately under-trained: its strict score must leave RL room to improve
(docs/worlds/shapeworld.md: roughly 0.3–0.7). `steps` and `n_scenes` are the knobs.
`PretrainConfig.for_size(64)` gives the 64 px scale's defaults (render.py: 4×4-token objects with a
rim and a pale core).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from t2i_gcpo.errors import UserError, check_writable_dir
from t2i_gcpo.hardware import native_bf16
from t2i_gcpo.policies.ar import ARConfig, ARPolicy
from t2i_gcpo.policies.families.ar import SHIPPED
from t2i_gcpo.policies.prompt_tokenizer import PromptTokenizer
from t2i_gcpo.pretrain.optim import pretrain_optimizer, set_lr
from t2i_gcpo.tokenizers.vq import VQConfig, VQTokenizer, train_vq
from t2i_gcpo.worlds.shapeworld.constants import TAGS
from t2i_gcpo.worlds.shapeworld.parse import ALL_TAGS, longest_prompt_words
from t2i_gcpo.worlds.shapeworld.prompts import compositional_test, content_key, generate_metadata, make_splits
from t2i_gcpo.worlds.shapeworld.render import render, sample_scene

SHIPPED_VQ = "shipped"  # vq_path naming the shipped 32 px model's VQ tokenizer


@dataclass
class PretrainConfig:
    seed: int = 0
    image_size: int = 32
    n_scenes: int = 40_000  # prompts drawn; those asking for a test prompt's content are dropped
    tags: list[str] = field(default_factory=lambda: list(ALL_TAGS))  # drawn uniformly
    vq_steps: int = 1_000  # VQ-VAE Adam steps at batch `vq_batch`
    vq_batch: int = 64
    vq_lr: float = 2e-3
    prior_steps: int = 2_000  # prior AdamW steps at batch `prior_batch`
    prior_batch: int = 32
    prior_lr: float = 1e-3  # peak, linear warm-up then cosine decay to 10 %
    warmup: int = 50
    weight_decay: float = 0.05
    cfg_dropout: float = 0.1  # probability of training a row on the null prompt
    cfg_scale: float = 2.0  # the CFG scale stored as the checkpoint's sampling default
    bf16: bool | None = None  # bf16 autocast for the prior's forward; None: where the CPU has native bf16
    max_minutes: float | None = None  # wall-clock cap shared by both stages (None: run all steps)
    eval_images_per_prompt: int = 4
    vq_path: str | None = SHIPPED_VQ  # reuse this trained VQ tokenizer (None: train one)
    vq: VQConfig | None = None  # tokenizer shape (None: the default VQConfig at `image_size`)
    ar: ARConfig | None = None  # prior shape; prompt_len and default_cfg_scale are set here

    @classmethod
    def for_size(cls, image_size: int, **overrides: Any) -> PretrainConfig:
        """The defaults of a ShapeWorld scale: 32 px (the shipped model) or 64 px — a 16×16-token
        VQ with 1 024 codes (the 64 px renders hold 431 distinct 4×4 patches, the 32 px ones 151 for
        256 codes) trained at batch 32 (as many codes per batch as batch 64 at 32 px), 1 500 steps,
        and a prior of 1 500 steps on GenEval's six tags (the shipped 64 px model's recipe)."""
        if image_size == 32:
            return cls(**overrides)
        if image_size == 64:
            vq = VQConfig(image_size=64, codebook_size=1024)
            scale = {
                "image_size": 64,
                "vq": vq,
                "vq_steps": 1_500,
                "vq_batch": 32,
                "vq_path": None,
                "tags": list(TAGS),
                "prior_steps": 1_500,
                "cfg_scale": 3.0,
            }
            return cls(**{**scale, **overrides})
        raise UserError(f"ShapeWorld pretraining supports image sizes 32 and 64, not {image_size}")


def use_bf16(setting: bool | None) -> bool:
    """bf16 autocast for pretraining: `setting`, or where the CPU has native bf16 when None (~1.5×
    faster than fp32 there, far slower where emulated)."""
    return native_bf16("cpu") if setting is None else bool(setting)


def _vq_folder(vq_path: str) -> str:
    return os.path.join(SHIPPED["shapeworld"], "vq") if vq_path == SHIPPED_VQ else vq_path


def render_dataset(metadata: list[dict], size: int, seed: int) -> np.ndarray:
    """uint8 [N, H, W, 3]: one random scene per metadata."""
    from tqdm.auto import tqdm

    rng = np.random.default_rng(seed)
    return np.stack([render(_place(m, rng, size), size) for m in tqdm(metadata, desc="render")])


def _place(meta: dict, rng: np.random.Generator, size: int, tries: int = 5) -> list:
    """`sample_scene`, retried: a crowded relation prompt fails one call in ten (prompts.py)."""
    for k in range(tries):
        try:
            return sample_scene(meta, rng, size)
        except UserError:
            if k == tries - 1:
                raise
    raise AssertionError("unreachable")


def _to_float(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255  # [B, 3, H, W]


@torch.no_grad()
def encode_dataset(vq: VQTokenizer, images: np.ndarray, batch: int = 512) -> torch.Tensor:
    """ids long [N, T]."""
    return torch.cat([vq.encode(_to_float(images[i : i + batch])) for i in range(0, len(images), batch)])


def train_prior(
    policy: ARPolicy,
    prompt_ids: torch.Tensor,
    tokens: torch.Tensor,
    cfg: PretrainConfig,
    max_seconds: float | None = None,
    callback: Callable[[int, ARPolicy], None] | None = None,
) -> dict[str, float]:
    """Cross-entropy on image tokens; prompt_ids [N, L], tokens [N, T]. `callback(step, policy)`
    runs after every optimiser step (e.g. to snapshot the model)."""
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(cfg.seed + 1)
    params = [p for n, p in policy.named_parameters() if not n.startswith("vq.")]
    opt = pretrain_optimizer(params, cfg.prior_lr, cfg.weight_decay)
    policy.train()
    t0, ema, step = time.time(), 0.0, 0
    bar = tqdm(range(cfg.prior_steps), desc="prior")
    for step in bar:
        set_lr(opt, cfg.prior_lr, step, cfg.prior_steps, cfg.warmup)
        idx = torch.randint(0, tokens.shape[0], (cfg.prior_batch,), generator=gen)
        null = torch.rand(cfg.prior_batch, generator=gen) < cfg.cfg_dropout  # [B] CFG dropout
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16(cfg.bf16)):
            logits = policy.teacher_forced_logits(prompt_ids[idx], tokens[idx], null=null)  # [B, T, K]
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[idx].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema = 0.95 * ema + 0.05 * loss.item() if step else loss.item()
        if step % 10 == 0:
            bar.set_postfix(loss=f"{ema:.3f}")
        if callback is not None:
            callback(step + 1, policy)
        if max_seconds is not None and time.time() - t0 > max_seconds:
            break
    policy.eval()
    return {"loss": ema, "steps": step + 1, "seconds": time.time() - t0}


def pretrain(
    out: str,
    cfg: PretrainConfig | None = None,
    evaluate: Callable[[ARPolicy, list[dict], int, int], dict] | None = None,
    callback: Callable[[int, ARPolicy], None] | None = None,
) -> dict[str, Any]:
    """Build, save to `out` and (optionally) evaluate the ShapeWorld model. Returns statistics,
    also written to ``out/pretrain.json`` (timings per stage, losses, the evaluation).

    `evaluate(policy, test_metadata, images_per_prompt, seed)` scores the saved model on the held-out
    prompts (the command passes the ShapeWorld task's evaluation; this module stays below tasks/):
    the template ones (``eval``) and, when the mix has compositional tags, the compositional ones
    (``eval_compositional``). `callback(step, policy)` runs after every prior step (`train_prior`)."""
    cfg = cfg or PretrainConfig()
    check_writable_dir(out, "output folder")  # before minutes of training, not at the save
    torch.manual_seed(cfg.seed)
    t_start = time.time()
    budget = None if cfg.max_minutes is None else cfg.max_minutes * 60
    stats: dict[str, Any] = {"config": asdict(cfg), "torch_threads": torch.get_num_threads()}
    stats["load_average"] = {"start": os.getloadavg()[0]}  # other jobs on the machine slow every stage

    if cfg.vq_path is not None:
        vq = VQTokenizer.from_pretrained(_vq_folder(cfg.vq_path))
    else:
        vq = VQTokenizer(cfg.vq or VQConfig(image_size=cfg.image_size))
    if vq.config.image_size != cfg.image_size:  # before minutes of rendering
        where = cfg.vq_path or "the VQ config"
        raise UserError(
            f"{where} is for {vq.config.image_size} px images, the scenes are {cfg.image_size} px"
        )

    # ---- data: train-distribution prompts, none of the held-out test prompts --------------------
    t = time.time()
    _, test = make_splits()
    compositional = compositional_test() if set(cfg.tags) - set(TAGS) else []
    held_out = {content_key(m) for m in test + compositional}
    meta = [m for m in generate_metadata(cfg.n_scenes, cfg.seed, cfg.tags) if content_key(m) not in held_out]
    images = render_dataset(meta, cfg.image_size, cfg.seed)  # [N, H, W, 3] uint8
    # compositional: as long as the longest prompt the grammar accepts, whatever was drawn
    max_len = longest_prompt_words() if compositional else None
    tokenizer = PromptTokenizer.build((m["prompt"] for m in meta), max_len)
    tokenizer.check([m["prompt"] for m in test + compositional])  # every test word is seen in training
    stats["data"] = {
        "scenes": len(meta),
        "unique_prompts": len({m["prompt"] for m in meta}),
        "seconds": time.time() - t,
    }

    # ---- VQ tokenizer -----------------------------------------------------------------------------
    if cfg.vq_path is not None:
        stats["vq"] = {"from": cfg.vq_path}
    else:

        def batch_images(n: int, gen: torch.Generator) -> torch.Tensor:
            return _to_float(images[torch.randint(0, len(images), (n,), generator=gen).numpy()])

        vq_budget = None if budget is None else 0.25 * budget
        stats["vq"] = train_vq(vq, batch_images, cfg.vq_steps, cfg.vq_batch, cfg.vq_lr, vq_budget, cfg.seed)
    stats["vq"]["merged_flat_duplicates"] = vq.merge_flat_duplicates()  # idempotent
    t = time.time()
    tokens = encode_dataset(vq, images)  # [N, T]
    stats["vq"]["encode_seconds"] = time.time() - t
    stats["load_average"]["after_vq"] = os.getloadavg()[0]
    stats["vq"]["codes_used"] = int(tokens.unique().numel())
    with torch.no_grad():
        x = _to_float(images[:512])
        stats["vq"]["heldin_mse"] = float(F.mse_loss(vq.decode(vq.encode(x)), x))

    # ---- prior ------------------------------------------------------------------------------------
    ar_cfg = cfg.ar or ARConfig()
    ar_cfg.prompt_len = tokenizer.max_len
    ar_cfg.default_cfg_scale = cfg.cfg_scale
    policy = ARPolicy(ar_cfg, tokenizer, vq)
    stats["prior_params"] = sum(p.numel() for n, p in policy.named_parameters() if not n.startswith("vq."))
    prompt_ids = tokenizer.encode([m["prompt"] for m in meta])  # [N, L]
    left = None if budget is None else max(budget - (time.time() - t_start), 1.0)
    stats["prior"] = train_prior(policy, prompt_ids, tokens, cfg, left, callback)
    stats["train_seconds"] = time.time() - t_start
    stats["load_average"]["after_prior"] = os.getloadavg()[0]

    # ---- save, reload (fp16 round trip), evaluate the reloaded model ------------------------------
    policy.save_pretrained(out)
    if evaluate:
        t = time.time()
        shipped = ARPolicy.from_pretrained(out)
        result = evaluate(shipped, test, cfg.eval_images_per_prompt, cfg.seed)
        stats["eval"] = {**result, "seconds": time.time() - t, "prompts": len(test)}
        if compositional:
            t = time.time()
            result = evaluate(shipped, compositional, cfg.eval_images_per_prompt, cfg.seed)
            stats["eval_compositional"] = {
                **result,
                "seconds": time.time() - t,
                "prompts": len(compositional),
            }
    stats["total_seconds"] = time.time() - t_start
    with open(os.path.join(out, "pretrain.json"), "w") as f:
        json.dump(stats, f, indent=2)
    return stats
