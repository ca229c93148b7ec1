"""Tests for the critical-token credit scheme, t2i_gcpo.core.critical
(docs/concepts/credit.md#critical-token)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from t2i_gcpo.core.critical import critical_weights, entropy_gradient, group_similarity
from t2i_gcpo.core.schemes import CreditInputs, credit_weights, get_scheme

FAST = settings(max_examples=40, deadline=None)
GRID = (2, 5)  # T = 10: positions 0…4 on row 0, 5…9 on row 1


def pair_features(T=10, D=3, differ=(), seed=0):
    """Features [2, T, D] of a group of two: identical rows except at the positions in `differ`."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(1, T, D, generator=g).repeat(2, 1, 1)
    for t in differ:
        e[1, t] = -e[0, t] + torch.randn(D, generator=g)
    return e


def ones(B=2, T=10):
    return torch.ones(B, T)


def step(B=2, T=10):
    return torch.arange(T).expand(B, T).clone()


# ---------------------------------------------------------------- hand-computed cases


def test_three_distinct_tokens_get_n_over_3():
    # row 0: first = 0; entropy spike at 7 (grid neighbours 2, 6, 8 → |3 − 1| = 2, theirs 2/3);
    # features differ from row 1 only at 4 → least similar = 4. Union {0, 4, 7} → 10/3 each.
    # row 1: entropy spike at 0 (overlaps "first") → union {0, 4} → 10/2 each.
    entropy = torch.ones(2, 10)
    entropy[0, 7] = 3.0
    entropy[1, 0] = 3.0
    w = critical_weights(entropy, pair_features(differ=(4,)), step(), ones(), 2, GRID)
    expected = torch.zeros(2, 10)
    expected[0, [0, 4, 7]] = 10 / 3
    expected[1, [0, 4]] = 5.0
    torch.testing.assert_close(w, expected)
    assert w.shape == (2, 10) and w.dtype == torch.float32


def test_each_criterion_alone():
    entropy = torch.ones(2, 10)
    entropy[:, 7] = 3.0
    feats = pair_features(differ=(4,))
    cases = {(0.1, 0, 0): 0, (0, 0.1, 0): 7, (0, 0, 0.1): 4}
    for fractions, t in cases.items():
        w = critical_weights(entropy, feats, step(), ones(), 2, GRID, *fractions)
        expected = torch.zeros(2, 10)
        expected[:, t] = 10.0
        torch.testing.assert_close(w, expected, msg=str(fractions))


def test_all_criteria_on_one_token():
    entropy = torch.ones(2, 10)
    entropy[:, 0] = 5.0
    w = critical_weights(entropy, pair_features(differ=(0,)), step(), ones(), 2, GRID)
    expected = torch.zeros(2, 10)
    expected[:, 0] = 10.0
    torch.testing.assert_close(w, expected)


def test_decision_order_follows_step_ties_by_position():
    entropy, feats = torch.ones(1, 10), torch.ones(1, 10, 2)
    rev = torch.arange(9, -1, -1)[None]  # step 9 … 0: position 9 is decided first
    w = critical_weights(entropy, feats, rev, torch.ones(1, 10), 1, GRID, 0.2, 0, 0)
    assert w[0].nonzero().flatten().tolist() == [8, 9]
    masked = torch.tensor([[3, 3, 1, 1, 0, 0, 2, 2, 4, 4]])  # masked model: two tokens per step
    w = critical_weights(entropy, feats, masked, torch.ones(1, 10), 1, GRID, 0.3, 0, 0)
    assert w[0].nonzero().flatten().tolist() == [2, 4, 5]  # step 0: 4, 5; step 1: 2 (before 3)
    w = critical_weights(entropy, feats, None, torch.ones(1, 10), 1, GRID, 0.3, 0, 0)  # None → position
    assert w[0].nonzero().flatten().tolist() == [0, 1, 2]


