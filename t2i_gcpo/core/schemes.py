"""The credit-scheme registry (docs/concepts/credit.md): each scheme is a named pure function that declares what it
needs; the train step fetches exactly that and nothing else.

A scheme is ``fn(inputs: CreditInputs, **options) -> w [B, T]`` (no gradient, mass-preserving),
registered with the inputs it reads:

    @register_scheme("mine", needs=("contrast",), doc="…")
    def mine(inp: CreditInputs, alpha: float = 1.0) -> Tensor: ...

Needs (the fields of `CreditInputs` they fill):
- ``contrast``  — logp_pos, logp_neg: the sampled tokens' log-probs under the positive and the
                  negative context [B, T] (recorded while sampling, or recomputed)
- ``dists``     — dists: the trained policy's full next-token logits, an iterable of
                  (token slice, logits [B, t, V]) chunks (memory stays at one chunk)
- ``ref_dists`` — ref_dists: the same chunks for the reference policy (same slices)
- ``features``  — features [B, T, D]: per-token embeddings (the VQ code vectors for images)
- ``groups``    — advantages [B] and group_size: whole groups, so the weights are computed on the full
                  batch before it is split into minibatches
Always given: mask [B, T], step [B, T] (the step at which each token was decided) and layout
(the (rows, cols) token grid of an image, or None for a sequence).

Options are the fields of the scheme's config section (`credit.<name>.*`) that the function takes as
keyword arguments. ``granularity="step"`` pools the weights over the tokens decided at one step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from t2i_gcpo.core.credit import (
    dgpo_scores,
    dgpo_weights_from_scores,
    gcpo_weights,
    stage_weights,
    uniform_weights,
)

NEEDS = ("contrast", "dists", "ref_dists", "features", "groups")
Chunks = Iterable[tuple[slice, Tensor]]


@dataclass
class CreditInputs:
    """What a scheme may read. Fields a scheme did not declare are left None."""

    mask: Tensor  # [B, T] — 1 for valid tokens
    step: Tensor | None = None  # [B, T] long — step at which each token was decided (AR: t)
    layout: tuple[int, int] | None = None  # (rows, cols) of an image's token grid; None = a sequence
    logp_pos: Tensor | None = None  # [B, T] — log π(y_t | c⁺, …)  (contrast)
    logp_neg: Tensor | None = None  # [B, T] — log π(y_t | c⁻, …)  (contrast)
    dists: Callable[[], Chunks] | None = None  # () → chunks of the policy's logits [B, t, V]
    ref_dists: Callable[[], Chunks] | None = None  # () → the reference's chunks, same slices
    features: Tensor | None = None  # [B, T, D]
    advantages: Tensor | None = None  # [B] (groups)
    group_size: int | None = None  # G (groups)


@dataclass(frozen=True)
class CreditScheme:
    name: str
    fn: Callable[..., Tensor]
    needs: frozenset[str]
    doc: str
    options: tuple[str, ...] = field(default=())  # keyword options the function takes


CREDIT_SCHEMES: dict[str, CreditScheme] = {}


def register_scheme(name: str, needs: tuple[str, ...] = (), doc: str = "") -> Callable:
    """Decorator: add `fn` to `CREDIT_SCHEMES` under `name`, with the inputs it needs."""
    unknown = set(needs) - set(NEEDS)
    if unknown:
        raise ValueError(f"scheme {name!r}: unknown needs {sorted(unknown)}; known: {NEEDS}")

    def add(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        params = list(inspect.signature(fn).parameters.values())[1:]
        CREDIT_SCHEMES[name] = CreditScheme(name, fn, frozenset(needs), doc, tuple(p.name for p in params))
        return fn

    return add


def get_scheme(name: str) -> CreditScheme:
    if name not in CREDIT_SCHEMES:
        raise KeyError(f"unknown credit scheme {name!r}; registered: {', '.join(CREDIT_SCHEMES)}")
    return CREDIT_SCHEMES[name]


@torch.no_grad()
def pool_by_step(weights: Tensor, step: Tensor, mask: Tensor) -> Tensor:
    """Step granularity: every valid token gets the mean weight of the valid tokens of its row decided
    at the same step (mass-preserving; identity when each step decides one token, as in AR)."""
    m = mask.bool()
    B, T = weights.shape
    key = step.long().clamp_min(0)  # [B, T]
    n_steps = int(key.max().item()) + 1 if key.numel() else 1
    w = torch.where(m, weights.float(), torch.zeros_like(weights, dtype=torch.float32))
    total = w.new_zeros(B, n_steps).scatter_add_(1, key, w)  # [B, S]
    count = w.new_zeros(B, n_steps).scatter_add_(1, key, m.float())
    mean = total / count.clamp_min(1)
    return torch.where(m, mean.gather(1, key), torch.zeros_like(w))


def credit_weights(name: str, inputs: CreditInputs, options: dict[str, Any] | None = None,
                   granularity: str = "token") -> Tensor:  # fmt: skip
    """w [B, T] of scheme `name`: checks that its declared inputs are present, passes the options it
    takes, and pools by step when asked."""
    scheme = get_scheme(name)
    missing = [n for n in scheme.needs if _missing(n, inputs)]
    if missing:
        raise ValueError(f"credit scheme {name!r} needs {missing}, which were not given")
    kwargs = {k: v for k, v in (options or {}).items() if k in scheme.options}
    w = scheme.fn(inputs, **kwargs)
    if w.shape != inputs.mask.shape:
        raise ValueError(
            f"credit scheme {name!r} returned {tuple(w.shape)}, expected {tuple(inputs.mask.shape)}"
        )
    if granularity == "step":
        if inputs.step is None:
            raise ValueError("granularity 'step' needs CreditInputs.step")
        w = pool_by_step(w, inputs.step, inputs.mask)
    elif granularity != "token":
        raise ValueError(f"unknown granularity {granularity!r}; expected 'token' or 'step'")
    return w


def _missing(need: str, inp: CreditInputs) -> bool:
    fields = {
        "contrast": (inp.logp_pos, inp.logp_neg),
        "dists": (inp.dists,),
        "ref_dists": (inp.ref_dists,),
        "features": (inp.features,),
        "groups": (inp.advantages, inp.group_size),
    }[need]
    return any(f is None for f in fields)


# ---------------------------------------------------------------------------- the built-in schemes


@register_scheme("uniform", doc="GRPO / DAPO: every valid token gets w = 1.")
def uniform(inp: CreditInputs) -> Tensor:
    return uniform_weights(inp.mask)


@register_scheme(
    "gcpo",
    needs=("contrast",),
    doc="GCPO (Guidance Contrastive Policy Optimization, arXiv 2605.29198): k3 divergence between the "
    "positive and negative context at the sampled token, normalised per sequence (docs/concepts/credit.md#gcpo).",
)
def gcpo(inp: CreditInputs, normalization: str = "hist", top_fraction: float = 0.4, top_mass: float = 0.8,
         tau: float = 1.0) -> Tensor:  # fmt: skip
    return gcpo_weights(inp.logp_pos, inp.logp_neg, inp.mask, normalization, top_fraction, top_mass, tau)


@register_scheme(
    "dgpo",
    needs=("dists", "ref_dists"),
    doc="DGPO (arXiv 2605.03327, reconstructed): N·softmax(h·g/τ), Hellinger distance to the reference "
    "times the normalised-entropy gate (docs/concepts/credit.md#dgpo).",
)
def dgpo(inp: CreditInputs, tau: float = 0.5, kappa: float = 1.0, squared: bool = False) -> Tensor:
    scores = torch.zeros(inp.mask.shape, dtype=torch.float32, device=inp.mask.device)  # s [B, T]
    for (sl, lp), (sl_ref, lr) in zip(inp.dists(), inp.ref_dists(), strict=True):
        if sl != sl_ref:
            raise ValueError(f"policy and reference chunks differ: {sl} vs {sl_ref}")
        scores[:, sl] = dgpo_scores(lp, lr, kappa, squared).to(scores.device)
    return dgpo_weights_from_scores(scores, inp.mask, tau)


@register_scheme(
    "stage",
    needs=("features", "groups"),
    doc="STAGE similarity credit: tokens unlike the same position in opposite-advantage group members "
    "get more credit (docs/concepts/credit.md#stage).",
)
def stage(inp: CreditInputs) -> Tensor:
    return stage_weights(inp.features, inp.advantages, inp.group_size, inp.mask)
