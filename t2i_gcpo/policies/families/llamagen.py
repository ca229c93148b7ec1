"""LlamaGen-T2I (policies/llamagen.py): the released GPT, VQ and FLAN-T5 files in one folder
(``llamagen:DIR``, or ``llamagen:DIR/t2i_XL_stage2_512.pt`` to name the GPT file), or a folder its
``save_pretrained`` wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from t2i_gcpo.policies.registry import read_json, register_family


def detect(path: Path) -> bool:
    """A saved folder (llamagen.json), or the release as downloaded: a t2i_*.pt GPT beside a
    vq_*.pt tokenizer."""
    if read_json(path / "llamagen.json").get("format") == "t2i-gcpo llamagen":
        return True
    return path.is_dir() and any(path.glob("t2i_*.pt")) and any(path.glob("vq_*.pt"))


@register_family(
    "llamagen",
    doc="LlamaGen-T2I's released GPT (2D RoPE over its VQ-16 tokens) with its VQ and FLAN-T5 caption encoder",
    detect=detect,
    options=frozenset(
        {
            "dtype",
            "gradient_checkpointing",
            "lora_rank",
            "max_rollout_batch",
            "gpt_size",
            "image_size",
            "cfg_interval",
        }
    ),
)
def load(target: str, options: Any) -> Any:
    from t2i_gcpo.policies.llamagen import LlamaGenPolicy

    lora = {"r": options.lora_rank} if options.lora_rank else None
    return LlamaGenPolicy.from_pretrained(
        target,
        dtype=options.dtype,
        gradient_checkpointing=options.gradient_checkpointing,
        lora=lora,
        max_rollout_batch=options.max_rollout_batch,
        gpt_size=options.gpt_size,
        image_size=options.image_size,
        cfg_interval=options.cfg_interval,
    )
