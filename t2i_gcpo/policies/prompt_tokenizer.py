"""Word-level prompt tokenizer of the built-in prior.

Lowercase, split on whitespace, a comma its own word ("a circle, a square" reads as "a circle , a
square", as the compositional grammar's separators); the vocabulary is the set of words of the training
prompts, after three special tokens. Prompts are right-padded with ``<pad>`` to a fixed length, so the
null prompt of classifier-free guidance is simply ``max_len`` pads. Saved as ``vocab.json``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable

import torch

from t2i_gcpo.errors import UserError, shorten

PAD, BOS, BOI = "<pad>", "<bos>", "<boi>"
SPECIALS = (PAD, BOS, BOI)


def words_of(prompt: str) -> list[str]:
    return re.findall(r",|[^\s,]+", prompt.lower())


class PromptTokenizer:
    """Words ⇄ ids; ids 0, 1, 2 are ``<pad>``, ``<bos>``, ``<boi>``."""

    def __init__(self, words: list[str], max_len: int) -> None:
        self.vocab: list[str] = list(SPECIALS) + [w for w in words if w not in SPECIALS]
        self.index = {w: i for i, w in enumerate(self.vocab)}
        self.max_len = max_len

    pad_id, bos_id, boi_id = 0, 1, 2

    def __len__(self) -> int:
        return len(self.vocab)

    @classmethod
    def build(cls, prompts: Iterable[str], max_len: int | None = None) -> PromptTokenizer:
        """Vocabulary = sorted words of `prompts`; `max_len` defaults to the longest prompt."""
        prompts = list(prompts)
        words = sorted({w for p in prompts for w in words_of(p)})
        longest = max((len(words_of(p)) for p in prompts), default=1)
        return cls(words, max_len or longest)

    def check(self, prompts: list[str]) -> None:
        """Raise UserError naming unknown words (and the known vocabulary) or over-long prompts."""
        unknown = sorted({w for p in prompts for w in words_of(p) if w not in self.index or w in SPECIALS})
        if unknown:
            known = " ".join(self.vocab[len(SPECIALS) :])
            raise UserError(
                f"unknown word(s) for this model: {', '.join(repr(w) for w in unknown)}; "
                f"its vocabulary is: {known}"
            )
        too_long = [p for p in prompts if len(words_of(p)) > self.max_len]
        if too_long:
            raise UserError(f"prompt longer than {self.max_len} words: {shorten(too_long[0])!r}")

    def encode(self, prompts: list[str]) -> torch.Tensor:
        """Prompts → ids [B, max_len], right-padded with ``<pad>`` (call `check` first)."""
        out = torch.full((len(prompts), self.max_len), self.pad_id, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids = [self.index[w] for w in words_of(p)]
            out[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return out

    def decode(self, ids: torch.Tensor) -> list[str]:
        return [" ".join(self.vocab[i] for i in row.tolist() if i >= len(SPECIALS)) for row in ids]

    def save(self, path: str) -> None:
        from t2i_gcpo.outdir import write_file

        write_file(
            os.path.join(path, "vocab.json"),
            json.dumps({"max_len": self.max_len, "vocab": self.vocab}, indent=1),
        )

    @classmethod
    def load(cls, path: str) -> PromptTokenizer:
        from t2i_gcpo.outdir import read_json

        raw = read_json(os.path.join(path, "vocab.json"), follow=True)
        if raw["vocab"][: len(SPECIALS)] != list(SPECIALS):
            raise UserError(f"{path}/vocab.json: the first entries must be {list(SPECIALS)}")
        return cls(raw["vocab"][len(SPECIALS) :], raw["max_len"])
