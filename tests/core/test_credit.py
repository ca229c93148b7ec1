"""Unit and property tests for t2i_gcpo.core.credit (docs/concepts/credit.md)."""

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from t2i_gcpo.core import CREDIT_SCHEMES  # noqa: E402
from t2i_gcpo.core.credit import (
    dgpo_weights,
    gcpo_divergence,
    gcpo_weights,
    hellinger_sq,
    hist_alpha,
    normalize_credit,
    stage_weights,
    uniform_weights,
)

FAST = settings(max_examples=40, deadline=None)
ALPHA = math.log(0.2) / math.log(0.6) - 1  # 2.1507
ln = math.log


def row(*xs):
    return torch.tensor([list(xs)], dtype=torch.float32)


# ---------------------------------------------------------------- hand-computed values


def test_registry_and_uniform():
    # the registry is what core/schemes/ holds: one module per scheme, each registering itself
    files = Path(CREDIT_SCHEMES["uniform"].fn.__code__.co_filename).parent.glob("*.py")
    modules = {p.stem for p in files} - {"__init__", "registry"}
    assert {s.fn.__module__.rsplit(".", 1)[1] for s in CREDIT_SCHEMES.values()} == modules
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert torch.equal(uniform_weights(mask), torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))


def test_gcpo_divergence_values_and_clamps():
    pos = torch.log(torch.tensor([0.5, 0.5, 0.3, 1e-30, 1.0, 0.0]))
    neg = torch.log(torch.tensor([0.25, 1.0, 0.3, 1.0, 1e-30, 0.0]))  # last: both −inf (Δ undefined)
    # Δ = ln .5 → .5 + ln2 − 1 ; Δ = ln 2 → 1 − ln2 ; Δ = 0 → 0 ; Δ = ±69 → clamp ±20 → d clamp 10 ; NaN → 0
    expected = torch.tensor([0.5 + ln(2) - 1, 1 - ln(2), 0.0, 10.0, 10.0, 0.0])
    torch.testing.assert_close(gcpo_divergence(pos, neg), expected)
    with pytest.raises(ValueError):
        gcpo_divergence(torch.zeros(2, 3), torch.zeros(2, 4))


def test_hist_alpha_official_value_and_checks():
    assert hist_alpha() == pytest.approx(2.151, abs=1e-3)
    assert hist_alpha(0.5, 0.5) == pytest.approx(0.0)  # x = y: uniform
    for x, y in [(0.0, 0.8), (0.4, 1.0), (0.6, 0.4)]:
        with pytest.raises(ValueError):
            hist_alpha(x, y)


def test_hist_n5_hand_computed():
    # d = [.3, .1, .5, .2, .4] → ranks [3, 1, 5, 2, 4] → p = [.6, .2, 1, .4, .8]
    # p^α = [1/3 (since .6^(α+1) = .2), .03139, 1, .13937, .61884], Σ = 2.12293
    # w = 5·p^α/Σ = [.78508, .07392, 2.35523, .32825, 1.45752]
    w = normalize_credit(row(0.3, 0.1, 0.5, 0.2, 0.4), torch.ones(1, 5))
    torch.testing.assert_close(w, row(0.78508, 0.07392, 2.35523, 0.32825, 1.45752), atol=1e-4, rtol=0)
    pa = [p**ALPHA for p in (0.6, 0.2, 1.0, 0.4, 0.8)]
    torch.testing.assert_close(w, row(*[5 * x / sum(pa) for x in pa]))


def test_hist_ties_share_the_average_rank():
    # d = [1, 1, 2, 0]: ranks [2.5, 2.5, 4, 1] → p = [.625, .625, 1, .25]
    pa = [p**ALPHA for p in (0.625, 0.625, 1.0, 0.25)]
    w = normalize_credit(row(1.0, 1.0, 2.0, 0.0), torch.ones(1, 4))
    torch.testing.assert_close(w, row(*[4 * x / sum(pa) for x in pa]))
    assert w[0, 0] == w[0, 1]
    # a constant row (no contrast at all, e.g. d = 0 everywhere) is uniform, not biased by position
    assert torch.equal(normalize_credit(torch.zeros(2, 7), torch.ones(2, 7)), torch.ones(2, 7))


