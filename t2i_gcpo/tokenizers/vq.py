"""The built-in image tokenizer: a small convolutional VQ-VAE (van den Oord et al. 2017, arXiv
1711.00937) with an EMA codebook (its appendix A.1; Razavi et al. 2019, arXiv 1906.00446).

32×32 RGB → 8×8 grid of ids from a K = 256 codebook (raster order, row by row), and back.

Why not diffusers ``VQModel``: it saves and loads the same way but trained 8.3× slower on the 2-core
CPU (docs/results/notes.md#vq-tokenizer).

Saved like a Hugging Face model: ``config.json`` + ``model.safetensors`` (weights stored in fp16 to
keep the shipped checkpoint small, upcast to fp32 at load).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from t2i_gcpo.errors import UserError
from t2i_gcpo.outdir import read_json, write_file

MAX_IMAGE_SIZE = 1024  # pixels a side
MAX_WIDTH = 1 << 16  # codebook entries, code and channel widths


@dataclass
class VQConfig:
    image_size: int = 32  # H = W of the images
    channels: tuple[int, ...] = (64, 128)  # conv width of each stride-2 stage
    num_down: int = 2  # stride-2 stages: grid = image_size / 2**num_down
    codebook_size: int = 256  # K
    code_dim: int = 16  # D, width of a codebook entry
    beta: float = 0.25  # commitment weight β
    ema_decay: float = 0.99  # γ of the EMA codebook update
    storage_dtype: str = "float16"  # dtype of the weights on disk


class ResBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1)
        self.c2 = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.c2(F.silu(self.c1(F.silu(x))))


class EMAQuantizer(nn.Module):
    """Nearest-neighbour codebook, updated by exponential moving averages of assigned encodings;
    entries that fall out of use are restarted from random encodings of the current batch."""

    def __init__(self, k: int, d: int, decay: float) -> None:
        super().__init__()
        self.decay = decay
        self.register_buffer("embed", torch.randn(k, d) * 0.1)  # [K, D]
        self.register_buffer("cluster_size", torch.ones(k))  # [K] EMA of assignment counts
        self.register_buffer("embed_avg", self.embed.clone())  # [K, D] EMA of assigned sums

    def ids(self, z: torch.Tensor) -> torch.Tensor:
        """z [N, D] → nearest code ids [N]."""
        dist = z.pow(2).sum(1, keepdim=True) - 2 * z @ self.embed.t() + self.embed.pow(2).sum(1)[None]
        return dist.argmin(1)

    @torch.no_grad()
    def ema_update(self, z: torch.Tensor, ids: torch.Tensor) -> None:
        onehot = F.one_hot(ids, self.embed.shape[0]).type_as(z)  # [N, K]
        self.cluster_size.mul_(self.decay).add_(onehot.sum(0), alpha=1 - self.decay)
        self.embed_avg.mul_(self.decay).add_(onehot.t() @ z, alpha=1 - self.decay)
        n = self.cluster_size.sum()
        size = (self.cluster_size + 1e-5) / (n + self.embed.shape[0] * 1e-5) * n  # Laplace smoothing
        self.embed.copy_(self.embed_avg / size[:, None])
        dead = self.cluster_size < 0.03
        if dead.any():  # restart unused codes at random encodings
            pick = torch.randint(0, z.shape[0], (int(dead.sum()),), device=z.device)
            self.embed[dead] = z[pick]
            self.embed_avg[dead] = z[pick]
            self.cluster_size[dead] = 1.0


class VQTokenizer(nn.Module):
    """Images [B, 3, H, W] in [0, 1] ⇄ token ids [B, rows·cols] (raster order)."""

    def __init__(self, config: VQConfig | None = None) -> None:
        super().__init__()
        self.config = c = config or VQConfig()
        ch = list(c.channels)
        if len(ch) != c.num_down:
            raise ValueError(f"channels {c.channels} needs one width per stride-2 stage ({c.num_down})")
        # a checkpoint's sizes are bounded before anything is allocated (a crafted image_size of 10⁹ would
        # size the prior's token grid and cache); MAX_IMAGE_SIZE is 16× the largest shipped world's
        if not (
            isinstance(c.image_size, int)
            and 0 < c.image_size <= MAX_IMAGE_SIZE
            and c.image_size % 2**c.num_down == 0
        ):
            raise ValueError(
                f"image_size must be a multiple of 2^num_down up to {MAX_IMAGE_SIZE}, got {c.image_size!r}"
            )
        for name, value in (
            ("codebook_size", c.codebook_size),
            ("code_dim", c.code_dim),
            *(("channels", w) for w in ch),
        ):
            if not (isinstance(value, int) and 0 < value <= MAX_WIDTH):
                raise ValueError(f"{name} must be an integer from 1 to {MAX_WIDTH}, got {value!r}")
        enc: list[nn.Module] = []
        for i, cout in enumerate(ch):  # each stage: stride-2 conv, residual block
            enc += [nn.Conv2d(3 if i == 0 else ch[i - 1], cout, 4, stride=2, padding=1), ResBlock(cout)]
        enc += [ResBlock(ch[-1]), nn.SiLU(), nn.Conv2d(ch[-1], c.code_dim, 1)]
        self.encoder = nn.Sequential(*enc)  # [B, 3, H, W] → [B, D, H/2^n, W/2^n]
        dec: list[nn.Module] = [nn.Conv2d(c.code_dim, ch[-1], 3, padding=1), ResBlock(ch[-1])]
        for i in reversed(range(c.num_down)):  # each stage: residual block, 2× nearest up, conv
            cout = 3 if i == 0 else ch[i - 1]
            dec += [
                ResBlock(ch[i]),
                nn.Upsample(scale_factor=2, mode="nearest"),
                nn.Conv2d(ch[i], cout, 3, padding=1),
            ]
        self.decoder = nn.Sequential(*dec)  # → [B, 3, H, W] in ≈ [-1, 1]
        self.quantizer = EMAQuantizer(c.codebook_size, c.code_dim, c.ema_decay)

    # ---- geometry -------------------------------------------------------------------------------
    @property
    def grid_shape(self) -> tuple[int, int]:
        g = self.config.image_size // 2**self.config.num_down
        return (g, g)

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    # ---- tokens ---------------------------------------------------------------------------------
    def _latents(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, 3, H, W] in [0, 1] → encodings [B, D, rows, cols]."""
        return self.encoder(images * 2 - 1)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images float [B, 3, H, W] in [0, 1] → ids long [B, rows·cols] (raster order)."""
        z = self._latents(images.float())  # [B, D, r, c]
        b, d = z.shape[:2]
        return self.quantizer.ids(z.permute(0, 2, 3, 1).reshape(-1, d)).view(b, -1)

    def code_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] → codebook vectors [B, T, D] (used by STAGE similarity credit)."""
        return self.quantizer.embed[ids]

    @torch.no_grad()
    def code_patches(self) -> torch.Tensor:
        """What each code looks like: images [K, 3, H, W], image k a grid filled with code k."""
        r, c = self.grid_shape
        return self.decode(
            torch.arange(self.codebook_size, device=self.quantizer.embed.device)[:, None].repeat(1, r * c)
        )

    @torch.no_grad()
    def merge_flat_duplicates(self, colour_tol: float = 0.03, flat_std: float = 0.02) -> int:
        """Make codes that decode to the same flat colour one code; returns how many entries changed.

        Dead-code restarts re-seed unused entries at random encodings, which are mostly background,
        so a trained codebook holds dozens of entries that all decode to the same flat grey (59 of
        256 in the shipped tokenizer). A prior trained on such ids spreads its probability over
        interchangeable codes: every background token then carries sampling noise into the policy
        gradient and a cond-vs-null divergence that has nothing to do with the prompt. A code is
        flat when a grid of it decodes with pixel std < `flat_std`; flat codes whose mean colours
        differ by < `colour_tol` (max over RGB) get the embedding of the lowest id of their group,
        so `encode` only ever emits that id (ties go to the first index) and `decode` is unchanged
        for the others. Object codes (not flat) are never touched.
        """
        k = self.codebook_size
        patches = self.code_patches()
        flat = patches.flatten(1).std(1) < flat_std  # [K]
        colour = patches.mean((2, 3))  # [K, 3]
        merged = 0
        done = torch.zeros(k, dtype=torch.bool)
        for i in range(k):
            if not flat[i] or done[i]:
                continue
            same = flat & ~done & ((colour - colour[i]).abs().amax(-1) < colour_tol)  # [K], includes i
            done |= same
            dup = same.nonzero().flatten()
            dup = dup[dup != i]
            merged += int((self.quantizer.embed[dup] != self.quantizer.embed[i]).any(-1).sum())
            self.quantizer.embed[dup] = self.quantizer.embed[i].clone()
        return merged

    def _decode_latents(self, zq: torch.Tensor) -> torch.Tensor:
        return (self.decoder(zq) * 0.5 + 0.5).clamp(0, 1)

    @torch.no_grad()
    def decode(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, rows·cols] → images [B, 3, H, W] in [0, 1]."""
        r, c = self.grid_shape
        zq = self.code_embeddings(ids).view(ids.shape[0], r, c, -1).permute(0, 3, 1, 2)  # [B, D, r, c]
        return self._decode_latents(zq)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training pass: (reconstruction [B, 3, H, W], commitment loss, ids [B, T]).

        Straight-through estimator: gradients of the reconstruction flow to the encoder past the
        nearest-neighbour lookup; the codebook itself moves by EMA in training mode.
        """
        z = self._latents(images)  # [B, D, r, c]
        b, d, r, c = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, d)  # [B·r·c, D]
        ids = self.quantizer.ids(flat.detach())
        if self.training:
            self.quantizer.ema_update(flat.detach(), ids)
        q = self.quantizer.embed[ids]
        commit = F.mse_loss(flat, q.detach())
        q = flat + (q - flat).detach()  # straight-through
        zq = q.view(b, r, c, d).permute(0, 3, 1, 2)
        return self.decoder(zq) * 0.5 + 0.5, commit, ids.view(b, -1)

    # ---- persistence ----------------------------------------------------------------------------
    def save_pretrained(self, path: str) -> None:
        """Write ``config.json`` + ``model.safetensors`` (weights in ``config.storage_dtype``)."""
        from safetensors.torch import save

        dtype = getattr(torch, self.config.storage_dtype)
        state = {k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()}
        write_file(
            os.path.join(path, "model.safetensors"), save(state)
        )  # world-readable, never through a link
        config = {"model_type": "t2i_gcpo_vq", **asdict(self.config)}
        write_file(os.path.join(path, "config.json"), json.dumps(config, indent=2))

    @classmethod
    def from_pretrained(cls, path: str) -> VQTokenizer:
        cfg_path = os.path.join(path, "config.json")
        weights = os.path.join(path, "model.safetensors")
        if os.path.exists(path) and not os.path.isdir(path):
            raise UserError(f"{path} is a file, expected a VQ tokenizer checkpoint folder")
        if not os.path.exists(cfg_path) and not os.path.exists(weights):
            why = (
                "no such directory" if not os.path.isdir(path) else "needs config.json and model.safetensors"
            )
            raise UserError(f"{path} is not a VQ tokenizer checkpoint ({why})")
        raw = read_config(cfg_path, "model_type", "t2i_gcpo_vq", schema=VQConfig)
        try:
            config = VQConfig(**{**raw, "channels": tuple(raw.get("channels", VQConfig.channels))})
            model = cls(config)
        except (TypeError, ValueError, RuntimeError, ZeroDivisionError) as e:
            raise UserError(f"{cfg_path}: not a VQ tokenizer config: {_one_line(e)}") from None
        state = load_weights(weights)
        try:
            model.load_state_dict(state)
        except RuntimeError as e:
            raise UserError(f"{weights}: the weights do not match {cfg_path}: {_one_line(e)}") from None
        return model.eval()


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_config(
    path: str, type_key: str | None = None, expected: str | None = None, schema: type | None = None
) -> dict:
    """A checkpoint's ``config.json`` as a dict, the `type_key` entry removed (and checked against
    `expected` when it is there), each key checked against the dataclass `schema` when given
    (weights.check_config_types); a `UserError` naming the file if it is missing, a directory or not
    a JSON object."""
    from t2i_gcpo.weights import check_config_types

    raw = read_json(path, follow=True)  # a model cache links its files
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a JSON object of config keys, got {type(raw).__name__}")
    found = raw.pop(type_key, None) if type_key else None
    if expected is not None and found is not None and found != expected:
        raise UserError(f"{path}: {type_key} is {found!r}, expected {expected!r}")
    return check_config_types(raw, schema, path) if schema is not None else raw


