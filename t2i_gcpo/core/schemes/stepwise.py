"""Stepwise rewards (Stepwise-Flow-GRPO, arXiv 2603.28718; docs/concepts/tree_credit.md#stepwise-rewards): the
registration; the maths is core/stepwise.py.

Masked families only: the sampler records every reveal step's full prediction x̂_s, the train step scores each
with the run's reward (a scheme that needs "step_rewards"), and the tokens revealed at step s get the group-
standardised gain r(x̂_s) − r(x̂_{s−1})."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

if TYPE_CHECKING:
    from torch import Tensor

from t2i_gcpo.core.schemes.registry import CreditInputs, Option, register_scheme


@register_scheme(
    "stepwise",
    needs=("step_rewards",),
    returns="advantages",
    doc="Stepwise rewards (masked models): the tokens revealed at step s get the gain r(x̂_s) − r(x̂_{s−1}) of "
    "the model's full prediction, standardised across the group "
    "(docs/concepts/tree_credit.md#stepwise-rewards).",
)
def stepwise(
    inp: CreditInputs,
    normalisation: Annotated[
        Literal["step", "group", "none"],
        Option(
            "σ dividing the centred gains: 'step', their std across the group at each step (GRPO at matched "
            "steps); 'group', the std of the group's final rewards (a sample's step advantages sum to its "
            "GRPO advantage); 'none', no division."
        ),
    ] = "step",
) -> Tensor:
    from t2i_gcpo.core.stepwise import stepwise_advantages

    return stepwise_advantages(inp.step_rewards, inp.group_size, inp.step, inp.mask, normalisation)
