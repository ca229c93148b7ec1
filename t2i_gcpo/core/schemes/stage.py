"""STAGE similarity credit (docs/concepts/credit.md#stage)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

from t2i_gcpo.core.schemes.registry import CreditInputs, register_scheme


@register_scheme(
    "stage",
    needs=("features", "groups"),
    doc="STAGE similarity credit: tokens unlike the same position in opposite-advantage group members "
    "get more credit (docs/concepts/credit.md#stage).",
)
def stage(inp: CreditInputs) -> Tensor:
    from t2i_gcpo.core.credit import stage_weights

    return stage_weights(inp.features, inp.advantages, inp.group_size, inp.mask)