def test_count_rounding():
    # k = max(1, round(f·N)), round half to even: N = 4 → 1, 15 → 2, 25 → 2, 35 → 4
    for n, k in [(4, 1), (15, 2), (25, 2), (35, 4), (10, 1)]:
        w = critical_weights(
            torch.ones(1, n), torch.ones(1, n, 2), None, torch.ones(1, n), 1, None, 0.1, 0, 0
        )
        assert w[0].nonzero().flatten().tolist() == list(range(k)), n
        torch.testing.assert_close(w.sum(), torch.tensor(float(n)))
    w = critical_weights(torch.ones(1, 4), torch.ones(1, 4, 2), None, torch.ones(1, 4), 1, None, 1.0, 0, 0)
    torch.testing.assert_close(w, torch.ones(1, 4))  # fraction 1: every token, weight 1


def test_entropy_gradient_grid_vs_sequence():
    h = torch.zeros(1, 10)
    h[0, 4] = 4.0  # end of grid row 0; in a sequence, 5 is its neighbour
    grid = torch.tensor([[0, 0, 0, 4 / 3, 4, 0, 0, 0, 0, 2]], dtype=torch.float64)  # 3: (0+4+0)/3; 9: (4+0)/2
    seq = torch.tensor([[0, 0, 0, 2, 4, 2, 0, 0, 0, 0]], dtype=torch.float64)  # 3, 5: (0+4)/2
    torch.testing.assert_close(entropy_gradient(h, torch.ones(1, 10), GRID), grid)
    torch.testing.assert_close(entropy_gradient(h, torch.ones(1, 10), None), seq)
    feats = torch.ones(1, 10, 2)
    k2 = dict(first_fraction=0, entropy_fraction=0.2, similarity_fraction=0)
    w_grid = critical_weights(h, feats, None, torch.ones(1, 10), 1, GRID, **k2)
    w_seq = critical_weights(h, feats, None, torch.ones(1, 10), 1, None, **k2)
    assert w_grid[0].nonzero().flatten().tolist() == [4, 9]
    assert w_seq[0].nonzero().flatten().tolist() == [3, 4]  # 3 and 5 tie at 2: the lower position wins


def test_entropy_gradient_ignores_padded_neighbours():
    h = torch.zeros(1, 10)
    h[0, 4] = 4.0
    h[0, 2] = 1e6  # padding: junk entropies must not count as neighbours
    h[0, 8] = float("nan")
    mask = torch.ones(1, 10)
    mask[0, [2, 8]] = 0
    g = entropy_gradient(h, mask, GRID)
    # 3 = (0, 3): valid neighbours {4} → |0 − 4| = 4; 4 = (0, 4): {3, 9} → 4; 9 = (1, 4): {4} → 4;
    # 7 = (1, 2): {6} → 0; 1 = (0, 1): {0, 6} → 0; padding → 0
    expected = torch.tensor([[0, 0, 0, 4, 4, 0, 0, 0, 0, 4]], dtype=torch.float64)
    torch.testing.assert_close(g, expected)


def test_entropy_gradient_isolated_token_is_zero():
    mask = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    h = torch.full((1, 10), 2.0)
    assert entropy_gradient(h, mask, GRID).abs().sum() == 0
    w = critical_weights(h, torch.ones(1, 10, 2), None, mask, 1, GRID)
    torch.testing.assert_close(w, mask.float())  # a one-token row gets weight 1


def test_similarity_only_against_same_group():
    # rows 0, 1 (group 0) are identical; rows 2, 3 (group 1) equal each other except at position 6 and
    # differ from group 0 everywhere — a batch-wide comparison would rate everything in row 0 dissimilar.
    g01 = pair_features(seed=1)
    g23 = pair_features(differ=(6,), seed=2)
    feats = torch.cat([g01, g23])
    mask = ones(4)
    sim = group_similarity(feats, mask, 2)
    torch.testing.assert_close(sim[:2], torch.ones(2, 10, dtype=torch.float64))
    assert (sim[2:, 6] < 1).all() and (sim[2:, :6] == 1).all() and (sim[2:, 7:] == 1).all()
    w = critical_weights(torch.ones(4, 10), feats, step(4), mask, 2, GRID, 0, 0, 0.1)
    expected = torch.zeros(4, 10)
    expected[:2] = 1.0  # nothing unlike its group: the set is empty → uniform
    expected[2:, 6] = 10.0
    torch.testing.assert_close(w, expected)


