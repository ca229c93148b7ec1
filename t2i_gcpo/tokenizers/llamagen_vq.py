"""LlamaGen's VQ tokenizer (``vq_ds16_t2i.pt``), its decoding half: codes → images. Written here from the
definition in FoundationVision/LlamaGen ``tokenizer/tokenizer_image/vq_model.py``,
state-dict keys as released.

Decoding (``VQModel.decode_code``): each token's codebook entry, **l2-normalised** (the codebook is trained
with ``codebook_l2_norm``), laid out as code vectors [B, C, h, w] (C = 8 for VQ-16), then ``post_quant_conv``
(1×1, C → z) and the convolutional decoder: conv_in, a middle of ResNet / attention / ResNet blocks, then one
level per channel multiplier from the top (each num_res_blocks + 1 ResNet blocks, attention after each at the
top level, a ×2 nearest-neighbour upsample and a 3×3 conv between levels), GroupNorm(32, ε 1e-6), swish,
conv_out. The output is in [−1, 1] (the reference saves it with ``normalize=True, value_range=(-1,
1)``, i.e. clamped).

The encoder is not built (RL never encodes images): its tensors in the file are read, checked and left out.
The architecture is read from the decoder's shapes (levels, widths, blocks), so VQ-16 and VQ-8 both load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from t2i_gcpo.errors import UserError

GROUPS = 32  # vq_model.py's Normalize: GroupNorm(32 groups)


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(GROUPS, channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = _norm(cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = _norm(cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm = _norm(c)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        n = self.norm(x)
        q, k, v = (m(n).reshape(b, c, h * w) for m in (self.q, self.k, self.v))
        weights = torch.softmax(q.transpose(1, 2) @ k * c**-0.5, dim=2)  # [b, hw (query), hw (key)]
        return x + self.proj_out((v @ weights.transpose(1, 2)).reshape(b, c, h, w))


class Upsample(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


@dataclass(frozen=True)
class Level:
    """One decoder level, from the top: its width, ResNet blocks, whether they have attention, an upsample."""

    channels: int
    blocks: int
    attention: bool
    upsample: bool


@dataclass(frozen=True)
class VQConfig:
    codebook_size: int  # K
    code_dim: int  # C
    z_channels: int
    mid_channels: int
    levels: tuple[Level, ...]

    @property
    def downsample(self) -> int:
        """Pixels per token a side (16 for VQ-16): 2 per upsample."""
        return 2 ** sum(lv.upsample for lv in self.levels)


class Level_(nn.Module):  # noqa: N801 (the released name is `conv_blocks.N`; the class name is ours)
    def __init__(self, cin: int, level: Level) -> None:
        super().__init__()
        self.res = nn.ModuleList(
            ResnetBlock(cin if i == 0 else level.channels, level.channels) for i in range(level.blocks)
        )
        self.attn = nn.ModuleList(
            AttnBlock(level.channels) for _ in range(level.blocks if level.attention else 0)
        )
        if level.upsample:
            self.upsample = Upsample(level.channels)


class Decoder(nn.Module):
    def __init__(self, config: VQConfig) -> None:
        super().__init__()
        c = config.mid_channels
        self.conv_in = nn.Conv2d(config.z_channels, c, 3, padding=1)
        self.mid = nn.ModuleList([ResnetBlock(c, c), AttnBlock(c), ResnetBlock(c, c)])
        blocks, cin = [], c
        for level in config.levels:
            blocks.append(Level_(cin, level))
            cin = level.channels
        self.conv_blocks = nn.ModuleList(blocks)
        self.norm_out = _norm(cin)
        self.conv_out = nn.Conv2d(cin, 3, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for level in self.conv_blocks:
            for i, res in enumerate(level.res):
                h = res(h)
                if len(level.attn):
                    h = level.attn[i](h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Quantizer(nn.Module):
    def __init__(self, k: int, c: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(k, c, _weight=torch.empty(k, c))  # loaded, not initialised

    def codes(self, indices: Tensor) -> Tensor:
        """Token ids [...] → their l2-normalised codebook entries [..., C] (``get_codebook_entry``)."""
        return F.normalize(self.embedding.weight, p=2, dim=-1)[indices]


class LlamaGenVQ(nn.Module):
    def __init__(self, config: VQConfig) -> None:
        super().__init__()
        self.config = config
        self.quantize = Quantizer(config.codebook_size, config.code_dim)
        self.post_quant_conv = nn.Conv2d(config.code_dim, config.z_channels, 1)
        self.decoder = Decoder(config)

    def code_vectors(self, tokens: Tensor, grid: tuple[int, int]) -> Tensor:
        """Token ids [B, h·w] (raster order) → code vectors [B, C, h, w] (``decode_code``'s ``qzshape``)."""
        b = tokens.shape[0]
        return self.quantize.codes(tokens).reshape(b, *grid, -1).permute(0, 3, 1, 2).contiguous()

    def decode_code(self, tokens: Tensor, grid: tuple[int, int]) -> Tensor:
        """Token ids [B, h·w] → images [B, 3, H, W], about [−1, 1]."""
        return self.decoder(self.post_quant_conv(self.code_vectors(tokens, grid)))


# ---------------------------------------------------------------------------------------------- loading
_BLOCK = re.compile(r"^decoder\.conv_blocks\.(\d+)\.(res|attn)\.(\d+)\.")


def config_from_state(state: dict[str, Tensor], what: str) -> VQConfig:
    """The decoder's architecture from a state dict in the released layout; UserError if it is not one."""
    need = [
        "quantize.embedding.weight",
        "post_quant_conv.weight",
        "decoder.conv_in.weight",
        "decoder.conv_out.weight",
    ]
    missing = [k for k in need if k not in state]
    if missing:
        hint = " (a GPT checkpoint?)" if "tok_embeddings.weight" in state else ""
        raise UserError(f"{what} is not a LlamaGen VQ tokenizer: no {missing[0]}{hint}")
    k, c = state["quantize.embedding.weight"].shape
    counts: dict[int, dict[str, int]] = {}
    for name in state:
        if m := _BLOCK.match(name):
            j, kind, i = int(m.group(1)), m.group(2), int(m.group(3))
            entry = counts.setdefault(j, {"res": 0, "attn": 0})
            entry[kind] = max(entry[kind], i + 1)
    if not counts or sorted(counts) != list(range(len(counts))):
        raise UserError(
            f"{what}: the decoder's levels (decoder.conv_blocks.N) are missing or not numbered 0…"
        )
    levels = tuple(
        Level(
            channels=state[f"decoder.conv_blocks.{j}.res.0.conv1.weight"].shape[0],
            blocks=counts[j]["res"],
            attention=counts[j]["attn"] > 0,
            upsample=f"decoder.conv_blocks.{j}.upsample.conv.weight" in state,
        )
        for j in sorted(counts)
    )
    config = VQConfig(
        codebook_size=k,
        code_dim=c,
        z_channels=state["post_quant_conv.weight"].shape[0],
        mid_channels=state["decoder.conv_in.weight"].shape[0],
        levels=levels,
    )
    with torch.device("meta"):
        own = LlamaGenVQ(config).state_dict()
    for name, t in own.items():
        if name not in state:
            raise UserError(f"{what} is not a LlamaGen VQ tokenizer: no {name}")
        if tuple(state[name].shape) != tuple(t.shape):
            raise UserError(f"{what}: {name} has shape {tuple(state[name].shape)}, expected {tuple(t.shape)}")
    return config


def build_vq(state: dict[str, Tensor], what: str) -> LlamaGenVQ:
    """The decoder of a released VQ state dict, float32, frozen, in eval mode."""
    config = config_from_state(state, what)
    with torch.device("meta"):
        vq = LlamaGenVQ(config)
    vq.load_state_dict({k: state[k].float() for k in vq.state_dict()}, assign=True)
    return vq.eval().requires_grad_(False)
