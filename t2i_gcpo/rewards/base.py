"""The reward protocol shared by every reward (ShapeWorld, GenEval, CLIPScore, user callables), and what a
reward returns: `RewardOutput`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the reward files import this module without torch (`--help` lists them)
    import torch


@dataclass
class RewardOutput:
    """The scores of B samples. A weighted sum r = Σ_k w_k r_k also gives each term's own score r_k,i in
    `terms`, named by `term_names` (GDPO normalises them one by one; the run logs ``reward/<term>/mean``);
    `details` holds what is not a score (a GeneVal tag, a judge's answer, the objects found)."""

    scores: torch.Tensor  # [B] float — the scalar reward r_i of each sample
    details: list[dict[str, Any]] = field(default_factory=list)  # [B] — per-sample info, or [] for none
    terms: torch.Tensor | None = None  # [B, K] float — r_k,i of each term k of a sum (None: a single reward)
    term_names: tuple[str, ...] = ()  # [K] — the terms' names, in the order of `terms`' columns

    def __post_init__(self) -> None:
        if self.terms is not None:
            self.term_names = tuple(self.term_names)
            if self.terms.dim() != 2 or self.terms.shape != (self.scores.shape[0], len(self.term_names)):
                raise ValueError(
                    f"RewardOutput.terms is {tuple(self.terms.shape)}, expected [B, K] = "
                    f"[{self.scores.shape[0]}, {len(self.term_names)}] (one column per name of term_names)"
                )

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    def select(self, index: Any) -> RewardOutput:
        """Rows `index` (a tensor or a list of ints) of every field."""
        import torch

        ids = torch.as_tensor(index, dtype=torch.long).flatten()
        details = [self.details[i] for i in ids.tolist()] if self.details else []
        terms = None if self.terms is None else self.terms[ids.to(self.terms.device)]
        return RewardOutput(self.scores[ids.to(self.scores.device)], details, terms, self.term_names)

    @staticmethod
    def concat(outputs: Sequence[RewardOutput]) -> RewardOutput:
        """The rows of every output in order; terms are kept when every output has the same ones."""
        import torch

        if not outputs:
            raise ValueError("nothing to concatenate")
        first = outputs[0]
        device = first.scores.device
        scores = torch.cat([o.scores.to(device) for o in outputs])
        if any(o.details for o in outputs):  # an output without details holds an empty one per sample
            details = [d for o in outputs for d in (o.details or [{} for _ in range(len(o))])]
        else:
            details = []
        names = {o.term_names for o in outputs}
        if any(o.terms is None for o in outputs) or len(names) > 1:
            if any(o.terms is not None for o in outputs):
                raise ValueError(f"cannot concatenate reward outputs of different terms: {sorted(names)}")
            return RewardOutput(scores, details)
        terms = torch.cat([o.terms.to(device) for o in outputs])
        return RewardOutput(scores, details, terms, first.term_names)


class Reward(Protocol):
    """Optional beyond this: ``bounds``, the (low, high) every score lies in where it is known
    (rewards.combine.reward_bounds; the run report clips the reward's ± std band to it), and
    ``check_prompts(prompts, metadata)`` (rewards.combine.check_prompts)."""

    name: str

    def __call__(self, images: Any, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        """Score samples. `images`: float tensor [B, 3, H, W] in [0, 1] (or texts for the text path);
        `metadata`: GenEval metadata per sample (empty dicts where there is none)."""
        ...
