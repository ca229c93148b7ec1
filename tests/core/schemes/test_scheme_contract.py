"""The contract around core/: Rollout containers, the credit registry, and the update's invariances
(gradient accumulation, shuffling within a group, uniform credit ≡ GRPO), on a tiny random prior."""

from __future__ import annotations

import pytest
import torch

from t2i_gcpo.config import TrainConfig
from t2i_gcpo.core import CREDIT_SCHEMES, CreditInputs, credit_weights, get_scheme, pool_by_step
from t2i_gcpo.core.losses import policy_loss
from t2i_gcpo.policies.ar import ARPolicy
from t2i_gcpo.policies.base import PromptRecord, Rollout, SamplingParams
from t2i_gcpo.policies.sampling import ChunkedDists
from t2i_gcpo.tasks.loop import group_generators
from t2i_gcpo.train.batch import Batch
from t2i_gcpo.train.update import update

from tiny_models import tiny_policy_dir

# ---------------------------------------------------------------------------- Rollout


def _rollout(b: int, t: int, g: int = 2, seed: int = 0) -> Rollout:
    gen = torch.Generator().manual_seed(seed)
    return Rollout(
        tokens=torch.randint(0, 9, (b, t), generator=gen),
        mask=torch.ones(b, t),
        step=torch.arange(t).expand(b, -1),
        logp={"pos": torch.randn(b, t, generator=gen), "neg": torch.randn(b, t, generator=gen)},
        prompts=[PromptRecord(f"p{i // g}", meta={"i": i}) for i in range(b)],
        group_size=g,
        state={"prompt_ids": torch.arange(b)[:, None].expand(b, 3), "names": [f"n{i}" for i in range(b)]},
    )


def test_rollout_select_and_concat_cover_every_per_sample_field():
    ro = _rollout(4, 5)
    sub = ro.select([3, 1])
    assert torch.equal(sub.tokens, ro.tokens[[3, 1]]) and torch.equal(sub.step, ro.step[[3, 1]])
    assert torch.equal(sub.logp["neg"], ro.logp["neg"][[3, 1]])
    assert [p.meta["i"] for p in sub.prompts] == [3, 1] and sub.state["names"] == ["n3", "n1"]
    assert torch.equal(sub.state["prompt_ids"][:, 0], torch.tensor([3, 1]))
    assert sub.group_size == 2 and sub.max_len == 5
    short = _rollout(2, 3, seed=1)
    both = Rollout.concat([ro, short])
    assert both.tokens.shape == (6, 5) and both.max_len == 5
    assert torch.equal(both.mask[4:], torch.tensor([[1.0, 1, 1, 0, 0]] * 2)), (
        "shorter rows are padded, masked"
    )
    assert torch.equal(both.logp["pos"][4:, :3], short.logp["pos"]) and both.state["names"][4:] == [
        "n0",
        "n1",
    ]
    assert torch.equal(Rollout.concat([ro.select([0, 1]), ro.select([2, 3])]).tokens, ro.tokens)


def test_pool_by_step_hand_computed():
    w = torch.tensor([[1.0, 3.0, 2.0, 6.0, 5.0]])
    step = torch.tensor([[0, 0, 1, 1, 2]])
    mask = torch.tensor([[1.0, 1, 1, 0, 1]])  # the padded token neither receives nor lends weight
    assert torch.allclose(pool_by_step(w, step, mask), torch.tensor([[2.0, 2.0, 2.0, 0.0, 5.0]]))
    ar = torch.arange(5).expand(1, -1)  # AR: one token a step → unchanged
    assert torch.equal(pool_by_step(w, ar, torch.ones(1, 5)), w)


# ---------------------------------------------------------------------------- the registry


def _full_inputs(B: int = 6, T: int = 16, V: int = 11, G: int = 3, seed: int = 0) -> CreditInputs:
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=gen) > 0.2).float()
    mask[0] = 0  # an empty row
    mask[1, 1:] = 0  # a one-token row
    logits, ref = torch.randn(B, T, V, generator=gen), torch.randn(B, T, V, generator=gen)
    chunks = lambda z: lambda: [(slice(s, s + 5), z[:, s : s + 5]) for s in range(0, T, 5)]  # noqa: E731
    return CreditInputs(
        mask=mask,
        step=torch.arange(T).expand(B, -1),
        layout=(4, 4),
        logp_pos=torch.randn(B, T, generator=gen),
        logp_neg=torch.randn(B, T, generator=gen),
        dists=chunks(logits),
        ref_dists=chunks(ref),
        features=torch.randn(B, T, 4, generator=gen),
        advantages=torch.randn(B, generator=gen),
        group_size=G,
    )


WEIGHT_SCHEMES = sorted(n for n, s in CREDIT_SCHEMES.items() if s.returns == "weights")  # vine, tempo:
# token advantages from rewards and branches (tests/core/test_tree_credit.py)


