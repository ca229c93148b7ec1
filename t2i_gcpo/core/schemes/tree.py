"""Tree groups (TreeRL, arXiv 2506.11902; TreeGRPO, arXiv 2512.08153; BranchGRPO, arXiv 2509.06040;
docs/concepts/tree_credit.md#tree-groups): the registration; the maths is core/tree_groups.py.

The group is a prefix tree whose every leaf is trained on: the train step samples each root's continuations
at the run's `branching.*` points and puts them in the batch (a scheme that needs "leaves")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

if TYPE_CHECKING:
    from torch import Tensor

from t2i_gcpo.core.schemes.registry import CreditInputs, Option, register_scheme


@register_scheme(
    "tree",
    needs=("rewards", "leaves"),
    returns="advantages",
    doc="Tree groups: the group is a prefix tree, every leaf trained on; a segment gets TreeRL's global plus "
    "local value difference (docs/concepts/tree_credit.md#tree-groups).",
)
def tree(
    inp: CreditInputs,
    normalisation: Annotated[
        Literal["group", "none"],
        Option("'group': divide by the std of the group's leaf rewards; 'none': raw values."),
    ] = "group",
) -> Tensor:
    from t2i_gcpo.core.tree_groups import tree_group_advantages

    return tree_group_advantages(inp.rewards, inp.group_size, inp.leaves, inp.mask, inp.step, normalisation)
