"""Prompt loading and a deterministic prompt stream.

The stream is a pure function of (seed, position): step k of a run always sees the same prompts,
which makes an interrupted-and-resumed run identical to an uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from t2i_gcpo.errors import UserError


def load_prompts(path: str | Path, classes: list[str] | None = None) -> list[dict]:
    """GenEval metadata for every prompt of a .txt (parsed) or .jsonl (read) file."""
    from t2i_gcpo.worlds.shapeworld import read_prompt_file

    metadata = read_prompt_file(path) if classes is None else read_prompt_file(path, classes=classes)
    if not metadata:
        raise UserError(f"prompt file {path} holds no prompts")
    return metadata


class PromptStream:
    """An endless, seeded sequence of prompts: a fresh permutation of the list every epoch."""

    def __init__(self, metadata: list[dict], seed: int):
        self.metadata = metadata
        self.seed = seed

    def take(self, start: int, count: int) -> list[dict]:
        """Prompts at stream positions start … start + count − 1."""
        n = len(self.metadata)
        out = []
        for pos in range(start, start + count):
            epoch, offset = divmod(pos, n)
            order = np.random.default_rng([self.seed, epoch]).permutation(n)
            out.append(self.metadata[order[offset]])
        return out
