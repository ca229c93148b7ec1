"""Credit that adds information (docs/concepts/tree_credit.md): branch points, segment advantages
(VinePPO/SPO), TEMPO's tree term, entropy gating and balanced minibatches — hand-computed values,
invariants (masks, telescoping, shapes, zero on shared stretches) and a toy reward whose segment
advantages are known exactly."""

from __future__ import annotations

import pytest
import torch

from t2i_gcpo.core.balanced import (
    advantage_mass,
    minibatch_balance,
    query_preserved_minibatches,
    reward_balanced_minibatches,
)
from t2i_gcpo.core.branch_points import at_boundaries, every_k, row_starts, top_entropy
from t2i_gcpo.core.entropy_gate import entropy_gate_weights, row_quantiles
from t2i_gcpo.core.tree import Tree
from t2i_gcpo.core.tree_credit import segment_advantages, segment_values, tempo_advantages, tempo_values

F = pytest.approx


def close(got: torch.Tensor, expected: list) -> None:
    """got equals the hand-computed (possibly nested) list to 1e-6."""
    torch.testing.assert_close(got.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=0)


# ---------------------------------------------------------------- branch points


def test_every_k_counts_steps_per_sample_and_pads():
    pts = every_k(torch.tensor([7, 3, 1, 0, 6]), 2)
    assert pts.tolist() == [[2, 4, 6], [2, -1, -1], [-1, -1, -1], [-1, -1, -1], [2, 4, -1]]
    assert every_k(torch.tensor([2, 1]), 5).shape == (2, 0)
    with pytest.raises(ValueError, match="k must be"):
        every_k(torch.tensor([4]), 0)


def test_top_entropy_takes_the_most_uncertain_valid_positions_but_never_the_root():
    h = torch.tensor([[9.0, 1.0, 3.0, 2.0, 3.0], [1.0, 2.0, 8.0, 7.0, 0.0]])
    m = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    # row 0: position 0 (9.0) is the root; 3.0 ties at 2 and 4 → 2 first; then 4; sorted.
    # row 1: positions 2, 3 are padding (their large entropies ignored); only position 1 is left.
    assert top_entropy(h, m, 2).tolist() == [[2, 4], [1, -1]]
    assert top_entropy(h, m, 3).tolist() == [[2, 3, 4], [1, -1, -1]]
    with pytest.raises(ValueError, match="does not match"):
        top_entropy(h[:, :3], m, 2)


def test_boundaries_are_valid_positions_after_the_root():
    m = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    b = row_starts(m, 3)  # a 3-column raster grid: rows start at 0, 3, 6
    assert b[0].tolist() == [True, False, False, True, False, False, True]
    assert at_boundaries(b, m).tolist() == [[3, 6], [3, -1]]
    lines = torch.tensor([[0, 1, 0, 1, 0, 0, 1], [1, 0, 0, 0, 0, 1, 1]]).bool()
    assert at_boundaries(lines, m).tolist() == [[1, 3, 6]] + [[-1, -1, -1]]


# ---------------------------------------------------------------- segment advantages (VinePPO / SPO)


