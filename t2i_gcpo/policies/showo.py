"""Show-o (Xie et al. 2024, arXiv 2408.12528; github.com/showlab/Show-o) from its released checkpoint as a
`Policy`: Phi-1.5 over text and MAGVIT-v2 image tokens, text-to-image by masked (MaskGIT) decoding.

Written here from the reference (models/modeling_showo.py, models/sampling.py, inference_t2i.py,
training/prompting_utils.py); nothing of a checkpoint folder is executed:

- Backbone: transformers' `PhiForCausalLM` built from the Phi-1.5 ``config.json`` with Show-o's
  vocabulary (58498 = 50295 text + 10 special + 8192 image codes + 1 mask), its weights read from the
  released ``pytorch_model.safetensors`` by the key map ``showo.<key>`` → ``<key>``.
- Prompt (``t2i_gen_prompt``): ``[<|t2i|>, <bos>, text ids, <eos>]`` left-padded with ``[PAD]`` to
  129 = 128 + 1 tokens (text beyond is cut and an ``<eos>`` put last), then ``<|soi|>``, the T image
  tokens (mask id where masked), ``<|eoi|>``; positions 0 … L − 1 over the whole row, pads included.
- Omni-attention (``create_attention_mask_predict_next(…, rm_pad_in_image=True)``): text rows causal and
  blind to the left padding, image rows (``<|soi|>`` … ``<|eoi|>``) see every non-pad token
  (`omni_attention_mask`).
- Negative context c⁻ (CFG's unconditional row and GCPO's contrast): the same format around ``""``
  (`PromptRecord.negative` where given).
- Guidance (1 + s)·ℓ_c − s·ℓ_u on the image-code logits (the lm_head rows of the 8192 codes, the
  mask row left out); s = 0 is the conditional model. Default s = 5 with 50 steps (the t2i command of
  the Show-o README and the GenEval evaluations of Mask-GRPO and UniRL).
- Schedule: after step s, ⌊T·cos(π/2·(s+1)/S)⌋ tokens stay masked (at least 1, at most one fewer than
  before; the last step reveals the rest) — `maskgen.reveal_counts`. Confidence log p(token) + τ_s·g
  with Gumbel noise g and τ_s = τ₀·Π_{k≤s}(1 − (k+1)/S), τ₀ = 1: the reference multiplies its running
  temperature by (1 − r) at every step, so the annealing compounds (`choice_temperatures`).

The sampler, the two log-prob estimators and branched continuations are the shared masked machinery
(policies/maskgen.py); what this file adds is the sequence, the mask, the head and the checkpoint.
Details and the folder layout: docs/real_checkpoints.md#show-o.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
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
from t2i_gcpo.policies.lora import add_lora_option, merged_state_dict
from t2i_gcpo.policies.maskgen import (
    GUIDANCE_SCHEDULES,
    MaskedPolicyMembers,
    check_reveal_order,
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
from t2i_gcpo.tokenizers.magvitv2 import MagvitV2

CLASS_NAME = "Showo"
WEIGHT_FILES = ("pytorch_model.safetensors", "model.safetensors")  # the released name, an early upload's
KEY_PREFIX = "showo."  # the released state dict: Showo.showo is the PhiForCausalLM
VQ_FOLDER = "magvitv2"  # showlab/magvitv2, the VQ every Show-o config names (model.vq_model)
# the tokens UniversalPrompting adds to the Phi tokenizer, in its order: [PAD] first (add_special_tokens),
# then these (add_tokens) — ids llm_vocab_size, llm_vocab_size + 1, …
PAD_TOKEN = "[PAD]"
SPECIAL_TOKENS = (
    "<|soi|>",
    "<|eoi|>",
    "<|sov|>",
    "<|eov|>",
    "<|t2i|>",
    "<|mmu|>",
    "<|t2v|>",
    "<|v2v|>",
    "<|lvg|>",
)
NEW_TOKENS = 1 + len(SPECIAL_TOKENS)  # num_new_special_tokens: 10
MAX_TEXT_TOKENS = 128  # dataset.preprocessing.max_seq_length of configs/showo_demo*.yaml
# the reveal order a checkpoint was trained under, beside the released files (Show-o's own code ignores it)
SAMPLING_FILE = "t2i_gcpo_sampling.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "dense")  # Phi's attention projections
# config.json keys of the released checkpoints (showlab/show-o, show-o-512x512, …) and their types
CONFIG_KEYS: dict[str, type | tuple[type, ...]] = {
    "_class_name": str,
    "_diffusers_version": str,
    "_name_or_path": str,
    "codebook_size": int,
    "llm_model_path": str,
    "llm_vocab_size": int,
    "load_from_showo": bool,
    "mask_token_id": int,
    "num_vq_tokens": int,
    "vocab_size": int,
    "w_clip_vit": bool,
}
REQUIRED_KEYS = ("codebook_size", "llm_model_path", "llm_vocab_size", "num_vq_tokens", "vocab_size")


# ---------------------------------------------------------------------------- the omni-attention mask


def omni_attention_mask(ids: torch.Tensor, pad_id: int, soi_id: int, eoi_id: int) -> torch.Tensor:
    """Show-o's attention mask for rows `ids` [N, L] → bool [N, 1, L, L] (True: query attends to key).

    Image rows (from ``<|soi|>`` through ``<|eoi|>``) attend to every key that is not a pad; text rows
    attend causally, and text rows after the last pad not to any key at or before it (the reference's
    ``create_attention_mask_predict_next`` with ``rm_pad_in_image=True``, vectorised)."""
    length = ids.shape[1]
    pad = ids == pad_id
    soi, eoi = ids == soi_id, ids == eoi_id
    image = (soi.cumsum(1) > eoi.cumsum(1)) | soi | eoi  # [N, L]
    pos = torch.arange(length, device=ids.device)
    last_pad = torch.where(pad, pos, -1).amax(1)  # [N]; −1 without padding
    q, k = pos[None, :, None], pos[None, None, :]
    after = (q > last_pad[:, None, None]) & (k <= last_pad[:, None, None])
    text_rows = (k <= q) & ~after  # [N, L, L]
    image_rows = ~pad[:, None, :]  # [N, 1, L]
    return torch.where(image[:, :, None], image_rows, text_rows)[:, None]


# ---------------------------------------------------------------------------- the checkpoint folder


def read_showo_config(path: Path) -> dict:
    """The released config.json, checked: its keys and types, and the vocabulary's arithmetic."""
    from t2i_gcpo.outdir import read_json

    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise UserError(
            f"'{path}' is not a Show-o checkpoint: no config.json (expected showlab/show-o's files)"
        )
    raw = read_json(cfg_file, dict, follow=True)
    if raw.get("_class_name") != CLASS_NAME:
        raise UserError(f"{cfg_file}: _class_name is {raw.get('_class_name')!r}, expected {CLASS_NAME!r}")
    for key, value in raw.items():
        if key not in CONFIG_KEYS:
            raise UserError(
                f"{cfg_file}: unknown config key '{key}' (not a Show-o setting this loader knows)"
            )
        tp = CONFIG_KEYS[key]
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise UserError(f"{cfg_file}: config key '{key}' must be {tp.__name__}, got {value!r}")
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if missing:
        raise UserError(f"{cfg_file}: missing config key(s) {', '.join(missing)}")
    if raw.get("w_clip_vit"):
        raise UserError(
            f"{cfg_file}: w_clip_vit is true (a Show-o with a CLIP-ViT understanding branch); use a "
            f"checkpoint without it (showlab/show-o, showlab/show-o-512x512)"
        )
    k, llm, vocab = raw["codebook_size"], raw["llm_vocab_size"], raw["vocab_size"]
    if min(k, llm, raw["num_vq_tokens"]) < 1 or vocab != llm + NEW_TOKENS + k + 1:
        raise UserError(
            f"{cfg_file}: vocab_size {vocab} must be llm_vocab_size + {NEW_TOKENS} special tokens + "
            f"codebook_size + 1 mask = {llm + NEW_TOKENS + k + 1}"
        )
    if raw.get("mask_token_id", vocab - 1) != vocab - 1:
        raise UserError(
            f"{cfg_file}: mask_token_id must be vocab_size − 1 = {vocab - 1}, got {raw['mask_token_id']}"
        )
    side = math.isqrt(raw["num_vq_tokens"])
    if side * side != raw["num_vq_tokens"]:
        raise UserError(f"{cfg_file}: num_vq_tokens {raw['num_vq_tokens']} is not a square grid")
    return raw