def test_similarity_values_by_hand():
    # group of 3 at one position: e0 = (1, 0), e1 = (0, 1), e2 = (1, 1)/√2 → cos01 = 0, cos02 = cos12 = 1/√2
    e = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 1.0]]])  # [3, 1, 2]
    r = 1 / math.sqrt(2)
    sim = group_similarity(e, torch.ones(3, 1), 3)
    torch.testing.assert_close(
        sim, torch.tensor([[r / 2], [r / 2], [r]], dtype=torch.float64), atol=1e-9, rtol=0
    )
    # member 1 padded there: 0 and 2 compare only with each other; 1 (padding) → 1
    sim = group_similarity(e, torch.tensor([[1.0], [0.0], [1.0]]), 3)
    torch.testing.assert_close(sim, torch.tensor([[r], [1.0], [r]], dtype=torch.float64), atol=1e-9, rtol=0)


def test_position_without_valid_peer_is_never_selected_by_similarity():
    feats = pair_features(differ=(3, 5))
    mask = ones()
    mask[1, 3] = 0  # row 0's position 3 has no valid peer → similarity 1
    sim = group_similarity(feats, mask, 2)
    assert sim[0, 3] == 1 and sim[0, 5] < 1
    w = critical_weights(torch.ones(2, 10), feats, step(), mask, 2, GRID, 0, 0, 0.3)  # k = 3
    assert w[0].nonzero().flatten().tolist() == [5]  # only one token with similarity < 1
    torch.testing.assert_close(w[0].sum(), torch.tensor(10.0))
    assert w[1].nonzero().flatten().tolist() == [5]
    torch.testing.assert_close(w[1].sum(), torch.tensor(9.0))
    # a group of one: similarity is 1 everywhere, criterion 3 selects nothing
    w = critical_weights(
        torch.ones(1, 10), torch.randn(1, 10, 3), None, torch.ones(1, 10), 1, GRID, 0.1, 0, 1.0
    )
    assert w[0].nonzero().flatten().tolist() == [0]


def test_padding_never_selected():
    # padding is decided first, has the largest entropy jump and is unlike its peer: still weight 0
    mask = ones()
    mask[:, [0, 7]] = 0
    entropy = torch.ones(2, 10)
    entropy[:, 7] = 100.0
    feats = pair_features(differ=(0, 7, 4))
    w = critical_weights(entropy, feats, step(), mask, 2, GRID, 0.1, 0.1, 0.1)
    assert (w[:, [0, 7]] == 0).all()
    expected = torch.zeros(2, 10)
    expected[:, [1, 4]] = 4.0  # first valid = 1; no entropy jump among valid tokens → 1; unlike = 4
    torch.testing.assert_close(w, expected)
    empty = critical_weights(entropy, feats, step(), torch.zeros(2, 10), 2, GRID)
    torch.testing.assert_close(empty, torch.zeros(2, 10))


def test_errors():
    e, f, m = torch.ones(2, 10), torch.ones(2, 10, 2), ones()
    with pytest.raises(ValueError, match="multiple of group_size"):
        critical_weights(e, f, None, m, 3, GRID)
    with pytest.raises(ValueError, match="layout"):
        critical_weights(e, f, None, m, 2, (3, 3))
    with pytest.raises(ValueError, match="\\[0, 1\\]"):
        critical_weights(e, f, None, m, 2, GRID, first_fraction=1.5)
    with pytest.raises(ValueError, match="at least one"):
        critical_weights(e, f, None, m, 2, GRID, 0, 0, 0)
    with pytest.raises(ValueError, match="does not match"):
        critical_weights(torch.ones(2, 9), f, None, m, 2, GRID)


def test_no_gradient():
    entropy = torch.rand(2, 10, requires_grad=True)
    feats = torch.randn(2, 10, 3, requires_grad=True)
    w = critical_weights(entropy, feats, step(), ones(), 2, GRID)
    assert w.shape == (2, 10) and not w.requires_grad


# ---------------------------------------------------------------- properties


