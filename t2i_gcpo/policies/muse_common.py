"""What the diffusers Muse-style pipelines share — aMUSEd (amused.py) and Meissonic (meissonic.py) — in one
implementation both adapters call: the pipeline folder and its frozen parts, the pipeline's conditioning and
guidance conventions, and the reveal loop (policies/maskgen.py) driving an adapter's transformer with them.

Both releases are a folder of ``transformer/``, ``vqvae/`` (diffusers ``VQModel``), ``text_encoder/``
(transformers ``CLIPTextModelWithProjection``), ``tokenizer/`` (``CLIPTokenizer``) and ``scheduler/``
(``scheduler_config.json``: ``mask_token_id``, ``masking_schedule``), and their pipelines agree on:

- text conditioning: the CLIP ids padded / truncated to a fixed length; the pooled projected
  ``text_embeds`` and the penultimate hidden states (``hidden_states[-2]``) condition the transformer;
- the negative prompt (``PromptRecord.negative``, else the adapter's default) through the same encoder: CFG's
  unconditional branch and GCPO's negative context c⁻;
- guidance ``uncond + s·(cond − uncond)`` on every position, applied only for s > 1 (scales clamp at 1);
- micro-conditioning ``[width, height, crop_x, crop_y, aesthetic]`` = [W, H, 0, 0, 6] in pixels;
- the scheduler's mask id and schedule (maskgen.reveal_counts counts as its ``step`` does) and the
  confidence noise τ = linspace(2, 0, S) (the pipelines' ``temperature=(2, 0)``);
- decoding: ``vqvae.decode(ids, force_not_quantize=True, shape=…)`` clipped to [0, 1].

They differ in the transformer (diffusers' ``UVit2DModel``; Meissonic's, meissonic_transformer.py), in what
it is given besides the text (Meissonic: the reveal step's timestep), and in defaults (steps, scale, text
length). An adapter implements the `MuseAdapter` members below; the functions here do the rest, bound as its
`Policy` members by `MuseMembers`. No adapter inherits from another (docs/concepts/adapters.md).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from typing_extensions import NotRequired, TypedDict

from t2i_gcpo.errors import UserError
from t2i_gcpo.outdir import read_json, write_file
from t2i_gcpo.policies.base import (
    Context,
    PromptRecord,
    Rollout,
    SamplingParams,
)
from t2i_gcpo.policies.branching import continuation_uniforms
from t2i_gcpo.policies.maskgen import (
    MASK_SCHEDULES,
    HiddenFn,
    MaskedPolicyMembers,
    check_reveal_order,
    guidance_scales,
    masked_logprobs,
    maskgit_branch,
    maskgit_generate,
    record_remasks,
    reveal_counts,
    sampled_rollout,
    step_predictions,
    step_progress,
)
from t2i_gcpo.policies.sampling import ChunkedDists, group_uniforms

SUBFOLDERS = ("transformer", "vqvae", "text_encoder", "tokenizer", "scheduler")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GUIDANCE = "u + s(c − u)"  # both pipelines: uncond_logits + s·(cond_logits − uncond_logits), for s > 1
CHOICE_TEMPERATURE = (2.0, 0.0)  # the pipelines' temperature=(2, 0): linspace over the steps
AESTHETIC_SCORE = 6  # micro_conditioning_aesthetic_score
CROP_COORD = (0, 0)  # micro_conditioning_crop_coord
# our sampling defaults beside the pipeline's files (the pipelines ignore it): the reveal order a checkpoint
# was trained under, so that `eval`, `sample` and `credit-map` sample it the same way
SAMPLING_FILE = "t2i_gcpo_sampling.json"


class SamplingRecord(TypedDict):
    """SAMPLING_FILE: the reveal order a checkpoint samples with, and the negative prompt it was trained with
    (absent from the files of earlier versions: the pipeline's empty prompt)."""

    reveal_order: str | None
    negative_prompt: NotRequired[str]


class MuseAdapter(Protocol):
    """What the shared functions read from an adapter (aMUSEd, Meissonic): its frozen parts, the pipeline's
    numbers (`pipeline_numbers`) and its transformer's features."""

    transformer: nn.Module
    vqvae: nn.Module
    text_encoder: nn.Module
    tokenizer: Any
    mask_id: int
    mask_schedule: str
    scheduler_config: dict[str, Any]
    grid_shape: tuple[int, int]
    num_tokens: int  # T
    codebook_size: int  # K
    feature_dim: int  # the width of `head`'s input
    image_size: int  # pixels per side
    text_length: int  # CLIP ids per prompt
    default_negative: str  # the negative prompt when a PromptRecord names none
    default_steps: int
    default_guidance_scale: float
    estimator: str
    remask_count: int
    replay_rows: int
    reveal_order: str

    @property
    def device(self) -> torch.device: ...

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Features [..., C] → codebook logits [..., K] in float32."""

    def conditioned_features(self, pos_ids: torch.Tensor, neg_ids: torch.Tensor, steps: int) -> HiddenFn:
        """The maskgen ``hidden_fn(canvas, rows, null)`` → features [N, T, C] of the transformer conditioned
        on CLIP ids `pos_ids` (rows where ``null`` is false) or `neg_ids`, for a decoding of `steps` steps."""


# ---------------------------------------------------------------------------- the folder


def check_pipeline_folder(path: str | Path, model: str) -> Path:
    """The folder as a Path if it holds every subfolder of `SUBFOLDERS`; else a one-line UserError."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise UserError(f"{model} checkpoint '{path}' is not a directory")
    missing = [s for s in SUBFOLDERS if not (path / s).is_dir()]
    if missing:
        raise UserError(
            f"'{path}' is not {_article(model)} {model} pipeline folder: missing "
            f"{', '.join(m + '/' for m in missing)} (expected {', '.join(s + '/' for s in SUBFOLDERS)})"
        )
    return path


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def check_dtype(dtype: str, model: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype '{dtype}' for {model}: use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def read_scheduler_config(path: Path) -> dict[str, Any]:
    """``scheduler/scheduler_config.json``: a ``mask_token_id`` and a known ``masking_schedule``."""
    config = read_json(path / "scheduler" / "scheduler_config.json", dict[str, Any], follow=True)
    if "mask_token_id" not in config:
        raise UserError("scheduler/scheduler_config.json has no mask_token_id")
    if config.get("masking_schedule", "cosine") not in MASK_SCHEDULES:
        raise UserError(f"unknown masking_schedule {config['masking_schedule']!r} in the scheduler config")
    return dict(config)


def load_frozen_parts(
    path: Path, dtype: torch.dtype, vq_cls: Any, model: str
) -> tuple[nn.Module, nn.Module, Any]:
    """(vqvae, text_encoder, tokenizer) of a pipeline folder, read from safetensors only (the folder's own
    Python files are never imported); a file diffusers / transformers cannot read is one UserError line."""
    from transformers import CLIPTextModelWithProjection, CLIPTokenizer

    try:
        vqvae = vq_cls.from_pretrained(path / "vqvae", use_safetensors=True)
        text_encoder = CLIPTextModelWithProjection.from_pretrained(
            path / "text_encoder", dtype=dtype, use_safetensors=True
        )
        tokenizer = CLIPTokenizer.from_pretrained(path / "tokenizer")
    except (OSError, ValueError) as e:
        raise UserError(
            f"cannot load the {model} checkpoint '{path}': {' '.join(str(e).split())[:300]}"
        ) from None
    if not getattr(vqvae.config, "lookup_from_codebook", False):
        raise UserError(f"the {model} VQModel must have lookup_from_codebook=true to decode token ids")
    return vqvae.eval().requires_grad_(False), text_encoder.eval().requires_grad_(False), tokenizer


def vae_scale_factor(vqvae: nn.Module) -> int:
    """Pixels per token side: 2^(len(block_out_channels) − 1), as the pipelines compute it."""
    return 2 ** (len(vqvae.config.block_out_channels) - 1)


def read_sampling_record(path: Path) -> SamplingRecord | dict:
    """The folder's SAMPLING_FILE, checked; {} where there is none (a released folder)."""
    if not (path / SAMPLING_FILE).is_file():
        return {}
    return read_json(path / SAMPLING_FILE, SamplingRecord, follow=True)


def read_reveal_order(path: Path, adapter: Any) -> None:
    """Apply the folder's SAMPLING_FILE (the reveal order it was trained under), where there is one."""
    record = read_sampling_record(path)
    if not record:
        return
    try:
        adapter.keep_reveal_order(record["reveal_order"])
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path / SAMPLING_FILE}: cannot read the reveal order ({e})") from None


def negative_prompt(path: Path, asked: str | None) -> str:
    """The default negative prompt: the one asked for (model_options.negative_prompt), else the one the folder
    was trained with (SAMPLING_FILE), else the pipelines' empty prompt."""
    return asked if asked is not None else str(read_sampling_record(path).get("negative_prompt", ""))


def save_frozen_parts(adapter: MuseAdapter, path: Path, scheduler_class: str) -> None:
    """The VQ, text encoder, tokenizer, scheduler config and SAMPLING_FILE of `adapter` under `path`."""
    adapter.vqvae.save_pretrained(path / "vqvae")
    adapter.text_encoder.save_pretrained(path / "text_encoder")
    adapter.tokenizer.save_pretrained(path / "tokenizer")
    sched = {"_class_name": scheduler_class, **adapter.scheduler_config}
    write_file(path / "scheduler" / "scheduler_config.json", json.dumps(sched, indent=2), within=path)
    record = {"reveal_order": adapter.reveal_order, "negative_prompt": adapter.default_negative}
    write_file(path / SAMPLING_FILE, json.dumps(record, indent=2))


def diffusers_version(default: str = "0.42.1") -> str:
    try:
        from importlib.metadata import version

        return version("diffusers")
    except Exception:
        return default


# ---------------------------------------------------------------------------- conditioning


def text_ids(adapter: MuseAdapter, texts: list[str]) -> torch.Tensor:
    """Texts → CLIP ids [N, text_length], padded and truncated as the pipelines do."""
    return adapter.tokenizer(
        texts, return_tensors="pt", padding="max_length", truncation=True, max_length=adapter.text_length
    ).input_ids.to(adapter.device)


@torch.no_grad()
def text_states(adapter: MuseAdapter, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CLIP ids [N, L] → (pooled projected embeddings [N, E], penultimate hidden states [N, L, H])."""
    out = adapter.text_encoder(ids.to(adapter.device), return_dict=True, output_hidden_states=True)
    return out.text_embeds, out.hidden_states[-2]


def micro_conds(adapter: MuseAdapter, n: int, dtype: torch.dtype) -> torch.Tensor:
    """[N, 5]: width, height, crop coordinates, aesthetic score (the pipelines' order)."""
    w = h = adapter.image_size
    row = torch.tensor([w, h, *CROP_COORD, AESTHETIC_SCORE], device=adapter.device, dtype=dtype)
    return row[None].expand(n, -1)


def resolve_steps(adapter: MuseAdapter, sampling: SamplingParams) -> int:
    steps = int(sampling.steps if sampling.steps is not None else adapter.default_steps)
    if steps < 1:
        raise UserError(f"steps must be ≥ 1, got {steps}")
    return steps


def scale_fn(sampling: SamplingParams):
    """The pipelines guide only when s > 1: scales below 1 act as 1 (the conditional branch)."""
    s, schedule = sampling.guidance_scale, sampling.guidance_schedule
    return lambda p: guidance_scales(s, schedule, p).clamp_min(1.0)


def choice_temperatures(steps: int) -> torch.Tensor:
    return torch.linspace(*CHOICE_TEMPERATURE, steps)


def default_sampling(adapter: MuseAdapter) -> SamplingParams:
    return SamplingParams(
        guidance_scale=adapter.default_guidance_scale,
        steps=adapter.default_steps,
        reveal_order=adapter.reveal_order,
    )


def keep_reveal_order(adapter: MuseAdapter, order: str) -> None:
    adapter.reveal_order = check_reveal_order(order)


# ---------------------------------------------------------------------------- the reveal loop


def rollout(
    adapter: MuseAdapter,
    prompts: Sequence[PromptRecord],
    group_size: int,
    sampling: SamplingParams,
    generators: Sequence[torch.Generator],
) -> Rollout:
    """`group_size` samples per prompt (rows i·G … i·G+G−1); ``PromptRecord.negative`` is honoured."""
    if len(generators) != len(prompts):
        raise ValueError(f"need one generator per prompt, got {len(generators)} for {len(prompts)}")
    if not sampling.temperature > 0:
        raise UserError(f"temperature must be > 0, got {sampling.temperature}")
    steps = resolve_steps(adapter, sampling)
    order = sampling.reveal_order or adapter.reveal_order
    sampling = dataclasses.replace(sampling, steps=steps, reveal_order=order)
    t_len, dev = adapter.num_tokens, adapter.device
    pos_ids = text_ids(adapter, [p.text for p in prompts]).repeat_interleave(group_size, dim=0)
    negatives = [adapter.default_negative if p.negative is None else p.negative for p in prompts]
    neg_ids = text_ids(adapter, negatives).repeat_interleave(group_size, dim=0)
    uniforms = group_uniforms(generators, group_size, (steps, t_len, 2), dev)
    hidden_fn = adapter.conditioned_features(pos_ids, neg_ids, steps)
    scales = scale_fn(sampling)
    predictions = step_predictions(sampling, len(pos_ids), steps, t_len, adapter.mask_id, dev)
    with torch.no_grad():
        tokens, step, logps = maskgit_generate(
            hidden_fn,
            adapter.head,
            t_len,
            adapter.mask_id,
            reveal_counts(t_len, steps, adapter.mask_schedule),
            sampling,
            uniforms,
            choice_temperatures(steps),
            scales(step_progress(steps)),
            GUIDANCE,
            dev,
            order,
            predictions,
        )
    state = {"prompt_ids": pos_ids, "negative_ids": neg_ids, "estimator": adapter.estimator}
    ro = sampled_rollout(tokens, step, logps, prompts, group_size, sampling, state, predictions)
    if adapter.estimator == "remask":
        record_remasks(
            ro,
            generators,
            adapter.remask_count,
            adapter.mask_schedule,
            hidden_fn,
            adapter.head,
            adapter.mask_id,
            adapter.codebook_size,
            adapter.feature_dim,
            GUIDANCE,
            scales,
        )
    return ro


def continue_rollout(
    adapter: MuseAdapter,
    rollout: Rollout,
    root: torch.Tensor,
    point: torch.Tensor,
    generators: Sequence[torch.Generator],
    n: int,
) -> Rollout:
    """Continuations of rows `root` from reveal steps `point` (`Policy.branch` through branching.branched)."""
    sampling = rollout.sampling
    steps = resolve_steps(adapter, sampling)
    root = root.to(adapter.device)
    counts = reveal_counts(adapter.num_tokens, steps, adapter.mask_schedule)
    uniforms = continuation_uniforms(generators, (len(counts), adapter.num_tokens, 2), adapter.device)
    hidden_fn = adapter.conditioned_features(
        rollout.state["prompt_ids"][root], rollout.state["negative_ids"][root], steps
    )
    return maskgit_branch(
        rollout,
        root,
        point,
        uniforms,
        hidden_fn,
        adapter.head,
        adapter.mask_id,
        counts,
        choice_temperatures(steps),
        scale_fn(sampling)(step_progress(steps)),
        GUIDANCE,
        sampling.reveal_order or adapter.reveal_order,
    )


def logprobs(
    adapter: MuseAdapter, rollout: Rollout, context: Context, dists: bool
) -> tuple[torch.Tensor, ChunkedDists | None]:
    """log softmax(ℓ/T) of the rollout's tokens [B, T] by its estimator, with gradient
    (maskgen.masked_logprobs; 0 where the remask estimator scores nothing), and with `dists` the
    full distributions."""
    sampling = rollout.sampling
    steps = resolve_steps(adapter, sampling)
    scales = scale_fn(sampling)
    hidden_fn = adapter.conditioned_features(
        rollout.state["prompt_ids"], rollout.state["negative_ids"], steps
    )
    return masked_logprobs(
        hidden_fn,
        adapter.head,
        rollout,
        context,
        dists,
        mask_id=adapter.mask_id,
        vocab=adapter.codebook_size,
        dim=adapter.feature_dim,
        guidance=GUIDANCE,
        step_scales=scales(step_progress(steps)),
        scale_fn=scales,
        device=adapter.device,
        replay_rows=adapter.replay_rows,
    )


# ---------------------------------------------------------------------------- images


@torch.no_grad()
def decode(adapter: MuseAdapter, rollout: Rollout) -> torch.Tensor:
    """Images [B, 3, H, W] in [0, 1] through the VQ decoder."""
    b, (rows, cols) = len(rollout), adapter.grid_shape
    latents = rollout.tokens.to(adapter.device).view(b, rows, cols)
    shape = (b, rows, cols, adapter.vqvae.config.latent_channels)
    return adapter.vqvae.decode(latents, force_not_quantize=True, shape=shape).sample.float().clip(0, 1)


def token_features(adapter: MuseAdapter, rollout: Rollout) -> torch.Tensor:
    """VQ codebook entries of the sampled tokens [B, T, D]."""
    return adapter.vqvae.quantize.embedding(rollout.tokens.to(adapter.device)).float()


# ---------------------------------------------------------------------------- the adapters' members


class MuseMembers(MaskedPolicyMembers):
    """The `Policy` members aMUSEd and Meissonic have alike: the functions above, each bound to the adapter
    (its first argument), and maskgen.MaskedPolicyMembers's `logprobs`, `branch` and `forward` over two of
    them. Listed before ``nn.Module`` among an adapter's bases; what differs is the adapter's
    own (`MuseAdapter`)."""

    default_sampling = default_sampling
    keep_reveal_order = keep_reveal_order
    text_ids = text_ids
    micro_conds = micro_conds
    rollout = rollout
    _continue = continue_rollout
    _logprobs = logprobs
    decode = decode
    token_features = token_features
