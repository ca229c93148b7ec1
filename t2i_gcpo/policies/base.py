"""What every generator adapter provides: the `Rollout` container and the `Policy` protocol.

Adapters (ar.py, janus.py, masked.py, ...) implement `Policy` without inheriting from each other.
Each adapter is a ``torch.nn.Module`` whose ``forward`` is its differentiable ``logprobs`` so that
accelerate/DDP wrapping synchronises gradients (DDP only hooks ``__call__``/``forward``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import torch

Context = Literal["cond", "uncond", "cfg"]


@dataclass
class Rollout:
    """A batch of sampled token sequences with the log-probs recorded while sampling.

    B = number of samples (prompts × group size), T = tokens per sample.
    Log-probs are of the sampled token at sampling temperature, under each distribution.
    """

    tokens: torch.Tensor  # [B, T] long — sampled image (or text) tokens, raster order for images
    mask: torch.Tensor  # [B, T] float — 1 for valid tokens, 0 for padding
    logp_cond: torch.Tensor  # [B, T] — log π(y_t | prompt, y_<t)
    logp_uncond: torch.Tensor  # [B, T] — log π(y_t | null prompt, y_<t)
    logp_cfg: torch.Tensor  # [B, T] — log of the CFG-combined distribution that was sampled
    prompts: list[str]  # [B] — the prompt of each sample
    cfg_scale: float = 1.0  # s in ℓ_u + s·(ℓ_c − ℓ_u)
    temperature: float = 1.0
    extras: dict[str, Any] = field(default_factory=dict)  # adapter-specific (prompt ids, reveal steps, …)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def select(self, index: torch.Tensor | list[int]) -> Rollout:
        """Rows `index` of every per-sample field (tensors in extras with a leading B dim included)."""
        idx = torch.as_tensor(index, dtype=torch.long, device=self.tokens.device)
        ids = idx.tolist()
        b = self.tokens.shape[0]

        def pick(v: Any) -> Any:
            if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == b:
                return v[idx.to(v.device)]
            if isinstance(v, list) and len(v) == b:
                return [v[i] for i in ids]
            return v

        return Rollout(
            tokens=self.tokens[idx],
            mask=self.mask[idx],
            logp_cond=self.logp_cond[idx],
            logp_uncond=self.logp_uncond[idx],
            logp_cfg=self.logp_cfg[idx],
            prompts=[self.prompts[i] for i in ids],
            cfg_scale=self.cfg_scale,
            temperature=self.temperature,
            extras={k: pick(v) for k, v in self.extras.items()},
        )

    def recorded_logp(self, context: Context) -> torch.Tensor:
        return {"cond": self.logp_cond, "uncond": self.logp_uncond, "cfg": self.logp_cfg}[context]


@runtime_checkable
class Policy(Protocol):
    """A generator adapter. Images are float tensors [B, 3, H, W] in [0, 1]."""

    grid_shape: tuple[int, int]  # (rows, cols) of the image-token grid; T = rows * cols

    def check_prompts(self, prompts: list[str]) -> None:
        """Raise UserError naming any words (or inputs) this model cannot take."""

    def rollout(
        self,
        prompts: list[str],
        group_size: int,
        cfg_scale: float,
        temperature: float = 1.0,
        top_k: int = 0,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """Sample `group_size` outputs per prompt (rows grouped: prompt 0's G samples first)."""

    def logprobs(self, rollout: Rollout, context: Context = "cond", full_dist: bool = False) -> Any:
        """Teacher-forced log-probs of `rollout.tokens` under `context`, with gradient.

        Returns [B, T] log-probs; with ``full_dist=True`` returns ``(logp [B, T], logits [B, T, V])``
        where logits are the temperature-scaled logits of that context at every position.
        """

    def decode(self, rollout: Rollout) -> torch.Tensor:
        """Images [B, 3, H, W] in [0, 1] for the rollout's tokens."""

    def save_pretrained(self, path: str) -> None: ...
