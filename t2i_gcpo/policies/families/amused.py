"""aMUSEd (policies/amused.py): a local diffusers ``AmusedPipeline`` folder (``amused:PATH``)."""

from __future__ import annotations

from typing import Any

from t2i_gcpo.policies.registry import read_json, register_family


@register_family(
    "amused",
    doc="aMUSEd, a diffusers AmusedPipeline folder",
    detect=lambda path: read_json(path / "model_index.json").get("_class_name") == "AmusedPipeline",
    options=frozenset({"dtype", "estimator", "remask_count", "negative_prompt"}),
)
def load(target: str, options: Any) -> Any:
    from t2i_gcpo.policies.amused import AmusedPolicy

    return AmusedPolicy.from_pretrained(
        target, options.dtype, options.estimator, options.remask_count, options.negative_prompt
    )
