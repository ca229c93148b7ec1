"""Branched rollouts (t2i_gcpo/policies/branching.py) on the shipped ShapeWorld priors and arithmetic LM and
on tiny Janus / aMUSEd checkpoints: prefixes kept, recorded log-probs equal teacher forcing (float32), a
continuation fed the root's own uniforms reproduces the root (from t = 0: a fresh sample), and a
continuation depends only on its key."""

from __future__ import annotations

import pytest
import torch

from t2i_gcpo.core.branch_points import every_k
from t2i_gcpo.core.tree_credit import segment_advantages
from t2i_gcpo.policies.base import PromptRecord, SamplingParams
from t2i_gcpo.policies.branching import branch_rollout, continuation_keys, decision_steps
from t2i_gcpo.policies.decode_loop import StaticDecodeLoop
from t2i_gcpo.tasks.loop import group_generators

from tiny_models import build_tiny_amused, build_tiny_janus

CONTEXTS = ("pos", "neg", "guided")
SHAPES = ["a photo of a green bar", "a photo of two triangles"]
SUMS = ["4*14*10=?", "16*7+12*12=?"]
SEEDS = [11, 12]


def seeded(seeds) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def records(texts) -> list[PromptRecord]:
    return [PromptRecord(t) for t in texts]


def check_prefixes(ro, br, masked: bool = False) -> None:
    """Every continuation keeps its root's decisions before its branch point."""
    for j, (b, t) in enumerate(zip(br.root.tolist(), br.point.tolist())):
        if masked:  # the tokens revealed at steps < t, at the same steps
            kept = ro.step[b] < t
            assert torch.equal(br.rollout.step[j][kept], ro.step[b][kept])
            assert torch.equal(br.rollout.tokens[j][kept], ro.tokens[b][kept])
            assert (br.rollout.step[j][~kept] >= t).all()
        else:
            assert torch.equal(br.rollout.tokens[j, :t], ro.tokens[b, :t])
            assert br.rollout.mask[j, :t].eq(1).all()


def check_teacher_forced(policy, br, contexts=CONTEXTS) -> None:
    """The recorded log-probs of every position equal a teacher-forced pass in float32."""
    with torch.no_grad():
        for c in contexts:
            tf = policy.logprobs(br.rollout, c)
            torch.testing.assert_close(br.rollout.logp[c], tf, atol=1e-4, rtol=0, msg=c)


def check_reproduces_root(policy, records_, sampling, points_per_row, masked=False) -> None:
    """A root sampled alone (group of one) with generator seed s, continued from t with a generator of
    seed s, draws the root's own uniforms from t on: it is the root, whatever t (t = 0: a fresh sample)."""
    ro = policy.rollout(records_, 1, sampling, seeded(SEEDS))
    points = torch.tensor(points_per_row)
    br = branch_rollout(
        policy, ro, points, 1, seeded([s for s, row in zip(SEEDS, points_per_row) for t in row if t >= 0])
    )
    base = ro.select(br.root)
    width = min(base.tokens.shape[1], br.rollout.tokens.shape[1])
    assert torch.equal(br.rollout.tokens[:, :width], base.tokens[:, :width]), br.point
    assert torch.equal(br.rollout.mask[:, :width], base.mask[:, :width])
    if masked:
        assert torch.equal(br.rollout.step, base.step)
    for c in base.logp:
        torch.testing.assert_close(br.rollout.logp[c][:, :width], base.logp[c][:, :width], atol=1e-4, rtol=0)


