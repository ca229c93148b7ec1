"""diffusers aMUSEd (Patil et al. 2024, arXiv 2401.01808) from a local folder as a `Policy`.

The pipeline cannot serve RL (its scheduler samples with ``torch.multinomial`` and returns no
probabilities), so this adapter drives ``UVit2DModel`` with the reveal loop aMUSEd and Meissonic share
(muse_common.py over maskgen.py) while keeping the pipeline's conventions: CLIP text conditioning, the empty
negative prompt, ``u + s(c − u)`` guidance, micro-conditioning, the scheduler's mask id and schedule. Only the
transformer is trained. Details: docs/concepts/adapters.md#amused.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from t2i_gcpo.errors import UserError
from t2i_gcpo.outdir import write_file
from t2i_gcpo.policies import muse_common as muse
from t2i_gcpo.policies.base import (
    PolicyCapabilities,
    SamplingParams,
    TokenLayout,
)
from t2i_gcpo.policies.muse_common import DTYPES, SAMPLING_FILE, SUBFOLDERS, SamplingRecord  # noqa: F401

SUPPORTED_DIFFUSERS = "diffusers 0.25 – 0.42.1 (tested with 0.42.1)"


def import_amused() -> tuple[Any, Any, Any]:
    """(UVit2DModel, VQModel, AmusedScheduler) from diffusers, or a UserError naming the
    versions that work."""
    try:
        import diffusers
        from diffusers import AmusedScheduler, UVit2DModel, VQModel
    except ImportError as e:
        try:
            from importlib.metadata import version

            have = f"diffusers {version('diffusers')} is installed"
        except Exception:
            have = "diffusers is not installed"
        raise UserError(
            f"aMUSEd needs diffusers' UVit2DModel, VQModel and AmusedScheduler ({SUPPORTED_DIFFUSERS}); "
            f"{have}: {e}. Install e.g. `pip install diffusers==0.42.1`."
        ) from None
    del diffusers
    return UVit2DModel, VQModel, AmusedScheduler


class AmusedPolicy(muse.MuseMembers, nn.Module):
    """Policy protocol for a local aMUSEd checkpoint (UVit2DModel + VQModel + CLIP text encoder)."""

    decode_session = None  # the reveal loop keeps no decode loop between rollouts (Policy.decode_session)
    output = "image"
    # rollout.autocast='auto' leaves diffusers' transformer in its dtype (bf16 sampling not checked)
    capabilities = PolicyCapabilities(
        bf16_sampling=False, branching=True, reveal_order=True, step_predictions=True
    )
    default_task = "geneval"
    guidance = muse.GUIDANCE  # AmusedPipeline: uncond_logits + s·(cond_logits − uncond_logits)
    DEFAULT_STEPS = 12  # AmusedPipeline num_inference_steps
    DEFAULT_GUIDANCE_SCALE = 10.0  # AmusedPipeline guidance_scale
    CHOICE_TEMPERATURE = muse.CHOICE_TEMPERATURE  # AmusedPipeline temperature=(2, 0): linspace over the steps
    AESTHETIC_SCORE = muse.AESTHETIC_SCORE  # micro_conditioning_aesthetic_score
    CROP_COORD = muse.CROP_COORD  # micro_conditioning_crop_coord
    default_steps, default_guidance_scale = DEFAULT_STEPS, DEFAULT_GUIDANCE_SCALE  # (muse_common.MuseAdapter)

    def __init__(
        self,
        transformer: nn.Module,
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
        mlm = getattr(transformer, "mlm_layer", None)
        if mlm is None or not isinstance(getattr(mlm, "conv2", None), nn.Conv2d):
            raise UserError(
                f"this UVit2DModel has no mlm_layer.conv2 codebook projection "
                f"({SUPPORTED_DIFFUSERS} have one)"
            )
        if not getattr(vqvae.config, "lookup_from_codebook", False):
            raise UserError("the aMUSEd VQModel must have lookup_from_codebook=true to decode token ids")
        if "mask_token_id" not in scheduler_config:
            raise UserError("scheduler/scheduler_config.json has no mask_token_id")
        self.transformer = transformer
        self.vqvae = vqvae.eval().requires_grad_(False)
        self.text_encoder = text_encoder.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.mask_id = int(scheduler_config["mask_token_id"])
        self.mask_schedule = scheduler_config.get("masking_schedule", "cosine")
        if self.mask_schedule not in muse.MASK_SCHEDULES:
            raise UserError(f"unknown masking_schedule {self.mask_schedule!r} in the scheduler config")
        self.scheduler_config = dict(scheduler_config)
        side = int(transformer.config.sample_size)
        self.grid_shape: tuple[int, int] = (side, side)
        self.layout = TokenLayout.image(side, side)
        self.num_tokens = side * side  # T
        self.codebook_size = int(transformer.config.codebook_size)  # K
        self.feature_dim = mlm.conv2.in_channels
        self.vae_scale_factor = muse.vae_scale_factor(vqvae)
        self.image_size = side * self.vae_scale_factor
        self.text_length = int(tokenizer.model_max_length)  # AmusedPipeline: max_length=model_max_length
        self.default_negative = negative_prompt  # AmusedPipeline: negative_prompt None → ""
        self.set_estimator(estimator, remask_count)
        self.replay_rows = replay_rows  # rows per transformer forward in a replay (0: one step a forward)
        self.reveal_order = "confidence"  # when SamplingParams names none: the pipeline's, or the trained one

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: str = "float32",
        estimator: str = "trajectory",
        remask_count: int = 2,
        negative_prompt: str | None = None,
    ) -> AmusedPolicy:
        """Load a local aMUSEd pipeline folder (never the Hub); `negative_prompt`: the default negative prompt
        (None: the one the folder was trained with, else the pipeline's "")."""
        path = muse.check_pipeline_folder(path, "aMUSEd")
        torch_dtype = muse.check_dtype(dtype, "aMUSEd")
        from t2i_gcpo.weights import check_weight_files

        check_weight_files(path)  # the loading check of every family: readable, number dtypes, finite
        uvit_cls, vq_cls, _ = import_amused()
        scheduler_config = muse.read_scheduler_config(path)
        try:
            transformer = uvit_cls.from_pretrained(
                path / "transformer", torch_dtype=torch_dtype, use_safetensors=True
            )
        except (OSError, ValueError) as e:
            raise UserError(
                f"cannot load the aMUSEd checkpoint '{path}': {' '.join(str(e).split())[:300]}"
            ) from None
        vqvae, text_encoder, tokenizer = muse.load_frozen_parts(path, torch_dtype, vq_cls, "aMUSEd")
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
        return policy

    # ------------------------------------------------------------------ prompts and conditioning
    @property
    def device(self) -> torch.device:
        return self.transformer.encoder_proj.weight.device  # (mlm_layer.conv2 is swapped out inside forwards)

    def check_prompts(self, prompts: list[str]) -> None:
        """Any text: the CLIP tokenizer truncates to its model_max_length, as the pipeline does."""

    def text_states(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """CLIP ids [N, L] → (pooled projected embeddings [N, E], penultimate hidden states [N, L, H])."""
        return muse.text_states(self, ids)

    @contextlib.contextmanager
    def _features_only(self) -> Iterator[None]:
        """Run the transformer up to its codebook projection (mlm_layer.conv2 bypassed)."""
        mlm = self.transformer.mlm_layer
        conv2 = mlm.conv2
        mlm.conv2 = nn.Identity()
        try:
            yield
        finally:
            mlm.conv2 = conv2

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Features [..., C] → codebook logits [..., K] (mlm_layer.conv2 as a linear map, float32)."""
        conv2 = self.transformer.mlm_layer.conv2
        bias = None if conv2.bias is None else conv2.bias.float()
        return F.linear(h.float(), conv2.weight.flatten(1).float(), bias)

    def _hidden_fn(self, pos_ids: torch.Tensor, neg_ids: torch.Tensor):
        """hidden_fn(canvas [N, T], rows [N], null [N]) → features [N, T, C] for the maskgen routines."""
        pooled_c, states_c = self.text_states(pos_ids)
        pooled_u, states_u = self.text_states(neg_ids)
        side = self.grid_shape[0]

        def hidden_fn(canvas: torch.Tensor, rows: torch.Tensor, null: torch.Tensor) -> torch.Tensor:
            n = canvas.shape[0]
            pooled = torch.where(null[:, None], pooled_u[rows], pooled_c[rows])
            states = torch.where(null[:, None, None], states_u[rows], states_c[rows])
            with self._features_only():
                h = self.transformer(
                    canvas.view(n, side, side),
                    micro_conds=self.micro_conds(n, states.dtype),
                    pooled_text_emb=pooled,
                    encoder_hidden_states=states,
                )  # [N, C, side, side]
            return h.flatten(2).transpose(1, 2)  # [N, T, C]

        return hidden_fn

    def conditioned_features(self, pos_ids: torch.Tensor, neg_ids: torch.Tensor, steps: int):
        """muse_common.MuseAdapter: UVit2DModel is not told the step (the canvas is all it sees)."""
        return self._hidden_fn(pos_ids, neg_ids)

    # ------------------------------------------------------------------ guidance over the steps
    def resolve_steps(self, sampling: SamplingParams) -> int:
        return muse.resolve_steps(self, sampling)

    def _scale_fn(self, sampling: SamplingParams):
        """The pipeline guides only when s > 1: scales below 1 act as 1 (the conditional branch)."""
        return muse.scale_fn(sampling)

    def choice_temperatures(self, steps: int) -> torch.Tensor:
        return muse.choice_temperatures(steps)

    # ------------------------------------------------------------------ saving
    def keep_full_precision(self) -> None:
        """Nothing to do: the weights are saved in their own dtype."""

    def save_pretrained(self, path: str | Path) -> None:
        """A diffusers aMUSEd pipeline folder (loads with `from_pretrained` or ``AmusedPipeline``)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.transformer.save_pretrained(path / "transformer")
        muse.save_frozen_parts(self, path, "AmusedScheduler")
        index = {
            "_class_name": "AmusedPipeline",
            "_diffusers_version": muse.diffusers_version(),
            "scheduler": ["diffusers", "AmusedScheduler"],
            "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "transformer": ["diffusers", "UVit2DModel"],
            "vqvae": ["diffusers", "VQModel"],
        }
        write_file(path / "model_index.json", json.dumps(index, indent=2))