def test_hist_official_constants_large_n():
    N = 10_000
    d = torch.rand(1, N, generator=torch.Generator().manual_seed(0))
    w = gcpo_weights(torch.zeros(1, N), d.sqrt(), torch.ones(1, N))  # Δ = √u ≥ 0: d increasing in u
    s = w[0].sort(descending=True).values
    assert s.sum().item() == pytest.approx(N, rel=1e-5)
    assert (s[: int(0.4 * N)].sum() / N).item() == pytest.approx(0.8, abs=0.01)
    assert s.max().item() == pytest.approx(3.14, abs=0.02)
    assert s.median().item() == pytest.approx(0.71, abs=0.01)


def test_softmax_mean_none_hand_computed():
    mask = torch.tensor([[1, 1, 1, 0]])
    # softmax τ = 1: d = [0, ln2, ln3] → e^d = [1, 2, 3]/6 → 3·that = [.5, 1, 1.5]; τ = 2 on 2d: same
    d = row(0.0, ln(2), ln(3), 99.0)
    torch.testing.assert_close(normalize_credit(d, mask, "softmax"), row(0.5, 1.0, 1.5, 0.0))
    torch.testing.assert_close(normalize_credit(2 * d, mask, "softmax", tau=2.0), row(0.5, 1.0, 1.5, 0.0))
    # mean: d = [1, 2, 3] → mean 2 → [.5, 1, 1.5]; all-zero d → ones
    torch.testing.assert_close(
        normalize_credit(row(1.0, 2.0, 3.0, 7.0), mask, "mean"), row(0.5, 1.0, 1.5, 0.0)
    )
    torch.testing.assert_close(normalize_credit(torch.zeros(1, 4), mask, "mean"), row(1.0, 1.0, 1.0, 0.0))
    # none: d·m, not mass-preserving
    torch.testing.assert_close(
        normalize_credit(row(1.0, 2.0, 3.0, 7.0), mask, "none"), row(1.0, 2.0, 3.0, 0.0)
    )
    # through gcpo_weights: Δ = ln2 at token 1 only → d = [0, 1−ln2, 0] → mean = (1−ln2)/3 → [0, 3, 0]
    pos = torch.log(row(0.5, 0.5, 0.5, 0.5))
    neg = torch.log(row(0.5, 1.0, 0.5, 0.5))
    torch.testing.assert_close(gcpo_weights(pos, neg, mask, "mean"), row(0.0, 3.0, 0.0, 0.0))


def test_hellinger_hand_values():
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.25, 0.25]]))
    lq = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.25, 0.25, 0.5]]))
    # BC = 2·√.125 + .25 = .95711 → H² = .04289
    torch.testing.assert_close(hellinger_sq(lp, lq), torch.tensor([0.0, 1 - (0.25 + 2 * math.sqrt(0.125))]))
    disjoint = hellinger_sq(torch.tensor([100.0, -100.0]), torch.tensor([-100.0, 100.0]))
    assert disjoint.item() == pytest.approx(1.0)


def test_dgpo_two_tokens_three_vocab_hand_computed():
    policy = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.5, 0.25, 0.25]]]))
    ref = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.25, 0.25, 0.5]]]))
    mask = torch.ones(1, 2)
    # token 0: π = π_ref → s = 0. token 1: h = √.04289 = .20711, entropy(π) = 1.03972,
    # g = 1.03972/ln3 = .94639, s = .19600; τ = .5 → w = 2·softmax([0, .39201]) = [.80647, 1.19353]
    h2 = 1 - (0.25 + 2 * math.sqrt(0.125))
    g = -(0.5 * ln(0.5) + 0.5 * ln(0.25)) / ln(3)
    for squared, h in [(False, math.sqrt(h2)), (True, h2)]:
        e = math.exp(h * g / 0.5)
        w = dgpo_weights(policy, ref, mask, tau=0.5, squared=squared)
        torch.testing.assert_close(w, row(2 / (1 + e), 2 * e / (1 + e)))
    assert dgpo_weights(policy, ref, mask)[0, 0].item() == pytest.approx(0.80647, abs=1e-4)
    # κ = 0 removes the entropy gate: s = h
    e = math.exp(math.sqrt(h2) / 0.5)
    torch.testing.assert_close(dgpo_weights(policy, ref, mask, kappa=0.0), row(2 / (1 + e), 2 * e / (1 + e)))