@pytest.mark.parametrize("name", WEIGHT_SCHEMES)
@pytest.mark.parametrize("granularity", ["token", "step"])
def test_every_registered_scheme_is_mass_preserving_and_b_by_t(name, granularity):
    for seed in range(3):
        inp = _full_inputs(seed=seed)
        w = credit_weights(name, inp, {}, granularity)
        assert w.shape == inp.mask.shape and not w.requires_grad
        assert torch.isfinite(w).all() and (w >= 0).all()
        assert (w[inp.mask == 0] == 0).all(), "padding gets no credit"
        if get_scheme(name).mass_preserving:
            assert torch.allclose((w * inp.mask).sum(1), inp.mask.sum(1), atol=1e-4), (
                f"{name}: mass not preserved"
            )
        else:  # a gate: every valid token's weight within [0, 2], and some mass kept
            assert (w <= 2).all() and ((w * inp.mask).sum(1) > 0)[inp.mask.sum(1) > 1].all(), name


def test_registry_checks_declared_needs_and_refuses_options_the_scheme_does_not_take():
    inp = _full_inputs()
    with pytest.raises(ValueError, match="needs"):
        credit_weights("gcpo", CreditInputs(mask=inp.mask))
    assert get_scheme("gcpo").needs == {"contrast"} and get_scheme("uniform").needs == set()
    # an option the function does not take is an error naming the scheme and its options, never dropped
    with pytest.raises(
        ValueError, match=r"'gcpo' has no option 'kappa' \(its options: normalization, top_fraction"
    ):
        credit_weights("gcpo", inp, {"normalization": "softmax", "tau": 0.5, "kappa": 3.0})
    b = credit_weights("gcpo", inp, {"normalization": "softmax", "tau": 0.5})
    assert not torch.equal(b, credit_weights("gcpo", inp, {}))  # its own options are used


def test_a_scheme_registered_elsewhere_is_trainable_by_name(tmp_path):
    """A new scheme is a function and a name: the config accepts it, and no trainer edit is needed."""
    from t2i_gcpo.core.schemes import CREDIT_SCHEMES as registry
    from t2i_gcpo.core.schemes import register_scheme

    @register_scheme("last_token_test", doc="all credit on the last valid token (test only)")
    def last_token(inp: CreditInputs) -> torch.Tensor:
        n = inp.mask.sum(1)
        w = torch.zeros_like(inp.mask)
        w[torch.arange(len(n)), (n - 1).clamp_min(0).long()] = n
        return w * inp.mask

    try:
        cfg = TrainConfig()
        cfg.credit.scheme = "last_token_test"
        cfg.validate()
        policy, ro, adv = _tiny_batch(tmp_path, perturb=False)
        _, weights = update(
            cfg,
            Batch(ro, adv, None, None),
            policy,
            None,
            None,
            torch.optim.SGD(policy.parameters(), lr=0.0),
            _Acc(),
        )
        assert torch.equal(weights[:, -1], torch.full((len(ro),), 16.0)) and weights[:, :-1].sum() == 0
    finally:
        registry.remove("last_token_test")


# ---------------------------------------------------------------------------- update invariances


class _Acc:
    """The slice of accelerate.Accelerator that `update` uses, for one process."""

    num_processes = 1
    device = torch.device("cpu")

    def backward(self, loss):
        loss.backward()

    def clip_grad_norm_(self, params, max_norm):
        return torch.nn.utils.clip_grad_norm_(list(params), max_norm)

    def no_sync(self, model):  # pragma: no cover - one process never asks
        raise AssertionError


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_policy_dir(tmp_path_factory.mktemp("contract"))


def _tiny_batch(tmp_path, tiny=None, seed=0, perturb=True):
    policy = ARPolicy.from_pretrained(str(tiny or tiny_policy_dir(tmp_path)))
    prompts = [PromptRecord("a photo of a red circle"), PromptRecord("a photo of two blue squares")]
    ro = policy.rollout(
        prompts, 4, SamplingParams(guidance_scale=2.0), group_generators(seed, "test", [0, 1])
    )
    gen = torch.Generator().manual_seed(seed)
    if perturb:
        ro.mask[:, 12:] = (torch.rand(len(ro), 4, generator=gen) > 0.5).float()  # variable lengths
        ro.logp["pos"] = ro.logp["pos"] + 0.1 * torch.randn(ro.logp["pos"].shape, generator=gen)  # ρ ≠ 1
    adv = torch.randn(len(ro), generator=gen)
    return policy, ro, adv


def _grads(cfg, policy, ro, adv, ref=None):
    policy.zero_grad(set_to_none=True)
    cfg.optim.grad_clip = 0.0
    snapshot = {k: v.clone() for k, v in policy.state_dict().items()}
    opt = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=1.0)
    stats, weights = update(cfg, Batch(ro, adv, None, None), policy, ref, ref, opt, _Acc())
    delta = {k: snapshot[k] - v for k, v in policy.state_dict().items() if not k.startswith("vq.")}
    policy.load_state_dict(snapshot)
    return delta, stats, weights