def llm_folder(path: Path, cfg: dict) -> Path:
    """Where the Phi config and tokenizer are: ``DIR/<last part of llm_model_path>`` (``phi-1_5``)."""
    name = Path(cfg["llm_model_path"].rstrip("/")).name
    if not name or name in (".", ".."):
        raise UserError(f"{path / 'config.json'}: llm_model_path {cfg['llm_model_path']!r} names no folder")
    return path / name


def read_phi_config(folder: Path, vocab_size: int) -> tuple[Any, dict]:
    """(PhiConfig with Show-o's vocabulary, the folder's config.json as read)."""
    from transformers import PhiConfig

    from t2i_gcpo.outdir import read_json

    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise UserError(
            f"'{folder}' has no config.json: Show-o needs microsoft/phi-1_5's config and tokenizer there "
            f"(hf download microsoft/phi-1_5 --exclude '*.safetensors' --exclude '*.bin' "
            f"--local-dir {folder})"
        )
    raw = read_json(cfg_file, dict, follow=True)
    if raw.get("model_type") != "phi":
        raise UserError(
            f"{cfg_file}: model_type {raw.get('model_type')!r}, expected 'phi' (transformers' Phi; the "
            f"remote-code 'phi-msft' revisions of phi-1_5 are not read)"
        )
    try:
        config = PhiConfig.from_dict({k: v for k, v in raw.items() if k != "auto_map"})
    except (TypeError, ValueError) as e:
        raise UserError(f"{cfg_file}: not a Phi config ({' '.join(str(e).split())[:200]})") from None
    config.vocab_size = vocab_size  # Showo.__init__: resize_token_embeddings(vocab_size)
    config.tie_word_embeddings = False
    config.use_cache = False
    config._attn_implementation = "sdpa"  # a boolean 4-D mask goes to scaled_dot_product_attention as is
    return config, raw


