"""Fetch what a credit scheme declares it needs (core/schemes.py) and nothing else, then call it.

The only place that knows where each input comes from: the rollout's recorded log-probs, a
teacher-forced pass of the policy or of a reference, the adapter's token features, whole groups.
Used by the train step, the step's credit-map figure and `t2i-gcpo credit-map`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch

from t2i_gcpo.core.schemes import CREDIT_SCHEMES, CreditInputs, CreditSchemeError, credit_weights, get_scheme
from t2i_gcpo.core.tree import Leaves, Tree
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import STEP_PREDICTIONS, STEP_REWARDS, Rollout
from t2i_gcpo.train.distributed import unwrap

TRAIN_CONTEXT = {"cond": "pos", "cfg": "guided"}  # rollout.train_logp → the policy's context name
# `Rollout.state` key: under advantage.reward_norm=per_reward, GDPO's decoupled rewards r̂ [B] float64 that a
# scheme reading the rewards gets in their place (train/collect.py `BatchCollector.decouple`)
CREDIT_REWARDS = "credit_rewards"


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


# a scheme's need → the `PolicyCapabilities` flag a family must declare to give it
NEED_CAPABILITY = {
    "dists": "full_dists",
    "ref_dists": "full_dists",
    "branches": "branching",
    "leaves": "branching",
    "step_rewards": "step_predictions",
}
CAPABILITY_WORDS = {
    "full_dists": "full next-token distributions",
    "branching": "branched rollouts",
    "step_predictions": "a full prediction at every reveal step (masked models)",
}


def check_capabilities(name: str, policy: Any, needs: Iterable[str] | None = None) -> None:
    """A one-line UserError when credit scheme `name` needs what the policy's family does not declare it
    can give (a run checks this before its directory exists); `needs`: only these of its needs."""
    model = unwrap(policy)
    wanted = get_scheme(name).needs if needs is None else get_scheme(name).needs & set(needs)
    for need in sorted(wanted):
        flag = NEED_CAPABILITY.get(need)
        if flag is not None and not getattr(model.capabilities, flag):
            raise UserError(
                f"credit scheme {name!r} needs {CAPABILITY_WORDS[flag]}, which this "
                f"{type(model).__name__} does not give (PolicyCapabilities.{flag}); choose "
                f"another scheme or model"
            )


def fetch_inputs(
    name: str,
    ro: Rollout,
    advantages: torch.Tensor | None,
    policy: Any,
    reference: Any,
    credit_cfg: Any,
    context: str,
    dists: Any = None,
) -> CreditInputs:
    """CreditInputs for scheme `name` on rollout `ro`, filled only where the scheme needs it.

    `dists`: the policy's distributions from a forward already made (else one is made on demand);
    `reference`: the policy that `ref_dists` come from (frozen initial or rollout snapshot)."""
    needs = get_scheme(name).needs
    model = unwrap(policy)
    check_capabilities(name, model, needs=("dists", "ref_dists"))  # what is fetched here
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
    # r(x̂_s), scored by the collector (`score_step_predictions`); missing: the scheme is refused
    if "step_rewards" in needs and STEP_REWARDS in ro.state:
        inp.step_rewards, inp.group_size = ro.state[STEP_REWARDS].to(ro.mask.device), ro.group_size
    return inp


def needs_step_rewards(name: str) -> bool:
    """Whether scheme `name` reads r(x̂_s): the train step then records and scores every reveal
    step's prediction."""
    return "step_rewards" in get_scheme(name).needs


