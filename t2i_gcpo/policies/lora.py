"""peft LoRA as the families that train adapters use it (janus.py, showo.py, llamagen.py, meissonic.py):
adapters injected into one module with the rest of it frozen, and that module's state dict with the adapters
folded into the base weights, which is what each family saves in its released layout."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from t2i_gcpo.errors import UserError

ADAPTER = "default"  # the name of the one adapter a family trains


def add_lora(
    target: nn.Module,
    rank: int,
    alpha: float | None = None,
    dropout: float = 0.0,
    targets: Sequence[str] = (),
    frozen: nn.Module | None = None,
) -> str:
    """peft LoRA of rank r (scale α/r, α = 2r unless given) on the `targets` layers of `target`; every
    parameter of `frozen` (default: `target`) frozen but the adapters'. → the adapter's name."""
    from peft import LoraConfig, inject_adapter_in_model

    cfg = LoraConfig(
        r=rank,
        lora_alpha=float(2 * rank if alpha is None else alpha),
        lora_dropout=float(dropout),
        target_modules=list(targets),
    )
    inject_adapter_in_model(cfg, target, adapter_name=ADAPTER)
    for name, p in (target if frozen is None else frozen).named_parameters():
        p.requires_grad_("lora_" in name)
    return ADAPTER


def add_lora_option(
    target: nn.Module, lora: dict, default_targets: Sequence[str], frozen: nn.Module | None = None
) -> str:
    """`add_lora` from a family's ``lora`` option ``{"r": 16, "alpha": 32, "dropout": 0.0, "target_modules":
    [...]}`` ("rank" for "r"; α = 2r, no dropout and `default_targets` where it names none)."""
    rank = int(lora.get("r", lora.get("rank", 0)) or 0)
    if rank <= 0:
        raise UserError(f"LoRA needs a positive rank 'r', got {lora!r}")
    return add_lora(
        target,
        rank,
        lora.get("alpha"),
        lora.get("dropout", 0.0),
        lora.get("target_modules", default_targets),
        frozen,
    )


def merged_state_dict(module: nn.Module, adapter: str | None) -> dict[str, torch.Tensor]:
    """`module`'s state dict with the deltas s·B·A of LoRA `adapter` folded into the base weights, under the
    base layers' own names (``….base_layer.weight`` / ``.bias`` → ``….weight`` / ``.bias``) and without the
    adapters' tensors; the plain state dict where `adapter` is None. `module` is not changed."""
    sd = dict(module.state_dict())
    if adapter is None:
        return sd
    from peft.tuners.lora import LoraLayer

    for name, mod in module.named_modules():
        if isinstance(mod, LoraLayer):
            base = sd.pop(f"{name}.base_layer.weight")
            sd[f"{name}.weight"] = base + mod.get_delta_weight(adapter).to(base.dtype)
            if f"{name}.base_layer.bias" in sd:
                sd[f"{name}.bias"] = sd.pop(f"{name}.base_layer.bias")
    return {k: v for k, v in sd.items() if "lora_" not in k}
