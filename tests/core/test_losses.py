"""Unit and invariance tests for t2i_gcpo.core.losses (docs/concepts/algorithms.md#policy-loss)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from t2i_gcpo.core.credit import gcpo_weights
from t2i_gcpo.core.losses import (
    AGGREGATIONS,
    aggregate,
    clipped_surrogate,
    gcpo_kl_reweight,
    kl_k3,
    policy_loss,
)

FAST = settings(max_examples=30, deadline=None)


# ---------------------------------------------------------------- surrogate


def test_clipped_surrogate_hand_cases():
    ratio = torch.tensor([[1.5, 0.5, 1.1, 1.5, 0.5, 1.25]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0, 1.0]])
    # ρ=1.5,Â=1: clipped high → −1.2 | ρ=0.5,Â=−1: clipped low → 0.8 | ρ=1.1,Â=1: unclipped → −1.1
    # ρ=1.5,Â=−1: unclipped → 1.5   | ρ=0.5,Â=1: unclipped → −0.5    | ρ=1.25: ε_high 0.2 → −1.2
    loss = clipped_surrogate(ratio, adv, 0.2, 0.2)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 0.8, -1.1, 1.5, -0.5, -1.2]]))
    # clip-higher (DAPO ε_high = 0.28): ρ = 1.25 is inside the range now → −1.25
    assert clipped_surrogate(ratio, adv, 0.2, 0.28)[0, 5].item() == pytest.approx(-1.25)


def test_clipped_tokens_have_zero_gradient():
    ratio = torch.tensor([[1.5, 0.5, 1.1, 1.5]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    clipped_surrogate(ratio, adv, 0.2, 0.2).sum().backward()
    # dL/dρ = −Â on the unclipped branch, 0 where clipped
    torch.testing.assert_close(ratio.grad, torch.tensor([[0.0, 0.0, -1.0, 1.0]]))


def test_dual_clip_bounds_negative_advantage_loss():
    ratio = torch.tensor([[5.0, 5.0, 2.0, 5.0]])
    adv = torch.tensor([[-1.0, -2.0, -1.0, 1.0]])
    # Â<0: L = min(ρ|Â|, 3|Â|) → 3, 6, 2 ; Â>0 untouched: −min(5, 1.2) = −1.2
    loss = clipped_surrogate(ratio, adv, 0.2, 0.2, dual_clip=3.0)
    torch.testing.assert_close(loss, torch.tensor([[3.0, 6.0, 2.0, -1.2]]))
    with pytest.raises(ValueError):
        clipped_surrogate(ratio, adv, 0.2, 0.2, dual_clip=0.9)


def test_surrogate_shape_checks():
    with pytest.raises(ValueError):
        clipped_surrogate(torch.ones(2, 3), torch.ones(2, 4), 0.2, 0.2)
    with pytest.raises(ValueError):
        clipped_surrogate(torch.ones(3), torch.ones(3), 0.2, 0.2)
    with pytest.raises(ValueError):
        clipped_surrogate(torch.ones(2, 3), torch.ones(2, 3), -0.1, 0.2)


# ---------------------------------------------------------------- aggregation

L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "kwargs", "expected"),
    [
        # seq 1: (1+2)/2 = 1.5, seq 2: 4/1 = 4 → (1.5+4)/2 = 2.75
        ("seq-mean-token-mean", {}, 2.75),
        # (1+2+4)/3
        ("token-mean", {}, 7 / 3),
        # (3/3 + 4/3)/2 = 7/6 with max_len = T = 3; (3/4 + 4/4)/2 = 0.875 with max_len = 4
        ("seq-mean-token-sum-norm", {}, 7 / 6),
        ("seq-mean-token-sum-norm", {"max_len": 4}, 0.875),
        # w = [[2,1,9],[.5,9,9]]: (2·1 + 1·2 + .5·4)/(2+1+.5) = 6/3.5
        ("weighted-token-mean", {"weights": torch.tensor([[2.0, 1.0, 9.0], [0.5, 9.0, 9.0]])}, 12 / 7),
    ],
)
def test_aggregate_hand_computed(mode, kwargs, expected):
    assert aggregate(L, M, mode, **kwargs).item() == pytest.approx(expected)


def test_aggregate_fully_masked_row_and_nan_padding():
    per_tok = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0], [float("nan")] * 3])
    per_tok.requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    # the empty third row is left out of the sequence count → still 2.75
    assert aggregate(per_tok, mask, "seq-mean-token-mean").item() == pytest.approx(2.75)
    assert aggregate(per_tok, mask, "token-mean").item() == pytest.approx(7 / 3)
    # Dr. GRPO's normaliser is constant: the empty row counts in the 1/B → (1 + 4/3 + 0)/3
    out = aggregate(per_tok, mask, "seq-mean-token-sum-norm")
    assert out.item() == pytest.approx(7 / 9)
    out.backward()
    assert torch.isfinite(per_tok.grad).all()
    torch.testing.assert_close(per_tok.grad, mask.float() / 9)


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_aggregate_all_masked_is_zero_with_graph(mode):
    x = torch.randn(2, 3, requires_grad=True)
    kw = {"weights": torch.ones(2, 3)} if mode == "weighted-token-mean" else {}
    out = aggregate(x, torch.zeros(2, 3), mode, **kw)
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    assert torch.equal(x.grad, torch.zeros(2, 3))


def test_aggregate_weighted_all_zero_weights_is_zero():
    assert aggregate(L, M, "weighted-token-mean", weights=torch.zeros(2, 3)).item() == 0.0


def test_aggregate_checks():
    with pytest.raises(ValueError):
        aggregate(L, M, "sum")
    with pytest.raises(ValueError):
        aggregate(L, M[:, :2], "token-mean")
    with pytest.raises(ValueError):
        aggregate(L, M, "weighted-token-mean")  # needs weights
    with pytest.raises(ValueError):
        aggregate(L, M, "weighted-token-mean", weights=torch.ones(2, 2))
    with pytest.raises(ValueError):
        aggregate(L, M, "token-mean", weights=torch.ones(2, 3))  # weights would be silently ignored
    with pytest.raises(ValueError):
        aggregate(L, M, "seq-mean-token-sum-norm", max_len=0)


# ---------------------------------------------------------------- KL


def test_kl_k3_values():
    logp = torch.log(torch.tensor([0.5, 0.5, 0.3]))
    ref = torch.log(torch.tensor([0.25, 1.0, 0.3]))
    # q = ln 0.5: 0.5 + ln2 − 1 = 0.19315 ; q = ln 2: 2 − ln2 − 1 = 0.30685 ; q = 0: 0
    torch.testing.assert_close(kl_k3(logp, ref), torch.tensor([0.5 + math.log(2) - 1, 1 - math.log(2), 0.0]))
    with pytest.raises(ValueError):
        kl_k3(torch.zeros(2), torch.zeros(3))


def test_gcpo_kl_reweight_values():
    w = torch.tensor([0.0, 0.5, 0.75, 1.0, 3.0])
    # 2 − 2w = [2, 1, .5, 0, −4] → clamp [1, 1, .5, 0, 0] → 0.5 + 0.5·that
    torch.testing.assert_close(gcpo_kl_reweight(w), torch.tensor([1.0, 1.0, 0.75, 0.5, 0.5]))


# ---------------------------------------------------------------- policy_loss


def _batch(seed=0, B=4, T=6):
    g = torch.Generator().manual_seed(seed)
    logp = (torch.rand(B, T, generator=g) * -3).requires_grad_(True)
    logp_old = logp.detach() + 0.3 * torch.randn(B, T, generator=g)  # some ratios clip
    logp_ref = logp.detach() + 0.2 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    mask = torch.ones(B, T)
    mask[0, 4:] = 0
    mask[2, 1:] = 0
    return logp, logp_old, logp_ref, adv, mask


def _grad(loss, x):
    (g,) = torch.autograd.grad(loss, x)
    return g


def test_uniform_weights_equal_grpo_written_directly():
    logp, logp_old, logp_ref, adv, mask = _batch()
    beta = 0.04
    loss, _ = policy_loss(
        logp,
        logp_old,
        adv,
        mask,
        weights=torch.ones_like(mask),
        eps_low=0.2,
        eps_high=0.2,
        aggregation="seq-mean-token-mean",
        logp_ref=logp_ref,
        beta=beta,
    )
    # GRPO Eq. 3: 1/G Σ_i 1/|o_i| Σ_t [−min(ρA, clip(ρ)A) + β·k3]
    ratio = torch.exp(logp - logp_old)
    A = adv[:, None]
    per_tok = -torch.min(ratio * A, ratio.clamp(0.8, 1.2) * A)
    q = logp_ref - logp
    per_tok = per_tok + beta * (torch.exp(q) - q - 1)
    direct = ((per_tok * mask).sum(1) / mask.sum(1)).mean()
    torch.testing.assert_close(loss, direct)
    torch.testing.assert_close(_grad(loss, logp), _grad(direct, logp))


def test_uniform_weights_equal_dapo_written_directly():
    logp, logp_old, _, adv, mask = _batch(seed=1)
    loss, _ = policy_loss(
        logp,
        logp_old,
        adv,
        mask,
        weights=torch.ones_like(mask),
        eps_low=0.2,
        eps_high=0.28,
        aggregation="token-mean",
    )
    # DAPO Eq. 10/12: one mean over all valid tokens of the batch, clip-higher
    ratio = torch.exp(logp - logp_old)
    A = adv[:, None]
    direct = (-torch.min(ratio * A, ratio.clamp(0.8, 1.28) * A) * mask).sum() / mask.sum()
    torch.testing.assert_close(_grad(loss, logp), _grad(direct, logp))
    # weights=None is the same as uniform weights
    loss_none, _ = policy_loss(logp, logp_old, adv, mask, eps_high=0.28, aggregation="token-mean")
    torch.testing.assert_close(loss_none, loss)


def test_weighted_token_mean_with_mass_preserving_weights_equals_token_mean():
    # Σ m·w·ℓ(A)/Σ m·w = Σ m·ℓ(A·w)/Σ m when Σ_t m·w = N_i and w ≥ 0 (min is positively homogeneous)
    logp, logp_old, _, adv, mask = _batch(seed=2)
    g = torch.Generator().manual_seed(3)
    w = gcpo_weights(torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g), mask)
    kw = {"weights": w, "eps_low": 0.2, "eps_high": 0.28}
    weighted, _ = policy_loss(logp, logp_old, adv, mask, aggregation="weighted-token-mean", **kw)
    token, _ = policy_loss(logp, logp_old, adv, mask, aggregation="token-mean", **kw)
    torch.testing.assert_close(weighted, token)
    torch.testing.assert_close(_grad(weighted, logp), _grad(token, logp))
    # …whereas the surrogate really differs: a non-preserving weight breaks the equality
    w2 = w * torch.linspace(0.5, 2.0, 4)[:, None]
    a, _ = policy_loss(logp, logp_old, adv, mask, weights=w2, aggregation="weighted-token-mean")
    b, _ = policy_loss(logp, logp_old, adv, mask, weights=w2, aggregation="token-mean")
    assert not torch.allclose(a, b)


def test_policy_loss_stats_hand_computed():
    # one sequence, 4 valid tokens + 1 padding; A = 1, ratios [1.5, 1.0, 0.5, 1.1] (+ junk padding)
    ratio = torch.tensor([[1.5, 1.0, 0.5, 1.1, 50.0]])
    logp = torch.log(ratio).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, stats = policy_loss(logp, torch.zeros(1, 5), torch.tensor([1.0]), mask)
    # L = −[1.2, 1.0, 0.5, 1.1] → mean −0.95 ; only ρ = 1.5 is clipped (Â > 0, ρ > 1.2)
    assert loss.item() == pytest.approx(-0.95)
    assert stats["loss/policy"].item() == pytest.approx(-0.95)
    assert stats["clip_frac"].item() == pytest.approx(0.25)
    assert stats["ratio/mean"].item() == pytest.approx(4.1 / 4)
    assert stats["loss/kl"].item() == 0.0 and "kl_k3" not in stats
    assert all(not v.requires_grad and v.dim() == 0 for v in stats.values())
    # A = −1: ρ = 0.5 clips low, and with dual clip c = 1.4 ρ = 1.5 is capped too
    _, stats = policy_loss(logp, torch.zeros(1, 5), torch.tensor([-1.0]), mask, dual_clip=1.4)
    assert stats["clip_frac"].item() == pytest.approx(0.5)


def test_policy_loss_token_advantages_hand_computed():
    # two sequences; row 0: 3 valid tokens, row 1: 2 valid + junk padding. Token advantages [B, T]
    ratio = torch.tensor([[1.5, 1.0, 0.5], [0.7, 1.1, 9.0]])
    logp = torch.log(ratio).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([[2.0, -1.0, 0.5], [-1.0, 0.0, float("nan")]])
    loss, stats = policy_loss(logp, torch.zeros(2, 3), adv, mask, eps_low=0.2, eps_high=0.2)
    # −min(ρA, clip(ρ)A): 2·1.2 (clipped), −1·1.0, 0.5·0.5, −1·0.8 (clipped: min(−0.7, −0.8)), 0
    per_token = [-2.4, 1.0, -0.25, 0.8, 0.0]
    assert loss.item() == pytest.approx(sum(per_token) / 5)
    assert stats["clip_frac"].item() == pytest.approx(2 / 5)
    # d/dlogp of −ρA/5 where unclipped: tokens (0,1), (0,2), (1,1); clipped ones and padding get 0
    grad = _grad(loss, logp)
    expected = torch.tensor([[0.0, 1.0 / 5, -0.25 / 5], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(grad, expected)
    # weights still multiply: Â = A_it·w_it; and [B] advantages equal their broadcast [B, T]
    w = torch.tensor([[2.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss_w, _ = policy_loss(logp, torch.zeros(2, 3), adv.nan_to_num(0.0), mask, weights=w)
    assert loss_w.item() == pytest.approx((-2.4 * 2 + 1.0 + 0.8) / 5)
    seq = torch.tensor([1.0, -2.0])
    a, _ = policy_loss(logp, torch.zeros(2, 3), seq, mask, aggregation="seq-mean-token-mean")
    b, _ = policy_loss(
        logp, torch.zeros(2, 3), seq[:, None].expand(2, 3), mask, aggregation="seq-mean-token-mean"
    )
    torch.testing.assert_close(a, b)


def test_policy_loss_kl_and_reweighting():
    logp, logp_old, logp_ref, adv, mask = _batch(seed=4)
    w = torch.rand(4, 6, generator=torch.Generator().manual_seed(5)) * 2
    loss0, s0 = policy_loss(logp, logp_old, adv, mask, weights=w, logp_ref=logp_ref, beta=0.0)
    loss1, s1 = policy_loss(
        logp, logp_old, adv, mask, weights=w, logp_ref=logp_ref, beta=0.5, kl_reweight=True
    )
    k3 = kl_k3(logp.detach(), logp_ref)
    expected_kl = aggregate(k3 * gcpo_kl_reweight(w), mask, "token-mean")
    torch.testing.assert_close(s1["loss/kl"], expected_kl)
    torch.testing.assert_close(loss1, loss0 + 0.5 * expected_kl)
    torch.testing.assert_close(s0["kl_k3"], (k3 * mask).sum() / mask.sum())
    assert s0["loss/kl"].item() == pytest.approx(aggregate(k3, mask, "token-mean").item())


def test_policy_loss_nan_padding_is_harmless():
    logp, logp_old, logp_ref, adv, mask = _batch(seed=6)
    junk = torch.where(mask.bool(), torch.zeros(()), torch.tensor(float("nan")))
    for mode in AGGREGATIONS:
        loss, stats = policy_loss(
            logp + junk,
            logp_old - junk,
            adv,
            mask,
            weights=torch.ones(4, 6) + junk,
            aggregation=mode,
            logp_ref=logp_ref + junk,
            beta=0.1,
        )
        grad = _grad(loss, logp)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert all(torch.isfinite(v) for v in stats.values())
        assert torch.equal(grad[~mask.bool()], torch.zeros(int((mask == 0).sum())))


def test_policy_loss_all_masked_is_zero_not_nan():
    logp = torch.randn(2, 3, requires_grad=True)
    for mode in AGGREGATIONS:
        loss, stats = policy_loss(logp, torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3), aggregation=mode)
        assert loss.item() == 0.0 and stats["clip_frac"].item() == 0.0
        assert torch.equal(_grad(loss, logp), torch.zeros(2, 3))


def test_policy_loss_shape_and_option_checks():
    logp, logp_old, logp_ref, adv, mask = _batch()
    with pytest.raises(ValueError):
        policy_loss(logp, logp_old, adv[:, None], mask)
    with pytest.raises(ValueError):
        policy_loss(logp, logp_old[:, :3], adv, mask)
    with pytest.raises(ValueError):
        policy_loss(logp, logp_old, adv, mask, weights=torch.ones(4, 5))
    with pytest.raises(ValueError):
        policy_loss(logp, logp_old, adv, mask, logp_ref=logp_ref[:2])
    with pytest.raises(ValueError):
        policy_loss(logp, logp_old, adv, mask, beta=0.1)  # no reference
    with pytest.raises(ValueError):
        policy_loss(logp, logp_old, adv, mask, kl_reweight=True)  # no weights
    with pytest.raises(ValueError):
        policy_loss(logp, logp_old, adv, mask, aggregation="sum")
    with pytest.raises(ValueError):
        policy_loss(logp[0], logp_old[0], adv[:1], mask[0])


@FAST
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(AGGREGATIONS), scale=st.floats(0.1, 10))
def test_policy_loss_scales_linearly_with_advantage(seed, mode, scale):
    # every mode is linear in A for a fixed ratio (clip regions depend only on sign(A))
    logp, logp_old, _, adv, mask = _batch(seed=seed)
    a, _ = policy_loss(logp, logp_old, adv, mask, aggregation=mode)
    b, _ = policy_loss(logp, logp_old, scale * adv, mask, aggregation=mode)
    torch.testing.assert_close(b, scale * a, rtol=1e-5, atol=1e-6)


def test_policy_loss_bf16_inputs_computed_in_fp32():
    logp, logp_old, logp_ref, adv, mask = _batch(seed=7)
    ref, _ = policy_loss(logp.detach().bfloat16().float(), logp_old.bfloat16().float(), adv, mask)
    loss, _ = policy_loss(logp.detach().bfloat16(), logp_old.bfloat16(), adv, mask)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref)
