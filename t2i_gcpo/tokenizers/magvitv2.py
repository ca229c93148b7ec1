"""MAGVIT-v2 as Show-o ships it (showlab/magvitv2; Yu et al. 2024, arXiv 2310.05737; Show-o's
models/modeling_magvitv2.py and models/common_modules.py): a convolutional encoder and decoder around a
lookup-free quantizer (LFQ). Written here from that reference; nothing of a checkpoint folder runs.

- LFQ: a latent z ∈ R^D per grid cell (D = ``z_channels`` = 13) is quantised to sign(z) ∈ {−1, +1}^D;
  its id is Σ_d 2^(D−1−d)·[z_d > 0], so K = 2^D = 8192 codes and the codebook is the fixed table of
  ±1 vectors (buffers ``quantize.embedding`` [K, D] and ``quantize.power_vals`` [D]).
- Decoder (``decode_code`` in the reference): ids [B, T] → codebook rows [B, D, h, w] → post-quant 1×1
  conv → conv_in → middle (ResNet, attention, ResNet) → up levels (ResNet blocks, nearest ×2 + conv) →
  GroupNorm(32), swish, conv_out: images in about [−1, 1], 2^(levels − 1) pixels per token a side
  (16: 256 px for 16×16 tokens, 512 px for 32×32).
- Encoder (``get_code``): the mirror image down to D channels, then the quant 1×1 conv and LFQ.

The released ``config.json`` holds only ``_class_name`` (``MAGVITv2``) and ``_diffusers_version``: the
architecture is the reference's constructor defaults (`MagvitConfig`). A folder may state other widths
under the same field names (the test suite's tiny tokenizers do); its weights must then fit them.
Weights: ``pytorch_model.safetensors`` (the released name) or ``model.safetensors``, key names as
released (``encoder.down.0.block.0.conv1.weight``, ``decoder.up.4.upsample.conv.weight``, …).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from t2i_gcpo.errors import UserError

CLASS_NAME = "MAGVITv2"
WEIGHT_FILES = ("pytorch_model.safetensors", "model.safetensors")  # the released name first
DIFFUSERS_VERSION = "0.30.1"  # what the released config.json names (its ModelMixin wrote it)
NORM_GROUPS = 32  # GroupNorm(32, C) everywhere, as the reference's Normalize


@dataclass(frozen=True)
class MagvitConfig:
    """The architecture; defaults are the reference's (VQGANEncoder, VQGANDecoder, LFQuantizer)."""

    ch: int = 128  # base width; level i has ch·ch_mult[i] channels
    encoder_ch_mult: tuple[int, ...] = (1, 2, 2, 4, 4)
    encoder_num_res_blocks: tuple[int, ...] = (4, 3, 4, 3, 4)
    decoder_ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    decoder_num_res_blocks: tuple[int, ...] = (4, 4, 3, 4, 3)
    z_channels: int = 13  # D: the LFQ code width, K = 2^D codes
    in_channels: int = 3
    out_channels: int = 3

    @property
    def codebook_size(self) -> int:
        return 2**self.z_channels

    @property
    def factor(self) -> int:
        """Pixels per token a side (one ×2 upsampling per decoder level but the first)."""
        return 2 ** (len(self.decoder_ch_mult) - 1)


def swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(NORM_GROUPS, channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """norm → swish → 3×3 conv, twice, plus the input (a 1×1 ``nin_shortcut`` where widths differ)."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = norm(c_in), nn.Conv2d(c_in, c_out, 3, padding=1)
        self.norm2, self.conv2 = norm(c_out), nn.Conv2d(c_out, c_out, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(swish(self.norm2(h)))  # the reference's dropout is p = 0
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the grid cells with 1×1-conv projections, plus the input."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm = norm(c)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        b, c, hh, ww = x.shape
        q = self.q(h).flatten(2).transpose(1, 2)  # [B, HW, C]
        k, v = self.k(h).flatten(2), self.v(h).flatten(2)  # [B, C, HW]
        w = torch.softmax(q @ k * c**-0.5, dim=-1)  # [B, HW (query), HW (key)]
        out = (v @ w.transpose(1, 2)).view(b, c, hh, ww)
        return x + self.proj_out(out)


class Downsample(nn.Module):
    """Pad right and bottom by one, then a 3×3 stride-2 conv (the reference's asymmetric padding)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Nearest-neighbour ×2, then a 3×3 conv."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Level(nn.Module):
    """One resolution: its ResNet blocks (``block``), no attention blocks (``attn``: the reference's
    attn_resolutions=[5] matches no power-of-two grid), and the resampling to the next level."""

    def __init__(self, widths: list[tuple[int, int]], resample: nn.Module | None, name: str) -> None:
        super().__init__()
        self.block = nn.ModuleList(ResnetBlock(a, b) for a, b in widths)
        self.attn = nn.ModuleList()
        if resample is not None:
            self.add_module(name, resample)


class Middle(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.block_1, self.attn_1, self.block_2 = ResnetBlock(c, c), AttnBlock(c), ResnetBlock(c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


class Encoder(nn.Module):
    def __init__(self, cfg: MagvitConfig) -> None:
        super().__init__()
        mult, blocks = cfg.encoder_ch_mult, cfg.encoder_num_res_blocks
        self.conv_in = nn.Conv2d(cfg.in_channels, cfg.ch, 3, padding=1)
        self.down = nn.ModuleList()
        c = cfg.ch
        for i, (m, n) in enumerate(zip(mult, blocks)):
            out = cfg.ch * m
            widths = [(c if j == 0 else out, out) for j in range(n)]
            last = i == len(mult) - 1
            self.down.append(Level(widths, None if last else Downsample(out), "downsample"))
            c = out
        self.mid = Middle(c)
        self.norm_out = norm(c)
        self.conv_out = nn.Conv2d(c, cfg.z_channels, 3, padding=1)
        self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.z_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.down:
            for block in level.block:
                h = block(h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        h = self.conv_out(swish(self.norm_out(self.mid(h))))
        return self.quant_conv(h)


class Decoder(nn.Module):
    def __init__(self, cfg: MagvitConfig) -> None:
        super().__init__()
        mult, blocks = cfg.decoder_ch_mult, cfg.decoder_num_res_blocks
        c = cfg.ch * mult[-1]
        self.post_quant_conv = nn.Conv2d(cfg.z_channels, cfg.z_channels, 1)
        self.conv_in = nn.Conv2d(cfg.z_channels, c, 3, padding=1)
        self.mid = Middle(c)
        levels: list[Level] = []
        for i in reversed(range(len(mult))):  # built from the coarsest; stored finest first (``up.0``)
            out = cfg.ch * mult[i]
            widths = [(c if j == 0 else out, out) for j in range(blocks[i])]
            levels.insert(0, Level(widths, Upsample(out) if i != 0 else None, "upsample"))
            c = out
        self.up = nn.ModuleList(levels)
        self.norm_out = norm(c)
        self.conv_out = nn.Conv2d(c, cfg.out_channels, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(self.post_quant_conv(z)))
        for level in reversed(self.up):
            for block in level.block:
                h = block(h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


class LFQuantizer(nn.Module):
    """Lookup-free quantisation: sign(z) per channel; id = Σ_d 2^(D−1−d)·[z_d > 0]."""

    def __init__(self, code_dim: int) -> None:
        super().__init__()
        ids = torch.arange(2**code_dim)
        bits = (ids[:, None] >> torch.arange(code_dim - 1, -1, -1)) & 1  # [K, D], most significant first
        self.register_buffer("embedding", bits.float() * 2 - 1)  # [K, D] of ±1
        self.register_buffer("power_vals", 2 ** torch.arange(code_dim - 1, -1, -1))  # [D] long

    def ids(self, z: torch.Tensor) -> torch.Tensor:
        """Latents [B, D, h, w] → ids [B, h·w] (raster order)."""
        bits = (z > 0).long()
        return (self.power_vals.view(1, -1, 1, 1) * bits).sum(1).flatten(1)

    def codes(self, ids: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        """Ids [B, T] → codebook rows as latents [B, D, h, w]."""
        b = ids.shape[0]
        return self.embedding[ids.reshape(-1)].view(b, *shape, -1).permute(0, 3, 1, 2).contiguous()


class MagvitV2(nn.Module):
    """Show-o's image tokenizer: images in [−1, 1] ⇄ ids in [0, 2^D) on an h×w grid."""

    def __init__(self, config: MagvitConfig | None = None) -> None:
        super().__init__()
        self.config = config or MagvitConfig()
        self.encoder = Encoder(self.config)
        self.decoder = Decoder(self.config)
        self.quantize = LFQuantizer(self.config.z_channels)

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    @staticmethod
    def grid(num_tokens: int, shape: tuple[int, int] | None = None) -> tuple[int, int]:
        if shape is not None:
            return shape
        side = math.isqrt(num_tokens)
        if side * side != num_tokens:
            raise ValueError(f"{num_tokens} tokens are not a square grid: give the shape")
        return side, side

    def code_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        """Ids [B, T] → their ±1 code vectors [B, T, D]."""
        return self.quantize.embedding[ids]

    def decode_code(self, ids: torch.Tensor, shape: tuple[int, int] | None = None) -> torch.Tensor:
        """Ids [B, T] → images [B, 3, H, W] in about [−1, 1] (the reference's ``decode_code``)."""
        z = self.quantize.codes(ids, self.grid(ids.shape[1], shape))
        return self.decoder(z.to(self.decoder.conv_in.weight.dtype))

    def get_code(self, images: torch.Tensor) -> torch.Tensor:
        """Images [B, 3, H, W] in [−1, 1] → ids [B, (H/16)·(W/16)] (the reference's ``get_code``)."""
        return self.quantize.ids(self.encoder(images))

    # ------------------------------------------------------------------ files
    def save_pretrained(self, path: str | Path) -> None:
        """``config.json`` (the released keys, plus the widths where they differ from the released
        ones) and ``pytorch_model.safetensors``."""
        from safetensors.torch import save_file

        from t2i_gcpo.outdir import write_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        default = asdict(MagvitConfig())
        own = {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in asdict(self.config).items()
            if v != default[k]
        }
        cfg = {"_class_name": CLASS_NAME, "_diffusers_version": DIFFUSERS_VERSION, **own}
        write_file(path / "config.json", json.dumps(cfg, indent=2) + "\n")
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        write_file(
            path / WEIGHT_FILES[0], b"", by_name=lambda tmp: save_file(state, tmp, metadata={"format": "pt"})
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> MagvitV2:
        """A MAGVIT-v2 folder (config.json naming ``MAGVITv2`` + safetensors weights); anything missing,
        unknown or of the wrong shape is a `UserError` naming the file."""
        from t2i_gcpo.outdir import read_json
        from t2i_gcpo.weights import read_weights

        path = Path(path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise UserError(
                f"'{path}' is not a MAGVIT-v2 folder: no config.json (expected showlab/magvitv2's files)"
            )
        raw = read_json(cfg_file, dict, follow=True)
        if raw.get("_class_name") != CLASS_NAME:
            raise UserError(f"{cfg_file}: _class_name is {raw.get('_class_name')!r}, expected {CLASS_NAME!r}")
        config = read_config(raw, cfg_file)
        weights = next((path / f for f in WEIGHT_FILES if (path / f).is_file()), None)
        if weights is None:
            raise UserError(f"'{path}' has no MAGVIT-v2 weights: expected {' or '.join(WEIGHT_FILES)}")
        model = cls(config)
        load_state(model, read_weights(weights), weights)
        return model.eval().requires_grad_(False)


def read_config(raw: dict, source: Path) -> MagvitConfig:
    """The `MagvitConfig` a config.json states (released keys and our width fields only)."""
    known = {f.name: f for f in fields(MagvitConfig)}
    values = {}
    for key, value in raw.items():
        if key.startswith("_"):  # _class_name, _diffusers_version, _name_or_path
            continue
        if key not in known:
            raise UserError(f"{source}: unknown config key '{key}' (not a MAGVIT-v2 setting)")
        tp = known[key].type
        ok = (
            isinstance(value, list) and value and all(isinstance(v, int) and v > 0 for v in value)
            if "tuple" in str(tp)
            else isinstance(value, int) and not isinstance(value, bool) and value > 0
        )
        if not ok:
            want = "a list of positive ints" if "tuple" in str(tp) else "a positive int"
            raise UserError(f"{source}: config key '{key}' must be {want}, got {value!r}")
        values[key] = tuple(value) if isinstance(value, list) else value
    config = MagvitConfig(**values)
    for side in ("encoder", "decoder"):
        if len(getattr(config, f"{side}_ch_mult")) != len(getattr(config, f"{side}_num_res_blocks")):
            raise UserError(f"{source}: {side}_ch_mult and {side}_num_res_blocks must have the same length")
    if config.ch % NORM_GROUPS or config.z_channels > 20:
        raise UserError(f"{source}: ch must be a multiple of {NORM_GROUPS} and z_channels at most 20")
    return config


def load_state(model: nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    """Copy `state` into `model`, every key present and of the model's shape (else a `UserError`)."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        parts = [
            f"missing {', '.join(missing[:3])}" if missing else "",
            f"unexpected {', '.join(unexpected[:3])}" if unexpected else "",
        ]
        raise UserError(f"{source}: not the weights of this model ({'; '.join(p for p in parts if p)})")
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[key].shape):
            raise UserError(
                f"{source}: tensor {key} has shape {tuple(tensor.shape)}, the model expects "
                f"{tuple(own[key].shape)} (a different width: check config.json)"
            )
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)