@torch.no_grad()
def score_step_predictions(
    policy: Any,
    reward: Any,
    ro: Rollout,
    final: torch.Tensor,
    keep_outputs: bool = False,
    terms: list | None = None,
) -> tuple[torch.Tensor, int, list]:
    """r(x̂_s) [B, S] float (CPU) of the rollout's recorded predictions (``state[STEP_PREDICTIONS]``, [B, S,
    T]), each decoded and scored with `reward` as the samples were: one reward call of B outputs per step
    before the last; x̂_{S−1} is the sample itself, whose score `final` [B] is reused
    (docs/concepts/tree_credit.md#stepwise-rewards). → (step rewards, reward calls made, the decoded outputs
    of steps 0 … S − 2 when `keep_outputs`, else []).
    `terms` (a list): each step's per-term scores [B, K] are appended to it (steps 0 … S − 2; GDPO)."""
    from t2i_gcpo.rewards.combine import call_reward
    from t2i_gcpo.train.branches import per_term_scores

    if STEP_PREDICTIONS not in ro.state:
        raise ValueError("the rollout has no recorded step predictions (sample with record_predictions=True)")
    x = ro.state[STEP_PREDICTIONS]  # [B, S, T]
    S = x.shape[1]
    out = torch.empty(len(ro), S, dtype=torch.float32)
    out[:, -1] = final.detach().float().cpu()
    outputs = []
    metas = [p.meta for p in ro.prompts]
    for s in range(S - 1):
        decoded = unwrap(policy).decode(dataclasses.replace(ro, tokens=x[:, s]))
        scored = call_reward(reward, decoded, ro.texts, metas)
        out[:, s] = scored.scores.float().cpu()
        if terms is not None:
            terms.append(per_term_scores(reward, scored).cpu())
        if keep_outputs:
            outputs.append(decoded.cpu() if torch.is_tensor(decoded) else decoded)
    return out, S - 1, outputs


def step_reward_note(name: str, steps: int) -> str:
    """The line a run prints before it starts when scheme `name` scores every reveal step's prediction."""
    return (
        f"note: credit scheme '{name}' scores the model's prediction after each of the {steps} reveal steps: "
        f"{steps - 1} more reward calls per round, each trained sample scored {steps} times instead of once "
        "(budget/step_predictions, budget/reward_calls); a slow reward slows the run that much"
    )


def add_tree_inputs(
    inp: CreditInputs,
    name: str,
    ro: Rollout,
    rewards: torch.Tensor | None,
    tree: Tree | None,
    leaves: Leaves | None = None,
) -> CreditInputs:
    """Fill the sampled tokens, and the "rewards" / "branches" inputs where scheme `name` needs them: the
    batch's scores and its continuations' rewards per branch point (train/branches.py)."""
    needs = get_scheme(name).needs
    inp.tokens = ro.tokens
    dev = ro.mask.device
    if rewards is not None and CREDIT_REWARDS in ro.state:  # GDPO: the decoupled rewards (train/collect.py)
        rewards = ro.state[CREDIT_REWARDS]
    if "rewards" in needs and rewards is not None:
        inp.rewards, inp.group_size = rewards.to(dev), ro.group_size
    if "branches" in needs and tree is not None:
        inp.tree = tree.to(dev)
    if "leaves" in needs and leaves is not None and rewards is not None:
        inp.leaves, inp.rewards, inp.group_size = leaves.to(dev), rewards.to(dev), ro.group_size
    return inp


def returns_advantages(name: str) -> bool:
    """Whether scheme `name` returns token advantages [B, T] instead of credit weights."""
    return get_scheme(name).returns == "advantages"


