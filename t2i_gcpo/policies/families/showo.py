"""Show-o (policies/showo.py): a local folder of the released checkpoint with its VQ and Phi tokenizer
(``showo:PATH``; a folder whose config.json names ``Showo`` is recognised without the prefix)."""

from __future__ import annotations

from typing import Any

from t2i_gcpo.policies.registry import read_json, register_family


@register_family(
    "showo",
    doc="Show-o's released checkpoint (Phi-1.5 over MAGVIT-v2 tokens) with its VQ and Phi tokenizer",
    detect=lambda path: read_json(path / "config.json").get("_class_name") == "Showo",
    options=frozenset(
        {"dtype", "gradient_checkpointing", "lora_rank", "estimator", "remask_count", "max_rollout_batch"}
    ),
)
def load(target: str, options: Any) -> Any:
    from t2i_gcpo.policies.showo import ShowoPolicy

    lora = {"r": options.lora_rank} if options.lora_rank else None
    return ShowoPolicy.from_pretrained(
        target,
        dtype=options.dtype,
        gradient_checkpointing=options.gradient_checkpointing,
        lora=lora,
        estimator=options.estimator,
        remask_count=options.remask_count,
        max_rollout_batch=options.max_rollout_batch,
    )
