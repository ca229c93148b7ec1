"""The ShapeWorld masked (MaskGIT) prior (policies/masked.py): the shipped ``shapeworld-masked``, or a
directory ``MaskedPolicy.save_pretrained`` wrote (``masked:PATH``)."""

from __future__ import annotations

import os
from typing import Any

from t2i_gcpo.policies.registry import ASSETS, read_json, register_family

SHIPPED = {"shapeworld-masked": os.path.join(ASSETS, "shapeworld_masked")}


@register_family(
    "masked",
    doc="the ShapeWorld masked (MaskGIT) prior: shipped shapeworld-masked, or a folder it saved",
    detect=lambda path: read_json(path / "model_index.json").get("policy") == "masked",
    shipped=SHIPPED,
    options=frozenset({"estimator", "remask_count"}),
    task="shapeworld",
)
def load(target: str, options: Any) -> Any:
    from t2i_gcpo.policies.masked import load_masked_policy

    return load_masked_policy(
        SHIPPED.get(target, target), options.estimator, options.remask_count, name=target
    )