def _close(a, b, tol=1e-5):
    return all(torch.allclose(a[k], b[k], atol=tol, rtol=1e-4) for k in a)


AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "weighted-token-mean"]


@pytest.mark.parametrize("scheme", ["uniform", "gcpo", "dgpo", "stage", "critical"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_one_minibatch_of_8_equals_eight_of_1(tiny_dir, tmp_path, scheme, aggregation):
    policy, ro, adv = _tiny_batch(tmp_path, tiny_dir)
    ref = ARPolicy.from_pretrained(str(tiny_dir)).requires_grad_(False) if scheme == "dgpo" else None
    if ref is not None:  # a reference that differs from the policy, so DGPO's weights are not uniform
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(0.05 * torch.randn_like(p))
    results = []
    for minibatches in (1, 8):
        cfg = TrainConfig()
        cfg.credit.scheme, cfg.loss.aggregation, cfg.loss.beta = scheme, aggregation, 0.0
        cfg.optim.minibatches = minibatches
        results.append(_grads(cfg, policy, ro, adv, ref))
    (d1, s1, w1), (d8, s8, w8) = results
    assert torch.allclose(w1, w8, atol=1e-6), "weights depend on the split"
    assert _close(d1, d8), f"{scheme}/{aggregation}: the update depends on the minibatch split"
    assert abs(s1["loss/policy"] - s8["loss/policy"]) < 1e-5
    assert any(v.abs().max() > 0 for v in d1.values())


@pytest.mark.parametrize("scheme", ["uniform", "gcpo", "stage", "critical"])
def test_shuffling_samples_within_a_group_changes_nothing(tiny_dir, tmp_path, scheme):
    policy, ro, adv = _tiny_batch(tmp_path, tiny_dir)
    perm = torch.tensor([2, 0, 3, 1, 5, 7, 4, 6])  # within group 0 (rows 0–3) and group 1 (rows 4–7)
    cfg = TrainConfig()
    cfg.credit.scheme, cfg.loss.aggregation = scheme, "token-mean"
    d, _, w = _grads(cfg, policy, ro, adv)
    d_perm, _, w_perm = _grads(cfg, policy, ro.select(perm), adv[perm])
    assert torch.allclose(w[perm], w_perm, atol=1e-6)
    assert _close(d, d_perm)


def test_uniform_credit_is_grpo():
    """Uniform weights give GRPO's loss: seq-mean-token-mean of −min(ρA, clip(ρ)A), by hand."""
    gen = torch.Generator().manual_seed(0)
    logp, old = torch.randn(3, 4, generator=gen), torch.randn(3, 4, generator=gen)
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    adv = torch.tensor([0.5, -1.0, 2.0])
    w = credit_weights("uniform", CreditInputs(mask=mask))
    loss, _ = policy_loss(
        logp, old, adv, mask, weights=w, eps_low=0.2, eps_high=0.2, aggregation="seq-mean-token-mean"
    )
    ratio = (logp - old).exp()
    per = -torch.minimum(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None])
    by_hand = sum((per[i] * mask[i]).sum() / mask[i].sum() for i in range(3)) / 3
    assert torch.allclose(loss, by_hand)
    assert torch.equal(loss, policy_loss(logp, old, adv, mask, aggregation="seq-mean-token-mean")[0])


def test_dr_grpo_divides_by_the_samplers_max_length_not_the_batch_width(tiny_dir, tmp_path):
    policy, ro, adv = _tiny_batch(tmp_path, tiny_dir)
    cfg = TrainConfig()
    cfg.loss.aggregation = "seq-mean-token-sum-norm"
    _, s_full, _ = _grads(cfg, policy, ro, adv)
    ro_long = Rollout.concat([ro])
    ro_long.max_len = 2 * ro.max_len  # a sampler that could have produced twice as many tokens
    _, s_long, _ = _grads(cfg, policy, ro_long, adv)
    assert s_long["loss/policy"] == pytest.approx(s_full["loss/policy"] / 2, rel=1e-5)


def test_logprobs_dists_are_the_trained_distribution(tiny_dir, tmp_path):
    policy, ro, _ = _tiny_batch(tmp_path, tiny_dir, perturb=False)
    for ctx in ("pos", "neg", "guided"):
        logp, dists = policy.logprobs_and_dists(ro, ctx)
        assert isinstance(dists, ChunkedDists)
        full = dists.full()
        assert torch.allclose(
            full.log_softmax(-1).gather(-1, ro.tokens[..., None]).squeeze(-1), logp, atol=1e-5
        )
        assert torch.allclose(logp, ro.logp[ctx], atol=1e-4), "recorded while sampling = teacher-forced"