def _stage_pair():
    # sample 0: every position (1, 0); sample 1: same direction, orthogonal, opposite
    e = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]], [[2.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]])
    return e, torch.tensor([1.0, -1.0])


def test_stage_group_of_two_hand_computed():
    e, A = _stage_pair()
    mask = torch.ones(2, 3)
    # sim = [1, 0, −1] → raw (1 − sim)/2 = [0, .5, 1] → rescaled to Σ = 3: [0, 1, 2] for both members
    w = stage_weights(e, A, 2, mask)
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]]))
    # partner padded at t = 2: no comparison there → neutral raw .5: row 0 raw [0, .5, .5] → [0, 1.5, 1.5]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    torch.testing.assert_close(stage_weights(e, A, 2, mask), torch.tensor([[0.0, 1.5, 1.5], [0.0, 2.0, 0.0]]))


def test_stage_fallbacks_are_uniform():
    e, _ = _stage_pair()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # same-sign advantages: no opposite member → uniform
    assert torch.equal(stage_weights(e, torch.tensor([1.0, 0.5]), 2, mask), mask.float())
    # groups of one → uniform
    assert torch.equal(stage_weights(e, torch.tensor([1.0, -1.0]), 1, mask), mask.float())
    # identical embeddings with opposite signs → raw weights all 0 → uniform
    same = torch.randn(1, 3, 4).repeat(2, 1, 1) * torch.tensor([1.0, 3.0])[:, None, None]
    assert torch.equal(stage_weights(same, torch.tensor([1.0, -1.0]), 2, torch.ones(2, 3)), torch.ones(2, 3))
    # all A = 0 (flat group): every other member counts (A_i·A_j = 0 ≤ 0) → same as the opposite-sign case
    torch.testing.assert_close(
        stage_weights(e, torch.zeros(2), 2, torch.ones(2, 3)),
        stage_weights(e, torch.tensor([1.0, -1.0]), 2, torch.ones(2, 3)),
    )


def test_stage_group_of_three_averages_opposite_members_only():
    # one position, D = 2. A = [1, −1, −.5]: member 0 is compared with 1 and 2; 1 and 2 only with 0
    e = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [1.0, 0.0]], [[-1.0, 0.0], [1.0, 0.0]]])
    w = stage_weights(e, torch.tensor([1.0, -1.0, -0.5]), 3, torch.ones(3, 2))
    # t0: member 0 sim = (0 + −1)/2 = −.5 → raw .75; member 1 sim 0 → .5; member 2 sim −1 → 1
    # t1: identical everywhere → raw 0 → row weights [N·raw/Σraw] = [2, 0]
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.0], [2.0, 0.0], [2.0, 0.0]]))
    e[:, 1] = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])  # t1: member 0 orthogonal to 1 and 2
    w = stage_weights(e, torch.tensor([1.0, -1.0, -0.5]), 3, torch.ones(3, 2))
    # raw t1: member 0 → .5, members 1, 2 → .5 ; rows: [.75, .5], [.5, .5], [1, .5]
    torch.testing.assert_close(w, torch.tensor([[1.2, 0.8], [1.0, 1.0], [4 / 3, 2 / 3]]))


# ---------------------------------------------------------------- checks


