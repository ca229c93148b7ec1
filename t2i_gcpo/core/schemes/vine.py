"""Segment advantages from branched continuations (VinePPO, arXiv 2410.01679; SPO, arXiv 2505.23564;
docs/concepts/tree_credit.md#segment-advantages): the registration; the maths is core/tree_credit.py.

Where the samples branch and how many continuations each point gets are the run's `branching.*` settings
(the train step samples and scores them for every scheme that needs "branches", train/branches.py); the
function turns their rewards into token advantages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

if TYPE_CHECKING:
    from torch import Tensor

from t2i_gcpo.core.schemes.registry import CreditInputs, Option, register_scheme


@register_scheme(
    "vine",
    needs=("rewards", "branches"),
    returns="advantages",
    doc="VinePPO / SPO segment advantages: continuations sampled from branch points estimate V(prefix); the "
    "tokens between two points get V(after) − V(before) (docs/concepts/tree_credit.md#segment-advantages).",
)
def vine(
    inp: CreditInputs,
    include_root: Annotated[
        bool, Option("Count the sample itself as one continuation of each of its prefixes.")
    ] = True,
    normalisation: Annotated[
        Literal["group", "roots", "none"],
        Option(
            "'group': divide by the std of every reward scored for the prompt, continuations included; "
            "'roots': by the std of its G samples alone (DAPO's divisor, so the two compare at the same "
            "step size); 'none': raw values."
        ),
    ] = "group",
) -> Tensor:
    from t2i_gcpo.core.tree_credit import segment_advantages

    return segment_advantages(
        inp.rewards, inp.group_size, inp.tree, inp.mask, inp.step, include_root, normalisation
    )
