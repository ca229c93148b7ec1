"""Resolve a `--model` string to a policy adapter.

- ``shapeworld``           the shipped ShapeWorld AR prior (t2i_gcpo/assets/shapeworld)
- ``shapeworld-64``        the shipped 64 px ShapeWorld AR prior, 16×16 tokens (t2i_gcpo/assets/shapeworld64)
- ``shapeworld-masked``    the shipped ShapeWorld masked (MaskGIT) prior (t2i_gcpo/assets/shapeworld_masked)
- ``arithmetic``           the shipped arithmetic-world causal LM (t2i_gcpo/assets/arithmetic), a `TextPolicy`
- ``masked:PATH``          a local directory saved by ``MaskedPolicy.save_pretrained``
- ``amused:PATH``          a local diffusers aMUSEd pipeline folder
- ``janus:PATH``           a local Janus / Janus-Pro checkpoint (transformers format)
- ``text:PATH``            a local transformers causal LM folder (config, weights, tokenizer) as a `TextPolicy`
- ``PATH``                 a local directory saved by ``ARPolicy.save_pretrained`` (e.g. a run's checkpoint)

The prefix may be left out for a directory whose own files say what it is (a run's checkpoint of any
family): ``config.json`` with model_type "janus", ``model_index.json`` with ``"policy": "masked"`` or
``"_class_name": "AmusedPipeline"``, ``config.json`` with a model_type that ``AutoModelForCausalLM``
supports (text).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from t2i_gcpo.errors import UserError

PREFIXES = ("janus", "amused", "masked", "text", "ar")
ASSETS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets")
TEXT_SHIPPED = {"arithmetic": os.path.join(ASSETS, "arithmetic")}  # built by `pretrain --world arithmetic`


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_causal_lm_type(model_type: object) -> bool:
    """Whether ``AutoModelForCausalLM`` builds a model of this ``config.json`` model_type."""
    if not isinstance(model_type, str) or not model_type:
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def detect_family(path: str) -> str:
    """The adapter family of a checkpoint directory, from its own files (``ar`` when nothing says)."""
    model_type = _read_json(Path(path) / "config.json").get("model_type")
    if model_type == "janus":
        return "janus"
    index = _read_json(Path(path) / "model_index.json")
    if index.get("_class_name") == "AmusedPipeline":
        return "amused"
    if index.get("policy") == "masked":
        return "masked"
    if not index and is_causal_lm_type(model_type):
        return "text"
    return "ar"


def is_shipped(name: str) -> bool:
    """Whether `name` is a model the package ships ("shapeworld", "shapeworld-masked", "arithmetic", …)."""
    from t2i_gcpo.policies.ar import SHIPPED as AR_SHIPPED
    from t2i_gcpo.policies.masked import SHIPPED as MASKED_SHIPPED

    return name in AR_SHIPPED or name in MASKED_SHIPPED or name in TEXT_SHIPPED


def split_spec(spec: str) -> tuple[str, str]:
    """``family:PATH`` or a name / path → (family, name or path)."""
    from t2i_gcpo.policies.masked import SHIPPED as MASKED_SHIPPED

    head, sep, rest = spec.partition(":")
    if sep and head in PREFIXES:
        return head, rest
    if spec in MASKED_SHIPPED:
        return "masked", spec
    if spec in TEXT_SHIPPED:
        return "text", spec
    return detect_family(spec), spec


def load_policy(spec: str, options: Any = None) -> Any:
    """The policy a `--model` string names; `options` (``TrainConfig.model_options``) sets the dtype,
    LoRA and checkpointing of real checkpoints and the log-prob estimator of masked models."""
    family, target = split_spec(spec)
    estimator = getattr(options, "estimator", "trajectory")
    remask_count = getattr(options, "remask_count", 2)
    if family != "masked" and family != "amused" and estimator != "trajectory":
        raise UserError(
            f"model_options.estimator={estimator!r} applies to masked models only "
            f"(shapeworld-masked, masked:PATH, amused:PATH); '{spec}' is autoregressive"
        )
    if getattr(options, "lora_rank", 0) and family != "janus":  # never silently full fine-tuning
        raise UserError(
            f"model_options.lora_rank applies to janus:PATH only, not to the {family} model '{spec}'"
        )
    if family == "janus":
        from t2i_gcpo.policies.janus import JanusPolicy

        kwargs = {}
        if options is not None:
            kwargs = dict(
                dtype=options.dtype,
                gradient_checkpointing=options.gradient_checkpointing,
                lora={"r": options.lora_rank} if options.lora_rank else None,
            )
        return JanusPolicy.from_pretrained(target, **kwargs)
    if family == "amused":
        from t2i_gcpo.policies.amused import AmusedPolicy

        dtype = getattr(options, "dtype", "float32")
        return AmusedPolicy.from_pretrained(target, dtype, estimator, remask_count)
    if family == "masked":
        from t2i_gcpo.policies.masked import load_masked_policy

        return load_masked_policy(target, estimator, remask_count)
    if family == "text":
        from t2i_gcpo.policies.text import TextPolicy

        kwargs = {}
        if options is not None:
            kwargs = dict(dtype=options.dtype, gradient_checkpointing=options.gradient_checkpointing,
                          negative=options.negative)  # fmt: skip
        return TextPolicy.from_pretrained(TEXT_SHIPPED.get(target, target), **kwargs)
    from t2i_gcpo.policies.ar import ARPolicy, resolve_checkpoint

    path = resolve_checkpoint(target)
    if not Path(path).is_dir():
        raise UserError(
            f"model '{spec}' not found: expected 'shapeworld', 'shapeworld-64', 'shapeworld-masked', 'arithmetic', "
            "'masked:PATH', 'amused:PATH', 'janus:PATH', 'text:PATH' or a checkpoint directory"
        )
    return ARPolicy.from_pretrained(path)
