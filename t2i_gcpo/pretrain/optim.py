"""The optimiser every embedded-world pretraining uses: AdamW (β = 0.9, 0.95) with weight decay on
matrices only, and a learning rate that warms up linearly, then follows a cosine down to 10 %."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def pretrain_optimizer(
    params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float
) -> torch.optim.AdamW:
    """AdamW with `weight_decay` on parameters of rank ≥ 2 (weights) and none on vectors (norms, biases)."""
    params = list(params)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )


def set_lr(opt: torch.optim.Optimizer, base_lr: float, step: int, steps: int, warmup: int) -> None:
    """lr = base · min(1, (step + 1)/warmup) · (0.1 + 0.9 · ½(1 + cos(π · step/steps)))."""
    warm = min(1.0, (step + 1) / warmup)
    cos = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps))
    for g in opt.param_groups:
        g["lr"] = base_lr * warm * cos
