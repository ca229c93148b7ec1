"""Meissonic's transformer (Bai et al. 2024, arXiv 2410.08261; viiika/Meissonic ``src/transformer.py``),
written here on diffusers' building blocks, with the released checkpoint's module names, so that the released
``transformer/diffusion_pytorch_model.safetensors`` loads key for key (`load_transformer`) and a trained one
saves the same way (`save_transformer`). Nothing of the checkpoint folder's own ``transformer.py`` is read.

The forward, for token ids [N, H, W] (the VQ grid, `mask_id` where masked):

1. micro-conditioning: each of the 5 numbers → a 256-d sinusoidal embedding (cos first), concatenated
   (1280) after the pooled projected text embedding, through ``cond_embed`` (an MLP) → c [N, D];
2. ``time_text_embed`` (diffusers ``CombinedTimestepTextProjEmbeddings``): the timestep × 1000 as a 256-d
   sinusoidal embedding through an MLP, plus an MLP of c → the adaptive-norm embedding e [N, D];
3. the tokens: embedding → RMSNorm → 1×1 conv (``embed``); ``down_block`` (2×2 conv, stride 2, when
   ``downsample``) → [N, D, h, w] → a sequence through RMSNorm + linear (``project_to_hidden*``);
4. the text: the penultimate CLIP states through a linear (``context_embedder``) and RMSNorm;
5. ``num_layers`` two-stream blocks (text and image, each with its own adaLN-Zero and MLP, one joint
   attention over [text; image]) then ``num_single_layers`` one-stream blocks over [text; image] (adaLN-Zero,
   attention and MLP in parallel); attention has RMSNorm on q and k and 3-axis RoPE over ids (0, row, col) of
   the image grid h × w (0 for every text token), theta 10000, ``axes_dims_rope`` per axis;
6. the image part back to [N, D, h, w] (RMSNorm + linear, ``project_from_hidden*``), ``up_block`` (2×2
   transposed conv when ``upsample``), ``mlm_layer``: 1×1 conv → RMSNorm → 1×1 conv to K codebook logits.

`features` stops before the last 1×1 conv (``mlm_layer.conv2``), which the adapter applies as its float32
head. The timestep is the pipeline's: S − 1 − s at reveal step s of S (src/pipeline.py passes the scheduler's
timestep, which the transformer multiplies by 1000). Constants of the reference that its config does not
carry: RMSNorm eps 1e-6 with weights, no bias in the UViT parts, micro-conditioning 5 × 256, MLP ratio 4.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from t2i_gcpo.errors import UserError
from t2i_gcpo.outdir import read_json, write_file

CONFIG_CLASS = "Transformer2DModel"  # the released config's _class_name (src/transformer.py's class)
WEIGHTS = "diffusion_pytorch_model.safetensors"
WEIGHTS_FP16 = "diffusion_pytorch_model.fp16.safetensors"  # the release's half-precision copy
MICRO_COND_DIM = 256  # per micro-conditioning number (the reference: "same as … amused")
MICRO_CONDS = 5  # width, height, crop x, crop y, aesthetic score
EPS = 1e-6
ROPE_THETA = 10000.0
MLP_RATIO = 4.0


@dataclass
class MeissonicTransformerConfig:
    """``transformer/config.json`` of the release (MeissonFlow/Meissonic: the defaults are its values)."""

    attention_head_dim: int = 128
    axes_dims_rope: tuple[int, ...] = (16, 56, 56)
    codebook_size: int = 8192  # K
    downsample: bool = True  # the 2×2 feature compression before the blocks (64×64 tokens → 32×32)
    guidance_embeds: bool = False  # unused by the reference ("unused in our implementation"): must be false
    in_channels: int = 64  # unused by the reference
    joint_attention_dim: int = 1024  # the text encoder's hidden width
    num_attention_heads: int = 8
    num_layers: int = 14  # two-stream blocks
    num_single_layers: int = 28  # one-stream blocks
    patch_size: int = 1  # unused by the reference: must be 1
    pooled_projection_dim: int = 1024  # the text encoder's projection width
    upsample: bool = True
    vocab_size: int = 8256  # token embeddings: K codes, the mask id (8255) and unused rows
    sample_size: int | None = None  # tokens per side; not in the release: the pipeline then renders 1024 px

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    def check(self, where: str) -> None:
        """A configuration the reference builds and runs; else a UserError naming `where`."""
        problems = []
        if self.guidance_embeds:
            problems.append("guidance_embeds=true (the reference never passes a guidance value)")
        if self.patch_size != 1:
            problems.append(f"patch_size={self.patch_size} (the reference embeds single tokens: 1)")
        if self.downsample != self.upsample:
            problems.append("downsample and upsample differ (the logits would not match the token grid)")
        if sum(self.axes_dims_rope) != self.attention_head_dim or any(d % 2 for d in self.axes_dims_rope):
            problems.append(
                f"axes_dims_rope {list(self.axes_dims_rope)} must be even and sum to attention_head_dim "
                f"{self.attention_head_dim}"
            )
        if self.pooled_projection_dim != self.inner_dim:
            problems.append(
                f"pooled_projection_dim {self.pooled_projection_dim} ≠ num_attention_heads × "
                f"attention_head_dim {self.inner_dim} (the reference feeds cond_embed's output to the "
                f"pooled-text projection)"
            )
        if self.codebook_size >= self.vocab_size:
            problems.append(
                f"codebook_size {self.codebook_size} leaves no mask id below vocab_size {self.vocab_size}"
            )
        if self.sample_size is not None and (
            self.sample_size < 1 or (self.downsample and self.sample_size % 2)
        ):
            problems.append(f"sample_size {self.sample_size} must be ≥ 1 (even with downsample)")
        if problems:
            raise UserError(f"{where}: not a Meissonic transformer this adapter runs: {'; '.join(problems)}")


def read_config(path: Path) -> MeissonicTransformerConfig:
    """``transformer/config.json`` → the checked config: its ``_class_name`` the reference's, every other key
    one `MeissonicTransformerConfig` knows, of its type, in a configuration the reference runs."""
    from t2i_gcpo.weights import check_config_types

    file = path / "config.json"
    raw = read_json(file, dict[str, Any], follow=True)
    if raw.get("_class_name") != CONFIG_CLASS:
        raise UserError(f"{file}: _class_name {raw.get('_class_name')!r}, not Meissonic's {CONFIG_CLASS!r}")
    values = {k: v for k, v in raw.items() if not k.startswith("_")}
    if "sample_size" in values and values["sample_size"] is None:
        values.pop("sample_size")
    check_config_types(values, MeissonicTransformerConfig, file)
    if "axes_dims_rope" in values:
        values["axes_dims_rope"] = tuple(values["axes_dims_rope"])
    config = MeissonicTransformerConfig(**values)
    config.check(str(file))
    return config


# ---------------------------------------------------------------------------- attention


def rope(
    config: MeissonicTransformerConfig, text_len: int, rows: int, cols: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [L + rows·cols, head_dim] of the reference's FluxPosEmbed over ids (0, 0, 0) per text token
    and (0, r, c) per image token in raster order (src/pipeline.py `_prepare_latent_image_ids`)."""
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    image = torch.stack([torch.zeros_like(r), r, c], -1).reshape(-1, 3)
    ids = torch.cat([torch.zeros(text_len, 3, dtype=image.dtype), image]).double()  # [S, 3]
    parts = [
        get_1d_rotary_pos_embed(
            dim,
            ids[:, i],
            theta=ROPE_THETA,
            use_real=True,
            repeat_interleave_real=True,
            freqs_dtype=torch.float64,
        )
        for i, dim in enumerate(config.axes_dims_rope)
    ]
    cos = torch.cat([p[0] for p in parts], -1).to(device)
    sin = torch.cat([p[1] for p in parts], -1).to(device)
    return cos, sin