@st.composite
def batches(draw):
    G = draw(st.integers(1, 3))
    P = draw(st.integers(1, 2))
    grid = draw(st.booleans())
    rows, cols = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    T = rows * cols
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    B = G * P
    mask = (torch.rand(B, T, generator=g) < draw(st.floats(0.0, 1.0))).float()
    entropy = torch.rand(B, T, generator=g) * 3
    feats = torch.randn(B, T, 3, generator=g)
    if draw(st.booleans()):  # many ties: a few distinct features and entropies
        feats = feats.round()
        entropy = entropy.round()
    stp = torch.randint(0, T, (B, T), generator=g) if draw(st.booleans()) else None
    fr = [draw(st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0])) for _ in range(3)]
    if sum(fr) == 0:
        fr[0] = 0.1
    return entropy, feats, stp, mask, G, (rows, cols) if grid else None, fr


@FAST
@given(batches())
def test_mass_preserved_random(batch):
    entropy, feats, stp, mask, G, layout, fr = batch
    w = critical_weights(entropy, feats, stp, mask, G, layout, *fr)
    n = mask.sum(dim=1)
    assert w.shape == mask.shape and not torch.isnan(w).any() and (w >= 0).all()
    assert (w[mask == 0] == 0).all()
    torch.testing.assert_close((w * mask).sum(dim=1), n)
    for i in range(w.shape[0]):  # w takes one value on the critical set; the set holds ≥ k₁ tokens
        vals = w[i][w[i] > 0]
        if n[i] > 0:
            assert torch.allclose(vals, vals[0].expand_as(vals))
            k1 = 0 if fr[0] == 0 else min(int(n[i]), max(1, round(fr[0] * float(n[i]))))
            assert len(vals) >= k1


# ---------------------------------------------------------------- through the registry


def logits_for(entropy_high, V=8):
    """Logits [B, T, V]: uniform (entropy ln V) where entropy_high, else one sharp token (≈ 0)."""
    B, T = entropy_high.shape
    sharp = torch.zeros(B, T, V)
    sharp[..., 0] = 30.0
    return torch.where(entropy_high[..., None], torch.zeros(B, T, V), sharp)


def test_registered_scheme():
    scheme = get_scheme("critical")
    assert scheme.needs == frozenset({"dists", "features", "groups"})
    assert scheme.options == ("first_fraction", "entropy_fraction", "similarity_fraction")
    assert "zghhui/GCPO" in scheme.doc


@pytest.mark.parametrize("chunk", [10, 3])
def test_credit_weights_through_registry(chunk):
    high = torch.zeros(2, 10, dtype=torch.bool)
    high[0, 7] = high[1, 0] = True
    logits = logits_for(high)

    def dists():
        for s in range(0, 10, chunk):
            sl = slice(s, min(s + chunk, 10))
            yield sl, logits[:, sl]

    inp = CreditInputs(
        mask=ones(),
        step=step(),
        layout=GRID,
        dists=dists,
        features=pair_features(differ=(4,)),
        advantages=torch.tensor([1.0, -1.0]),
        group_size=2,
    )
    with pytest.raises(ValueError, match="'critical' has no option 'tau'"):  # never silently dropped
        credit_weights("critical", inp, {"first_fraction": 0.1, "tau": 3.0})
    w = credit_weights("critical", inp, {"first_fraction": 0.1})
    expected = torch.zeros(2, 10)
    expected[0, [0, 4, 7]] = 10 / 3
    expected[1, [0, 4]] = 5.0
    torch.testing.assert_close(w, expected)
    entropy = torch.special.entr(torch.softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(entropy[0, 7], torch.tensor(math.log(8)))
    torch.testing.assert_close(w, critical_weights(entropy, inp.features, inp.step, inp.mask, 2, GRID))
    w2 = credit_weights("critical", inp, {"first_fraction": 0.0, "similarity_fraction": 0.0})
    assert w2[0].nonzero().flatten().tolist() == [7]  # entropy criterion only
    assert credit_weights("critical", inp, granularity="step").shape == (2, 10)  # AR: one token per step


def test_registry_checks_needs():
    inp = CreditInputs(
        mask=ones(), step=step(), layout=GRID, dists=lambda: iter(()), group_size=2, advantages=torch.zeros(2)
    )
    with pytest.raises(ValueError, match="features"):
        credit_weights("critical", inp)