def _two_samples():
    """One group of two. Sample 0 (r = 1, 5 tokens): points 2, 4, continuations [0, 1, 1] and [1, 1, 1].
    Sample 1 (r = 0, 4 valid tokens): point 3, continuations [1, 0, 0] (its slot 2 is unused, NaN)."""
    rewards = torch.tensor([1.0, 0.0])
    points = torch.tensor([[2, 4], [3, -1]])
    cont = torch.tensor([[[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]], [[1.0, 0.0, 0.0], [float("nan")] * 3]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    return rewards, points, cont, mask


def test_segment_advantages_hand_computed_without_the_root():
    rewards, points, cont, mask = _two_samples()
    adv = segment_advantages(rewards, 2, Tree(points, cont), mask, include_root=False)
    # V0 = 1/2 (group mean). Sample 0: V1 = 2/3, V2 = 1, V(full) = 1 → 1/6, 1/6 | 1/3, 1/3 | 0.
    # Sample 1: V1 = 1/3, V(full) = 0 → −1/6 ×3 | −1/3, then padding 0.
    assert adv[0].tolist() == F([1 / 6, 1 / 6, 1 / 3, 1 / 3, 0.0])
    assert adv[1].tolist() == F([-1 / 6, -1 / 6, -1 / 6, -1 / 3, 0.0])
    assert adv.dtype == torch.float32 and adv.shape == mask.shape


def test_segment_advantages_hand_computed_with_the_root_as_a_continuation():
    rewards, points, cont, mask = _two_samples()
    v = segment_values(rewards, 2, Tree(points, cont), include_root=True)
    assert v[0].tolist() == F([0.5, 3 / 4, 1.0, 1.0])  # V1 = (2 + 1)/4, V2 = (3 + 1)/4, V(full) = r
    assert v[1].tolist() == F([0.5, 1 / 4, 0.0, 0.0])  # V1 = (1 + 0)/4; the unused slot is V(full)
    adv = segment_advantages(rewards, 2, Tree(points, cont), mask)
    assert adv[0].tolist() == F([1 / 4, 1 / 4, 1 / 4, 1 / 4, 0.0])
    assert adv[1].tolist() == F([-1 / 4, -1 / 4, -1 / 4, -1 / 4, 0.0])


def test_segment_advantages_group_scale_divides_by_the_std_of_every_reward_of_the_prompt():
    rewards, points, cont, mask = _two_samples()
    raw = segment_advantages(rewards, 2, Tree(points, cont), mask)
    scored = torch.tensor([1.0, 0.0] + [0.0, 1.0, 1.0, 1.0, 1.0, 1.0] + [1.0, 0.0, 0.0])  # NaN slots unused
    scaled = segment_advantages(rewards, 2, Tree(points, cont), mask, scale="group", eps=0.0)
    torch.testing.assert_close(scaled, raw / scored.std())
    with pytest.raises(ValueError, match="unknown scale"):
        segment_advantages(rewards, 2, Tree(points, cont), mask, scale="batch")


def test_segment_advantages_telescope_to_reward_minus_group_mean():
    gen = torch.Generator().manual_seed(0)
    B, G, T, K, M = 12, 4, 9, 3, 5
    rewards = torch.rand(B, generator=gen)
    lengths = torch.randint(5, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    points = every_k(lengths, 3)[:, :K]
    cont = torch.rand(B, points.shape[1], M, generator=gen)
    for include_root in (False, True):
        adv = segment_advantages(rewards, G, Tree(points, cont), mask, include_root=include_root).double()
        starts = torch.zeros_like(mask)  # one token per segment: position 0 and every branch point
        starts[:, 0] = True
        for i in range(B):
            starts[i, points[i][points[i] >= 0]] = True
        group_mean = rewards.view(-1, G).mean(dim=1).repeat_interleave(G).double()
        torch.testing.assert_close(
            (adv * starts).sum(dim=1), rewards.double() - group_mean, atol=1e-6, rtol=0
        )
        assert (adv[~mask] == 0).all()
        for i in range(B):  # constant inside a segment
            bounds = [0, *points[i][points[i] >= 0].tolist(), int(lengths[i])]
            for a, b in zip(bounds, bounds[1:]):
                assert torch.unique(adv[i, a:b]).numel() == 1


def test_segment_advantages_follow_decision_steps_not_positions():
    """Masked images: a token belongs to the segment of the step that revealed it."""
    rewards, points, cont, _ = _two_samples()
    step = torch.tensor([[4, 0, 2, 1, 3], [3, 3, 0, 1, 2]])  # sample 1's last step is 3 (point 3 is legal)
    mask = torch.ones(2, 5)
    adv = segment_advantages(rewards, 2, Tree(points, cont), mask, step=step, include_root=False)
    assert adv[0].tolist() == F([0.0, 1 / 6, 1 / 3, 1 / 6, 1 / 3])
    assert adv[1].tolist() == F([-1 / 3, -1 / 3, -1 / 6, -1 / 6, -1 / 6])


def test_segment_advantages_are_zero_for_a_flat_prompt_and_without_points():
    rewards = torch.full((4,), 0.3)
    points = torch.tensor([[2], [1], [-1], [3]])
    cont = torch.full((4, 1, 2), 0.3)
    adv = segment_advantages(rewards, 4, Tree(points, cont), torch.ones(4, 5), scale="group")
    assert (adv == 0).all()
    none = segment_advantages(torch.tensor([1.0, 0.0]), 2, Tree.empty(2, 3), torch.ones(2, 3))
    close(none, [[0.5] * 3, [-0.5] * 3])  # no branch: GRPO's r − mean on every token


@pytest.mark.parametrize(
    ("points", "cont_mask", "message"),
    [
        ([[2, 2], [3, -1]], None, "increasing"),
        ([[0, 2], [3, -1]], None, "increasing"),
        ([[-1, 2], [3, -1]], None, "come first"),
        ([[2, 4], [4, -1]], None, "after its sample's last step"),
        ([[2, 4], [3, -1]], torch.zeros(2, 2, 3, dtype=torch.bool), "no continuations"),
    ],
)
def test_segment_advantages_reject_bad_points(points, cont_mask, message):
    rewards, _, cont, mask = _two_samples()
    with pytest.raises(ValueError, match=message):
        segment_advantages(rewards, 2, Tree(torch.tensor(points), cont, cont_mask), mask, include_root=False)


def test_segment_advantages_check_shapes():
    rewards, points, cont, mask = _two_samples()
    with pytest.raises(ValueError, match=r"a Tree needs points \[B, K\] and rewards \[B, K, M\]"):
        Tree(points, cont[:, :1])
    with pytest.raises(ValueError, match="exists .* must match rewards"):
        Tree(points, cont, torch.ones(2, 2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="the tree has 2 rows, the rewards 4"):
        segment_values(torch.ones(4), 2, Tree(points, cont))
    with pytest.raises(ValueError, match="multiple of group_size"):
        segment_advantages(rewards, 3, Tree(points, cont), mask)
    with pytest.raises(ValueError, match="step"):
        segment_advantages(rewards, 2, Tree(points, cont), mask, step=torch.zeros(2, 4))


# ---------------------------------------------------------------- toy reward with exact values


class _Chain:
    """Binary tokens from a Markov chain: y_0 ~ Bernoulli(p0), P(y_t = 1 | y_{t−1}) = a if y_{t−1} = 1 else b.
    Reward 1 iff y_3 = 1, so the exact value of a prefix y_{<t} is P(y_3 = 1 | y_{<t}): a matrix power for
    t ≤ 3, the reward itself once y_3 is decided."""

    T = 6

    def __init__(self, p0: float, a: float, b: float) -> None:
        self.p0, self.a, self.b = p0, a, b
        self.M = torch.tensor([[1 - b, b], [1 - a, a]], dtype=torch.float64)  # M[prev, next]

    def value(self, prefix: list[int]) -> float:
        t = len(prefix)
        if t >= 4:
            return float(prefix[3] == 1)
        if t == 0:
            start = torch.tensor([1 - self.p0, self.p0], dtype=torch.float64)
            return float((start @ torch.linalg.matrix_power(self.M, 3))[1])
        return float(torch.linalg.matrix_power(self.M, 3 - (t - 1))[prefix[-1], 1])

    def continue_from(self, prefix: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
        """n samples [n, T] that keep ``prefix`` and draw the rest from the chain."""
        y = torch.zeros(n, self.T, dtype=torch.long)
        y[:, : prefix.numel()] = prefix
        for t in range(prefix.numel(), self.T):
            p1 = torch.full((n,), self.p0) if t == 0 else torch.where(y[:, t - 1] == 1, self.a, self.b)
            y[:, t] = (torch.rand(n, generator=gen) < p1).long()
        return y

    @staticmethod
    def reward(y: torch.Tensor) -> torch.Tensor:
        return (y[:, 3] == 1).double()


@pytest.mark.parametrize(("p0", "a", "b"), [(0.5, 0.5, 0.5), (0.6, 0.85, 0.25)])
def test_segment_advantages_match_the_exact_values_in_expectation(p0, a, b):
    """Monte Carlo with M = 20 000 continuations per branch point: each estimated value has a standard
    error ≤ 0.5/√M ≈ 0.0035, and a segment advantage (a difference of two) ≤ 0.005; tolerance 0.02 (> 4σ).
    With i.i.d. tokens (first case) only the segment that decides y_3 gets an expected advantage."""
    chain, gen, G, M = _Chain(p0, a, b), torch.Generator().manual_seed(1), 4, 20_000
    roots = chain.continue_from(torch.empty(0, dtype=torch.long), G, gen)  # [G, T]
    rewards = chain.reward(roots)
    points = every_k(torch.full((G,), chain.T), 2)  # t = 2, 4: segments [0, 2), [2, 4), [4, 6)
    cont = torch.stack(
        [
            torch.stack([chain.reward(chain.continue_from(roots[i, :t], M, gen)) for t in points[i].tolist()])
            for i in range(G)
        ]
    )  # [G, K, M]
    mask = torch.ones(G, chain.T)
    group_mean = float(rewards.mean())
    for include_root in (False, True):
        adv = segment_advantages(rewards, G, Tree(points, cont.float()), mask, include_root=include_root)
        for i in range(G):
            y, r = roots[i].tolist(), float(rewards[i])
            # E[V̂(prefix_k) | root] = V*(prefix_k), or (r + M·V*)/(M + 1) when the root is one of the samples
            v = [chain.value(y[:t]) for t in (2, 4)]
            if include_root:
                v = [(r + M * x) / (M + 1) for x in v]
            expected = [v[0] - group_mean, v[1] - v[0], r - v[1]]
            got = [float(adv[i, 0]), float(adv[i, 2]), float(adv[i, 4])]
            assert got == F(expected, abs=0.02)
            if a == b:  # i.i.d.: V* = p0 before y_3 is drawn, so only segment [2, 4) carries credit
                assert abs(got[1] - (r - p0)) < 0.02 and abs(got[2]) < 0.02


# ---------------------------------------------------------------- TEMPO


def test_tempo_hand_computed_on_a_tiny_tree():
    """Group of 4: 1-2-3 (r 1), 1-2-4 (r 0), 1-5-6 (r 1), 7-8-9 (r 0). Nodes: root {all} 1/2; [1] {0,1,2} 2/3,
    [7] {3} 0; [1,2] {0,1} 1/2, [1,5] {2} 1; leaves = r."""
    tokens = torch.tensor([[1, 2, 3], [1, 2, 4], [1, 5, 6], [7, 8, 9]])
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    mask = torch.ones(4, 3)
    v = tempo_values(tokens, mask, rewards, 4)
    close(v, [[0.5, 2 / 3, 0.5, 1.0], [0.5, 2 / 3, 0.5, 0.0], [0.5, 2 / 3, 1.0, 1.0], [0.5, 0.0, 0.0, 0.0]])
    adv = tempo_advantages(tokens, mask, rewards, 4)
    expected = [[1 / 6, -1 / 6, 1 / 2], [1 / 6, -1 / 6, -1 / 2], [1 / 6, 1 / 3, 0.0], [-1 / 2, 0.0, 0.0]]
    close(adv, expected)
    # shared stretches: sample 2 alone below [1, 5], sample 3 alone below [7] — no branching, no credit
    assert adv[2, 2] == 0 and (adv[3, 1:] == 0).all()
    scaled = tempo_advantages(tokens, mask, rewards, 4, scale="group", eps=0.0)
    torch.testing.assert_close(scaled, adv / rewards.std())


def test_tempo_variable_lengths_credit_the_end_to_the_last_token():
    """a = 1-2 (r 1), b = 1-2-3 (r 0), c = 1-4 (r 0); mean 1/3. Token 0 is shared by all (0); [1,2] {a,b} 1/2;
    a ends there: its last token's after-node is {a} (1), b goes on to 3 (0)."""
    tokens = torch.tensor([[1, 2, 0], [1, 2, 3], [1, 4, 0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0]])
    rewards = torch.tensor([1.0, 0.0, 0.0])
    adv = tempo_advantages(tokens, mask, rewards, 3)
    close(adv, [[0.0, 2 / 3, 0.0], [0.0, 1 / 6, -1 / 2], [0.0, -1 / 3, 0.0]])
    torch.testing.assert_close(adv.sum(dim=1), rewards - rewards.mean())  # telescoping, every sample


def test_tempo_telescopes_to_leaf_value_minus_group_mean_and_groups_are_independent():
    gen = torch.Generator().manual_seed(3)
    B, G, T = 16, 8, 6
    tokens = torch.randint(0, 2, (B, T), generator=gen)  # a binary vocabulary: long shared prefixes
    tokens[3] = tokens[2]  # an exact duplicate with a different reward: the leaf's value is their mean
    lengths = torch.randint(2, T + 1, (B,), generator=gen)
    lengths[3] = lengths[2]
    mask = torch.arange(T)[None, :] < lengths[:, None]
    rewards = torch.rand(B, generator=gen)
    adv = tempo_advantages(tokens, mask, rewards, G).double()
    leaf = tempo_values(tokens, mask, rewards, G)[:, -1]
    assert float(leaf[2]) == F(float(rewards[2:4].double().mean())) and leaf[3] == leaf[2]
    group_mean = rewards.double().view(-1, G).mean(dim=1).repeat_interleave(G)
    torch.testing.assert_close(adv.sum(dim=1), leaf - group_mean, atol=1e-6, rtol=0)
    assert (adv[~mask] == 0).all()
    alone = tempo_advantages(tokens[G:], mask[G:], rewards[G:], G)  # the second group on its own
    torch.testing.assert_close(alone, adv[G:].float())


def test_tempo_rejects_holes_and_is_zero_for_a_flat_group():
    tokens, rewards = torch.tensor([[1, 2], [1, 3]]), torch.tensor([1.0, 0.0])
    with pytest.raises(ValueError, match="prefix masks"):
        tempo_advantages(tokens, torch.tensor([[0, 1], [1, 1]]), rewards, 2)
    with pytest.raises(ValueError, match="must both be"):
        tempo_advantages(tokens[:, :1], torch.ones(2, 2), rewards, 2)
    assert (tempo_advantages(tokens, torch.ones(2, 2), torch.ones(2), 2, scale="group") == 0).all()


# ---------------------------------------------------------------- entropy gating (EG-GRPO)


def test_entropy_gate_hand_computed():
    h = torch.tensor([[0.1, 0.5, 0.2, 0.9, 0.4]])
    m = torch.ones(1, 5)
    # sorted 0.1 0.2 0.4 0.5 0.9: q0.2 at 0.8 → 0.18, q0.8 at 3.2 → 0.58
    assert row_quantiles(h, m, 0.2).tolist() == F([0.18]) and row_quantiles(h, m, 0.8).tolist() == F([0.58])
    w = entropy_gate_weights(h, m, 0.2, 0.8, bonus=0.5)
    close(w, [[0.0, 1.0, 1.0, 1.5, 1.0]])  # mass 4.5 = 5 − 1 + 0.5·1
    kept = entropy_gate_weights(h, m, 0.2, 0.8, bonus=0.5, preserve_mass=True)
    close(kept, [[0.0, 5 / 4.5, 5 / 4.5, 1.5 * 5 / 4.5, 5 / 4.5]])


def test_row_quantiles_match_torch_quantile_on_the_valid_entries():
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(6, 11, generator=gen)
    mask = torch.arange(11)[None, :] < torch.tensor([11, 1, 5, 7, 2, 0])[:, None]
    for q in (0.0, 0.2, 0.5, 0.93, 1.0):
        got = row_quantiles(x, mask, q)
        for i in range(5):
            assert float(got[i]) == F(float(torch.quantile(x[i][mask[i]].double(), q)))
        assert torch.isnan(got[5])


def test_entropy_gate_mass_bound_padding_and_ties():
    gen = torch.Generator().manual_seed(5)
    B, T = 7, 13
    h = torch.rand(B, T, generator=gen)
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=gen)[:, None]
    beta = 0.7
    w = entropy_gate_weights(h, mask, 0.25, 0.75, bonus=beta).double()
    n, low, high = mask.sum(1), (w == 0) & mask, w > 1
    torch.testing.assert_close(w.sum(1), (n - low.sum(1) + beta * high.sum(1)).double())
    assert w.float().max() <= torch.tensor(1 + beta) and (w[~mask] == 0).all() and (w.sum(1) > 0).all()
    h_top = torch.where(mask, h, -1.0).argmax(dim=1)
    assert (w[torch.arange(B), h_top] > 0).all()  # the most uncertain token is never gated
    kept = entropy_gate_weights(h, mask, 0.25, 0.75, bonus=beta, preserve_mass=True).double()
    torch.testing.assert_close(kept.sum(1), n.double())
    noisy = torch.where(mask, h, torch.full_like(h, 1e6))  # padding entropies change nothing
    torch.testing.assert_close(entropy_gate_weights(noisy, mask, 0.25, 0.75, bonus=beta).double(), w)
    flat = entropy_gate_weights(torch.full((2, 4), 0.3), torch.ones(2, 4))
    assert (flat == 1).all()  # equal entropies are neither gated nor boosted


def test_entropy_gate_batch_scope_uses_one_quantile_for_all_tokens():
    h = torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 9.0]])
    m = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the padded 9.0 does not count
    # valid entropies 0 1 2 3 4: q0.2 = 0.8, q0.8 = 3.2
    w = entropy_gate_weights(h, m, 0.2, 0.8, bonus=1.0, scope="batch")
    assert w.tolist() == [[0.0, 1.0, 1.0], [1.0, 2.0, 0.0]]
    per_sample = entropy_gate_weights(h, m, 0.2, 0.8, bonus=1.0)
    assert per_sample.tolist() == [[0.0, 1.0, 2.0], [0.0, 2.0, 0.0]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"low_quantile": 0.8, "high_quantile": 0.2}, "low_quantile"),
        ({"bonus": 1.5}, "bonus"),
        ({"scope": "group"}, "unknown scope"),
    ],
)
def test_entropy_gate_rejects_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        entropy_gate_weights(torch.rand(2, 3), torch.ones(2, 3), **kwargs)


