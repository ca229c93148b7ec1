"""Credit-assignment core: pure tensor maths (torch only), no models, images or files.

advantages — GRPO/DAPO sequence advantages; losses — clipped surrogate, aggregation, k3 KL;
credit — token weights (uniform, GCPO, DGPO, STAGE); critical — the critical-token weights; schemes — the
registry the train step reads, one module per scheme (what each needs, its options). See docs/concepts/algorithms.md and docs/concepts/credit.md.
"""

from t2i_gcpo.core.advantages import (
    PerPromptStatTracker,
    dynamic_sampling_filter,
    group_advantages,
    zero_std_groups,
)
from t2i_gcpo.core.credit import (
    NORMALIZATIONS,
    dgpo_scores,
    dgpo_weights,
    gcpo_divergence,
    gcpo_weights,
    hellinger_sq,
    hist_alpha,
    normalize_credit,
    stage_weights,
    uniform_weights,
)
from t2i_gcpo.core.losses import (
    AGGREGATIONS,
    aggregate,
    clipped_surrogate,
    gcpo_kl_reweight,
    kl_k3,
    policy_loss,
)
from t2i_gcpo.core.schemes import (
    CREDIT_SCHEMES,
    CreditInputs,
    CreditSchemeError,
    Option,
    credit_scheme,
    credit_weights,
    get_scheme,
    pool_by_step,
    register_scheme,
)

__all__ = [
    "AGGREGATIONS",
    "CREDIT_SCHEMES",
    "CreditInputs",
    "CreditSchemeError",
    "Option",
    "credit_scheme",
    "credit_weights",
    "dgpo_scores",
    "get_scheme",
    "pool_by_step",
    "register_scheme",
    "NORMALIZATIONS",
    "PerPromptStatTracker",
    "aggregate",
    "clipped_surrogate",
    "dgpo_weights",
    "dynamic_sampling_filter",
    "gcpo_divergence",
    "gcpo_kl_reweight",
    "gcpo_weights",
    "group_advantages",
    "hellinger_sq",
    "hist_alpha",
    "kl_k3",
    "normalize_credit",
    "policy_loss",
    "stage_weights",
    "uniform_weights",
    "zero_std_groups",
]
