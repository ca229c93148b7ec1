"""Resolve a `--model` string to a policy adapter.

- ``shapeworld``           the shipped ShapeWorld checkpoint (t2i_gcpo/assets/shapeworld)
- ``janus:PATH``           a local Janus / Janus-Pro checkpoint (transformers format; the prefix may be
                           left out for a directory whose config.json says model_type "janus")
- ``PATH``                 a local directory saved by ``ARPolicy.save_pretrained`` (e.g. a run's checkpoint)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from t2i_gcpo.errors import UserError


def _is_janus_dir(path: str) -> bool:
    """A transformers Janus checkpoint (e.g. a run's checkpoint of a Janus policy) needs no prefix."""
    import json

    cfg = Path(path) / "config.json"
    try:
        return cfg.is_file() and json.loads(cfg.read_text()).get("model_type") == "janus"
    except (OSError, ValueError):
        return False


def load_policy(spec: str, options: Any = None) -> Any:
    if spec.startswith("janus:") or _is_janus_dir(spec):
        from t2i_gcpo.policies.janus import JanusPolicy

        kwargs = {}
        if options is not None:
            kwargs = dict(
                dtype=options.dtype,
                gradient_checkpointing=options.gradient_checkpointing,
                lora={"r": options.lora_rank} if options.lora_rank else None,
            )
        return JanusPolicy.from_pretrained(spec.removeprefix("janus:"), **kwargs)
    from t2i_gcpo.policies.ar import ARPolicy, resolve_checkpoint

    path = resolve_checkpoint(spec)
    if not Path(path).is_dir():
        raise UserError(
            f"model '{spec}' not found: expected 'shapeworld', 'janus:PATH' or a checkpoint directory"
        )
    return ARPolicy.from_pretrained(path)