def test_shape_checks_raise():
    m = torch.ones(2, 3)
    with pytest.raises(ValueError):
        uniform_weights(torch.ones(3))
    with pytest.raises(ValueError):
        gcpo_weights(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError):
        gcpo_weights(torch.zeros(2, 3), torch.zeros(2, 3), m, normalization="rank")
    with pytest.raises(ValueError):
        gcpo_weights(torch.zeros(2, 3), torch.zeros(2, 3), m, normalization="softmax", tau=0.0)
    with pytest.raises(ValueError):
        dgpo_weights(torch.zeros(2, 3), torch.zeros(2, 3), m)  # logits must be [B, T, V]
    with pytest.raises(ValueError):
        dgpo_weights(torch.zeros(2, 3, 4), torch.zeros(2, 3, 5), m)
    with pytest.raises(ValueError):
        dgpo_weights(torch.zeros(2, 3, 1), torch.zeros(2, 3, 1), m)  # |V| = 1
    with pytest.raises(ValueError):
        dgpo_weights(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), m, tau=-1.0)
    with pytest.raises(ValueError):
        hellinger_sq(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError):
        stage_weights(torch.zeros(2, 3, 4), torch.zeros(2), 3, m)  # B not a multiple of G
    with pytest.raises(ValueError):
        stage_weights(torch.zeros(2, 3, 4), torch.zeros(2, 1), 2, m)
    with pytest.raises(ValueError):
        stage_weights(torch.zeros(2, 3), torch.zeros(2), 2, m)


def test_no_nan_on_empty_and_one_token_rows():
    mask = torch.tensor([[0, 0, 0], [0, 1, 0]])
    g = torch.Generator().manual_seed(0)
    outs = [
        uniform_weights(mask),
        *[
            gcpo_weights(torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g), mask, n)
            for n in ("hist", "softmax", "mean")
        ],
        dgpo_weights(torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g), mask),
        stage_weights(torch.randn(2, 3, 4, generator=g), torch.tensor([1.0, -1.0]), 2, mask),
    ]
    for w in outs:
        assert torch.equal(w, mask.float())


# ---------------------------------------------------------------- properties


@st.composite
def batches(draw, max_t=8):
    P, G = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    B, T = P * G, draw(st.integers(1, max_t))
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T))).view(B, T)
    return G, mask, draw(st.integers(0, 2**31 - 1))


def all_schemes(G, mask, seed, pad=0):
    """Every mass-preserving scheme on random inputs; ``pad`` appends padding columns of junk."""
    g = torch.Generator().manual_seed(seed)
    B, T = mask.shape
    V, D = 5, 3
    pos, neg = torch.randn(B, T, generator=g) * 2, torch.randn(B, T, generator=g) * 2
    lp, lr = torch.randn(B, T, V, generator=g) * 3, torch.randn(B, T, V, generator=g) * 3
    emb, adv = torch.randn(B, T, D, generator=g), torch.randn(B, generator=g)
    if pad:  # append padding columns, and overwrite every padded input (old and new) with junk
        junk = torch.Generator().manual_seed(seed + 1)
        m = torch.cat([mask, torch.zeros(B, pad, dtype=mask.dtype)], dim=1)
        nan = float("nan")  # NaN for some inputs, huge values for others

        def fill(x, value):
            x = torch.cat([x, torch.zeros(B, pad, *x.shape[2:])], 1)
            value = value if isinstance(value, float) else value(x.shape)
            return torch.where(m.view(B, -1, *[1] * (x.dim() - 2)), x, value)

        big = lambda shape: torch.randn(shape, generator=junk) * 50  # noqa: E731
        pos, neg, lp, lr, emb = fill(pos, nan), fill(neg, big), fill(lp, nan), fill(lr, big), fill(emb, nan)
        mask = m
    return {
        "uniform": uniform_weights(mask),
        **{f"gcpo-{n}": gcpo_weights(pos, neg, mask, n, tau=0.7) for n in ("hist", "softmax", "mean")},
        "dgpo": dgpo_weights(lp, lr, mask),
        "dgpo-sq": dgpo_weights(lp, lr, mask, squared=True, kappa=2.0),
        "stage": stage_weights(emb, adv, G, mask),
    }


