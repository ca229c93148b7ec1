"""Critical-token credit (Group Critical-token PO, zghhui/GCPO, ICLR 2026;
docs/concepts/credit.md#critical-token): the registration; the maths is t2i_gcpo/core/critical.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

if TYPE_CHECKING:
    from torch import Tensor

from t2i_gcpo.core.schemes.registry import CreditInputs, Option, register_scheme


def _check(options: dict[str, Any]) -> tuple[str, str] | None:
    names = ("first_fraction", "entropy_fraction", "similarity_fraction")
    if sum(options.get(n, 0.1) for n in names) <= 0:
        return "", f"at least one of {', '.join(names)} must be > 0"
    return None


@register_scheme(
    "critical",
    needs=("dists", "features", "groups"),
    doc="Critical-token credit (Group Critical-token PO, zghhui/GCPO, ICLR 2026 — not this package's gcpo): "
    "w = N/|S| on the union of the first tokens in decision order, the largest grid entropy gradients and "
    "the least group-similar tokens, 0 elsewhere (docs/concepts/credit.md#critical-token).",
    check=_check,
)
def critical(
    inp: CreditInputs,
    first_fraction: Annotated[
        float, Option("Share of tokens credited for coming first in decoding order.", 0, 1)
    ] = 0.1,
    entropy_fraction: Annotated[
        float, Option("Share credited for the largest entropy change against grid neighbours.", 0, 1)
    ] = 0.1,
    similarity_fraction: Annotated[
        float, Option("Share credited for the least similarity to the group's other samples.", 0, 1)
    ] = 0.1,
) -> Tensor:
    from t2i_gcpo.core.credit import chunked_entropy
    from t2i_gcpo.core.critical import critical_weights

    entropy = chunked_entropy(inp.dists(), inp.mask.shape, inp.mask.device)  # H [B, T]
    return critical_weights(
        entropy,
        inp.features,
        inp.step,
        inp.mask,
        inp.group_size,
        inp.layout,
        first_fraction,
        entropy_fraction,
        similarity_fraction,
    )
