"""diffusers aMUSEd (Patil et al. 2024, arXiv 2401.01808) from a local folder as a `Policy`.

The pipeline cannot serve RL (its scheduler samples with ``torch.multinomial`` and returns no
probabilities), so this adapter drives ``UVit2DModel`` with the shared masked sampler (maskgen.py) while
keeping the pipeline's conventions: CLIP text conditioning, the empty negative prompt, ``u + s(c − u)``
guidance, micro-conditioning, the scheduler's mask id and schedule. Only the transformer is trained.
Details: docs/concepts/adapters.md#amused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from typing_extensions import TypedDict

from t2i_gcpo.errors import UserError
from t2i_gcpo.outdir import read_json, write_file
from t2i_gcpo.policies.base import (
    STEP_PREDICTIONS,
    Branches,
    Context,
    PolicyCapabilities,
    PromptRecord,
    Rollout,
    SamplingParams,
    TokenLayout,
)
from t2i_gcpo.policies.branching import branched, continuation_uniforms
from t2i_gcpo.policies.maskgen import (
    MASK_SCHEDULES,
    check_estimator,
    check_reveal_order,
    draw_remasks,
    guidance_scales,
    masked_logprobs,
    maskgit_branch,
    maskgit_generate,
    remask_record,
    remask_scored,
    reveal_counts,
    step_predictions,
    step_progress,
)
from t2i_gcpo.policies.sampling import ChunkedDists, group_uniforms

SUPPORTED_DIFFUSERS = "diffusers 0.25 – 0.42.1 (tested with 0.42.1)"
SUBFOLDERS = ("transformer", "vqvae", "text_encoder", "tokenizer", "scheduler")
# our sampling defaults beside the pipeline's files (AmusedPipeline ignores it): the reveal order a
# checkpoint was trained under, so that `eval`, `sample` and `credit-map` sample it the same way
SAMPLING_FILE = "t2i_gcpo_sampling.json"


class SamplingRecord(TypedDict):
    """SAMPLING_FILE: the reveal order a checkpoint samples with."""

    reveal_order: str | None


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def import_amused() -> tuple[Any, Any, Any]:
    """(UVit2DModel, VQModel, AmusedScheduler) from diffusers, or a UserError naming the versions that work."""
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


class AmusedPolicy(nn.Module):
    """Policy protocol for a local aMUSEd checkpoint (UVit2DModel + VQModel + CLIP text encoder)."""

    decode_session = None  # the reveal loop keeps no decode loop between rollouts (Policy.decode_session)
    output = "image"
    # rollout.autocast='auto' leaves diffusers' transformer in its dtype (bf16 sampling not checked)
    capabilities = PolicyCapabilities(
        bf16_sampling=False, branching=True, reveal_order=True, step_predictions=True
    )
    default_task = "geneval"
    guidance = "u + s(c − u)"  # AmusedPipeline: uncond_logits + s·(cond_logits − uncond_logits)
    DEFAULT_STEPS = 12  # AmusedPipeline num_inference_steps
    DEFAULT_GUIDANCE_SCALE = 10.0  # AmusedPipeline guidance_scale
    CHOICE_TEMPERATURE = (2.0, 0.0)  # AmusedPipeline temperature=(2, 0): linspace over the steps
    AESTHETIC_SCORE = 6  # micro_conditioning_aesthetic_score
    CROP_COORD = (0, 0)  # micro_conditioning_crop_coord

    def __init__(self, transformer: nn.Module, vqvae: nn.Module, text_encoder: nn.Module, tokenizer: Any,
                 scheduler_config: dict, estimator: str = "trajectory", remask_count: int = 2,
                 replay_rows: int = 0) -> None:  # fmt: skip
        super().__init__()
        mlm = getattr(transformer, "mlm_layer", None)
        if mlm is None or not isinstance(getattr(mlm, "conv2", None), nn.Conv2d):
            raise UserError(
                f"this UVit2DModel has no mlm_layer.conv2 codebook projection ({SUPPORTED_DIFFUSERS} have one)"
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
        if self.mask_schedule not in MASK_SCHEDULES:
            raise UserError(f"unknown masking_schedule {self.mask_schedule!r} in the scheduler config")
        self.scheduler_config = dict(scheduler_config)
        side = int(transformer.config.sample_size)
        self.grid_shape: tuple[int, int] = (side, side)
        self.layout = TokenLayout.image(side, side)
        self.num_tokens = side * side  # T
        self.codebook_size = int(transformer.config.codebook_size)  # K
        self.feature_dim = mlm.conv2.in_channels
        self.vae_scale_factor = 2 ** (len(vqvae.config.block_out_channels) - 1)
        self.image_size = side * self.vae_scale_factor
        self.set_estimator(estimator, remask_count)
        self.replay_rows = replay_rows  # rows per transformer forward in a replay (0: one step a forward)
        self.reveal_order = "confidence"  # when SamplingParams names none: the pipeline's, or the trained one

    def set_estimator(self, estimator: str, remask_count: int = 2) -> None:
        check_estimator(estimator, remask_count)
        self.estimator, self.remask_count = estimator, int(remask_count)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: str = "float32", estimator: str = "trajectory",
                        remask_count: int = 2) -> AmusedPolicy:  # fmt: skip
        """Load a local aMUSEd pipeline folder (never the Hub)."""
        path = Path(path).expanduser()
        if not path.is_dir():
            raise UserError(f"aMUSEd checkpoint '{path}' is not a directory")
        missing = [s for s in SUBFOLDERS if not (path / s).is_dir()]
        if missing:
            raise UserError(
                f"'{path}' is not an aMUSEd pipeline folder: missing {', '.join(m + '/' for m in missing)} "
                f"(expected {', '.join(s + '/' for s in SUBFOLDERS)})"
            )
        if dtype not in DTYPES:
            raise UserError(f"unknown dtype '{dtype}' for aMUSEd: use one of {', '.join(DTYPES)}")
        from t2i_gcpo.weights import check_weight_files

        check_weight_files(path)  # the loading check of every family: readable, number dtypes, finite
        uvit_cls, vq_cls, _ = import_amused()
        from transformers import CLIPTextModelWithProjection, CLIPTokenizer

        sched_file = path / "scheduler" / "scheduler_config.json"
        scheduler_config = read_json(sched_file, dict[str, Any], follow=True)
        try:
            transformer = uvit_cls.from_pretrained(
                path / "transformer", torch_dtype=DTYPES[dtype], use_safetensors=True
            )
            vqvae = vq_cls.from_pretrained(path / "vqvae", use_safetensors=True)
            text_encoder = CLIPTextModelWithProjection.from_pretrained(
                path / "text_encoder", dtype=DTYPES[dtype], use_safetensors=True
            )
            tokenizer = CLIPTokenizer.from_pretrained(path / "tokenizer")
        except (OSError, ValueError) as e:
            raise UserError(
                f"cannot load the aMUSEd checkpoint '{path}': {' '.join(str(e).split())[:300]}"
            ) from None
        policy = cls(transformer, vqvae, text_encoder, tokenizer, scheduler_config, estimator, remask_count)
        if (path / SAMPLING_FILE).is_file():
            order = read_json(path / SAMPLING_FILE, SamplingRecord, follow=True)["reveal_order"]
            try:
                policy.keep_reveal_order(order)
            except (ValueError, KeyError, TypeError) as e:
                raise UserError(f"{path / SAMPLING_FILE}: cannot read the reveal order ({e})") from None
        return policy

    # ------------------------------------------------------------------ prompts and conditioning
    @property
    def device(self) -> torch.device:
        return self.transformer.encoder_proj.weight.device  # (mlm_layer.conv2 is swapped out inside forwards)

    def default_sampling(self) -> SamplingParams:
        return SamplingParams(
            guidance_scale=self.DEFAULT_GUIDANCE_SCALE,
            steps=self.DEFAULT_STEPS,
            reveal_order=self.reveal_order,
        )

    def branch(self, rollout: Rollout, points: torch.Tensor, n: int,
               generators: Sequence[torch.Generator]) -> Branches:  # fmt: skip
        """`n` continuations of every sample from each of its branch points (reveal steps): each re-runs the
        reveal schedule from its step on the root's canvas (docs/concepts/tree_credit.md#branched-rollouts)."""
        return branched(rollout, points, n, generators, self._continue)

    def _continue(self, rollout: Rollout, root: torch.Tensor, point: torch.Tensor,
                  generators: Sequence[torch.Generator], n: int) -> Rollout:  # fmt: skip
        sampling = rollout.sampling
        steps = self.resolve_steps(sampling)
        root = root.to(self.device)
        counts = reveal_counts(self.num_tokens, steps, self.mask_schedule)
        uniforms = continuation_uniforms(generators, (len(counts), self.num_tokens, 2), self.device)
        return maskgit_branch(
            rollout, root, point, uniforms, self._hidden_fn(rollout.state["prompt_ids"][root], rollout.state["negative_ids"][root]), self.head, self.mask_id,
            counts, self.choice_temperatures(steps), self._scale_fn(sampling)(step_progress(steps)), self.guidance,
            rollout.sampling.reveal_order or self.reveal_order,
        )  # fmt: skip

    def keep_reveal_order(self, order: str) -> None:
        """Make `order` this model's default reveal order, saved with it (`SAMPLING_FILE`)."""
        self.reveal_order = check_reveal_order(order)

    def check_prompts(self, prompts: list[str]) -> None:
        """Any text: the CLIP tokenizer truncates to its model_max_length, as the pipeline does."""

    def text_ids(self, texts: list[str]) -> torch.Tensor:
        """Texts → CLIP ids [N, model_max_length], padded and truncated as the pipeline does."""
        return self.tokenizer(
            texts, return_tensors="pt", padding="max_length", truncation=True,
            max_length=self.tokenizer.model_max_length,
        ).input_ids.to(self.device)  # fmt: skip

    @torch.no_grad()
    def text_states(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """CLIP ids [N, L] → (pooled projected embeddings [N, E], penultimate hidden states [N, L, H])."""
        out = self.text_encoder(ids.to(self.device), return_dict=True, output_hidden_states=True)
        return out.text_embeds, out.hidden_states[-2]

    def micro_conds(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        """[N, 5]: width, height, crop coordinates, aesthetic score (the pipeline's order)."""
        w = h = self.image_size
        row = torch.tensor([w, h, *self.CROP_COORD, self.AESTHETIC_SCORE], device=self.device, dtype=dtype)
        return row[None].expand(n, -1)

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
                    canvas.view(n, side, side), micro_conds=self.micro_conds(n, states.dtype),
                    pooled_text_emb=pooled, encoder_hidden_states=states,
                )  # [N, C, side, side]  # fmt: skip
            return h.flatten(2).transpose(1, 2)  # [N, T, C]

        return hidden_fn

    # ------------------------------------------------------------------ guidance over the steps
    def resolve_steps(self, sampling: SamplingParams) -> int:
        steps = int(sampling.steps if sampling.steps is not None else self.DEFAULT_STEPS)
        if steps < 1:
            raise UserError(f"steps must be ≥ 1, got {steps}")
        return steps

    def _scale_fn(self, sampling: SamplingParams):
        """The pipeline guides only when s > 1: scales below 1 act as 1 (the conditional branch)."""
        s, schedule = sampling.guidance_scale, sampling.guidance_schedule
        return lambda p: guidance_scales(s, schedule, p).clamp_min(1.0)

    def choice_temperatures(self, steps: int) -> torch.Tensor:
        return torch.linspace(*self.CHOICE_TEMPERATURE, steps)

    # ------------------------------------------------------------------ sampling
    def rollout(self, prompts: Sequence[PromptRecord], group_size: int, sampling: SamplingParams,
                generators: Sequence[torch.Generator]) -> Rollout:  # fmt: skip
        """`group_size` samples per prompt (rows i·G … i·G+G−1); ``PromptRecord.negative`` is honoured."""
        if len(generators) != len(prompts):
            raise ValueError(f"need one generator per prompt, got {len(generators)} for {len(prompts)}")
        if not sampling.temperature > 0:
            raise UserError(f"temperature must be > 0, got {sampling.temperature}")
        steps = self.resolve_steps(sampling)
        order = sampling.reveal_order or self.reveal_order
        sampling = dataclasses.replace(sampling, steps=steps, reveal_order=order)
        pos_ids = self.text_ids([p.text for p in prompts]).repeat_interleave(group_size, dim=0)
        neg_ids = self.text_ids([p.negative or "" for p in prompts]).repeat_interleave(group_size, dim=0)
        uniforms = group_uniforms(generators, group_size, (steps, self.num_tokens, 2), self.device)
        hidden_fn = self._hidden_fn(pos_ids, neg_ids)
        scale_fn = self._scale_fn(sampling)
        predictions = step_predictions(
            sampling, len(pos_ids), steps, self.num_tokens, self.mask_id, self.device
        )
        with torch.no_grad():
            tokens, step, logps = maskgit_generate(
                hidden_fn, self.head, self.num_tokens, self.mask_id,
                reveal_counts(self.num_tokens, steps, self.mask_schedule), sampling, uniforms,
                self.choice_temperatures(steps), scale_fn(step_progress(steps)), self.guidance, self.device,
                order, predictions,
            )  # fmt: skip
        logp = {"pos": logps[0], "neg": logps[1], "guided": logps[2]}
        ro = Rollout(
            tokens=tokens,
            mask=torch.ones_like(tokens, dtype=torch.float),
            step=step,
            logp=logp,
            prompts=[p for p in prompts for _ in range(group_size)],
            group_size=group_size,
            sampling=sampling,
            state={"prompt_ids": pos_ids, "negative_ids": neg_ids, "estimator": self.estimator},
        )
        if predictions is not None:
            ro.state[STEP_PREDICTIONS] = predictions
        if self.estimator == "remask":
            u = group_uniforms(generators, group_size, (self.remask_count, self.num_tokens + 1), self.device)
            masks, times = draw_remasks(u, self.mask_schedule)
            ro.state.update(remask=masks, remask_t=times, sampled_logp=logp)
            ro.logp = remask_record(
                hidden_fn, self.head, tokens, masks, times, self.mask_id, self.codebook_size,
                self.feature_dim, self.guidance, sampling.temperature, scale_fn,
            )  # fmt: skip
            ro.scored = remask_scored(ro.mask, masks)
        return ro

    # ------------------------------------------------------------------ log-probs
    def logprobs(self, rollout: Rollout, context: Context = "pos") -> torch.Tensor:
        """log softmax(ℓ/T) of the sampled tokens [B, T] by the rollout's estimator, with gradient
        (0 where the remask estimator scores nothing: outside `rollout.loss_mask`)."""
        return self._logprobs(rollout, context, dists=False)[0]

    def logprobs_and_dists(
        self, rollout: Rollout, context: Context = "pos"
    ) -> tuple[torch.Tensor, ChunkedDists]:
        """`logprobs` and the full distributions of the same forward (`ChunkedDists`, no gradient)."""
        logp, dists = self._logprobs(rollout, context, dists=True)
        assert dists is not None
        return logp, dists

    def _logprobs(
        self, rollout: Rollout, context: Context, dists: bool
    ) -> tuple[torch.Tensor, ChunkedDists | None]:
        sampling = rollout.sampling
        scale_fn = self._scale_fn(sampling)
        return masked_logprobs(
            self._hidden_fn(rollout.state["prompt_ids"], rollout.state["negative_ids"]), self.head,
            rollout, context, dists, mask_id=self.mask_id, vocab=self.codebook_size, dim=self.feature_dim,
            guidance=self.guidance, step_scales=scale_fn(step_progress(self.resolve_steps(sampling))),
            scale_fn=scale_fn, device=self.device, replay_rows=self.replay_rows,
        )  # fmt: skip

    def forward(
        self, rollout: Rollout, context: Context = "pos", dists: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, ChunkedDists]:
        """`logprobs`, or with ``dists`` `logprobs_and_dists`: what a DDP/FSDP-wrapped policy calls."""
        return self.logprobs_and_dists(rollout, context) if dists else self.logprobs(rollout, context)

    # ------------------------------------------------------------------ images
    @torch.no_grad()
    def decode(self, rollout: Rollout) -> torch.Tensor:
        """Images [B, 3, H, W] in [0, 1]."""
        b, side = len(rollout), self.grid_shape[0]
        latents = rollout.tokens.to(self.device).view(b, side, side)
        shape = (b, side, side, self.vqvae.config.latent_channels)
        return self.vqvae.decode(latents, force_not_quantize=True, shape=shape).sample.float().clip(0, 1)

    def token_features(self, rollout: Rollout) -> torch.Tensor:
        """VQ codebook entries of the sampled tokens [B, T, D]."""
        return self.vqvae.quantize.embedding(rollout.tokens.to(self.device)).float()

    # ------------------------------------------------------------------ saving
    def keep_full_precision(self) -> None:
        """Nothing to do: the weights are saved in their own dtype."""

    def save_pretrained(self, path: str | Path) -> None:
        """A diffusers aMUSEd pipeline folder (loads with `from_pretrained` or ``AmusedPipeline``)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.transformer.save_pretrained(path / "transformer")
        self.vqvae.save_pretrained(path / "vqvae")
        self.text_encoder.save_pretrained(path / "text_encoder")
        self.tokenizer.save_pretrained(path / "tokenizer")
        sched = {"_class_name": "AmusedScheduler", **self.scheduler_config}
        write_file(path / "scheduler" / "scheduler_config.json", json.dumps(sched, indent=2), within=path)
        try:
            from importlib.metadata import version

            dv = version("diffusers")
        except Exception:
            dv = "0.42.1"
        index = {
            "_class_name": "AmusedPipeline",
            "_diffusers_version": dv,
            "scheduler": ["diffusers", "AmusedScheduler"],
            "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "transformer": ["diffusers", "UVit2DModel"],
            "vqvae": ["diffusers", "VQModel"],
        }
        write_file(path / "model_index.json", json.dumps(index, indent=2))
        write_file(path / SAMPLING_FILE, json.dumps({"reveal_order": self.reveal_order}, indent=2))
