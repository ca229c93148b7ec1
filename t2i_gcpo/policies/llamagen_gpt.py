"""LlamaGen's text-conditional GPT (Sun et al. 2024, arXiv 2406.06525), written here from the definition in
FoundationVision/LlamaGen ``autoregressive/models/gpt.py``, its state-dict keys as released.

A Llama-style decoder over one sequence per sample

    [c_1 … c_L (the caption: L = 120 projected T5 features, left-padded), y_1 … y_T (image tokens)]

with RMSNorm (ε 1e-5, normalised in float32), SwiGLU (w2(silu(w1 x) · w3 x)), one fused q|k|v projection
(``wqkv``), no biases, and a head over the VQ codebook (``output``). The caption embedder (``cls_embedding``)
is a two-layer MLP with tanh-GELU (``cap_proj.fc1``, ``fc2``) over the caption features; its learned
``uncond_embedding`` [L, C] (a buffer: saved, never trained) is the null caption of CFG.

Positions: 2D rotary embeddings over the image grid. Each head's dimensions are taken in pairs (x_2i, x_2i+1)
(gpt-fast's complex layout, not transformers' half split); the first hd/4 pairs turn by row·θ_i, the last hd/4
by column·θ_i, θ_i = base^(−4i/hd) (i < hd/4). The table has L + T rows: the L caption positions get cos = sin
= 0 (so their queries and keys are zero: every score against a caption key is 0, the reference's layout),
image token k sits at position L + k with grid cell k's angles. Position L − 1 (the last caption
slot) predicts token 0.

Attention mask: causal, with the caption's padding slots masked as keys for every query, and the diagonal kept
(a padding query sees itself, so no row is empty) — ``generate.py``'s ``emb_masks`` rule, also its training's.

`FusedGPT` presents this model to the fused decoder (policies/fused_llama.py) as the Llama it reads: the q and
k rows of ``wqkv`` permuted per head from the pair layout to the half split (q·k is unchanged by permuting
both alike), its rotary tables the 2D ones, so the static / graph-captured decode loop serves LlamaGen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from t2i_gcpo.errors import UserError


@dataclass(frozen=True)
class GPTSize:
    dim: int
    layers: int
    heads: int


# gpt.py's GPT_models (the name → n_layer, n_head, dim); only GPT-XL was released for text-to-image
GPT_SIZES: dict[str, GPTSize] = {
    "GPT-B": GPTSize(768, 12, 12),
    "GPT-L": GPTSize(1024, 24, 16),
    "GPT-XL": GPTSize(1280, 36, 20),
    "GPT-XXL": GPTSize(1536, 48, 24),
    "GPT-XXXL": GPTSize(2560, 48, 40),
    "GPT-1B": GPTSize(2048, 22, 32),
    "GPT-3B": GPTSize(3200, 24, 32),
    "GPT-7B": GPTSize(4096, 32, 32),
}


@dataclass(frozen=True)
class GPTConfig:
    """The architecture of one checkpoint (`config_from_state`: its shapes and `GPT_SIZES`)."""

    size: str  # the GPT_SIZES name
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int  # SwiGLU width (gpt.py: find_multiple(int(2·4·dim/3), 256))
    vocab: int  # K, the VQ codebook
    caption_len: int  # L: caption positions (cls_token_num, 120 released)
    caption_dim: int  # C: T5 feature width (flan-t5-xl: 2048)
    grid: int  # the image token grid's side (block_size = grid²)
    norm_eps: float = 1e-5
    rope_base: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def tokens(self) -> int:
        return self.grid * self.grid


# ---------------------------------------------------------------------------------------------- modules
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        f = x.float()
        return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class MLP(nn.Module):
    def __init__(self, inp: int, hidden: int, out: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(inp, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, out, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    def __init__(self, caption_dim: int, dim: int, caption_len: int) -> None:
        super().__init__()
        self.cap_proj = MLP(caption_dim, dim, dim)
        self.register_buffer("uncond_embedding", torch.zeros(caption_len, caption_dim))  # the null caption


class Attention(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.head_dim
        self.wqkv = nn.Linear(c.dim, (c.heads + 2 * c.kv_heads) * c.head_dim, bias=False)
        self.wo = nn.Linear(c.dim, c.dim, bias=False)

    def forward(self, x: Tensor, freqs: Tensor, mask: Tensor) -> Tensor:
        b, s, _ = x.shape
        kv = self.kv_heads * self.head_dim
        q, k, v = self.wqkv(x).split([self.heads * self.head_dim, kv, kv], dim=-1)
        q = rotate_pairs(q.view(b, s, self.heads, self.head_dim), freqs)
        k = rotate_pairs(k.view(b, s, self.kv_heads, self.head_dim), freqs)
        v = v.view(b, s, self.kv_heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.ffn, bias=False)
        self.w3 = nn.Linear(c.dim, c.ffn, bias=False)
        self.w2 = nn.Linear(c.ffn, c.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.attention = Attention(c)
        self.feed_forward = FeedForward(c)
        self.attention_norm = RMSNorm(c.dim, c.norm_eps)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps)

    def forward(self, x: Tensor, freqs: Tensor, mask: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x), freqs, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class LlamaGenGPT(nn.Module):
    """The released GPT's modules and names; `forward` is the teacher-forced pass (dropouts of the reference's
    training are left out: RL samples and scores in eval mode, where they are identities)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.cls_embedding = CaptionEmbedder(config.caption_dim, config.dim, config.caption_len)
        # no initialisation: the weights are loaded (and Embedding's init on the meta device
        # costs seconds of imports)
        self.tok_embeddings = nn.Embedding(
            config.vocab, config.dim, _weight=torch.empty(config.vocab, config.dim)
        )
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab, bias=False)
        self.gradient_checkpointing = False
        self._freqs: dict[torch.device, Tensor] = {}

    def freqs(self, device: torch.device) -> Tensor:
        """The 2D rotary table [L + T, hd/2, 2] (cos, sin) on `device`, float32."""
        if device not in self._freqs:
            c = self.config
            self._freqs[device] = rope_2d(c.grid, c.head_dim, c.rope_base, c.caption_len).to(device)
        return self._freqs[device]

    def caption_embeds(self, features: Tensor) -> Tensor:
        """Caption features [N, L, C] (zeros at padding) → the caption's input embeddings [N, L, D]."""
        return self.cls_embedding.cap_proj(features.to(self.tok_embeddings.weight.dtype))

    def null_embeds(self, rows: int) -> Tensor:
        """The null caption's input embeddings [rows, L, D] (CFG's unconditional branch)."""
        null = self.cls_embedding.uncond_embedding
        return self.caption_embeds(null.expand(rows, *null.shape))

    def forward(self, x: Tensor, key_mask: Tensor) -> Tensor:
        """Input embeddings [N, S, D] from position 0, `key_mask` [N, S] bool (False: a caption padding slot)
        → final-norm hidden states [N, S, D]."""
        s = x.shape[1]
        freqs = self.freqs(x.device)[:s]
        mask = attention_mask(key_mask)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, freqs, mask, use_reentrant=False)
            else:
                x = layer(x, freqs, mask)
        return self.norm(x)