def attention(
    attn: nn.Module, x: torch.Tensor, context: torch.Tensor | None, pos: tuple[torch.Tensor, torch.Tensor]
) -> Any:
    """The reference's attention (diffusers' Flux processor of its day) on a diffusers ``Attention``: per-head
    RMSNorm on q and k, [context; x] joint when `context` is given, RoPE, SDPA; → x's output projected
    (and the context's), or for a one-stream block the attention output without projection."""
    from diffusers.models.embeddings import apply_rotary_emb

    b, heads = x.shape[0], attn.heads

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(b, -1, heads, t.shape[-1] // heads).transpose(1, 2)  # [B, heads, S, d]

    q, k, v = split(attn.to_q(x)), split(attn.to_k(x)), split(attn.to_v(x))
    q, k = attn.norm_q(q), attn.norm_k(k)
    if context is not None:
        cq, ck, cv = (
            split(attn.add_q_proj(context)),
            split(attn.add_k_proj(context)),
            split(attn.add_v_proj(context)),
        )
        cq, ck = attn.norm_added_q(cq), attn.norm_added_k(ck)
        q, k, v = torch.cat([cq, q], 2), torch.cat([ck, k], 2), torch.cat([cv, v], 2)
    q, k = apply_rotary_emb(q, pos), apply_rotary_emb(k, pos)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=False)
    out = out.transpose(1, 2).reshape(b, -1, heads * q.shape[-1]).to(q.dtype)
    if context is None:
        return out
    text, image = out[:, : context.shape[1]], out[:, context.shape[1] :]
    return attn.to_out[1](attn.to_out[0](image)), attn.to_add_out(text)