# ---------------------------------------------------------------- balanced minibatches


def _is_whole_group_partition(batches, B, G):
    rows = torch.cat(batches).sort().values
    assert rows.tolist() == list(range(B))
    for b in batches:
        assert b.tolist() == sorted(b.tolist())
        groups = b // G
        assert all((groups == g).sum() == G for g in groups.unique())


def test_query_preserved_minibatches_keep_groups_whole():
    batches = query_preserved_minibatches(10, 2, 2)
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9]]
    shuffled = query_preserved_minibatches(24, 3, 3, torch.Generator().manual_seed(0))
    _is_whole_group_partition(shuffled, 24, 3)
    assert [b.numel() for b in shuffled] == [9, 9, 6]
    with pytest.raises(ValueError, match="n_minibatches"):
        query_preserved_minibatches(8, 2, 5)


def test_reward_balanced_minibatches_cancel_the_net_advantage():
    # group nets 2, 1, −1, −2: the in-order split gives nets 3 and −3; the greedy pass pairs 2 with −2
    adv = torch.tensor([1.0, 1.0, 0.5, 0.5, -0.5, -0.5, -1.0, -1.0])
    naive = query_preserved_minibatches(8, 2, 2)
    assert minibatch_balance(adv, naive)[:, 2].tolist() == [3.0, -3.0]
    batches = reward_balanced_minibatches(adv, 2, 2)
    assert [b.tolist() for b in batches] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert minibatch_balance(adv, batches).tolist() == [[2.0, 2.0, 0.0], [1.0, 1.0, 0.0]]