def credit_share(token_advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """How a scheme's token advantages spread credit, drawn and logged as weights: w = |A_it|·N / Σ_t |A_it|
    per row (mass N, the row's valid tokens; 1 everywhere for a row whose advantages are all 0)."""
    a = torch.where(mask.bool(), token_advantages.abs().float(), 0.0)
    total = a.sum(dim=1, keepdim=True)
    n = mask.float().sum(dim=1, keepdim=True)
    return torch.where(total > 0, a * n / total.clamp_min(1e-30), mask.float())


def compute_weights(
    credit_cfg: Any,
    ro: Rollout,
    advantages: torch.Tensor | None,
    policy: Any,
    reference: Any,
    context: str,
    dists: Any = None,
    name: str | None = None,
    rewards: torch.Tensor | None = None,
    tree: Tree | None = None,
    leaves: Leaves | None = None,
) -> torch.Tensor:
    """w [B, T] of the configured scheme (or of `name`), without gradient; token advantages [B, T] for a
    scheme that returns them (`returns_advantages`). `rewards` [B], `tree` and `leaves` (`Batch.tree`,
    `Batch.leaves`): the batch's scores, continuations and tree groups, for schemes that need them."""
    name = name or credit_cfg.scheme
    inp = fetch_inputs(name, ro, advantages, policy, reference, credit_cfg, context, dists)
    add_tree_inputs(inp, name, ro, rewards, tree, leaves)
    options = scheme_options(credit_cfg, name)
    if name in CREDIT_SCHEMES:  # a built-in scheme's failure is a bug: its traceback stays
        with torch.no_grad():
            return credit_weights(name, inp, options, credit_cfg.granularity)
    try:  # a user's function (--credit): what went wrong in one line, naming it
        with torch.no_grad():
            w = credit_weights(name, inp, options, credit_cfg.granularity)
    except CreditSchemeError as e:
        raise UserError(str(e)) from None
    except Exception as e:
        raise UserError(f"credit scheme '{name}' failed: {type(e).__name__}: {e}") from e
    check_user_weights(name, w, inp.mask)
    return w


def check_user_weights(name: str, w: torch.Tensor, mask: torch.Tensor) -> None:
    """A user scheme's output is real numbers, and credit weights (not token advantages) are ≥ 0 on valid
    tokens: a weight scales its token's advantage, and a negative one would reverse it (the credit lift
    and the figures read weights as shares); else a one-line UserError naming the scheme."""
    if w.is_complex() or not w.is_floating_point():
        raise UserError(
            f"credit scheme '{name}' returned {w.dtype} weights, expected real numbers (a float tensor)"
        )
    negative = (w < 0) & mask.bool()
    if not returns_advantages(name) and negative.any():
        raise UserError(
            f"credit scheme '{name}' returned negative weights for {int(negative.sum())} valid token(s) "
            f"(min {float(w[negative].min()):.3g}): weights must be ≥ 0 (a scheme that returns signed token "
            "advantages says so: returns='advantages')"
        )


def check_user_credit(cfg: Any, policy: Any, prompts: list, dry: Callable[[], Any]) -> None:
    """Before the run directory exists: a user's credit function (``--credit file.py:function``) weighs
    the `dry` sample (train/run.dry_sample: one group of 2 of the first prompt, scored) as the update would
    call it — an exception, a wrong shape, NaN, complex or negative weights stop here in one line, not at
    step 1. (A scheme that needs continuations, tree groups or step rewards is left to the first step: they
    cost extra rollouts and reward calls.)"""
    from t2i_gcpo.core.advantages import group_advantages

    name = cfg.credit.scheme
    if (
        name in CREDIT_SCHEMES
        or not prompts
        or get_scheme(name).needs & {"branches", "leaves", "step_rewards"}
    ):
        return
    scored = dry()
    advantages = group_advantages(scored.reward.scores, 2)
    context = TRAIN_CONTEXT[cfg.rollout.train_logp]
    try:
        compute_weights(
            cfg.credit, scored.rollout, advantages, policy, policy, context, rewards=scored.reward.scores
        )
    except UserError as e:
        raise UserError(f"{e} (on a dry sample, before the run started)") from e.__cause__


def scheme_weights(
    credit_cfg: Any,
    ro: Rollout,
    advantages: torch.Tensor,
    policy: Any,
    reference: Any,
    context: str,
    names: tuple[str, ...],
    rewards: torch.Tensor | None = None,
    tree: Tree | None = None,
    leaves: Leaves | None = None,
) -> dict[str, torch.Tensor]:
    """Weights under each named scheme, for figures (a scheme returning token advantages: their
    `credit_share`); a scheme that needs a reference, rewards, continuations or step rewards is
    skipped without them."""
    out = {}
    for name in names:
        needs = get_scheme(name).needs
        if ("ref_dists" in needs and reference is None) or ("rewards" in needs and rewards is None):
            continue
        if ("branches" in needs and tree is None) or ("leaves" in needs and leaves is None):
            continue
        if "step_rewards" in needs and STEP_REWARDS not in ro.state:
            continue
        w = compute_weights(
            credit_cfg,
            ro,
            advantages,
            policy,
            reference,
            context,
            name=name,
            rewards=rewards,
            tree=tree,
            leaves=leaves,
        )
        out[name] = credit_share(w, ro.loss_mask) if returns_advantages(name) else w
    return out
