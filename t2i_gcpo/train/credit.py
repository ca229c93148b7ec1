"""Fetch what a credit scheme declares it needs (core/schemes.py) and nothing else, then call it.

The only place that knows where each input comes from: the rollout's recorded log-probs, a
teacher-forced pass of the policy or of a reference, the adapter's token features, whole groups.
Used by the train step, the step's credit-map figure and `t2i-gcpo credit-map`.
"""

from __future__ import annotations

from typing import Any

import torch

from t2i_gcpo.core.schemes import CREDIT_SCHEMES, CreditInputs, CreditSchemeError, credit_weights, get_scheme
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import Rollout
from t2i_gcpo.train.distributed import unwrap

TRAIN_CONTEXT = {"cond": "pos", "cfg": "guided"}  # rollout.train_logp → the policy's context name


def scheme_options(credit_cfg: Any, name: str) -> dict[str, Any]:
    """The keyword options scheme `name` is called with (`CreditConfig.options_for`: its section
    `credit.<name>`, and `credit.options` for the configured scheme)."""
    return credit_cfg.options_for(name)


def reads_recorded_contrast(credit_cfg: Any) -> bool:
    """Whether the configured scheme reads the rollout's recorded pos / neg log-probs: the trainer then
    asks the sampler to score the negative context (`SamplingParams.score_negative`)."""
    return "contrast" in get_scheme(credit_cfg.scheme).needs and credit_cfg.contrast == "recorded"


def no_grad_dists(model: Any, ro: Rollout, context: str) -> Any:
    """Full distributions of `model` (policy or reference) for the rollout, chunked, no gradient."""
    with torch.no_grad():
        return unwrap(model)(ro, context=context, dists=True)[1]


def fetch_inputs(name: str, ro: Rollout, advantages: torch.Tensor | None, policy: Any, reference: Any,
                 credit_cfg: Any, context: str, dists: Any = None) -> CreditInputs:  # fmt: skip
    """CreditInputs for scheme `name` on rollout `ro`, filled only where the scheme needs it.

    `dists`: the policy's distributions from a forward already made (else one is made on demand);
    `reference`: the policy that `ref_dists` come from (frozen initial or rollout snapshot)."""
    needs = get_scheme(name).needs
    model = unwrap(policy)
    if needs & {"dists", "ref_dists"} and not model.capabilities.full_dists:
        raise UserError(
            f"credit scheme {name!r} reads full next-token distributions, which this {type(model).__name__} "
            "does not give (PolicyCapabilities.full_dists)"
        )
    # the tokens credit may fall on: those the log-prob estimator scores (Rollout.loss_mask)
    inp = CreditInputs(mask=ro.loss_mask, step=ro.step, layout=model.layout.grid)
    if "contrast" in needs:
        # "recorded": the sampler's log-probs, equal to re-scoring with one update epoch, and free; a context
        # the rollout lacks (text sampled without c⁻ for a scheme that reads no contrast, its figure drawing
        # this one) is scored now, as "recompute" (the official code) scores both
        recorded = {} if credit_cfg.contrast == "recompute" else ro.logp
        with torch.no_grad():
            inp.logp_pos, inp.logp_neg = (
                recorded[c] if c in recorded else unwrap(policy)(ro, context=c) for c in ("pos", "neg")
            )
    if "dists" in needs:
        inp.dists = (lambda: dists) if dists is not None else (lambda: no_grad_dists(policy, ro, context))
    if "ref_dists" in needs:
        if reference is None:
            raise ValueError(f"credit scheme {name!r} needs a reference policy")
        inp.ref_dists = lambda: no_grad_dists(reference, ro, context)
    if "features" in needs:
        with torch.no_grad():
            inp.features = unwrap(policy).token_features(ro)
    if "groups" in needs:
        inp.advantages, inp.group_size = advantages, ro.group_size
    return inp


def compute_weights(credit_cfg: Any, ro: Rollout, advantages: torch.Tensor | None, policy: Any, reference: Any,
                    context: str, dists: Any = None, name: str | None = None) -> torch.Tensor:  # fmt: skip
    """w [B, T] of the configured scheme (or of `name`), without gradient."""
    name = name or credit_cfg.scheme
    inp = fetch_inputs(name, ro, advantages, policy, reference, credit_cfg, context, dists)
    options = scheme_options(credit_cfg, name)
    if name in CREDIT_SCHEMES:  # a built-in scheme's failure is a bug: its traceback stays
        with torch.no_grad():
            return credit_weights(name, inp, options, credit_cfg.granularity)
    try:  # a user's function (--credit): what went wrong in one line, naming it
        with torch.no_grad():
            return credit_weights(name, inp, options, credit_cfg.granularity)
    except CreditSchemeError as e:
        raise UserError(str(e)) from None
    except Exception as e:
        raise UserError(f"credit scheme '{name}' failed: {type(e).__name__}: {e}") from e


def scheme_weights(credit_cfg: Any, ro: Rollout, advantages: torch.Tensor, policy: Any, reference: Any,
                   context: str, names: tuple[str, ...]) -> dict[str, torch.Tensor]:  # fmt: skip
    """Weights under each named scheme, for figures; a scheme that needs a reference is skipped without one."""
    out = {}
    for name in names:
        if "ref_dists" in get_scheme(name).needs and reference is None:
            continue
        out[name] = compute_weights(credit_cfg, ro, advantages, policy, reference, context, name=name)
    return out