def test_reward_balanced_minibatches_spread_positive_mass_when_groups_are_centred():
    # GRPO groups are centred (net 0 each): the greedy pass then evens out the positive mass, 3 + 1 | 2 + 2
    adv = torch.tensor([3.0, -3.0, 1.0, -1.0, 2.0, -2.0, 2.0, -2.0])
    batches = reward_balanced_minibatches(adv, 2, 2)
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert minibatch_balance(adv, batches)[:, 0].tolist() == [4.0, 4.0]


def test_reward_balanced_minibatches_on_token_advantages_and_uneven_counts():
    gen = torch.Generator().manual_seed(6)
    B, G, T = 20, 4, 5
    adv = torch.randn(B, T, generator=gen)
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=gen)[:, None]
    batches = reward_balanced_minibatches(adv, G, 2, mask)
    _is_whole_group_partition(batches, B, G)
    assert [b.numel() for b in batches] == [12, 8]  # 5 groups: 3 | 2
    pos, neg = advantage_mass(adv, mask)
    masked = torch.where(mask, adv, 0.0).double()
    torch.testing.assert_close(pos - neg, masked.sum(dim=1))
    assert [b.tolist() for b in reward_balanced_minibatches(adv, G, 2, mask)] == [b.tolist() for b in batches]


