"""Causal language models as text policies (policies/text.py): the shipped ``arithmetic`` model, or a
local transformers causal-LM folder (``text:PATH``: config, weights, tokenizer)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from t2i_gcpo.policies.registry import ASSETS, read_json, register_family

SHIPPED = {"arithmetic": os.path.join(ASSETS, "arithmetic")}  # built by `pretrain --world arithmetic`


def is_causal_lm_type(model_type: object) -> bool:
    """Whether ``AutoModelForCausalLM`` builds a model of this ``config.json`` model_type."""
    if not isinstance(model_type, str) or not model_type:
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def detect(path: Path) -> bool:
    """A transformers causal-LM folder: a ``config.json`` model_type AutoModelForCausalLM builds, and no
    ``model_index.json`` (a pipeline or a t2i-gcpo prior)."""
    return not read_json(path / "model_index.json") and is_causal_lm_type(
        read_json(path / "config.json").get("model_type")
    )


@register_family(
    "text",
    doc="a causal language model (shipped arithmetic, or a transformers folder)",
    detect=detect,
    shipped=SHIPPED,
    options=frozenset({"dtype", "gradient_checkpointing", "negative", "max_rollout_batch"}),
    shipped_task="arithmetic",
)
def load(target: str, options: Any) -> Any:
    from t2i_gcpo.policies.text import TextPolicy

    return TextPolicy.from_pretrained(
        SHIPPED.get(target, target),
        dtype=options.dtype,
        gradient_checkpointing=options.gradient_checkpointing,
        negative=options.negative,
        max_rollout_batch=options.max_rollout_batch,
    )
