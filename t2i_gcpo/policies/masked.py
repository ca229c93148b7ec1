"""The built-in masked (MaskGIT-style) text-to-image prior for ShapeWorld as a `Policy`.

A bidirectional Llama over [<bos>, prompt words, <boi>, image tokens or [MASK]] sharing the AR prior's
vocabulary and VQ codes, so the two priors see the same words and codes; null prompt, guidance and
sampler as in maskgen.py, with the `trajectory` or `remask` estimator chosen per policy.
Details: docs/concepts/adapters.md#masked-prior.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import (
    Context,
    PolicyCapabilities,
    PromptRecord,
    Rollout,
    SamplingParams,
    TokenLayout,
)
from t2i_gcpo.policies.branching import continuation_uniforms
from t2i_gcpo.policies.maskgen import (
    MASK_SCHEDULES,
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
from t2i_gcpo.policies.prior_folder import load_prior_folder, save_prior_folder
from t2i_gcpo.policies.prompt_tokenizer import PromptTokenizer
from t2i_gcpo.policies.sampling import ChunkedDists, check_records, group_uniforms
from t2i_gcpo.tokenizers.vq import VQTokenizer

ASSETS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets")
AR_ASSETS = os.path.join(ASSETS, "shapeworld")  # the AR prior: its prompt vocabulary and VQ are shared


@dataclass
class MaskedConfig:
    prompt_len: int = 10  # L, prompt words (padded) between <bos> and <boi>
    hidden_size: int = 192  # d
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 512  # SwiGLU width (≈ 8/3 d, Llama's ratio)
    default_cfg_scale: float = 3.0  # s used when the caller gives none (`default_sampling`)
    default_steps: int = 8  # S, decoding steps when SamplingParams.steps is None
    choice_temperature: float = 4.5  # τ₀ of the annealed Gumbel noise on the confidence (MaskGIT: 4.5)
    reveal_order: str = "confidence"  # default order when SamplingParams.reveal_order is None (maskgen.py)
    mask_schedule: str = "cosine"  # γ: fraction still masked against progress (cosine | linear)
    storage_dtype: str = "float16"  # dtype of weights on disk; upcast to fp32 at load
    grid: tuple[int, int] = field(default=(8, 8))  # (rows, cols), copied from the VQ
    codebook_size: int = 256  # K, copied from the VQ


class MaskedPolicy(MaskedPolicyMembers, nn.Module):
    """Text-conditioned bidirectional transformer over [prompt; VQ tokens] plus its (frozen) VQ."""

    decode_session = None  # the reveal loop keeps no decode loop between rollouts (Policy.decode_session)
    output = "image"
    # rollout.autocast='auto' samples in bf16 where native (its own transformer)
    capabilities = PolicyCapabilities(
        bf16_sampling=True, branching=True, reveal_order=True, step_predictions=True
    )
    default_task = "shapeworld"
    guidance = "u + s(c − u)"  # CFG on the logits, as the AR prior

    def __init__(
        self,
        config: MaskedConfig,
        tokenizer: PromptTokenizer,
        vq: VQTokenizer,
        estimator: str = "trajectory",
        remask_count: int = 2,
        replay_rows: int = 512,
    ) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaModel

        if tuple(config.grid) != tuple(vq.grid_shape) or config.codebook_size != vq.codebook_size:
            config.grid, config.codebook_size = tuple(vq.grid_shape), vq.codebook_size
        if config.prompt_len != tokenizer.max_len:
            raise ValueError(f"prompt_len {config.prompt_len} != tokenizer.max_len {tokenizer.max_len}")
        if config.mask_schedule not in MASK_SCHEDULES:
            raise ValueError(f"mask_schedule must be one of {MASK_SCHEDULES}, not {config.mask_schedule!r}")
        check_reveal_order(config.reveal_order)
        if int(config.default_steps) < 1:
            raise ValueError(f"default_steps must be ≥ 1, got {config.default_steps}")
        self.config = config
        self.tokenizer = tokenizer
        self.grid_shape: tuple[int, int] = tuple(config.grid)
        self.layout = TokenLayout.image(*self.grid_shape)
        self.num_tokens = self.grid_shape[0] * self.grid_shape[1]  # T
        self.prefix_len = config.prompt_len + 2  # P
        self.image_offset = len(tokenizer)  # embedding id of image code 0
        self.mask_id = config.codebook_size  # canvas value of a masked position (embedding id offset + K)
        llama_cfg = LlamaConfig(
            vocab_size=len(tokenizer) + config.codebook_size + 1,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            num_key_value_heads=config.num_heads,
            max_position_embeddings=self.prefix_len + self.num_tokens,
            pad_token_id=None,  # the pad embedding is learned: it *is* the null prompt
            tie_word_embeddings=False,
        )
        llama_cfg._attn_implementation = "sdpa"
        llama_cfg.is_causal = False  # transformers builds a bidirectional mask (None without padding)
        self.llama = LlamaModel(llama_cfg)
        for layer in self.llama.layers:  # … and sdpa must not fall back to is_causal=True
            layer.self_attn.is_causal = False
        self.head = nn.Linear(config.hidden_size, config.codebook_size, bias=False)  # → K image logits
        self.vq = vq.eval().requires_grad_(False)
        self.set_estimator(estimator, remask_count)
        self.replay_rows = replay_rows  # rows per forward when replaying a trajectory

    # ---- sequences ------------------------------------------------------------------------------
    def default_sampling(self) -> SamplingParams:
        return SamplingParams(
            guidance_scale=float(self.config.default_cfg_scale),
            steps=self.config.default_steps,
            reveal_order=self.config.reveal_order,
        )

    def check_prompts(self, prompts: list[str]) -> None:
        self.tokenizer.check(prompts)

    def encode_prompts(self, prompts: list[str]) -> torch.Tensor:
        """Prompts → word ids [B, L] (raises UserError on unknown words)."""
        self.check_prompts(prompts)
        return self.tokenizer.encode(prompts).to(self.device)

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def prefix(self, prompt_ids: torch.Tensor, null: torch.Tensor | bool = False) -> torch.Tensor:
        """[B, L] word ids → [B, P] = [<bos>, words, <boi>]; rows where `null` get the null prompt."""
        b = prompt_ids.shape[0]
        ids = prompt_ids.clone()
        ids[torch.as_tensor(null, device=ids.device).expand(b)] = self.tokenizer.pad_id
        bos = ids.new_full((b, 1), self.tokenizer.bos_id)
        boi = ids.new_full((b, 1), self.tokenizer.boi_id)
        return torch.cat([bos, ids, boi], dim=1)

    def hidden(
        self, prompt_ids: torch.Tensor, canvas: torch.Tensor, null: torch.Tensor | bool = False
    ) -> torch.Tensor:
        """Word ids [N, L] and canvases [N, T] (codes, `mask_id` where masked) → hidden states of the
        image positions [N, T, D] (one bidirectional forward)."""
        seq = torch.cat([self.prefix(prompt_ids, null), canvas + self.image_offset], dim=1)  # [N, P+T]
        return self.llama(input_ids=seq).last_hidden_state[:, self.prefix_len :]

    def logits(
        self, prompt_ids: torch.Tensor, canvas: torch.Tensor, null: torch.Tensor | bool = False
    ) -> torch.Tensor:
        """Raw codebook logits [N, T, K] at every image position (pretraining's forward)."""
        return self.head(self.hidden(prompt_ids, canvas, null))

    def _hidden_fn(self, prompt_ids: torch.Tensor):
        pid = prompt_ids.to(self.device)
        return lambda canvas, rows, null: self.hidden(pid[rows], canvas, null)

    # ---- guidance over the steps -----------------------------------------------------------------
    def resolve_steps(self, sampling: SamplingParams) -> int:
        steps = int(sampling.steps if sampling.steps is not None else self.config.default_steps)
        if steps < 1:
            raise UserError(f"steps must be ≥ 1, got {steps}")
        return steps

    def _continue(
        self,
        rollout: Rollout,
        root: torch.Tensor,
        point: torch.Tensor,
        generators: Sequence[torch.Generator],
        n: int,
    ) -> Rollout:
        sampling = rollout.sampling
        steps = self.resolve_steps(sampling)
        root = root.to(self.device)
        counts = reveal_counts(self.num_tokens, steps, self.config.mask_schedule)
        uniforms = continuation_uniforms(generators, (len(counts), self.num_tokens, 2), self.device)
        return maskgit_branch(
            rollout,
            root,
            point,
            uniforms,
            self._hidden_fn(rollout.state["prompt_ids"].to(self.device)[root]),
            self.head,
            self.mask_id,
            counts,
            self.choice_temperatures(steps),
            self._scale_fn(sampling)(step_progress(steps)),
            self.guidance,
            self.resolve_reveal_order(rollout.sampling),
        )

    def keep_reveal_order(self, order: str) -> None:
        """Make `order` this model's default reveal order, saved with it (config.json)."""
        self.config.reveal_order = check_reveal_order(order)

    def resolve_reveal_order(self, sampling: SamplingParams) -> str:
        """The sampling's reveal order, or the checkpoint's when it names none (checked by the sampler)."""
        return sampling.reveal_order or self.config.reveal_order

    def _scale_fn(self, sampling: SamplingParams):
        return lambda progress: guidance_scales(sampling.guidance_scale, sampling.guidance_schedule, progress)

    def choice_temperatures(self, steps: int) -> torch.Tensor:
        """τ_s = τ₀·(1 − (s + 1)/S): MaskGIT's annealing of the confidence noise (0 at the last step)."""
        return self.config.choice_temperature * (1 - (torch.arange(steps) + 1) / steps)

    # ---- differentiable log-probs ---------------------------------------------------------------

    def _logprobs(
        self, rollout: Rollout, context: Context, dists: bool
    ) -> tuple[torch.Tensor, ChunkedDists | None]:
        sampling = rollout.sampling
        steps = self.resolve_steps(sampling)
        scale_fn = self._scale_fn(sampling)
        return masked_logprobs(
            self._hidden_fn(rollout.state["prompt_ids"]),
            self.head,
            rollout,
            context,
            dists,
            mask_id=self.mask_id,
            vocab=self.config.codebook_size,
            dim=self.config.hidden_size,
            guidance=self.guidance,
            step_scales=scale_fn(step_progress(steps)),
            scale_fn=scale_fn,
            device=self.device,
            replay_rows=self.replay_rows,
        )

    # ---- sampler --------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        sampling: SamplingParams,
        uniforms: torch.Tensor,
        predictions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample image tokens for word ids [B, L] with uniforms [B, S, T, 2] → (tokens [B, T], reveal
        steps [B, T], log-probs [3, B, T] of pos / neg / guided at each token's reveal step); `predictions`
        [B, S, T], when given, receives each step's full prediction x̂_s (maskgen.maskgit_continue)."""
        if not sampling.temperature > 0:
            raise UserError(f"temperature must be > 0, got {sampling.temperature}")
        steps = uniforms.shape[1]
        counts = reveal_counts(self.num_tokens, steps, self.config.mask_schedule)
        scales = self._scale_fn(sampling)(step_progress(steps))
        return maskgit_generate(
            self._hidden_fn(prompt_ids),
            self.head,
            self.num_tokens,
            self.mask_id,
            counts,
            sampling,
            uniforms,
            self.choice_temperatures(steps),
            scales,
            self.guidance,
            self.device,
            self.resolve_reveal_order(sampling),
            predictions,
        )

    def rollout(
        self,
        prompts: Sequence[PromptRecord],
        group_size: int,
        sampling: SamplingParams,
        generators: Sequence[torch.Generator],
    ) -> Rollout:
        """`group_size` samples per prompt, prompt i's samples contiguous (rows i·G … i·G+G−1)."""
        check_records(prompts, generators, "the ShapeWorld masked prior")
        steps = self.resolve_steps(sampling)
        sampling = dataclasses.replace(
            sampling, steps=steps, reveal_order=self.resolve_reveal_order(sampling)
        )
        pid = self.encode_prompts([p.text for p in prompts]).repeat_interleave(group_size, dim=0)  # [B, L]
        uniforms = group_uniforms(generators, group_size, (steps, self.num_tokens, 2), self.device)
        predictions = step_predictions(sampling, len(pid), steps, self.num_tokens, self.mask_id, self.device)
        tokens, step, logps = self.generate(pid, sampling, uniforms, predictions)
        state = {"prompt_ids": pid, "estimator": self.estimator}
        ro = sampled_rollout(tokens, step, logps, prompts, group_size, sampling, state, predictions)
        if self.estimator == "remask":
            record_remasks(
                ro,
                generators,
                self.remask_count,
                self.config.mask_schedule,
                self._hidden_fn(pid),
                self.head,
                self.mask_id,
                self.config.codebook_size,
                self.config.hidden_size,
                self.guidance,
                self._scale_fn(sampling),
            )
        return ro

    # ---- images ---------------------------------------------------------------------------------
    def decode(self, rollout: Rollout) -> torch.Tensor:
        """Images [B, 3, H, W] in [0, 1]."""
        return self.vq.decode(rollout.tokens.to(self.device))

    def token_features(self, rollout: Rollout) -> torch.Tensor:
        """VQ codebook vectors of the sampled tokens [B, T, D] (STAGE and critical-token credit)."""
        return self.vq.code_embeddings(rollout.tokens.to(self.device))

    # ---- persistence ----------------------------------------------------------------------------
    def keep_full_precision(self) -> None:
        """Save weights in float32 from now on (`config.storage_dtype`, float16 for shipping)."""
        self.config.storage_dtype = "float32"

    def save_pretrained(self, path: str) -> None:
        """``path/model_index.json``, ``path/prior/{config.json, model.safetensors, vocab.json}``,
        ``path/vq/{config.json, model.safetensors}``; weights stored in ``config.storage_dtype``."""
        save_prior_folder(self, path, "t2i_gcpo_masked", "masked")

    @classmethod
    def from_pretrained(cls, path: str, estimator: str = "trajectory", remask_count: int = 2) -> MaskedPolicy:
        """Load a `save_pretrained` folder; a missing, malformed or mismatched file is a `UserError`
        naming it."""
        return load_prior_folder(
            path,
            "t2i_gcpo_masked",
            MaskedConfig,
            "a masked policy",
            lambda c, t, v: cls(c, t, v, estimator, remask_count),
        )


def load_masked_policy(
    path: str, estimator: str = "trajectory", remask_count: int = 2, name: str | None = None
) -> MaskedPolicy:
    """A `MaskedPolicy.save_pretrained` directory (a shipped name is resolved to its folder by the family
    registration, policies/families/masked.py); `name` is what the user wrote, for the error."""
    if not os.path.isdir(path):
        raise UserError(f"model {name or path!r}: no such directory {path}")
    return MaskedPolicy.from_pretrained(path, estimator, remask_count)