@FAST
@given(batches())
def test_mass_preservation_under_arbitrary_masks(batch):
    G, mask, seed = batch
    n = mask.sum(dim=1).float()
    for name, w in all_schemes(G, mask, seed).items():
        assert torch.isfinite(w).all() and (w >= 0).all(), name
        assert torch.equal(w[~mask], torch.zeros(int((~mask).sum()))), name
        torch.testing.assert_close(w.sum(dim=1), n, rtol=1e-5, atol=1e-4, msg=name)
        one = mask.sum(dim=1) == 1
        torch.testing.assert_close(w[one].sum(dim=1), torch.ones(int(one.sum())), msg=name)


@FAST
@given(batches(), st.integers(1, 4))
def test_padding_never_changes_other_weights(batch, pad):
    G, mask, seed = batch
    T = mask.shape[1]
    plain, padded = all_schemes(G, mask, seed), all_schemes(G, mask, seed, pad=pad)
    for name in plain:
        torch.testing.assert_close(padded[name][:, :T], plain[name], msg=name)
        assert torch.equal(padded[name][:, T:], torch.zeros(mask.shape[0], pad)), name


MONOTONE = [torch.exp, lambda x: x**3 + x, torch.log1p, lambda x: 2 * x + 5, torch.sqrt]


@FAST
@given(st.lists(st.integers(0, 6), min_size=1, max_size=12), st.integers(0, len(MONOTONE) - 1))
def test_hist_invariant_to_monotone_transforms(levels, k):
    d = torch.tensor([levels], dtype=torch.float32) / 2  # integer levels → ties are exact
    mask = torch.ones_like(d)
    torch.testing.assert_close(normalize_credit(MONOTONE[k](d), mask), normalize_credit(d, mask))


@FAST
@given(st.permutations(list(range(12))), st.integers(0, 2**31 - 1))
def test_hist_gcpo_weights_depend_only_on_the_order_of_d(perm, seed):
    # Δ ∈ [0, 2.4] on distinct levels (d increasing in Δ ≥ 0, below the clamp at 10);
    # Δ' = 2.4·(Δ/2.4)² keeps the order, so hist weights are identical
    delta = torch.tensor([perm], dtype=torch.float32) * 0.2
    pos = torch.rand(1, 12, generator=torch.Generator().manual_seed(seed)) * -5
    mask = torch.ones(1, 12)
    w = gcpo_weights(pos, pos + delta, mask)
    w2 = gcpo_weights(pos, pos + 2.4 * (delta / 2.4) ** 2, mask)
    torch.testing.assert_close(w, w2)
    assert w[0, perm.index(11)] == w.max() and w[0, perm.index(0)] == w.min()


@FAST
@given(batches(), st.floats(0.05, 5.0))
def test_dgpo_uniform_when_policy_equals_reference(batch, tau):
    _, mask, seed = batch
    logits = torch.randn(*mask.shape, 7, generator=torch.Generator().manual_seed(seed)) * 4
    torch.testing.assert_close(dgpo_weights(logits, logits.clone(), mask, tau=tau), mask.float())


@FAST
@given(st.integers(0, 2**31 - 1), st.floats(0.01, 100.0))
def test_hellinger_in_unit_interval(seed, scale):
    g = torch.Generator().manual_seed(seed)
    h = hellinger_sq(torch.randn(3, 4, 6, generator=g) * scale, torch.randn(3, 4, 6, generator=g) * scale)
    assert h.shape == (3, 4) and (h >= 0).all() and (h <= 1).all()


def test_weights_carry_no_gradient():
    mask = torch.ones(2, 4)
    pos, neg = torch.randn(2, 4, requires_grad=True), torch.randn(2, 4, requires_grad=True)
    lp, lr = torch.randn(2, 4, 5, requires_grad=True), torch.randn(2, 4, 5, requires_grad=True)
    emb, adv = torch.randn(2, 4, 3, requires_grad=True), torch.randn(2, requires_grad=True)
    outs = [
        gcpo_weights(pos, neg, mask),
        normalize_credit(pos * 2, mask, "softmax"),
        gcpo_divergence(pos, neg),
        dgpo_weights(lp, lr, mask),
        hellinger_sq(lp, lr),
        stage_weights(emb, adv, 2, mask),
        uniform_weights(mask.requires_grad_(True)),
    ]
    assert not any(w.requires_grad for w in outs)