def _clip_half(t: torch.Tensor) -> torch.Tensor:
    return t.clip(-65504, 65504) if t.dtype == torch.float16 else t


class JointBlock(nn.Module):
    """A two-stream (MM-DiT) block: text and image each with adaLN-Zero and an MLP, attention over both."""

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        from diffusers.models.attention import FeedForward
        from diffusers.models.attention_processor import Attention
        from diffusers.models.normalization import AdaLayerNormZero

        self.norm1 = AdaLayerNormZero(dim)
        self.norm1_context = AdaLayerNormZero(dim)
        self.attn = Attention(
            query_dim=dim,
            cross_attention_dim=None,
            added_kv_proj_dim=dim,
            dim_head=head_dim,
            heads=heads,
            out_dim=dim,
            context_pre_only=False,
            bias=True,
            qk_norm="rms_norm",
            eps=EPS,
        )
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=EPS)
        self.ff = FeedForward(dim=dim, dim_out=dim, activation_fn="gelu-approximate")
        self.norm2_context = nn.LayerNorm(dim, elementwise_affine=False, eps=EPS)
        self.ff_context = FeedForward(dim=dim, dim_out=dim, activation_fn="gelu-approximate")

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        emb: torch.Tensor,
        pos: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        nx, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(x, emb=emb)
        nc, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(context, emb=emb)
        attn_x, attn_c = attention(self.attn, nx, nc, pos)
        x = x + gate_msa[:, None] * attn_x
        nx = self.norm2(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        x = x + gate_mlp[:, None] * self.ff(nx)
        context = context + c_gate_msa[:, None] * attn_c
        nc = self.norm2_context(context) * (1 + c_scale_mlp[:, None]) + c_shift_mlp[:, None]
        context = _clip_half(context + c_gate_mlp[:, None] * self.ff_context(nc))
        return context, x


class SingleBlock(nn.Module):
    """A one-stream block over [text; image]: adaLN-Zero, attention and an MLP in parallel, one projection."""

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        from diffusers.models.attention_processor import Attention
        from diffusers.models.normalization import AdaLayerNormZeroSingle

        hidden = int(dim * MLP_RATIO)
        self.norm = AdaLayerNormZeroSingle(dim)
        self.proj_mlp = nn.Linear(dim, hidden)
        self.act_mlp = nn.GELU(approximate="tanh")
        self.proj_out = nn.Linear(dim + hidden, dim)
        self.attn = Attention(
            query_dim=dim,
            cross_attention_dim=None,
            dim_head=head_dim,
            heads=heads,
            out_dim=dim,
            bias=True,
            qk_norm="rms_norm",
            eps=EPS,
            pre_only=True,
        )

    def forward(
        self, x: torch.Tensor, emb: torch.Tensor, pos: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        nx, gate = self.norm(x, emb=emb)
        mixed = torch.cat([attention(self.attn, nx, None, pos), self.act_mlp(self.proj_mlp(nx))], dim=2)
        return _clip_half(x + gate[:, None] * self.proj_out(mixed))


# ---------------------------------------------------------------------------- the UViT parts


class TokenEmbed(nn.Module):
    """Token ids [N, H, W] → [N, D, H, W]: embedding, RMSNorm, 1×1 conv (the reference's UVit2DConvEmbed)."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        from diffusers.models.normalization import RMSNorm

        self.embeddings = nn.Embedding(vocab, dim)
        self.layer_norm = RMSNorm(dim, EPS, True)
        self.conv = nn.Conv2d(dim, dim, kernel_size=1, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.conv(self.layer_norm(self.embeddings(ids)).permute(0, 3, 1, 2))


class CodebookHead(nn.Module):
    """[N, D, H, W] → codebook logits [N, K, H, W]: 1×1 conv, RMSNorm, 1×1 conv (the
    reference's ConvMlmLayer)."""

    def __init__(self, dim: int, codebook_size: int) -> None:
        super().__init__()
        from diffusers.models.normalization import RMSNorm

        self.conv1 = nn.Conv2d(dim, dim, kernel_size=1, bias=False)
        self.layer_norm = RMSNorm(dim, EPS, True)
        self.conv2 = nn.Conv2d(dim, codebook_size, kernel_size=1, bias=False)

    def features(self, h: torch.Tensor) -> torch.Tensor:
        """Everything but conv2: [N, D, H, W]."""
        return self.layer_norm(self.conv1(h).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.features(h))


class Resample(nn.Module):
    """The reference's Simple_UVitBlock: a 2×2 conv of stride 2 (``downsample``) or a 2×2 transposed conv
    (``upsample``), each after an RMSNorm over channels; the identity when neither."""

    def __init__(self, dim: int, downsample: bool = False, upsample: bool = False) -> None:
        super().__init__()
        from diffusers.models.resnet import Downsample2D, Upsample2D

        norm = dict(norm_type="rms_norm", eps=EPS, elementwise_affine=True, bias=False)
        self.downsample = (
            Downsample2D(dim, use_conv=True, padding=0, name="Conv2d_0", kernel_size=2, **norm)
            if downsample
            else None
        )
        self.upsample = (
            Upsample2D(
                dim, use_conv_transpose=True, kernel_size=2, padding=0, name="conv", interpolate=False, **norm
            )
            if upsample
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.downsample is not None:
            x = self.downsample(x)
        if self.upsample is not None:
            x = self.upsample(x)
        return x


class MeissonicTransformer(nn.Module):
    """Meissonic's masked-token transformer (module docstring); parameter names as released."""

    def __init__(self, config: MeissonicTransformerConfig) -> None:
        super().__init__()
        from diffusers.models.embeddings import CombinedTimestepTextProjEmbeddings, TimestepEmbedding
        from diffusers.models.normalization import RMSNorm

        config.check("the Meissonic transformer config")
        self.config = config
        dim, heads, head_dim = config.inner_dim, config.num_attention_heads, config.attention_head_dim
        self.time_text_embed = CombinedTimestepTextProjEmbeddings(
            embedding_dim=dim, pooled_projection_dim=config.pooled_projection_dim
        )
        self.context_embedder = nn.Linear(config.joint_attention_dim, dim)
        self.transformer_blocks = nn.ModuleList(
            JointBlock(dim, heads, head_dim) for _ in range(config.num_layers)
        )
        self.single_transformer_blocks = nn.ModuleList(
            SingleBlock(dim, heads, head_dim) for _ in range(config.num_single_layers)
        )
        self.embed = TokenEmbed(config.vocab_size, dim)
        self.mlm_layer = CodebookHead(dim, config.codebook_size)
        self.cond_embed = TimestepEmbedding(
            MICRO_CONDS * MICRO_COND_DIM + config.pooled_projection_dim, dim, sample_proj_bias=False
        )
        self.encoder_proj_layer_norm = RMSNorm(dim, EPS, True)
        self.project_to_hidden_norm = RMSNorm(dim, EPS, True)
        self.project_to_hidden = nn.Linear(dim, dim, bias=False)
        self.project_from_hidden_norm = RMSNorm(dim, EPS, True)
        self.project_from_hidden = nn.Linear(dim, dim, bias=False)
        self.down_block = Resample(dim, downsample=config.downsample)
        self.up_block = Resample(dim, upsample=config.upsample)
        self.gradient_checkpointing = False  # the blocks under activation checkpointing when grads are on

    @property
    def dtype(self) -> torch.dtype:
        return self.context_embedder.weight.dtype

    def features(
        self,
        ids: torch.Tensor,
        micro_conds: torch.Tensor,
        pooled_projections: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        timestep: torch.Tensor,
    ) -> torch.Tensor:
        """Token ids [N, H, W], micro-conditioning [N, 5], pooled projected text [N, P], penultimate text
        states [N, L, J], timesteps [N] (or [1]) → the codebook head's input [N, D, H, W]."""
        from diffusers.models.embeddings import get_timestep_embedding

        n = ids.shape[0]
        micro = get_timestep_embedding(
            micro_conds.flatten(), MICRO_COND_DIM, flip_sin_to_cos=True, downscale_freq_shift=0
        ).reshape(n, -1)
        cond = self.cond_embed(torch.cat([pooled_projections, micro], dim=1).to(self.dtype))
        cond = cond.to(encoder_hidden_states.dtype)
        x = self.down_block(self.embed(ids))  # [N, D, h, w]
        context = self.encoder_proj_layer_norm(self.context_embedder(encoder_hidden_states))
        _, d, rows, cols = x.shape
        x = self.project_to_hidden(
            self.project_to_hidden_norm(x.permute(0, 2, 3, 1).reshape(n, rows * cols, d))
        )
        emb = self.time_text_embed(timestep.to(x.dtype) * 1000, cond)  # the reference: timestep × 1000
        pos = rope(self.config, context.shape[1], rows, cols, x.device)
        run = self._checkpointed if self.gradient_checkpointing and torch.is_grad_enabled() else _call
        for block in self.transformer_blocks:
            context, x = run(block, x, context, emb, pos)
        x = torch.cat([context, x], dim=1)
        for block in self.single_transformer_blocks:
            x = run(block, x, emb, pos)
        x = self.project_from_hidden(self.project_from_hidden_norm(x[:, context.shape[1] :]))
        x = self.up_block(x.reshape(n, rows, cols, d).permute(0, 3, 1, 2))
        return self.mlm_layer.features(x)

    @staticmethod
    def _checkpointed(block: nn.Module, *args: Any) -> Any:
        return checkpoint(block, *args, use_reentrant=False)

    def forward(
        self,
        ids: torch.Tensor,
        micro_conds: torch.Tensor,
        pooled_projections: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        timestep: torch.Tensor,
    ) -> torch.Tensor:
        """Codebook logits [N, K, H, W] (the reference's output)."""
        h = self.features(ids, micro_conds, pooled_projections, encoder_hidden_states, timestep)
        return self.mlm_layer.conv2(h)


def _call(block: nn.Module, *args: Any) -> Any:
    return block(*args)


# ---------------------------------------------------------------------------- files


def load_transformer(path: Path, dtype: torch.dtype) -> MeissonicTransformer:
    """``transformer/`` (config.json + the safetensors weights; the fp16 copy when it is the only one) → the
    model in `dtype`, every released key matched (a missing or extra key is one UserError line)."""
    from safetensors.torch import load_file

    config = read_config(path)
    file = path / WEIGHTS if (path / WEIGHTS).is_file() else path / WEIGHTS_FP16
    if not file.is_file():
        raise UserError(f"{path}: no {WEIGHTS} (nor {WEIGHTS_FP16}): the transformer's weights are missing")
    state = load_file(str(file))
    with torch.device("meta"):
        model = MeissonicTransformer(config)
    want = set(model.state_dict())
    missing, extra = sorted(want - set(state)), sorted(set(state) - want)
    if missing or extra:
        said = [f"missing {_some(missing)}" if missing else "", f"unexpected {_some(extra)}" if extra else ""]
        raise UserError(f"{file}: not the weights of this config.json: {'; '.join(s for s in said if s)}")
    shapes = [k for k, v in model.state_dict().items() if tuple(state[k].shape) != tuple(v.shape)]
    if shapes:
        k = shapes[0]
        raise UserError(
            f"{file}: {k} has shape {tuple(state[k].shape)}, config.json gives "
            f"{tuple(model.state_dict()[k].shape)}"
            + (f" (and {len(shapes) - 1} more)" if len(shapes) > 1 else "")
        )
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, assign=True)
    return model


def _some(keys: list[str], n: int = 3) -> str:
    return ", ".join(keys[:n]) + (f" and {len(keys) - n} more" if len(keys) > n else "")


def save_transformer(
    model: MeissonicTransformer, path: Path, state: dict[str, torch.Tensor] | None = None
) -> None:
    """``path/config.json`` (the released keys, ``_class_name`` Transformer2DModel) and ``path/`` + `WEIGHTS`:
    what the reference's ``Transformer2DModel.from_pretrained(path)`` and `load_transformer` read."""
    from safetensors.torch import save_file

    from t2i_gcpo.policies.muse_common import diffusers_version

    path.mkdir(parents=True, exist_ok=True)
    values = dataclasses.asdict(model.config)
    values["axes_dims_rope"] = list(values["axes_dims_rope"])
    if values["sample_size"] is None:
        values.pop("sample_size")
    config = {"_class_name": CONFIG_CLASS, "_diffusers_version": diffusers_version(), **values}
    write_file(path / "config.json", json.dumps(config, indent=2))
    state = model.state_dict() if state is None else state
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(path / WEIGHTS))


def parameter_count(config: MeissonicTransformerConfig) -> int:
    """Parameters of a transformer of `config` (built on the meta device: no memory)."""
    with torch.device("meta"):
        return sum(math.prod(p.shape) for p in MeissonicTransformer(config).parameters())
