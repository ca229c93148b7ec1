"""Segment advantages from branched continuations (VinePPO, arXiv 2410.01679; SPO, arXiv 2505.23564;
docs/concepts/tree_credit.md#segment-advantages): the registration; the maths is core/tree_credit.py.

The train step reads `rule`, `k` and `continuations` to pick the branch points and sample the
continuations (train/branches.py); the function itself turns their rewards into token advantages."""

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
    rule: Annotated[
        Literal["every_k", "entropy", "boundary"],
        Option(
            "Where to branch: every k decision steps, before the k highest-entropy steps, or at task "
            "boundaries (text: line starts; AR images: token rows)."
        ),
    ] = "every_k",
    k: Annotated[int, Option("every_k: the spacing; entropy: how many points per sample.", 1)] = 16,
    continuations: Annotated[int, Option("Continuations sampled from each branch point.", 1)] = 2,
    include_root: Annotated[
        bool, Option("Count the sample itself as one continuation of each of its prefixes.")
    ] = True,
    normalisation: Annotated[
        Literal["group", "none"],
        Option("'group': divide by the std of every reward scored for the prompt; 'none': raw values."),
    ] = "group",
) -> Tensor:
    from t2i_gcpo.core.tree_credit import segment_advantages

    del rule, k, continuations  # read by the train step, which samples the continuations
    return segment_advantages(
        inp.rewards, inp.group_size, inp.branch_points, inp.branch_rewards, inp.mask,
        inp.branch_exists, inp.step, include_root, normalisation,
    )  # fmt: skip