def test_minibatch_helpers_check_their_inputs():
    with pytest.raises(ValueError, match="multiple of group_size"):
        reward_balanced_minibatches(torch.zeros(5), 2, 1)
    with pytest.raises(ValueError, match="mask"):
        advantage_mass(torch.zeros(2, 3), torch.ones(2, 2))


# ----------------------------------------------------------------------------- the registered schemes


def test_vine_scheme_returns_hand_computed_segment_advantages():
    from t2i_gcpo.core.schemes import CreditInputs, credit_weights, get_scheme

    # one group of 2, 4 tokens each; sample 0 branched at t = 2 with continuations scoring 1 and 0
    mask = torch.ones(2, 4)
    inp = CreditInputs(
        mask=mask,
        step=torch.arange(4).expand(2, 4),
        tokens=torch.zeros(2, 4, dtype=torch.long),
        rewards=torch.tensor([1.0, 0.0]),
        group_size=2,
        tree=Tree(
            torch.tensor([[2], [-1]]),
            torch.tensor([[[1.0, 0.0]], [[float("nan")] * 2]], dtype=torch.float64),
            torch.tensor([[[True, True]], [[False, False]]]),
        ),
    )
    assert get_scheme("vine").returns == "advantages"
    a = credit_weights("vine", inp, {"normalisation": "none", "include_root": True})
    # V(prompt) = 0.5; sample 0: V(t=2) = mean(1, 0, own 1) = 2/3, V(end) = 1; sample 1: 0 − 0.5 everywhere
    torch.testing.assert_close(a, torch.tensor([[1 / 6, 1 / 6, 1 / 3, 1 / 3], [-0.5] * 4]))
    without_root = credit_weights("vine", inp, {"normalisation": "none", "include_root": False})
    torch.testing.assert_close(without_root[0], torch.tensor([0.0, 0.0, 0.5, 0.5]))