def load_phi_weights(model: nn.Module, path: Path) -> None:
    """Copy the released ``showo.*`` tensors into `model` one at a time (peak memory: the model and one
    tensor): every key present, none unknown, each of the model's shape."""
    from safetensors import SafetensorError, safe_open

    own = model.state_dict(keep_vars=True)
    seen = set()
    try:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if not name.startswith(KEY_PREFIX) or name[len(KEY_PREFIX) :] not in own:
                    raise UserError(f"{path}: unexpected tensor {name} (not a Show-o Phi weight)")
                key = name[len(KEY_PREFIX) :]
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != tuple(own[key].shape):
                    raise UserError(
                        f"{path}: tensor {name} has shape {tuple(tensor.shape)}, the model built from "
                        f"the Phi config expects {tuple(own[key].shape)} (a Phi config of another width?)"
                    )
                with torch.no_grad():
                    own[key].copy_(tensor)
                seen.add(key)
    except (SafetensorError, OSError, RuntimeError) as e:
        raise UserError(f"{path}: cannot read the weights: {' '.join(str(e).split())[:200]}") from None
    missing = sorted(set(own) - seen)
    if missing:
        raise UserError(f"{path}: missing {len(missing)} tensor(s), e.g. {KEY_PREFIX}{missing[0]}")


