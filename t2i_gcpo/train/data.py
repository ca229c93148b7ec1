"""A deterministic prompt stream (prompt files are read by the task).

The stream is a pure function of (seed, position): step k of a run always sees the same prompts,
which makes an interrupted-and-resumed run identical to an uninterrupted one.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class PromptStream:
    """An endless, seeded sequence of prompts: a fresh permutation of the list every epoch."""

    def __init__(self, prompts: list[Any], seed: int):
        self.metadata = prompts
        self.seed = seed

    def take(self, start: int, count: int) -> list[Any]:
        """Prompts at stream positions start … start + count − 1."""
        n = len(self.metadata)
        out = []
        for pos in range(start, start + count):
            epoch, offset = divmod(pos, n)
            order = np.random.default_rng([self.seed, epoch]).permutation(n)
            out.append(self.metadata[order[offset]])
        return out
