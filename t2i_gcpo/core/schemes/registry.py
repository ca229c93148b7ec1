"""The credit-scheme registry (docs/concepts/credit.md#registry): each scheme is a named pure function that
declares what it needs; the train step fetches exactly that and nothing else.

A scheme is ``fn(inputs: CreditInputs, **options) -> w [B, T]`` (no gradient, mass-preserving),
registered with the inputs it reads, in a module of its own in this package:

    @register_scheme("mine", needs=("contrast",), doc="…")
    def mine(inp: CreditInputs, alpha: Annotated[float, Option("α: …", low=0)] = 1.0) -> Tensor:
        import torch  # here, not at the top: listing the registry (`--help`) loads no torch

Needs (the fields of `CreditInputs` they fill):
- ``contrast``  — logp_pos, logp_neg: the sampled tokens' log-probs under the positive and the
                  negative context [B, T] (recorded while sampling, or recomputed)
- ``dists``     — dists: the trained policy's full next-token logits, an iterable of
                  (token slice, logits [B, t, V]) chunks (memory stays at one chunk)
- ``ref_dists`` — ref_dists: the same chunks for the reference policy (same slices)
- ``features``  — features [B, T, D]: per-token embeddings (the VQ code vectors for images)
- ``groups``    — advantages [B] and group_size: whole groups, so the weights are computed on the full
                  batch before it is split into minibatches
- ``rewards``   — rewards [B] (the samples' scores) and group_size, whole groups
- ``branches``  — tree (`core.tree.Tree`: points [B, K], rewards [B, K, M], exists [B, K, M]): the rewards
                  of M continuations sampled from each sample's branch points (the train step samples and
                  scores them only for a scheme that declares this; docs/concepts/tree_credit.md)
- ``leaves``    — leaves (`core.tree.Leaves`: root [B], point [B]): the group is a prefix tree whose every
                  leaf is a row of the batch — roots and their continuations, trained on (the train step
                  samples them for a scheme that declares this; docs/concepts/tree_credit.md#tree-groups)
- ``step_rewards`` — step_rewards [B, S] and group_size: r(x̂_s), the reward of the model's full prediction
                  after each of the S reveal steps of a masked model (the sampler records x̂_s and the train
                  step scores them only for a scheme that declares this;
                  docs/concepts/tree_credit.md#stepwise-rewards)
Always given: mask [B, T], tokens [B, T], step [B, T] (the step at which each token was decided) and
layout (the (rows, cols) token grid of an image, or None for a sequence).

A scheme returns credit weights w [B, T] (the token advantage is then A_i·w_it), or, registered with
``returns="advantages"``, the token advantages A_it [B, T] themselves (the loss uses them as they are).

Options are the keyword parameters after the first: the signature is their only declaration (name, type,
default; `Option` in an ``Annotated`` type adds the documentation and accepted range that the config
section ``credit.<name>.*`` and ``--help-config`` show). An option the function does not take is an
error, never dropped. ``granularity="step"`` pools the weights over the tokens decided at one step.

A user's own scheme (``--credit file.py:function``) is a function marked with `credit_scheme`; it is
added under its spec with `add_user_scheme` and found by `get_scheme` like a built-in one.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from t2i_gcpo.extensions import Registry

if TYPE_CHECKING:  # the registry loads without torch (what `--help` lists); the functions import it
    from torch import Tensor

    from t2i_gcpo.core.tree import Leaves, Tree

NEEDS = (
    "contrast",
    "dists",
    "ref_dists",
    "features",
    "groups",
    "rewards",
    "branches",
    "leaves",
    "step_rewards",
)
# the needs that read the rewards themselves (GDPO, advantage.reward_norm=per_reward, hands the shipped
# schemes that declare one its decoupled rewards: docs/concepts/algorithms.md#gdpo-and-credit-schemes)
REWARD_NEEDS = frozenset({"rewards", "branches", "leaves", "step_rewards"})
RETURNS = ("weights", "advantages")
Chunks = Iterable["tuple[slice, Tensor]"]


class CreditSchemeError(ValueError):
    """A scheme asked for what it cannot have (inputs, options) or returned unusable weights."""


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
    group_size: int | None = None  # G (groups, rewards)
    tokens: Tensor | None = None  # [B, T] long — the sampled tokens
    rewards: Tensor | None = None  # [B] (rewards)
    tree: Tree | None = None  # branch points and their continuations' rewards (branches)
    leaves: Leaves | None = None  # each row's root and branch point in its tree group (leaves)
    step_rewards: Tensor | None = None  # [B, S] — r(x̂_s) of each reveal step's full prediction (step_rewards)


@dataclass(frozen=True)
class Option:
    """An option's documentation and accepted range, attached to its parameter with ``Annotated``
    (bounds as the config's: `low` ≤ v ≤ `high`, strict with `low_open` / `high_open`; `why` explains)."""

    doc: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""


@dataclass(frozen=True)
class SchemeOption:
    """One keyword option of a scheme, read from its signature."""

    name: str
    type: Any  # the annotation without Annotated; Any when there is none
    default: Any  # inspect.Parameter.empty: the option must be given
    info: Option | None = None

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty


@dataclass(frozen=True)
class CreditScheme:
    name: str
    fn: Callable[..., Tensor]
    needs: frozenset[str]
    doc: str
    specs: tuple[SchemeOption, ...] = field(default=())  # the keyword options the function takes
    any_options: bool = False  # the function takes **kwargs
    # cross-option check: options → None, or (option name, what is wrong) for a one-line error
    check: Callable[[dict[str, Any]], tuple[str, str] | None] | None = None
    returns: str = "weights"  # or "advantages": token advantages [B, T] (RETURNS)
    # weights: Σ_t m·w = N per sequence (the loss's scale unchanged); False for a scheme that gates tokens
    # off without giving their share to others (eg_grpo by default)
    mass_preserving: bool = True

    @property
    def options(self) -> tuple[str, ...]:
        """The names of the keyword options."""
        return tuple(o.name for o in self.specs)

    def describe_options(self) -> str:
        return ", ".join(self.options) or "none"


# the built-in schemes, one module each in this package (t2i_gcpo/extensions.py), and any registered in code
CREDIT_SCHEMES: Registry[CreditScheme] = Registry(
    "credit scheme", builtins="t2i_gcpo.core.schemes", skip=("registry",)
)
USER_SCHEMES: dict[str, CreditScheme] = {}  # user functions, keyed by their spec ("file.py:function")


def scheme_from_function(
    name: str,
    fn: Callable[..., Tensor],
    needs: Iterable[str] = (),
    doc: str = "",
    check: Any = None,
    returns: str = "weights",
) -> CreditScheme:
    """A `CreditScheme` for `fn`, its options read from its signature; CreditSchemeError for unknown
    needs or a function that cannot take the inputs."""
    needs = tuple(needs)
    unknown = sorted(set(needs) - set(NEEDS))
    if unknown:
        raise CreditSchemeError(f"credit scheme {name!r}: unknown needs {unknown}; known: {', '.join(NEEDS)}")
    if returns not in RETURNS:
        raise CreditSchemeError(f"credit scheme {name!r}: returns must be one of {RETURNS}, got {returns!r}")
    if not callable(fn):
        raise CreditSchemeError(f"credit scheme {name!r} is not a function (it is a {type(fn).__name__})")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise CreditSchemeError(f"credit scheme {name!r}: its signature cannot be read") from None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if not params or params[0].kind not in positional:
        raise CreditSchemeError(
            f"credit scheme {name!r} must take the CreditInputs as its first argument: fn(inputs, **options)"
        )
    hints = option_types(fn, [p.name for p in params[1:]])
    options = []
    for p in params[1:]:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if p.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise CreditSchemeError(f"credit scheme {name!r}: option {p.name!r} must be a keyword argument")
        tp, info = hints.get(p.name, Any), None
        if typing.get_origin(tp) is typing.Annotated:
            tp, *extras = typing.get_args(tp)
            info = next((e for e in extras if isinstance(e, Option)), None)
        options.append(SchemeOption(p.name, tp, p.default, info))
    any_options = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    return CreditScheme(name, fn, frozenset(needs), doc, tuple(options), any_options, check, returns)


def option_types(fn: Callable, names: list[str]) -> dict[str, Any]:
    """The resolved annotations of `fn`'s options `names` (with their ``Annotated`` extras), each on its
    own: the inputs' and the result's annotations (tensors) may name torch, which a scheme's module
    imports only when it runs. An annotation that cannot be resolved leaves its option untyped. (The
    reward registry reads its rewards' options the same way.)"""
    annotations = getattr(fn, "__annotations__", {})
    context = getattr(inspect.unwrap(fn), "__globals__", {})
    hints = {}
    for name in names:
        if name in annotations:
            holder = types.SimpleNamespace(__annotations__={name: annotations[name]})
            try:
                hints[name] = typing.get_type_hints(holder, context, include_extras=True)[name]
            except Exception:
                continue
    return hints


def register_scheme(
    name: str,
    needs: tuple[str, ...] = (),
    doc: str = "",
    check: Any = None,
    returns: str = "weights",
    mass_preserving: bool = True,
) -> Callable:
    """Decorator: add `fn` to `CREDIT_SCHEMES` under `name`, with the inputs it needs (and, optionally,
    a `check` of its options together, see `CreditScheme`; `returns`: "weights" or "advantages";
    `mass_preserving`: whether its weights keep Σ_t m·w = N)."""

    def add(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        scheme = scheme_from_function(name, fn, needs, doc, check, returns)
        CREDIT_SCHEMES.add(dataclasses.replace(scheme, mass_preserving=mass_preserving), replace=True)
        return fn

    scheme_from_function(name, lambda inp: inp, needs, returns=returns)  # unknown needs fail here
    return add


def credit_scheme(needs: tuple[str, ...] = (), doc: str = "") -> Callable:
    """Decorator for a user's own credit scheme (``t2i-gcpo train --credit file.py:function``,
    docs/guides/custom-credit.md): declares the inputs it needs (any of `NEEDS`). It registers nothing;
    the function is added under its spec when a run names it. Same as setting ``fn.needs = (…)``."""

    def mark(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        name = getattr(fn, "__name__", None) or type(fn).__name__
        scheme_from_function(name, lambda inp: inp, needs)  # unknown needs: an error at import, naming fn
        fn.needs = tuple(needs)  # type: ignore[attr-defined]
        if doc:
            fn.credit_doc = doc  # type: ignore[attr-defined]
        return fn

    return mark


def add_user_scheme(spec: str, fn: Callable[..., Tensor]) -> CreditScheme:
    """Add the user function `fn` under `spec` (its declared needs from `credit_scheme` or ``fn.needs``);
    replaces an earlier function of the same spec (the file was loaded again)."""
    needs = getattr(fn, "needs", ())
    if isinstance(needs, str):
        needs = (needs,)
    doc = getattr(fn, "credit_doc", None) or (inspect.getdoc(fn) or "").split("\n")[0]
    USER_SCHEMES[spec] = scheme = scheme_from_function(spec, fn, needs, doc)
    return scheme


def get_scheme(name: str) -> CreditScheme:
    if name in CREDIT_SCHEMES:
        return CREDIT_SCHEMES[name]
    if name in USER_SCHEMES:
        return USER_SCHEMES[name]
    raise KeyError(f"unknown credit scheme {name!r}; registered: {', '.join(CREDIT_SCHEMES)}")


def check_options(scheme: CreditScheme, options: dict[str, Any]) -> dict[str, Any]:
    """`options` if `scheme` takes every one of them and each option it must be given is there, else a
    CreditSchemeError naming the scheme and its options."""
    if not scheme.any_options:
        unknown = [k for k in options if k not in scheme.options]
        if unknown:
            s = "s" if len(unknown) > 1 else ""
            raise CreditSchemeError(
                f"credit scheme {scheme.name!r} has no option{s} {', '.join(map(repr, unknown))} "
                f"(its options: {scheme.describe_options()})"
            )
    missing = [o.name for o in scheme.specs if o.required and o.name not in options]
    if missing:
        raise CreditSchemeError(f"credit scheme {scheme.name!r} needs the option(s) {', '.join(missing)}")
    return dict(options)


def pool_by_step(weights: Tensor, step: Tensor, mask: Tensor) -> Tensor:
    """Step granularity: every valid token gets the mean weight of the valid tokens of its row decided
    at the same step (mass-preserving; identity when each step decides one token, as in AR). No gradient."""
    import torch

    m = mask.bool()
    B, T = weights.shape
    key = step.long().clamp_min(0)  # [B, T]
    n_steps = int(key.max().item()) + 1 if key.numel() else 1
    w = torch.where(m, weights.detach().float(), torch.zeros_like(weights, dtype=torch.float32))
    total = w.new_zeros(B, n_steps).scatter_add_(1, key, w)  # [B, S]
    count = w.new_zeros(B, n_steps).scatter_add_(1, key, m.float())
    mean = total / count.clamp_min(1)
    return torch.where(m, mean.gather(1, key), torch.zeros_like(w))


def credit_weights(
    name: str, inputs: CreditInputs, options: dict[str, Any] | None = None, granularity: str = "token"
) -> Tensor:
    """w [B, T] of scheme `name` (token advantages for a scheme that returns them): checks that its declared
    inputs are present and that it takes every option given, checks what it returns (a [B, T] tensor, finite
    on valid tokens), and pools by step when asked."""
    import torch

    scheme = get_scheme(name)
    missing = [n for n in scheme.needs if _missing(n, inputs)]
    if missing:
        raise CreditSchemeError(f"credit scheme {name!r} needs {missing}, which were not given")
    w = scheme.fn(inputs, **check_options(scheme, options or {}))
    if not isinstance(w, torch.Tensor):
        raise CreditSchemeError(
            f"credit scheme {name!r} returned a {type(w).__name__}, expected a tensor [B, T]"
        )
    if w.shape != inputs.mask.shape:
        raise CreditSchemeError(
            f"credit scheme {name!r} returned {tuple(w.shape)}, expected {tuple(inputs.mask.shape)}"
        )
    bad = ~torch.isfinite(w) & inputs.mask.bool()
    if bad.any():
        raise CreditSchemeError(
            f"credit scheme {name!r} returned NaN/inf weights for {int(bad.sum())} valid token(s) "
            f"of {int(inputs.mask.bool().sum())}"
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
        "rewards": (inp.rewards, inp.group_size),
        "branches": (inp.tree,),
        "leaves": (inp.leaves, inp.rewards, inp.group_size),
        "step_rewards": (inp.step_rewards, inp.group_size, inp.step),
    }[need]
    return any(f is None for f in fields)
