"""Janus / Janus-Pro (policies/janus.py): a local checkpoint in transformers format (``janus:PATH``)."""

from __future__ import annotations

from typing import Any

from t2i_gcpo.policies.registry import read_json, register_family


@register_family(
    "janus",
    doc="Janus / Janus-Pro in transformers format (a local folder)",
    detect=lambda path: read_json(path / "config.json").get("model_type") == "janus",
    options=frozenset({"dtype", "gradient_checkpointing", "lora_rank", "max_rollout_batch"}),
)
def load(target: str, options: Any) -> Any:
    from t2i_gcpo.policies.janus import JanusPolicy

    lora = {"r": options.lora_rank} if options.lora_rank else None
    return JanusPolicy.from_pretrained(
        target,
        dtype=options.dtype,
        gradient_checkpointing=options.gradient_checkpointing,
        lora=lora,
        max_rollout_batch=options.max_rollout_batch,
    )
