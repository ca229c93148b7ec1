"""The ShapeWorld autoregressive prior (policies/ar.py): the shipped ``shapeworld`` and ``shapeworld-64``,
or a directory ``ARPolicy.save_pretrained`` wrote (``ar:PATH``, or the path alone)."""

from __future__ import annotations

import os
from typing import Any

from t2i_gcpo.policies.registry import ASSETS, read_json, register_family

SHIPPED = {  # names resolved to shipped checkpoints
    "shapeworld": os.path.join(ASSETS, "shapeworld"),  # 32 px, 8×8 tokens
    "shapeworld-64": os.path.join(ASSETS, "shapeworld64"),  # 64 px, 16×16 tokens (`pretrain --size 64`)
}


@register_family(
    "ar",
    doc="the ShapeWorld autoregressive prior: shipped shapeworld, shapeworld-64, or a folder it saved",
    detect=lambda path: read_json(path / "model_index.json").get("policy") == "ar",
    shipped=SHIPPED,
    task="shapeworld",
)
def load(target: str, options: Any) -> Any:
    from t2i_gcpo.policies.ar import load_policy

    return load_policy(SHIPPED.get(target, target), name=target)