def test_tempo_scheme_reads_the_group_in_decision_order():
    from t2i_gcpo.core.schemes import CreditInputs, credit_weights

    # masked-style: 3 tokens, decided in the order position 2, 0, 1 (steps 0, 1, 2) in both samples;
    # the samples agree on position 2 (decided first) and differ at position 0: the tree branches there
    tokens = torch.tensor([[5, 7, 3], [6, 7, 3]])
    step = torch.tensor([[1, 2, 0], [1, 2, 0]])
    inp = CreditInputs(
        mask=torch.ones(2, 3),
        step=step,
        tokens=tokens,
        rewards=torch.tensor([1.0, 0.0]),
        group_size=2,
        advantages=torch.tensor([0.7, -0.7]),
    )
    delta = credit_weights("tempo", inp, {"normalisation": "none", "sequence_term": False})
    # shared first decision: δ = 0; the branching decision (position 0): ±0.5; after it nothing branches
    torch.testing.assert_close(delta, torch.tensor([[0.5, 0.0, 0.0], [-0.5, 0.0, 0.0]]))
    full = credit_weights("tempo", inp, {"normalisation": "none"})
    torch.testing.assert_close(full, delta + torch.tensor([[0.7], [-0.7]]))


def test_minibatch_rows_keep_groups_whole_and_balance_them():
    from t2i_gcpo.config import TrainConfig
    from t2i_gcpo.policies.base import Rollout
    from t2i_gcpo.train.update import minibatch_rows

    cfg = TrainConfig()
    cfg.optim.minibatches = 2
    ro = Rollout(
        torch.zeros(8, 3, dtype=torch.long),
        torch.ones(8, 3),
        torch.zeros(8, 3, dtype=torch.long),
        {},
        [],
        group_size=2,
    )
    adv = torch.tensor([1.0, -1.0, 2.0, 0.0, -2.0, 0.0, 0.5, -0.5])  # group nets 0, 2, −2, 0
    assert [r.tolist() for r in minibatch_rows(cfg, ro, adv)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    cfg.optim.minibatch_split = "query"
    assert [r.tolist() for r in minibatch_rows(cfg, ro, adv)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    cfg.optim.minibatch_split = "balanced"  # groups 1 (+2) and 2 (−2) cancel in one minibatch
    assert sorted(r.tolist() for r in minibatch_rows(cfg, ro, adv)) == [[0, 1, 6, 7], [2, 3, 4, 5]]


def test_roots_normalisation_divides_by_the_spread_of_the_groups_own_samples():
    rewards, points, cont, mask = _two_samples()
    raw = segment_advantages(rewards, 2, Tree(points, cont), mask)
    roots = segment_advantages(rewards, 2, Tree(points, cont), mask, scale="roots", eps=0.0)
    torch.testing.assert_close(roots, raw / rewards.std())  # std(1, 0), the continuations left out