def attention_mask(key_mask: Tensor) -> Tensor:
    """[N, S] bool (False: a masked key) → [N, 1, S, S]: causal, masked keys hidden, the diagonal kept."""
    s = key_mask.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=key_mask.device).tril()
    eye = torch.eye(s, dtype=torch.bool, device=key_mask.device)
    return (causal & key_mask[:, None, None, :]) | eye


def rope_2d(grid: int, head_dim: int, base: float, caption_len: int) -> Tensor:
    """[caption_len + grid², head_dim/2, 2]: (cos, sin) of each pair's angle (module docstring)."""
    quarter = head_dim // 4
    theta = 1.0 / (base ** (torch.arange(0, 2 * quarter, 2)[:quarter].float() / (head_dim // 2)))  # [hd/4]
    t = torch.outer(torch.arange(grid).float(), theta)  # [grid, hd/4]
    angles = torch.cat([t[:, None, :].expand(-1, grid, -1), t[None, :, :].expand(grid, -1, -1)], dim=-1)
    table = torch.stack([angles.cos(), angles.sin()], dim=-1).flatten(0, 1)  # [grid², hd/2, 2]
    return torch.cat([torch.zeros(caption_len, head_dim // 2, 2), table])


def rotate_pairs(x: Tensor, freqs: Tensor) -> Tensor:
    """x [N, S, H, hd] rotated pair by pair by `freqs` [S, hd/2, 2], in float32, back in x's dtype."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    f = freqs.view(1, pairs.shape[1], 1, pairs.shape[3], 2)
    cos, sin = f[..., 0], f[..., 1]
    out = torch.stack(
        [pairs[..., 0] * cos - pairs[..., 1] * sin, pairs[..., 1] * cos + pairs[..., 0] * sin], -1
    )
    return out.flatten(3).type_as(x)


# ---------------------------------------------------------------------------------------------- loading
LAYER_KEY = re.compile(r"^layers\.(\d+)\.")
C2I_KEY = "cls_embedding.embedding_table.weight"  # the class-conditional models' label table


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


def config_from_state(state: dict[str, Tensor], grid: int, size: str | None, what: str) -> GPTConfig:
    """The `GPTConfig` of a state dict in the released layout: widths from its shapes, heads from `GPT_SIZES`
    (the size whose dim and layers the shapes have, or `size` when named, checked against them). UserError for
    a class-conditional checkpoint, missing tensors, or shapes no size has."""
    if C2I_KEY in state:
        raise UserError(
            f"{what} is a class-conditional (C2I) LlamaGen checkpoint (it has {C2I_KEY}, a "
            f"class-label table, where a text-to-image one has the caption projection): use a "
            f"t2i_*.pt checkpoint"
        )
    need = [
        "tok_embeddings.weight",
        "cls_embedding.cap_proj.fc1.weight",
        "cls_embedding.uncond_embedding",
        "layers.0.attention.wqkv.weight",
        "layers.0.feed_forward.w1.weight",
        "norm.weight",
        "output.weight",
    ]
    missing = [k for k in need if k not in state]
    if missing:
        raise UserError(
            f"{what} is not a LlamaGen text-to-image GPT checkpoint: no {missing[0]} "
            f"({len(missing)} of the released tensors missing)"
        )
    vocab, dim = state["tok_embeddings.weight"].shape
    layers = 1 + max(int(m.group(1)) for k in state if (m := LAYER_KEY.match(k)))
    caption_len, caption_dim = state["cls_embedding.uncond_embedding"].shape
    if size is not None:
        if size not in GPT_SIZES:
            raise UserError(f"model_options.gpt_size={size!r}: choose from {', '.join(GPT_SIZES)}")
        named = GPT_SIZES[size]
        if (named.dim, named.layers) != (dim, layers):
            raise UserError(
                f"{what} has dim {dim} and {layers} layers, but {size} has dim {named.dim} and {named.layers}"
            )
    else:
        found = [n for n, s in GPT_SIZES.items() if (s.dim, s.layers) == (dim, layers)]
        if not found:
            near = [f"{n} (dim {s.dim}, {s.layers} layers)" for n, s in GPT_SIZES.items() if s.dim == dim]
            known = near or [f"{n} {s.dim}/{s.layers}" for n, s in GPT_SIZES.items()]
            raise UserError(
                f"{what} has dim {dim} and {layers} layers, which match no LlamaGen size: "
                f"{', '.join(known)}" + ("" if near else " (dim/layers)")
            )
        size = found[0]
    heads = GPT_SIZES[size].heads
    head_dim = dim // heads
    qkv_rows = state["layers.0.attention.wqkv.weight"].shape[0]
    kv_heads = (qkv_rows // head_dim - heads) // 2
    if dim % heads or head_dim % 4 or kv_heads < 1 or (heads + 2 * kv_heads) * head_dim != qkv_rows:
        raise UserError(
            f"{what}: wqkv has {qkv_rows} rows, which {size} ({heads} heads of {head_dim}) cannot split"
        )
    config = GPTConfig(
        size=size,
        dim=dim,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        ffn=state["layers.0.feed_forward.w1.weight"].shape[0],
        vocab=vocab,
        caption_len=caption_len,
        caption_dim=caption_dim,
        grid=grid,
    )
    check_shapes(state, config, what)
    return config


def check_shapes(state: dict[str, Tensor], config: GPTConfig, what: str) -> None:
    """Every tensor the model needs is in `state` with its shape (keys the model does not hold — a KV cache
    saved by the reference's sampler, an optimizer's — are ignored, as the reference's
    non-strict load does)."""
    with torch.device("meta"):
        own = LlamaGenGPT(config)
    for name, t in own.state_dict().items():
        if name not in state:
            raise UserError(f"{what} is not a {config.size} text-to-image checkpoint: no {name}")
        if tuple(state[name].shape) != tuple(t.shape):
            raise UserError(
                f"{what}: {name} has shape {tuple(state[name].shape)}, {config.size} needs {tuple(t.shape)}"
            )


def build_gpt(state: dict[str, Tensor], config: GPTConfig, dtype: torch.dtype) -> LlamaGenGPT:
    """The model with `state`'s tensors in `dtype` (the released files mix fp32 and bf16 tensors)."""
    with torch.device("meta"):
        gpt = LlamaGenGPT(config)
    own = gpt.state_dict()
    gpt.load_state_dict({k: state[k].to(dtype) for k in own}, assign=True)
    gpt._freqs = {}
    return gpt.eval()


# ---------------------------------------------------------------------------------------------- fused decoder
class _Rows:
    """One of q, k, v of a block's fused ``wqkv`` for the fused decoder: `weight` is rows `index` of its
    effective weight (LoRA deltas merged), recomputed at each read (the decoder copies it)."""

    def __init__(self, attention: Attention, index: Tensor) -> None:
        self.attention, self.index = attention, index

    @property
    def weight(self) -> Tensor:
        from t2i_gcpo.policies.fused_llama import effective_weight

        w = effective_weight(self.attention.wqkv)  # read now: peft replaces the module when it adds LoRA
        return w.index_select(0, self.index.to(w.device))


class _Attention:
    def __init__(self, block: TransformerBlock, config: GPTConfig) -> None:
        hd, q_rows, kv_rows = (
            config.head_dim,
            config.heads * config.head_dim,
            config.kv_heads * config.head_dim,
        )
        half = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])  # pair layout → half split

        def heads(start: int, n: int) -> Tensor:
            return (start + torch.arange(n)[:, None] * hd + half[None]).flatten()

        self.block = block
        self.q_proj = _Rows(block.attention, heads(0, config.heads))
        self.k_proj = _Rows(block.attention, heads(q_rows, config.kv_heads))
        self.v_proj = _Rows(block.attention, q_rows + kv_rows + torch.arange(kv_rows))

    @property
    def o_proj(self) -> nn.Module:
        return self.block.attention.wo


class _MLP:
    def __init__(self, block: TransformerBlock) -> None:
        self.block = block

    gate_proj = property(lambda self: self.block.feed_forward.w1)
    up_proj = property(lambda self: self.block.feed_forward.w3)
    down_proj = property(lambda self: self.block.feed_forward.w2)


class _Layer:
    """A block as a transformers ``LlamaDecoderLayer`` is read; every module looked up at each read."""

    def __init__(self, block: TransformerBlock, config: GPTConfig) -> None:
        self.block, self.self_attn, self.mlp = block, _Attention(block, config), _MLP(block)

    input_layernorm = property(lambda self: self.block.attention_norm)
    post_attention_layernorm = property(lambda self: self.block.ffn_norm)


class FusedGPT:
    """A `LlamaGenGPT` as the transformers ``LlamaModel`` `FusedLlamaDecoder` reads (config, embed_tokens,
    layers with q/k/v/o and gate/up/down projections, norm, rotary_emb, parameters, modules): q and k rows in
    the half split, the rotary tables the 2D ones (module docstring). Not a module: it holds the GPT's own
    modules, which stay the policy's."""

    def __init__(self, gpt: LlamaGenGPT) -> None:
        c = gpt.config
        self.gpt = gpt
        self.config = SimpleNamespace(
            model_type="llama",  # a Llama decoder, whose rotary tables `rotary_emb` gives
            num_attention_heads=c.heads,
            num_key_value_heads=c.kv_heads,
            head_dim=c.head_dim,
            hidden_size=c.dim,
            rms_norm_eps=c.norm_eps,
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
        )
        self.embed_tokens, self.norm = gpt.tok_embeddings, gpt.norm
        self.layers = [_Layer(block, c) for block in gpt.layers]

    def parameters(self):
        return self.gpt.parameters()

    def modules(self):
        return self.gpt.modules()

    def rotary_emb(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(cos, sin) [1, n, hd] in the half-split layout at `positions` [1, n] (0 past
        the table), float32."""
        c = self.gpt.config
        table = self.gpt.freqs(positions.device)
        n = int(positions.max()) + 1
        padded = torch.cat([table, table.new_zeros(max(0, n - len(table)), *table.shape[1:])])[positions[0]]
        cos, sin = padded[..., 0], padded[..., 1]  # [n, hd/2]
        assert cos.shape[-1] * 2 == c.head_dim
        return torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None]


def parameter_count(config: GPTConfig) -> int:
    """Weights of a GPT of `config` (the benchmarks' FLOP and roofline counts)."""
    c = config
    per_layer = (
        c.dim * (c.heads + 2 * c.kv_heads) * c.head_dim + c.dim * c.dim + 3 * c.dim * c.ffn + 2 * c.dim
    )
    return c.layers * per_layer + 2 * c.vocab * c.dim + c.dim + c.caption_dim * c.dim + c.dim * c.dim


def ffn_width(dim: int) -> int:
    """gpt.py's SwiGLU width for `dim`: find_multiple(int(2·4·dim/3), 256)."""
    return find_multiple(int(2 * 4 * dim / 3), 256)
