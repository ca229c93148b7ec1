"""Meissonic (Bai et al. 2024, arXiv 2410.08261; MeissonFlow/Meissonic) from a local folder as a `Policy`.

The released folder is a Muse-style pipeline — ``transformer/`` (Meissonic's own transformer, rebuilt here in
meissonic_transformer.py from safetensors; the folder's ``transformer.py`` is never imported), ``vqvae/``
(diffusers ``VQModel``), ``text_encoder/`` (CLIP ViT-H/14 with projection), ``tokenizer/`` and
``scheduler/`` (its ``mask_token_id`` and ``masking_schedule``) — and this adapter drives it with the reveal
loop aMUSEd and Meissonic share (muse_common.py) under the reference pipeline's conventions
(viiika/Meissonic src/pipeline.py, src/scheduler.py, inference.py):

- text: CLIP ids padded / truncated to 77 (the pipeline's ``max_length=77``); the projected pooled
  ``text_embeds`` and the penultimate hidden states; the negative prompt (``PromptRecord.negative``, else
  ``model_options.negative_prompt``, else the checkpoint's saved one, else ``""`` as the pipeline) through
  the same encoder;
- guidance ``uncond + s·(cond − uncond)`` on every position, only for s > 1; 64 steps and s = 9 by default
  (inference.py; the pipeline's ``__call__`` defaults are 48 and 9);
- micro-conditioning [W, H, 0, 0, 6] (W = H = the resolution in pixels) and the timestep S − 1 − s of reveal
  step s: both enter the transformer beside the pooled text (meissonic_transformer.py);
- the resolution: ``transformer/config.json``'s ``sample_size`` (tokens per side) × the VQ's scale factor
  2^(len(block_out_channels) − 1) where it is given, else the pipeline's 1024 px (64 × 64 tokens for the
  released VQ's factor 16);
- the scheduler's mask id and schedule (the same reveal counts as aMUSEd's scheduler), confidence noise
  τ = linspace(2, 0, S), decoding through ``vqvae.decode(…, force_not_quantize=True)``.

Only the transformer is trained (all of it, or LoRA adapters on its attention projections); the VQ and the
text encoder stay frozen. Details: docs/concepts/adapters.md#meissonic, docs/real_checkpoints.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from t2i_gcpo.errors import UserError
from t2i_gcpo.outdir import read_json, write_file
from t2i_gcpo.policies import muse_common as muse
from t2i_gcpo.policies.base import (
    PolicyCapabilities,
    TokenLayout,
)
from t2i_gcpo.policies.lora import add_lora, merged_state_dict
from t2i_gcpo.policies.maskgen import mask_progress, reveal_counts
from t2i_gcpo.policies.meissonic_transformer import MeissonicTransformer, load_transformer, save_transformer

PIPELINE_CLASS = "Pipeline"  # the release's model_index.json _class_name (src/pipeline.py's class)
MODEL_INDEX = {  # the release's model_index.json, its components named as released
    "_class_name": PIPELINE_CLASS,
    "scheduler": ["scheduler", "Scheduler"],
    "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "transformer": ["transformer", "Transformer2DModel"],
    "vqvae": ["diffusers", "VQModel"],
}
TEXT_LENGTH = 77  # src/pipeline.py: the tokenizer's max_length=77, whatever its model_max_length
DEFAULT_RESOLUTION = 1024  # src/pipeline.py: height = width = 1024
# peft LoRA targets: every attention projection of both block kinds (the diffusers Flux LoRA convention)
DEFAULT_LORA_TARGETS = (
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
)


def clip_text_widths(folder: Path) -> tuple[int, int, int]:
    """(hidden width, projection width, positions) of ``text_encoder/config.json``, read before any weight: a
    CLIP text model with projection, or a whole CLIP model
    (laion/CLIP-ViT-H-14-laion2B-s32B-b79K's layout)."""
    file = folder / "config.json"
    raw = read_json(file, dict[str, Any], follow=True)
    kind = raw.get("model_type")
    text = raw.get("text_config") if kind == "clip" else raw
    if kind not in ("clip_text_model", "clip") or not isinstance(text, dict):
        raise UserError(f"{file}: model_type {kind!r}, not a CLIP text encoder (CLIPTextModelWithProjection)")
    try:
        projection = raw.get("projection_dim", text.get("projection_dim", 512))
        return (
            int(text.get("hidden_size", 512)),
            int(projection),
            int(text.get("max_position_embeddings", 77)),
        )
    except (TypeError, ValueError):
        raise UserError(f"{file}: hidden_size / projection_dim are not numbers") from None


class MeissonicPolicy(muse.MuseMembers, nn.Module):
    """Policy protocol for a local Meissonic checkpoint (module docstring)."""

    decode_session = None  # the reveal loop keeps no decode loop between rollouts (Policy.decode_session)
    output = "image"
    # rollout.autocast='auto' leaves the transformer in its dtype (bf16 sampling not checked to train as
    # float32 does): model_options.dtype=bfloat16 or rollout.autocast=bf16 ask for it
    capabilities = PolicyCapabilities(
        bf16_sampling=False, branching=True, reveal_order=True, step_predictions=True
    )
    default_task = "geneval"
    guidance = muse.GUIDANCE  # src/pipeline.py: uncond_logits + guidance_scale·(cond_logits − uncond_logits)
    default_steps = 64  # inference.py steps = 64 (src/pipeline.py's own default: 48)
    default_guidance_scale = 9.0  # inference.py CFG = 9; src/pipeline.py guidance_scale=9.0
    text_length = TEXT_LENGTH

    def __init__(
        self,
        transformer: MeissonicTransformer,
        vqvae: nn.Module,
        text_encoder: nn.Module,
        tokenizer: Any,
        scheduler_config: dict,
        estimator: str = "trajectory",
        remask_count: int = 2,
        replay_rows: int = 0,
        negative_prompt: str = "",
    ) -> None:
        super().__init__()
        cfg = transformer.config
        mask_id = int(scheduler_config["mask_token_id"])
        if not cfg.codebook_size <= mask_id < cfg.vocab_size:
            raise UserError(
                f"scheduler mask_token_id {mask_id} is not a mask row of the transformer's embeddings "
                f"(codebook_size {cfg.codebook_size} ≤ id < vocab_size {cfg.vocab_size})"
            )
        latent = getattr(vqvae.config, "num_vq_embeddings", cfg.codebook_size)
        if latent != cfg.codebook_size:
            raise UserError(f"the VQ has {latent} codes, the transformer predicts {cfg.codebook_size}")
        self.transformer = transformer
        self.vqvae = vqvae.eval().requires_grad_(False)
        self.text_encoder = text_encoder.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.scheduler_config = dict(scheduler_config)
        self.mask_id = mask_id
        self.mask_schedule = scheduler_config.get("masking_schedule", "cosine")
        self.vae_scale_factor = muse.vae_scale_factor(vqvae)
        side = cfg.sample_size or DEFAULT_RESOLUTION // self.vae_scale_factor
        if cfg.downsample and side % 2:
            raise UserError(
                f"a {side}×{side} token grid cannot be compressed 2×2 (downsample): use an even side"
            )
        self.grid_shape: tuple[int, int] = (side, side)
        self.layout = TokenLayout.image(side, side)
        self.num_tokens = side * side  # T
        self.image_size = side * self.vae_scale_factor  # the micro-conditioning's width and height
        self.codebook_size = cfg.codebook_size  # K
        self.feature_dim = cfg.inner_dim
        self.default_negative = negative_prompt
        self.set_estimator(estimator, remask_count)
        self.replay_rows = replay_rows  # rows per transformer forward in a replay (0: one step a forward)
        self.reveal_order = "confidence"  # when SamplingParams names none: the pipeline's, or the trained one
        self.lora_adapter: str | None = None

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: str = "float32",
        estimator: str = "trajectory",
        remask_count: int = 2,
        gradient_checkpointing: bool = False,
        lora_rank: int = 0,
        negative_prompt: str | None = None,
    ) -> MeissonicPolicy:
        """Load a local Meissonic folder (never the Hub; nothing of the folder is executed: weights are read
        from safetensors, configs from JSON). Every part is checked against the others before a weight is
        read: a missing part, a text encoder of another width, a config the reference does not run are one
        UserError line."""
        path = muse.check_pipeline_folder(path, "Meissonic")
        torch_dtype = muse.check_dtype(dtype, "Meissonic")
        from diffusers import VQModel

        from t2i_gcpo.policies.meissonic_transformer import read_config
        from t2i_gcpo.weights import check_weight_files

        config = read_config(path / "transformer")
        hidden, projection, positions = clip_text_widths(path / "text_encoder")
        if hidden != config.joint_attention_dim or projection != config.pooled_projection_dim:
            raise UserError(
                f"{path / 'text_encoder'}: a text encoder of width {hidden} (projection {projection}), "
                f"but the transformer takes {config.joint_attention_dim} (joint_attention_dim) and "
                f"{config.pooled_projection_dim} (pooled_projection_dim): not this transformer's text encoder"
            )
        if positions < TEXT_LENGTH:
            raise UserError(
                f"{path / 'text_encoder'}: {positions} positions, the pipeline encodes {TEXT_LENGTH}"
            )
        scheduler_config = muse.read_scheduler_config(path)
        check_weight_files(path)  # the loading check of every family: readable, number dtypes, finite
        transformer = load_transformer(path / "transformer", torch_dtype)
        vqvae, text_encoder, tokenizer = muse.load_frozen_parts(path, torch_dtype, VQModel, "Meissonic")
        policy = cls(
            transformer,
            vqvae,
            text_encoder,
            tokenizer,
            scheduler_config,
            estimator,
            remask_count,
            negative_prompt=muse.negative_prompt(path, negative_prompt),
        )
        muse.read_reveal_order(path, policy)
        if lora_rank:
            policy.add_lora(lora_rank)
        transformer.gradient_checkpointing = bool(gradient_checkpointing)
        return policy

    def add_lora(
        self, rank: int, alpha: float | None = None, targets: Sequence[str] = DEFAULT_LORA_TARGETS
    ) -> None:
        """LoRA (peft) of rank `rank` on the transformer's attention projections: the rest of it frozen."""
        if rank <= 0:
            raise UserError(f"LoRA needs a positive rank, got {rank}")
        self.lora_adapter = add_lora(self.transformer, rank, alpha, targets=targets)

    # ------------------------------------------------------------------ prompts and conditioning
    @property
    def device(self) -> torch.device:
        return self.transformer.context_embedder.weight.device

    def check_prompts(self, prompts: list[str]) -> None:
        """Any text: the CLIP tokenizer truncates to 77 ids, as the pipeline does."""

    def timesteps(self, masked: torch.Tensor, steps: int) -> torch.Tensor:
        """The pipeline's timestep for canvases with `masked` [N] masked tokens in a decoding of `steps`
        steps: S − 1 − s for the canvas reveal step s sees (its masked count fixes s: every step reveals at
        least one token); a count no step sees (a re-mask of the remask estimator) gets S − 1 − S·γ⁻¹(masked /
        T), clamped to [0, S − 1] — the step whose canvas it would be under the schedule γ."""
        t_len = self.num_tokens
        counts = torch.tensor(reveal_counts(t_len, steps, self.mask_schedule), device=masked.device)
        before = t_len - torch.cumsum(counts, 0) + counts  # masked tokens before each step [S]
        exact = masked[:, None] == before[None, :]  # [N, S]: at most one match per row
        step = exact.float().argmax(1)
        between = steps * mask_progress(masked.float() / t_len, self.mask_schedule)
        step = torch.where(exact.any(1), step.float(), between)
        return (steps - 1 - step).clamp(0, steps - 1)

    def conditioned_features(self, pos_ids: torch.Tensor, neg_ids: torch.Tensor, steps: int):
        """muse_common.MuseAdapter: hidden_fn(canvas [N, T], rows [N], null [N]) → features [N, T, D], the
        text of `pos_ids` (or `neg_ids` where null) with the canvas's timestep (`timesteps`)."""
        pooled_c, states_c = muse.text_states(self, pos_ids)
        pooled_u, states_u = muse.text_states(self, neg_ids)
        rows_, cols = self.grid_shape

        def hidden_fn(canvas: torch.Tensor, rows: torch.Tensor, null: torch.Tensor) -> torch.Tensor:
            n = canvas.shape[0]
            pooled = torch.where(null[:, None], pooled_u[rows], pooled_c[rows])
            states = torch.where(null[:, None, None], states_u[rows], states_c[rows])
            h = self.transformer.features(
                canvas.view(n, rows_, cols),
                micro_conds=self.micro_conds(n, states.dtype),
                pooled_projections=pooled,
                encoder_hidden_states=states,
                timestep=self.timesteps((canvas == self.mask_id).sum(1), steps),
            )  # [N, D, rows, cols]
            return h.flatten(2).transpose(1, 2)  # [N, T, D]

        return hidden_fn

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Features [..., D] → codebook logits [..., K] (mlm_layer.conv2 as a linear map, float32)."""
        return F.linear(h.float(), self.transformer.mlm_layer.conv2.weight.flatten(1).float())

    # ------------------------------------------------------------------ saving
    def keep_full_precision(self) -> None:
        """Nothing to do: the weights are saved in their own dtype."""

    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """The transformer's state dict with any LoRA deltas folded into the base weights (no mutation)."""
        return merged_state_dict(self.transformer, self.lora_adapter)

    def save_pretrained(self, path: str | Path) -> None:
        """The released folder layout (LoRA merged): loads with `from_pretrained`, ``meissonic:PATH`` or as
        the reference's inference.py loads MeissonFlow/Meissonic (its component classes from_pretrained)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_transformer(self.transformer, path / "transformer", self.merged_state_dict())
        muse.save_frozen_parts(self, path, "Scheduler")
        index = {**MODEL_INDEX, "_diffusers_version": muse.diffusers_version()}
        write_file(path / "model_index.json", json.dumps(index, indent=2))
