"""Meissonic (policies/meissonic.py): a local copy of the released MeissonFlow/Meissonic folder, or a run's
checkpoint of one (``meissonic:PATH``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from t2i_gcpo.policies.registry import read_json, register_family


def detect(path: Path) -> bool:
    """The release's model_index.json: Meissonic's ``Pipeline`` of a ``Transformer2DModel`` and a ``VQModel``
    (the first upload names the transformer's module ``src.transformer``, later ones ``transformer``)."""
    index = read_json(path / "model_index.json")

    def component(name: str) -> object:
        entry = index.get(name)
        return entry[1] if isinstance(entry, list) and len(entry) == 2 else None

    return (
        index.get("_class_name") == "Pipeline"
        and component("transformer") == "Transformer2DModel"
        and component("vqvae") == "VQModel"
    )


@register_family(
    "meissonic",
    doc="Meissonic, a local copy of the released MeissonFlow/Meissonic folder",
    detect=detect,
    options=frozenset(
        {"dtype", "estimator", "remask_count", "gradient_checkpointing", "lora_rank", "negative_prompt"}
    ),
)
def load(target: str, options: Any) -> Any:
    from t2i_gcpo.policies.meissonic import MeissonicPolicy

    return MeissonicPolicy.from_pretrained(
        target,
        options.dtype,
        options.estimator,
        options.remask_count,
        gradient_checkpointing=options.gradient_checkpointing,
        lora_rank=options.lora_rank,
        negative_prompt=options.negative_prompt,
    )
