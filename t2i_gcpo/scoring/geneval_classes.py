"""GenEval's 80 COCO class names, read from the packaged copy of its object_names.txt."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def geneval_classes() -> list[str]:
    """GenEval's 80 COCO class names, from the packaged copy of object_names.txt."""
    text = resources.files("t2i_gcpo").joinpath("data/geneval/object_names.txt").read_text()
    return [line.strip() for line in text.splitlines() if line.strip()]
