"""The folder the built-in ShapeWorld priors (ar.py, masked.py) save to and load from:
``model_index.json`` (which family), ``prior/{config.json, model.safetensors, vocab.json}`` and the
VQ tokenizer in ``vq/``. Every way a file can be missing, misplaced (a folder where a file belongs),
truncated, malformed or hold NaN/inf weights is a `UserError` naming the file."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError  # transformers' configs check their own fields
from torch import nn

from t2i_gcpo.errors import UserError, check_file
from t2i_gcpo.policies.prompt_tokenizer import PromptTokenizer
from t2i_gcpo.tokenizers.vq import VQTokenizer, load_weights, read_config


def save_prior_folder(policy: Any, path: str, model_type: str, family: str) -> None:
    """Write `policy` (with ``config``, ``tokenizer``, ``vq``) to `path`; the prior's weights are
    stored in ``config.storage_dtype``, the VQ's by the VQ itself."""
    from safetensors.torch import save

    from t2i_gcpo.outdir import write_file

    prior = os.path.join(path, "prior")
    dtype = getattr(torch, policy.config.storage_dtype)
    state = {
        k: v.detach().to(dtype).contiguous()
        for k, v in policy.state_dict().items()
        if not k.startswith("vq.")
    }
    # every file whole, world-readable (shipped files are) and never through a link (outdir.write_file)
    write_file(os.path.join(prior, "model.safetensors"), save(state), within=path)
    config = {"model_type": model_type, **asdict(policy.config)}
    write_file(os.path.join(prior, "config.json"), json.dumps(config, indent=2), within=path)
    policy.tokenizer.save(prior)
    policy.vq.save_pretrained(os.path.join(path, "vq"))
    write_file(
        os.path.join(path, "model_index.json"),
        json.dumps({"policy": family, "prior": "prior", "vq": "vq"}, indent=2),
    )


def load_prior_folder(
    path: str,
    model_type: str,
    config_cls: type,
    what: str,
    build: Callable[[Any, PromptTokenizer, VQTokenizer], nn.Module],
) -> nn.Module:
    """The model `build(config, tokenizer, vq)` makes from a `save_prior_folder` folder, weights loaded,
    in eval mode; `what` names the family in errors ("an AR policy")."""
    prior = os.path.join(path, "prior")
    need = [os.path.join(prior, n) for n in ("config.json", "model.safetensors", "vocab.json")]
    if not any(os.path.exists(p) for p in need):
        raise UserError(
            f"{path} is not {what} checkpoint (needs prior/config.json, model.safetensors, vocab.json)"
        )
    for p in need:
        check_file(p)
    raw = read_config(need[0], "model_type", model_type, schema=config_cls)
    vq = VQTokenizer.from_pretrained(os.path.join(path, "vq"))
    try:
        tokenizer = PromptTokenizer.load(prior)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise UserError(f"{need[2]}: not a prompt vocabulary ({type(e).__name__}: {e})") from None
    try:
        config = config_cls(**{**raw, "grid": tuple(raw.get("grid", config_cls().grid))})
        if not math.isfinite(float(config.default_cfg_scale)):
            raise ValueError(f"default_cfg_scale must be a finite number, got {config.default_cfg_scale}")
        model = build(config, tokenizer, vq)
    except (TypeError, ValueError, RuntimeError, ZeroDivisionError, StrictDataclassError) as e:
        raise UserError(f"{need[0]}: not {what} config: {' '.join(str(e).split())[:300]}") from None
    state = load_weights(need[1])
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shapes differ from the config
        raise UserError(
            f"{need[1]}: the weights do not match {need[0]}: {' '.join(str(e).split())[:300]}"
        ) from None
    missing = [k for k in missing if not k.startswith("vq.")]
    if missing or unexpected:
        raise UserError(
            f"{path}: checkpoint does not match the model (missing {missing}, unexpected {unexpected})"
        )
    return model.eval()