def load_weights(path: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, floating ones upcast to float32, through the loading check
    every family shares (`t2i_gcpo.weights`): a `UserError` naming the file if it is missing, a
    directory, truncated or otherwise unreadable, holds a non-number dtype, or NaN/inf values."""
    from t2i_gcpo.weights import read_weights

    return read_weights(path)


def train_vq(
    model: VQTokenizer,
    sample_images: Callable[[int, torch.Generator], torch.Tensor],
    steps: int = 2000,
    batch_size: int = 64,
    lr: float = 2e-3,
    max_seconds: float | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, float]:
    """Train `model` on batches from ``sample_images(batch_size, generator) -> [B, 3, H, W] in [0, 1]``.

    Loss: ‖x − x̂‖² + β‖z − sg(e)‖² (the codebook term is replaced by the EMA update). Cosine
    learning-rate decay over `steps`; stops early after `max_seconds`. Returns final statistics.
    """
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    t0 = time.time()
    bar = tqdm(range(steps), desc="vq", disable=not progress)
    rec = 0.0
    step = 0
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        x = sample_images(batch_size, gen)
        xr, commit, ids = model(x)
        rec_loss = F.mse_loss(xr, x)
        loss = rec_loss + model.config.beta * commit
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        rec = 0.9 * rec + 0.1 * rec_loss.item() if step else rec_loss.item()
        if step % 20 == 0:
            used = int((model.quantizer.cluster_size > 0.5).sum())
            bar.set_postfix(mse=f"{rec:.4f}", codes=used)
        if max_seconds is not None and time.time() - t0 > max_seconds:
            break
    model.eval()
    return {"mse": rec, "steps": step + 1, "seconds": time.time() - t0}
