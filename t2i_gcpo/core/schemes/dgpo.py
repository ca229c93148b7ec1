"""DGPO credit (arXiv 2605.03327, reconstructed; docs/concepts/credit.md#dgpo)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

if TYPE_CHECKING:
    from torch import Tensor

from t2i_gcpo.core.schemes.registry import CreditInputs, Option, register_scheme

TAU = "> 0; smaller overflows the scaled scores"


@register_scheme(
    "dgpo",
    needs=("dists", "ref_dists"),
    doc="DGPO (arXiv 2605.03327, reconstructed): N·softmax(h·g/τ), Hellinger distance to the reference "
    "times the normalised-entropy gate (docs/concepts/credit.md#dgpo).",
)
def dgpo(
    inp: CreditInputs,
    tau: Annotated[
        float, Option("τ: softmax temperature over s_t = h_t·g_t (reconstructed default 0.5).", 1e-6, why=TAU)
    ] = 0.5,
    kappa: Annotated[float, Option("κ: exponent of the entropy gate g_t = (H(π_θ)/ln|V|)^κ.", 0)] = 1.0,
    squared: Annotated[bool, Option("Use the squared Hellinger H² instead of h = sqrt(H²).")] = False,
) -> Tensor:
    import torch

    from t2i_gcpo.core.credit import dgpo_scores, dgpo_weights_from_scores

    scores = torch.zeros(inp.mask.shape, dtype=torch.float32, device=inp.mask.device)  # s [B, T]
    for (sl, lp), (sl_ref, lr) in zip(inp.dists(), inp.ref_dists(), strict=True):
        if sl != sl_ref:
            raise ValueError(f"policy and reference chunks differ: {sl} vs {sl_ref}")
        scores[:, sl] = dgpo_scores(lp, lr, kappa, squared).to(scores.device)
    return dgpo_weights_from_scores(scores, inp.mask, tau)
