"""TEMPO's tree term (arXiv 2509.18314; docs/concepts/tree_credit.md#tempo): the group read as a prefix
tree, no extra samples. The registration; the maths is core/tree_credit.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

if TYPE_CHECKING:
    from torch import Tensor

from t2i_gcpo.core.schemes.registry import CreditInputs, Option, register_scheme


@register_scheme(
    "tempo",
    needs=("rewards", "groups"),
    returns="advantages",
    doc="TEMPO: the group as a prefix tree in decision order; token advantage A_i + δ_it, δ = V(node "
    "after) − V(node before), 0 where the node does not branch (docs/concepts/tree_credit.md#tempo).",
)
def tempo(
    inp: CreditInputs,
    normalisation: Annotated[
        Literal["group", "none"], Option("'group': δ divided by the std of the group's rewards; 'none': raw.")
    ] = "group",
    sequence_term: Annotated[bool, Option("Add the GRPO advantage A_i to δ (TEMPO's advantage).")] = True,
) -> Tensor:
    import torch

    from t2i_gcpo.core.tree_credit import tempo_advantages

    tokens, m, step = inp.tokens, inp.mask.bool(), inp.step
    B, T = m.shape
    pos = torch.arange(T, device=m.device).expand(B, T)
    d = pos if step is None else step.long().to(m.device)
    # decision order: valid tokens by (step, position), padding last; a node is a (position, token) pair,
    # so masked images (several tokens a step, any position) share a prefix only where both agree
    order = torch.where(m, d * T + pos, torch.full_like(pos, B * T * T + T)).argsort(dim=1, stable=True)
    key = torch.gather(tokens.long().to(m.device) * T + pos, 1, order)
    delta_sorted = tempo_advantages(
        key, torch.gather(m, 1, order), inp.rewards, inp.group_size, normalisation
    )
    delta = torch.zeros_like(delta_sorted).scatter_(1, order, delta_sorted)  # back to token positions
    if sequence_term:
        delta = delta + inp.advantages.to(delta)[:, None]
    return torch.where(m, delta, torch.zeros_like(delta))
