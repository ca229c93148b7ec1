"""Uniform credit (GRPO, DAPO): every valid token gets w = 1."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

from t2i_gcpo.core.schemes.registry import CreditInputs, register_scheme


@register_scheme("uniform", doc="GRPO / DAPO: every valid token gets w = 1.")
def uniform(inp: CreditInputs) -> Tensor:
    from t2i_gcpo.core.credit import uniform_weights

    return uniform_weights(inp.mask)
