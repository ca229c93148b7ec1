"""GCPO credit (Guidance Contrastive Policy Optimization, arXiv 2605.29198; docs/concepts/credit.md#gcpo)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

if TYPE_CHECKING:
    from torch import Tensor

from t2i_gcpo.core.schemes.registry import CreditInputs, Option, register_scheme

HIST = "the hist schedule takes ln(1 − x) and ln(1 − y)"
TAU = "> 0; smaller overflows the scaled scores"


def _check(options: dict[str, Any]) -> tuple[str, str] | None:
    x, y = options.get("top_fraction", 0.4), options.get("top_mass", 0.8)
    if options.get("normalization", "hist") == "hist" and x > y:
        return "top_fraction", (
            f"must be ≤ top_mass (the hist schedule gives the top fraction x of tokens a share y ≥ x of the "
            f"credit), got {x:g} > {y:g}"
        )
    return None


@register_scheme(
    "gcpo",
    needs=("contrast",),
    doc="GCPO (Guidance Contrastive Policy Optimization, arXiv 2605.29198): k3 divergence between the "
    "positive and negative context at the sampled token, normalised per sequence "
    "(docs/concepts/credit.md#gcpo).",
    check=_check,
)
def gcpo(
    inp: CreditInputs,
    normalization: Annotated[
        Literal["hist", "softmax", "mean", "none"],
        Option("How d_t becomes weights (docs/concepts/credit.md#gcpo); 'hist' is the official one."),
    ] = "hist",
    top_fraction: Annotated[
        float, Option("x in the hist schedule: the top fraction of tokens …", 1e-6, 1 - 1e-6, why=HIST)
    ] = 0.4,
    top_mass: Annotated[
        float,
        Option(
            "y in the hist schedule: … that carries this fraction of the credit.", 1e-6, 1 - 1e-6, why=HIST
        ),
    ] = 0.8,
    tau: Annotated[float, Option("τ for normalization='softmax'.", 1e-6, why=TAU)] = 1.0,
) -> Tensor:
    from t2i_gcpo.core.credit import gcpo_weights

    return gcpo_weights(inp.logp_pos, inp.logp_neg, inp.mask, normalization, top_fraction, top_mass, tau)
