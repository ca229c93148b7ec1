"""What a run's config says of how it samples: its `SamplingParams` and its precision once 'auto' is resolved
for the device (the trainer, the memory model, held-out evaluation and the budget study read both)."""

from __future__ import annotations

from typing import Any

from t2i_gcpo.config import TrainConfig
from t2i_gcpo.policies.base import SamplingParams
from t2i_gcpo.train.credit import reads_recorded_contrast
from t2i_gcpo.train.distributed import unwrap


def resolve_autocast(cfg: TrainConfig, device_type: str, policy: Any) -> None:
    """rollout.autocast / optim.autocast 'auto' → 'bf16' where `device_type` multiplies bf16 natively,
    else 'none'; the rollout only for a policy whose sampler declares bf16 support
    (`capabilities.bf16_sampling`: the ShapeWorld priors, the fused text decoder). In place: the run's
    config.yaml then says what ran, and a resumed run keeps it."""
    from t2i_gcpo.hardware import native_bf16

    native = native_bf16(device_type)
    if cfg.rollout.autocast == "auto":
        sampler = unwrap(policy).capabilities.bf16_sampling
        cfg.rollout.autocast = "bf16" if native and sampler else "none"
    if cfg.optim.autocast == "auto":
        cfg.optim.autocast = "bf16" if native else "none"


def sampling_params(cfg: TrainConfig) -> SamplingParams:
    """How the run samples (rollouts and held-out evaluation); rollout.cfg_scale already resolved."""
    return SamplingParams(
        temperature=cfg.rollout.temperature,
        top_k=cfg.rollout.top_k,
        top_p=cfg.rollout.top_p,
        guidance_scale=float(cfg.rollout.cfg_scale),
        steps=cfg.rollout.steps,
        guidance_schedule=cfg.rollout.guidance_schedule,
        max_new_tokens=cfg.rollout.max_new_tokens,
        reveal_order=cfg.rollout.reveal_order,
        score_negative=reads_recorded_contrast(cfg.credit),
        autocast=cfg.rollout.autocast,
        decode=cfg.rollout.decode,
    )