def check_independent(policy, ro, points, n, slots) -> None:
    """A continuation depends on its key only: branching fewer rows and points gives the same ones."""
    G = ro.group_size
    keys = continuation_keys(slots, G, points, n)
    assert len(set(keys)) == len(keys)
    full = branch_rollout(policy, ro, points, n, group_generators(7, "branch", keys))
    first, last = points.clone(), points.clone()
    first[1:] = -1  # the first row alone …
    first[0, 1:] = -1  # … and its first point alone
    last[:-1] = -1  # the last row alone
    for few, rows in ((first, slice(0, n)), (last, slice(len(full.root) - int((last >= 0).sum()) * n, None))):
        part = branch_rollout(
            policy, ro, few, n, group_generators(7, "branch", continuation_keys(slots, G, few, n))
        )
        width = part.rollout.tokens.shape[1]
        assert torch.equal(part.rollout.tokens, full.rollout.tokens[rows, :width])
        assert torch.equal(part.point, full.point[rows])


def check_max_rollout_batch(policy, ro, points, n, limit, spied, monkeypatch) -> None:
    """With `max_rollout_batch` set, the continuations are sampled in passes of at most that many rows
    (`spied`: (owner, name[, i]) of what sees each pass's rows first, in its i-th argument) and are the same
    continuations."""
    keys = continuation_keys(list(range(len(ro) // ro.group_size)), ro.group_size, points, n)
    whole = branch_rollout(policy, ro, points, n, group_generators(3, "b", keys))
    owner, name, i = (*spied, 0)[:3]
    seen, inner = [], getattr(owner, name)

    def spy(*args, **kwargs):
        seen.append(len(args[i]))
        return inner(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(policy, "max_rollout_batch", limit)
        m.setattr(owner, name, spy)
        sliced = branch_rollout(policy, ro, points, n, group_generators(3, "b", keys))
    assert seen and max(seen) <= limit < max(seen_whole_pass(points, n))
    assert torch.equal(sliced.rollout.tokens, whole.rollout.tokens)
    for c in whole.rollout.logp:
        torch.testing.assert_close(sliced.rollout.logp[c], whole.rollout.logp[c], atol=1e-4, rtol=0)


def seen_whole_pass(points, n) -> list[int]:
    """Rows per pass without a limit: every continuation from one point in one pass."""
    used = points[points >= 0]
    return [int((used == t).sum()) * n for t in used.unique()]


# ---------------------------------------------------------------------------- ShapeWorld AR


@pytest.fixture(scope="module")
def ar():
    from t2i_gcpo.policies.registry import load_policy

    return load_policy("shapeworld").eval()


def test_ar_continuations_keep_prefix_and_record_teacher_forced_logprobs(ar):
    ro = ar.rollout(records(SHAPES), 2, ar.default_sampling(), seeded(SEEDS))
    points = torch.tensor([[40, 52], [0, -1], [63, -1], [40, 60]])
    br = branch_rollout(
        ar, ro, points, 2, group_generators(0, "branch", continuation_keys([0, 1], 2, points, 2))
    )
    assert br.rollout.tokens.shape == (12, 64) and br.rollout.group_size == 2
    assert br.root.tolist() == [0] * 4 + [1] * 2 + [2] * 2 + [3] * 4
    assert br.point.tolist()[::2] == [40, 52, 0, 63, 40, 60] and br.slot.tolist()[::2] == [0, 1, 0, 0, 0, 1]
    assert br.rollout.texts == [ro.texts[b] for b in br.root.tolist()]
    check_prefixes(ro, br)
    check_teacher_forced(ar, br)
    # from t = 0 the continuations are new samples: they differ from their root
    assert (br.rollout.tokens != ro.tokens[br.root]).any(dim=1)[br.point == 0].all()


def test_ar_continuation_with_the_roots_uniforms_is_the_root(ar):
    # hot sampling: every position's draw depends on its uniform (cold, the background tokens would not)
    hot = SamplingParams(guidance_scale=3.0, temperature=3.0)
    check_reproduces_root(ar, records(SHAPES), hot, [[0, 21], [33, 63]])


def test_ar_continuation_depends_on_its_key_only(ar):
    ro = ar.rollout(records(SHAPES), 2, ar.default_sampling(), seeded(SEEDS))
    check_independent(ar, ro, torch.tensor([[44, 56], [50, -1], [44, -1], [56, 60]]), 2, [3, 4])


def test_branches_feed_segment_advantages(ar):
    ro = ar.rollout(records(SHAPES), 2, ar.default_sampling(), seeded(SEEDS))
    points = every_k(decision_steps(ro), 32)  # [4, 1]: t = 32
    br = branch_rollout(ar, ro, points, 2, group_generators(0, "b", continuation_keys([0, 1], 2, points, 2)))
    values = torch.arange(len(br.root), dtype=torch.float)
    tree = br.tree(points, values)
    assert tree.rewards.shape == (4, 1, 2) and tree.exists.all() and tree.rewards[3, 0].tolist() == [6.0, 7.0]
    adv = segment_advantages(torch.tensor([0.0, 1.0, 1.0, 0.0]), 2, tree, ro.mask)
    assert adv.shape == (4, 64)


def test_bad_points_are_refused(ar):
    ro = ar.rollout(records(SHAPES[:1]), 1, ar.default_sampling(), seeded(SEEDS[:1]))
    with pytest.raises(ValueError, match="last decision step"):
        branch_rollout(ar, ro, torch.tensor([[64]]), 1, seeded([0]))
    with pytest.raises(ValueError, match="one generator per continuation"):
        branch_rollout(ar, ro, torch.tensor([[3]]), 2, seeded([0]))


# ---------------------------------------------------------------------------- ShapeWorld masked


@pytest.fixture(scope="module")
def masked():
    from t2i_gcpo.policies.registry import load_policy

    return load_policy("shapeworld-masked").eval()


@pytest.mark.parametrize("order", ["confidence", "random"])
def test_masked_continuations_keep_revealed_canvas_and_record_trajectory_logprobs(masked, order):
    sampling = SamplingParams(guidance_scale=3.0, steps=6, reveal_order=order)
    ro = masked.rollout(records(SHAPES), 2, sampling, seeded(SEEDS))
    assert decision_steps(ro).tolist() == [6] * 4
    points = torch.tensor([[1, 4], [0, -1], [5, -1], [2, 3]])
    br = branch_rollout(
        masked, ro, points, 2, group_generators(0, "b", continuation_keys([0, 1], 2, points, 2))
    )
    assert br.rollout.tokens.shape == (12, 64)
    check_prefixes(ro, br, masked=True)
    check_teacher_forced(masked, br)
    hot = SamplingParams(guidance_scale=3.0, steps=6, reveal_order=order, temperature=3.0)
    check_reproduces_root(masked, records(SHAPES), hot, [[0, 3], [2, -1]], masked=True)


def test_masked_remask_roots_give_trajectory_continuations(masked):
    masked.set_estimator("remask", 2)
    try:
        ro = masked.rollout(records(SHAPES[:1]), 2, masked.default_sampling(), seeded(SEEDS[:1]))
        br = branch_rollout(masked, ro, torch.tensor([[3], [5]]), 2, seeded(range(4)))
    finally:
        masked.set_estimator("trajectory")
    assert br.rollout.state["estimator"] == "trajectory" and "remask" not in br.rollout.state
    check_prefixes(ro, br, masked=True)
    check_teacher_forced(masked, br)


def test_masked_continuation_depends_on_its_key_only(masked):
    ro = masked.rollout(records(SHAPES), 2, masked.default_sampling(), seeded(SEEDS))
    check_independent(masked, ro, every_k(decision_steps(ro), 3), 2, [(0, 1), (0, 2)])


# ---------------------------------------------------------------------------- text


@pytest.fixture(scope="module")
def lm():
    from t2i_gcpo.policies.families.text import SHIPPED
    from t2i_gcpo.policies.text import TextPolicy

    return TextPolicy.from_pretrained(SHIPPED["arithmetic"], max_new_tokens=40)


HOT = SamplingParams(temperature=1.5, max_new_tokens=40)  # hot enough that completions differ in length


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_text_continuations(lm, fused, scale, monkeypatch):
    lm.fused_sampler = fused
    try:
        sampling = (
            HOT if scale == 1.0 else SamplingParams(temperature=1.5, max_new_tokens=40, guidance_scale=scale)
        )
        ro = lm.rollout(records(SUMS), 2, sampling, seeded(SEEDS))
        steps = decision_steps(ro)
        assert torch.equal(steps, ro.mask.sum(1).long())
        points = torch.stack([torch.zeros_like(steps), steps // 3, steps - 1], dim=1)
        keys = continuation_keys([0, 1], 2, points, 2)
        br = branch_rollout(lm, ro, points, 2, group_generators(0, "b", keys))
        assert len(br.root) == 24 and set(br.rollout.logp) == set(ro.logp)
        check_prefixes(ro, br)
        check_teacher_forced(lm, br, ("pos", "neg", "guided"))
        check_reproduces_root(lm, records(SUMS), sampling, [[0, 4, 9], [2, -1, -1]])
        if fused:
            check_independent(lm, ro, points[:, 1:], 2, [0, 1])
        # fused: the static loop's pass (self, sampling, uniforms [rows, T], …)
        spied = (StaticDecodeLoop, "begin", 2) if fused else (lm, "decode_n_tokens")
        check_max_rollout_batch(lm, ro, points, 2, 3, spied, monkeypatch)
    finally:
        lm.fused_sampler = True


def test_text_line_starts_are_boundaries(lm):
    """Task boundaries for arithmetic: branch at the first token of each line of the completion."""
    from t2i_gcpo.core.branch_points import at_boundaries

    ro = lm.rollout(records(SUMS[:1]), 1, SamplingParams(max_new_tokens=40), seeded(SEEDS[:1]))
    pieces = [lm.tokenizer.decode([t]) for t in ro.tokens[0].tolist()]
    after_newline = torch.tensor([[False] + ["\n" in p for p in pieces[:-1]]])
    points = at_boundaries(after_newline, ro.mask)
    assert points.shape[1] >= 1, lm.decode(ro)
    br = branch_rollout(lm, ro, points, 2, seeded(range(2 * points.shape[1])))
    check_prefixes(ro, br)
    for j, t in enumerate(br.point.tolist()):  # every continuation starts a new line
        assert lm.tokenizer.decode(br.rollout.tokens[j, :t].tolist()).endswith("\n")


# ---------------------------------------------------------------------------- Janus and aMUSEd (tiny)


@pytest.fixture(scope="module")
def janus(tmp_path_factory):
    from t2i_gcpo.policies.janus import JanusPolicy

    return JanusPolicy.from_pretrained(build_tiny_janus(tmp_path_factory.mktemp("janus") / "ckpt"))


def test_janus_continuations(janus, monkeypatch):
    sampling = SamplingParams(guidance_scale=5.0)
    texts = ["a red circle", "two blue squares left of a green cat"]  # different lengths → left padding
    ro = janus.rollout(records(texts), 2, sampling, seeded(SEEDS))
    points = torch.tensor([[0, 7], [15, -1], [3, -1], [1, 2]])
    br = branch_rollout(
        janus, ro, points, 3, group_generators(0, "b", continuation_keys([0, 1], 2, points, 3))
    )
    assert br.rollout.tokens.shape == (18, 16)
    check_prefixes(ro, br)
    check_teacher_forced(janus, br)
    check_reproduces_root(janus, records(texts), sampling, [[0, 9], [15, -1]])
    check_independent(janus, ro, points, 2, [0, 1])
    shared = torch.tensor([[0, 7], [0, 7], [3, -1], [3, -1]])  # two roots per point: 6 rows, passes of 3
    check_max_rollout_batch(janus, ro, shared, 3, 4, (StaticDecodeLoop, "begin", 2), monkeypatch)


@pytest.fixture(scope="module")
def amused(tmp_path_factory):
    from t2i_gcpo.policies.amused import AmusedPolicy

    folder = tmp_path_factory.mktemp("amused")
    build_tiny_amused(str(folder))
    return AmusedPolicy.from_pretrained(folder)


def test_amused_continuations(amused):
    sampling = SamplingParams(guidance_scale=4.0, steps=5)
    texts = ["a red circle", "red"]
    ro = amused.rollout(records(texts), 2, sampling, seeded(SEEDS))
    points = torch.tensor([[1, 3], [0, -1], [4, -1], [2, -1]])
    br = branch_rollout(
        amused, ro, points, 2, group_generators(0, "b", continuation_keys([0, 1], 2, points, 2))
    )
    check_prefixes(ro, br, masked=True)
    check_teacher_forced(amused, br)
    check_reproduces_root(amused, records(texts), sampling, [[0, 2], [4, -1]], masked=True)


def test_unsupported_policy_is_refused(ar):
    ro = ar.rollout(records(SHAPES[:1]), 1, ar.default_sampling(), seeded(SEEDS[:1]))
    import dataclasses

    from toy_family import ToyPolicy

    toy = ToyPolicy()  # declares no branching
    with pytest.raises(TypeError, match="ToyPolicy has no branched rollouts"):
        branch_rollout(toy, ro, torch.tensor([[3]]), 1, seeded([0]))
    ar.capabilities = dataclasses.replace(ar.capabilities, branching=False)  # a capability, not a probe
    try:
        with pytest.raises(TypeError, match="ARPolicy has no branched rollouts"):
            branch_rollout(ar, ro, torch.tensor([[3]]), 1, seeded([0]))
    finally:
        del ar.capabilities  # the class's declaration again


def test_ar_continuations_start_from_the_rollouts_kept_cache(ar, monkeypatch):
    """With `keep_cache` the continuations fork the rollout's own KV cache (no prefill) and draw what a
    prefilled cache draws; after the weights change the cache is stale and a prefill is made again."""
    import dataclasses

    from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder

    kept = dataclasses.replace(ar.default_sampling(), keep_cache=True)
    ro = ar.rollout(records(SHAPES), 2, kept, seeded(SEEDS))
    plain = ar.rollout(records(SHAPES), 2, ar.default_sampling(), seeded(SEEDS))
    assert (
        torch.equal(ro.tokens, plain.tokens) and "cache_key" not in plain.state
    )  # keeping changes no sample
    points = torch.tensor([[12, 40], [32, -1], [0, 63], [20, -1]])
    keys = continuation_keys([0, 1], 2, points, 2)
    prefills = []
    real = FusedLlamaDecoder.forward

    def spy(self, ids, start, *args, **kwargs):
        if ids.shape[1] > 1:
            prefills.append(ids.shape)
        return real(self, ids, start, *args, **kwargs)

    monkeypatch.setattr(FusedLlamaDecoder, "forward", spy)
    from_cache = branch_rollout(ar, ro, points, 2, group_generators(5, "b", keys))
    assert prefills == []
    from_prefill = branch_rollout(ar, plain, points, 2, group_generators(5, "b", keys))
    assert len(prefills) == 1
    assert torch.equal(from_cache.rollout.tokens, from_prefill.rollout.tokens)
    for c in CONTEXTS:
        torch.testing.assert_close(
            from_cache.rollout.logp[c], from_prefill.rollout.logp[c], atol=1e-5, rtol=0
        )
    with torch.no_grad():  # an optimizer step changes the weights in place: the kept cache no longer serves
        ar.head.weight.mul_(1.0)
    first = continuation_keys([0], 2, points[:2], 2)
    branch_rollout(ar, ro.select(torch.tensor([0, 1])), points[:2], 2, group_generators(5, "b", first))
    assert len(prefills) == 2
