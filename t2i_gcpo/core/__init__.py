"""Credit-assignment core: pure tensor maths (torch only), no models, images or files.

advantages — GRPO/DAPO sequence advantages; losses — clipped surrogate, aggregation, k3 KL;
credit — token weights (uniform, GCPO, DGPO, STAGE); critical — the critical-token weights; schemes — the
registry the train step reads, one module per scheme (what each needs, its options). See
docs/concepts/algorithms.md and docs/concepts/credit.md.

The names below are imported from their module when first asked for: the scheme registry (what
`--help` lists) loads without torch, the maths with it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {  # name -> the module that defines it
    "PerPromptStatTracker": "t2i_gcpo.core.advantages",
    "dynamic_sampling_filter": "t2i_gcpo.core.advantages",
    "group_advantages": "t2i_gcpo.core.advantages",
    "zero_std_groups": "t2i_gcpo.core.advantages",
    "NORMALIZATIONS": "t2i_gcpo.core.credit",
    "dgpo_scores": "t2i_gcpo.core.credit",
    "dgpo_weights": "t2i_gcpo.core.credit",
    "gcpo_divergence": "t2i_gcpo.core.credit",
    "gcpo_weights": "t2i_gcpo.core.credit",
    "hellinger_sq": "t2i_gcpo.core.credit",
    "hist_alpha": "t2i_gcpo.core.credit",
    "normalize_credit": "t2i_gcpo.core.credit",
    "stage_weights": "t2i_gcpo.core.credit",
    "uniform_weights": "t2i_gcpo.core.credit",
    "AGGREGATIONS": "t2i_gcpo.core.losses",
    "aggregate": "t2i_gcpo.core.losses",
    "clipped_surrogate": "t2i_gcpo.core.losses",
    "gcpo_kl_reweight": "t2i_gcpo.core.losses",
    "kl_k3": "t2i_gcpo.core.losses",
    "policy_loss": "t2i_gcpo.core.losses",
    "CREDIT_SCHEMES": "t2i_gcpo.core.schemes",
    "CreditInputs": "t2i_gcpo.core.schemes",
    "CreditSchemeError": "t2i_gcpo.core.schemes",
    "Option": "t2i_gcpo.core.schemes",
    "credit_scheme": "t2i_gcpo.core.schemes",
    "credit_weights": "t2i_gcpo.core.schemes",
    "get_scheme": "t2i_gcpo.core.schemes",
    "pool_by_step": "t2i_gcpo.core.schemes",
    "register_scheme": "t2i_gcpo.core.schemes",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