def enable_checkpointing(model: nn.Module) -> None:
    """Activation checkpointing of every decoder layer (transformers ≥ 5.x names it
    ``activation_checkpointing_enable``; ``gradient_checkpointing_enable`` before)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def no_init() -> Any:
    """transformers' context that skips random initialisation (every weight is then read from the file)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # another transformers layout: initialise, then overwrite
        return contextlib.nullcontext()
    return no_init_weights()


# ---------------------------------------------------------------------------- the policy


class ShowoPolicy(MaskedPolicyMembers, nn.Module):
    """Policy protocol (t2i_gcpo.policies.base) for a local Show-o checkpoint (text-to-image)."""

    decode_session = None  # the reveal loop keeps no decode loop between rollouts (Policy.decode_session)
    output = "image"
    capabilities = PolicyCapabilities(
        bf16_sampling=False, branching=True, reveal_order=True, step_predictions=True
    )
    default_task = "geneval"
    guidance = "(1 + s)c − s·u"  # Showo.t2i_generate: (1 + guidance_scale)·cond − guidance_scale·uncond
    DEFAULT_GUIDANCE_SCALE = 5.0  # Show-o README (t2i, 512×512), Mask-GRPO's and UniRL's GenEval runs
    DEFAULT_STEPS = 50  # generation_timesteps of the same commands
    CHOICE_TEMPERATURE = 1.0  # τ₀: training.generation_temperature, default 1.0

    def __init__(
        self,
        phi: nn.Module,
        vq: MagvitV2,
        tokenizer: Any,
        showo_config: dict,
        phi_config: dict,
        estimator: str = "trajectory",
        remask_count: int = 2,
        max_rollout_batch: int | None = None,
        decode_batch: int = 8,
    ) -> None:
        super().__init__()
        self.phi = phi  # PhiForCausalLM
        self.vq = vq.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.showo_config, self.phi_config = dict(showo_config), dict(phi_config)
        self.codebook_size = int(showo_config["codebook_size"])  # K
        self.num_tokens = int(showo_config["num_vq_tokens"])  # T
        side = math.isqrt(self.num_tokens)
        self.grid_shape: tuple[int, int] = (side, side)
        self.layout = TokenLayout.image(side, side)
        llm = int(showo_config["llm_vocab_size"])
        self.image_offset = llm + NEW_TOKENS  # token id of image code 0
        self.mask_token_id = int(showo_config["vocab_size"]) - 1  # = image_offset + K
        self.mask_id = self.codebook_size  # a masked position on the canvas (code ids 0 … K − 1)
        self.pad_id, self.soi_id, self.eoi_id, self.t2i_id = (
            self._token_id(t, llm + i)
            for t, i in ((PAD_TOKEN, 0), ("<|soi|>", 1), ("<|eoi|>", 2), ("<|t2i|>", 5))
        )
        self.bos_id, self.eos_id = tokenizer.bos_token_id, tokenizer.eos_token_id
        if self.bos_id is None or self.eos_id is None:
            raise UserError("the Phi tokenizer defines no BOS or EOS token (<|endoftext|> for phi-1_5)")
        self.prompt_len = MAX_TEXT_TOKENS + 1  # the task token, then up to 128 text tokens with BOS and EOS
        self.seq_len = self.prompt_len + self.num_tokens + 2  # L: + <|soi|> … <|eoi|>
        if int(getattr(phi.config, "max_position_embeddings", self.seq_len)) < self.seq_len:
            raise UserError(
                f"the Phi config's max_position_embeddings is below Show-o's sequence of {self.seq_len}"
            )
        self.feature_dim = int(phi.config.hidden_size)  # D
        self.image_size = side * vq.config.factor
        self.set_estimator(estimator, remask_count)
        self.max_rollout_batch = max_rollout_batch  # rows per sampling pass (None: all)
        self.decode_batch = decode_batch
        # the order when SamplingParams names none: the reference's, or the one a checkpoint was trained under
        self.reveal_order = "confidence"
        self.lora_adapter: str | None = None

    def _token_id(self, token: str, expected: int) -> int:
        got = self.tokenizer.convert_tokens_to_ids(token)
        if got != expected:
            raise UserError(
                f"the Phi tokenizer puts {token} at id {got}, Show-o's config expects {expected} "
                f"(llm_vocab_size {self.image_offset - NEW_TOKENS} + its place among the added tokens): a "
                f"tokenizer other than microsoft/phi-1_5's?"
            )
        return got

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        lora: dict | None = None,
        estimator: str = "trajectory",
        remask_count: int = 2,
        max_rollout_batch: int | None = None,
    ) -> ShowoPolicy:
        """A LOCAL Show-o folder (never the Hub): the released ``config.json`` and weights, ``magvitv2/``
        (showlab/magvitv2) and ``phi-1_5/`` (microsoft/phi-1_5's config.json and tokenizer files).

        lora: ``{"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": [...]}`` — peft LoRA on the Phi
        attention projections, the rest of the backbone frozen; without it every Phi weight trains. The
        VQ is always frozen."""
        path = Path(path).expanduser()
        if not path.is_dir():
            raise UserError(f"Show-o checkpoint '{path}' is not a directory")
        if dtype not in DTYPES:
            raise UserError(f"unknown dtype '{dtype}' for Show-o: use one of {', '.join(DTYPES)}")
        cfg = read_showo_config(path)
        weights = next((path / f for f in WEIGHT_FILES if (path / f).is_file()), None)
        if weights is None:
            raise UserError(f"'{path}' has no Show-o weights: expected {' or '.join(WEIGHT_FILES)}")
        if not (path / VQ_FOLDER).is_dir():
            raise UserError(
                f"'{path}' has no {VQ_FOLDER}/ folder: Show-o decodes with showlab/magvitv2 "
                f"(hf download showlab/magvitv2 --local-dir {path / VQ_FOLDER})"
            )
        llm = llm_folder(path, cfg)
        phi_config, phi_raw = read_phi_config(llm, int(cfg["vocab_size"]))
        from t2i_gcpo.weights import check_weight_files

        check_weight_files(path)  # the loading check of every family: readable, number dtypes, finite
        vq = MagvitV2.from_pretrained(path / VQ_FOLDER)
        if vq.codebook_size != int(cfg["codebook_size"]):
            raise UserError(
                f"{path / VQ_FOLDER}: a MAGVIT-v2 of {vq.codebook_size} codes, the Show-o config says "
                f"codebook_size {cfg['codebook_size']}"
            )
        tokenizer = load_tokenizer(llm)
        from transformers import PhiForCausalLM

        with no_init():
            phi = PhiForCausalLM(phi_config)
        load_phi_weights(phi, weights)
        phi = phi.to(DTYPES[dtype])
        policy = cls(phi, vq, tokenizer, cfg, phi_raw, estimator, remask_count, max_rollout_batch)
        if lora:
            policy._add_lora(lora)
        if gradient_checkpointing:
            enable_checkpointing(phi)
        if (path / SAMPLING_FILE).is_file():
            from t2i_gcpo.outdir import read_json

            order = read_json(path / SAMPLING_FILE, dict, follow=True).get("reveal_order")
            try:
                policy.keep_reveal_order(order)
            except (UserError, TypeError) as e:
                raise UserError(f"{path / SAMPLING_FILE}: cannot read the reveal order ({e})") from None
        return policy

    def _add_lora(self, lora: dict) -> None:
        # adapters in the backbone (the Phi model), every other parameter frozen (its lm_head too)
        self.lora_adapter = add_lora_option(self.phi.model, lora, DEFAULT_LORA_TARGETS, frozen=self.phi)

    # ------------------------------------------------------------------ prompts
    @property
    def device(self) -> torch.device:
        return self.phi.lm_head.weight.device

    def default_sampling(self) -> SamplingParams:
        return SamplingParams(
            guidance_scale=self.DEFAULT_GUIDANCE_SCALE,
            steps=self.DEFAULT_STEPS,
            reveal_order=self.reveal_order,
        )

    def check_prompts(self, prompts: list[str]) -> None:
        """Any text without Show-o's own tokens in it (they would change the sequence and its mask); text
        beyond 128 tokens is cut, as the reference does."""
        reserved = (PAD_TOKEN, *SPECIAL_TOKENS, self.tokenizer.eos_token, self.tokenizer.bos_token)
        for p in prompts:
            if not isinstance(p, str):
                raise UserError(f"Show-o prompts must be strings, got {p!r}")
            found = [t for t in reserved if t and t in p]
            if found:
                raise UserError(f"prompt {p[:60]!r} holds Show-o's reserved token {found[0]}")

    def prompt_ids(self, texts: Sequence[str]) -> torch.Tensor:
        """Texts → the 129-token text part of Show-o's t2i sequence [N, 129] (``t2i_gen_prompt``)."""
        self.check_prompts(list(texts))
        rows = []
        for text in texts:
            ids = list(self.tokenizer(text)["input_ids"])
            if not ids or ids[0] != self.bos_id:
                ids = [self.bos_id] + ids
            ids = [self.t2i_id] + ids + [self.eos_id]
            if len(ids) <= self.prompt_len:
                ids = [self.pad_id] * (self.prompt_len - len(ids)) + ids
            else:
                ids = ids[: self.prompt_len - 1] + [self.eos_id]
            rows.append(ids)
        return torch.tensor(rows, dtype=torch.long, device=self.device).view(len(rows), self.prompt_len)

    def sequence(self, prompt: torch.Tensor, canvas: torch.Tensor) -> torch.Tensor:
        """Text parts [N, 129] and canvases [N, T] (codes, K where masked) → token ids [N, L]."""
        n = canvas.shape[0]
        soi, eoi = canvas.new_full((n, 1), self.soi_id), canvas.new_full((n, 1), self.eoi_id)
        return torch.cat([prompt, soi, canvas + self.image_offset, eoi], dim=1)  # K + offset = the mask token

    def hidden(self, prompt: torch.Tensor, canvas: torch.Tensor) -> torch.Tensor:
        """Last hidden states [N, T, D] at the image positions (one forward through Phi)."""
        ids = self.sequence(prompt.to(self.device), canvas.to(self.device))
        mask = omni_attention_mask(ids, self.pad_id, self.soi_id, self.eoi_id)
        pos = torch.arange(ids.shape[1], device=ids.device)[None].expand_as(ids)
        out = self.phi.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        start = self.prompt_len + 1
        return out.last_hidden_state[:, start : start + self.num_tokens]

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden states [..., D] → image-code logits [..., K] in float32 (lm_head's code rows)."""
        lm = self.phi.lm_head
        rows = slice(self.image_offset, self.image_offset + self.codebook_size)
        bias = None if lm.bias is None else lm.bias[rows].float()
        return F.linear(h.float(), lm.weight[rows].float(), bias)

    def _hidden_fn(self, pos_ids: torch.Tensor, neg_ids: torch.Tensor):
        """hidden_fn(canvas [N, T], rows [N], null [N]) for the maskgen routines: row r's text part is
        `pos_ids[r]`, or `neg_ids[r]` where null."""
        pos_ids, neg_ids = pos_ids.to(self.device), neg_ids.to(self.device)

        def hidden_fn(canvas: torch.Tensor, rows: torch.Tensor, null: torch.Tensor) -> torch.Tensor:
            prompt = torch.where(null[:, None], neg_ids[rows], pos_ids[rows])
            return self.hidden(prompt, canvas)

        return hidden_fn

    # ------------------------------------------------------------------ schedule and guidance
    def resolve_steps(self, sampling: SamplingParams) -> int:
        steps = int(sampling.steps if sampling.steps is not None else self.DEFAULT_STEPS)
        if steps < 1:
            raise UserError(f"steps must be ≥ 1, got {steps}")
        return steps

    def choice_temperatures(self, steps: int) -> torch.Tensor:
        """τ_s = τ₀·Π_{k=0}^{s} (1 − (k+1)/S) [S] (float64): the reference's running temperature."""
        out, tau = [], self.CHOICE_TEMPERATURE
        for s in range(steps):
            tau = tau * (1.0 - (s + 1) / steps)
            out.append(tau)
        return torch.tensor(out, dtype=torch.float64)

    def _scale_fn(self, sampling: SamplingParams):
        """s at progress p: ``constant`` s; ``linear`` s·p (from the conditional model at the first step to
        s at the last; in this formula no guidance is s = 0)."""
        s, schedule = float(sampling.guidance_scale), sampling.guidance_schedule
        if schedule not in GUIDANCE_SCHEDULES:
            raise UserError(
                f"unknown guidance schedule {schedule!r}; expected one of {', '.join(GUIDANCE_SCHEDULES)}"
            )
        if schedule == "constant":
            return lambda p: torch.full_like(p.float(), s)
        return lambda p: s * p.float()

    # ------------------------------------------------------------------ sampling
    def rollout(
        self,
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
        steps = self.resolve_steps(sampling)
        order = check_reveal_order(sampling.reveal_order or self.reveal_order)
        sampling = dataclasses.replace(sampling, steps=steps, reveal_order=order)
        pos_ids = self.prompt_ids([p.text for p in prompts]).repeat_interleave(group_size, dim=0)
        neg_ids = self.prompt_ids([p.negative or "" for p in prompts]).repeat_interleave(group_size, dim=0)
        uniforms = group_uniforms(generators, group_size, (steps, self.num_tokens, 2), self.device)
        counts = reveal_counts(self.num_tokens, steps, "cosine")
        scale_fn = self._scale_fn(sampling)
        scales, temps = scale_fn(step_progress(steps)), self.choice_temperatures(steps)
        b = len(pos_ids)
        predictions = step_predictions(sampling, b, steps, self.num_tokens, self.mask_id, self.device)
        parts, per = [], self.max_rollout_batch or max(b, 1)  # passes of at most max_rollout_batch rows
        for lo in range(0, b, per):
            rows = slice(lo, lo + per)
            with torch.no_grad():
                parts.append(
                    maskgit_generate(
                        self._hidden_fn(pos_ids[rows], neg_ids[rows]),
                        self.head,
                        self.num_tokens,
                        self.mask_id,
                        counts,
                        sampling,
                        uniforms[rows],
                        temps,
                        scales,
                        self.guidance,
                        self.device,
                        order,
                        None if predictions is None else predictions[rows],
                    )
                )
        tokens, step = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        logps = torch.cat([p[2] for p in parts], dim=1)
        state = {"prompt_ids": pos_ids, "negative_ids": neg_ids, "estimator": self.estimator}
        ro = sampled_rollout(tokens, step, logps, prompts, group_size, sampling, state, predictions)
        if self.estimator == "remask":
            record_remasks(
                ro,
                generators,
                self.remask_count,
                "cosine",
                self._hidden_fn(pos_ids, neg_ids),
                self.head,
                self.mask_id,
                self.codebook_size,
                self.feature_dim,
                self.guidance,
                scale_fn,
            )
        return ro

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
        uniforms = continuation_uniforms(generators, (steps, self.num_tokens, 2), self.device)
        hidden_fn = self._hidden_fn(rollout.state["prompt_ids"][root], rollout.state["negative_ids"][root])
        return maskgit_branch(
            rollout,
            root,
            point,
            uniforms,
            hidden_fn,
            self.head,
            self.mask_id,
            reveal_counts(self.num_tokens, steps, "cosine"),
            self.choice_temperatures(steps),
            self._scale_fn(sampling)(step_progress(steps)),
            self.guidance,
            sampling.reveal_order or self.reveal_order,
        )

    def keep_reveal_order(self, order: str) -> None:
        """Make `order` this model's default reveal order, saved with it (`SAMPLING_FILE`)."""
        self.reveal_order = check_reveal_order(order)

    # ------------------------------------------------------------------ log-probs

    def _logprobs(
        self, rollout: Rollout, context: Context, dists: bool
    ) -> tuple[torch.Tensor, ChunkedDists | None]:
        sampling = rollout.sampling
        scale_fn = self._scale_fn(sampling)
        state = rollout.state
        return masked_logprobs(
            self._hidden_fn(state["prompt_ids"], state["negative_ids"]),
            self.head,
            rollout,
            context,
            dists,
            mask_id=self.mask_id,
            vocab=self.codebook_size,
            dim=self.feature_dim,
            guidance=self.guidance,
            step_scales=scale_fn(step_progress(self.resolve_steps(sampling))),
            scale_fn=scale_fn,
            device=self.device,
            replay_rows=0,
        )

    # ------------------------------------------------------------------ images
    @torch.no_grad()
    def decode(self, rollout: Rollout) -> torch.Tensor:
        """Images [B, 3, H, W] in [0, 1] through MAGVIT-v2 (256 px for 16×16 tokens, 512 px for 32×32)."""
        tokens = rollout.tokens.to(self.device)
        parts = [
            self.vq.decode_code(tokens[s : s + self.decode_batch], self.grid_shape)
            for s in range(0, len(tokens), self.decode_batch)
        ]
        return ((torch.cat(parts).float() + 1) / 2).clamp(0, 1)

    def token_features(self, rollout: Rollout) -> torch.Tensor:
        """The ±1 LFQ code vectors of the sampled tokens [B, T, 13]."""
        return self.vq.code_embeddings(rollout.tokens.to(self.device)).float()

    # ------------------------------------------------------------------ saving
    def keep_full_precision(self) -> None:
        """Nothing to do: the weights are saved in their own dtype."""

    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """The Phi state dict with any LoRA deltas folded into the base weights (no mutation)."""
        return merged_state_dict(self.phi, self.lora_adapter)

    def save_pretrained(self, path: str | Path) -> None:
        """The released layout (LoRA merged): ``config.json``, ``pytorch_model.safetensors`` (``showo.*``
        keys), ``magvitv2/``, ``phi-1_5/`` (Phi config and tokenizer), and `SAMPLING_FILE`."""
        from safetensors.torch import save_file

        from t2i_gcpo.outdir import write_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        write_file(path / "config.json", json.dumps(self.showo_config, indent=2) + "\n")
        state = {KEY_PREFIX + k: v.detach().contiguous().cpu() for k, v in self.merged_state_dict().items()}
        write_file(
            path / WEIGHT_FILES[0], b"", by_name=lambda tmp: save_file(state, tmp, metadata={"format": "pt"})
        )
        self.vq.save_pretrained(path / VQ_FOLDER)
        llm = llm_folder(path, self.showo_config)
        llm.mkdir(exist_ok=True)
        write_file(llm / "config.json", json.dumps(self.phi_config, indent=2) + "\n")
        self.tokenizer.save_pretrained(str(llm))
        write_file(path / SAMPLING_FILE, json.dumps({"reveal_order": self.reveal_order}, indent=2) + "\n")


def load_tokenizer(folder: Path) -> Any:
    """The Phi tokenizer of `folder` with Show-o's tokens added as UniversalPrompting adds them (its own
    code never runs: ``trust_remote_code=False``)."""
    from transformers import AutoTokenizer

    from t2i_gcpo.weights import custom_code_refusal

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 — transformers raises many kinds for a folder it cannot read
        raise custom_code_refusal(folder, e) or UserError(
            f"no Phi tokenizer in '{folder}' ({type(e).__name__}: {' '.join(str(e).split())[:160]})"
        ) from None
    tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    tokenizer.add_tokens(list(SPECIAL_TOKENS))
    return tokenizer
