"""Entropy gating in the manner of EG-GRPO (arXiv 2604.02355; docs/concepts/tree_credit.md#entropy-gating):
the registration; the maths is core/entropy_gate.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

if TYPE_CHECKING:
    from torch import Tensor

from t2i_gcpo.core.schemes.registry import CreditInputs, Option, register_scheme


def _check(options: dict[str, Any]) -> tuple[str, str] | None:
    lo, hi = options.get("low_quantile", 0.2), options.get("high_quantile", 0.8)
    if lo > hi:
        return "low_quantile", f"must be ≤ high_quantile, got {lo:g} > {hi:g}"
    return None


@register_scheme(
    "eg_grpo",
    needs=("dists",),
    doc="EG-GRPO-style entropy gate: w = 0 below the low entropy quantile, 1 + β above the high one, 1 "
    "between (docs/concepts/tree_credit.md#entropy-gating).",
    check=_check,
    mass_preserving=False,  # unless preserve_mass: gated tokens' share is not handed to the others
)
def eg_grpo(
    inp: CreditInputs,
    low_quantile: Annotated[float, Option("Tokens below this entropy quantile get no credit.", 0, 1)] = 0.2,
    high_quantile: Annotated[float, Option("Tokens above this quantile get the bonus.", 0, 1)] = 0.8,
    bonus: Annotated[float, Option("β: the high-entropy tokens' weight is 1 + β.", 0, 1)] = 0.5,
    scope: Annotated[
        Literal["sample", "batch"], Option("Quantiles of each sample's entropies, or of the whole batch's.")
    ] = "sample",
    preserve_mass: Annotated[bool, Option("Rescale each row so that Σ w = N (its valid tokens).")] = False,
) -> Tensor:
    from t2i_gcpo.core.credit import chunked_entropy
    from t2i_gcpo.core.entropy_gate import entropy_gate_weights

    entropy = chunked_entropy(inp.dists(), inp.mask.shape, inp.mask.device)  # H [B, T]
    return entropy_gate_weights(entropy, inp.mask, low_quantile, high_quantile, bonus, scope, preserve_mass)
