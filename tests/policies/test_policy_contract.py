"""The `Policy` contract, checked once for every registered model family on its tiny model
(tests/tiny_models.py; the toy family of tests/toy_family.py is registered from here, as a user's
own family would be): rollout shapes, dtypes and mask; recorded log-probs equal to teacher-forced ones
(float32); a prompt's samples independent of its batch-mates; decode; save_pretrained → load.

A new family passes by adding its builder to TINY_MODELS; family-specific behaviour stays in its own
test file."""

from __future__ import annotations

import dataclasses
import importlib.metadata

import pytest
import torch

from t2i_gcpo.config import ModelOptions
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies import registry
from t2i_gcpo.policies.base import CONTEXTS, Policy, PolicyCapabilities, PromptRecord, policy_members
from t2i_gcpo.policies.registry import families, load_policy, models_help, split_spec
from t2i_gcpo.tasks.loop import group_generators

import toy_family
from repo_paths import REPO
from tiny_models import TINY_MODELS

CASES = {**TINY_MODELS, "toy": (toy_family.build_tiny_toy, ["a red circle", "two blue squares left of it"])}
G = 2  # samples per prompt
TOL = 1e-4  # float32, logits of order 10–20 in the tiny models


@pytest.fixture(scope="module", autouse=True)
def toy_registered():
    toy_family.register()
    yield
    toy_family.unregister()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """family → (policy, prompts, sampling), each tiny model built on first use."""
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            build, prompts = CASES[name]
            spec = build(tmp_path_factory.mktemp(name))
            assert split_spec(spec)[0] == name
            policy = load_policy(spec).eval()
            default = policy.default_sampling()
            sampling = dataclasses.replace(
                default, temperature=0.8, max_new_tokens=6, steps=4 if default.steps is not None else None
            )
            cache[name] = (policy, prompts, sampling)
        return cache[name]

    return get


def gens(seed: int, keys) -> list[torch.Generator]:
    return group_generators(seed, "contract", keys)


def records(texts) -> list[PromptRecord]:
    return [PromptRecord(t) for t in texts]


def test_every_registered_family_has_a_tiny_model():
    assert set(families()) == set(CASES)


@pytest.mark.parametrize("family", CASES)
def test_rollout_shapes_dtypes_and_mask(built, family):
    policy, prompts, sampling = built(family)
    assert isinstance(policy, Policy)  # every declared member exists
    assert isinstance(policy.capabilities, PolicyCapabilities)
    assert policy.device == next(policy.parameters()).device
    ro = policy.rollout(records(prompts), G, sampling, gens(0, range(2)))
    b, t = ro.tokens.shape
    assert b == len(ro) == 2 * G and ro.group_size == G and t <= ro.max_len
    assert [p.text for p in ro.prompts] == [p for p in prompts for _ in range(G)]  # grouped by prompt
    assert ro.tokens.dtype == torch.long and ro.step.dtype == torch.long and ro.mask.dtype == torch.float32
    assert ro.step.shape == ro.mask.shape == (b, t)
    assert set(ro.mask.unique().tolist()) <= {0.0, 1.0} and (ro.mask.sum(1) >= 1).all()
    assert "pos" in ro.logp and set(ro.logp) <= set(CONTEXTS)
    for lp in ro.logp.values():
        assert lp.shape == (b, t) and lp.dtype == torch.float32
        assert (lp[ro.mask > 0] <= 0).all() and torch.isfinite(lp).all()
    if policy.layout.kind == "grid":
        assert t == policy.layout.grid[0] * policy.layout.grid[1] and (ro.mask == 1).all()


@pytest.mark.parametrize("family", CASES)
def test_recorded_logprobs_equal_teacher_forced(built, family):
    policy, prompts, sampling = built(family)
    ro = policy.rollout(records(prompts), G, sampling, gens(1, range(2)))
    with torch.no_grad():
        for ctx, recorded in ro.logp.items():
            forced = policy.logprobs(ro, ctx)
            assert forced.shape == recorded.shape
            assert ((forced - recorded) * ro.mask).abs().max().item() < TOL, ctx
            with_dists, dists = policy.logprobs_and_dists(ro, ctx)
            assert torch.allclose(with_dists, forced)
            assert sum(1 for _ in dists) >= 1
    for one, other in (("pos", "neg"), ("guided", "pos")):  # the contexts really differ
        if one in ro.logp and other in ro.logp and sampling.guidance_scale != 1:
            assert ((ro.logp[one] - ro.logp[other]) * ro.mask).abs().max() > 1e-3, (one, other)


@pytest.mark.parametrize("family", CASES)
def test_a_seeded_rollout_is_reproducible_and_the_seed_matters(built, family):
    policy, prompts, sampling = built(family)
    a, b, c = (policy.rollout(records(prompts), G, sampling, gens(s, range(2))) for s in (5, 5, 6))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.step, b.step)
    assert all(torch.equal(a.logp[k], b.logp[k]) for k in a.logp)
    assert not torch.equal(a.tokens, c.tokens)


@pytest.mark.parametrize("family", CASES)
def test_a_prompts_samples_do_not_depend_on_its_batch_mates(built, family):
    policy, prompts, sampling = built(family)
    alone = policy.rollout(records(prompts[:1]), G, sampling, gens(2, [0]))
    # the same prompt with the same generator, now second in a batch with another prompt before it
    crowd = policy.rollout(records(prompts[::-1]), G, sampling, gens(2, [7]) + gens(2, [0]))
    mine = crowd.select(range(G, 2 * G))
    n = alone.tokens.shape[1]
    assert torch.equal(mine.tokens[:, :n], alone.tokens) and torch.equal(mine.mask[:, :n], alone.mask)
    assert torch.equal(mine.step[:, :n], alone.step) and (mine.mask[:, n:] == 0).all()
    assert not torch.equal(crowd.tokens[:G], crowd.tokens[G:]), "the other prompt's group is its own"
    for ctx, lp in alone.logp.items():  # float rounding of another batch shape only
        assert ((mine.logp[ctx][:, :n] - lp) * alone.mask).abs().max().item() < TOL, ctx


@pytest.mark.parametrize("family", CASES)
def test_decode_output(built, family):
    policy, prompts, sampling = built(family)
    ro = policy.rollout(records(prompts), G, sampling, gens(3, range(2)))
    out = policy.decode(ro)
    if policy.output == "image":
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
        assert out.dim() == 4 and out.shape[:2] == (len(ro), 3) and min(out.shape[2:]) > 0
        assert out.min() >= 0 and out.max() <= 1
    else:
        assert policy.output == "text" and isinstance(out, list) and len(out) == len(ro)
        assert all(isinstance(s, str) for s in out)
    features = policy.token_features(ro)
    assert features.shape[:2] == ro.tokens.shape and features.dim() == 3


@pytest.mark.parametrize("family", CASES)
def test_save_pretrained_then_load_by_path_alone(built, family, tmp_path):
    policy, prompts, sampling = built(family)
    ro = policy.rollout(records(prompts), G, sampling, gens(4, range(2)))
    policy.save_pretrained(str(tmp_path / "copy"))
    assert split_spec(str(tmp_path / "copy"))[0] == family  # the folder's own files say its family
    back = load_policy(str(tmp_path / "copy")).eval()
    assert type(back) is type(policy)
    with torch.no_grad():
        for ctx in ro.logp:
            assert ((back.logprobs(ro, ctx) - ro.logp[ctx]) * ro.mask).abs().max().item() < TOL, ctx
    again = back.rollout(records(prompts), G, sampling, gens(4, range(2)))
    assert torch.equal(again.tokens, ro.tokens)


@pytest.mark.parametrize("family", CASES)
def test_a_branch_fed_the_roots_uniforms_reproduces_the_root(built, family):
    """`Policy.branch` where `capabilities.branching`: a continuation from step t whose generator is the
    root's own (a group of one) re-draws the root's uniforms from t on, so it is the root; elsewhere
    branching is refused."""
    from t2i_gcpo.policies.branching import decision_steps

    policy, prompts, sampling = built(family)
    ro = policy.rollout(records(prompts), 1, sampling, gens(8, range(2)))
    n_steps = decision_steps(ro).tolist()
    rows = [sorted({t for t in (1, n // 2) if 0 < t < n}) for n in n_steps]  # steps 1 and half-way
    points = torch.tensor([r + [-1] * (2 - len(r)) for r in rows])  # [B, 2], −1 padding
    if not policy.capabilities.branching:
        with pytest.raises(TypeError):
            policy.branch(ro, points, 1, gens(8, [0]))
        return
    keys = [b for b, row in enumerate(points.tolist()) for t in row if t >= 0]
    assert keys, "every row has a step to branch from"
    br = policy.branch(ro, points, 1, gens(8, keys))
    base = ro.select(br.root)
    width = min(base.tokens.shape[1], br.rollout.tokens.shape[1])
    assert torch.equal(br.rollout.tokens[:, :width], base.tokens[:, :width]), br.point
    assert torch.equal(br.rollout.mask[:, :width], base.mask[:, :width])
    for ctx in base.logp:
        torch.testing.assert_close(
            br.rollout.logp[ctx][:, :width], base.logp[ctx][:, :width], atol=TOL, rtol=0
        )


# ----------------------------------------------------------------------------- the registry


def test_a_registered_family_is_listed_and_its_options_checked(tmp_path):
    assert "'toy:PATH'" in models_help() and "'janus:PATH'" in models_help()
    with pytest.raises(UserError, match=r"model 'nowhere' not found: expected .*'toy:PATH'"):
        load_policy("nowhere")
    spec = toy_family.build_tiny_toy(tmp_path)
    with pytest.raises(UserError) as err:
        load_policy(spec, ModelOptions(dtype="bfloat16"))  # the toy family reads no model option
    assert str(err.value) == (
        f"model_options.dtype='bfloat16' applies to amused, janus, llamagen, meissonic, showo and text "
        f"models only, not to the toy model '{spec}'"
    )
    with pytest.raises(UserError, match="'toy' is already registered"):
        toy_family.register()


def test_an_installed_package_registers_a_family_through_its_entry_point(monkeypatch, tmp_path):
    toy_family.unregister()
    family = dataclasses.replace(toy_family.make_family(), name="plugged")
    point = importlib.metadata.EntryPoint("plugged", "toy_family:PLUGGED", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(toy_family, "PLUGGED", family, raising=False)
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group: [point] if group == point.group else []
    )
    monkeypatch.setitem(registry.FAMILIES._loaded, "plugins", False)
    try:
        path = toy_family.build_tiny_toy(tmp_path).partition(":")[2]
        assert split_spec(f"plugged:{path}") == ("plugged", path)
        assert isinstance(load_policy(f"plugged:{path}"), toy_family.ToyPolicy)
    finally:
        registry.unregister_family("plugged")
        toy_family.register()


def test_a_scheme_reading_distributions_is_refused_where_the_family_declares_none():
    from t2i_gcpo.config import TrainConfig
    from t2i_gcpo.train.credit import compute_weights

    policy = toy_family.ToyPolicy()
    ro = policy.rollout([PromptRecord("a red circle")], 2, policy.default_sampling(), gens(0, range(1)))
    credit = TrainConfig().credit
    assert (
        compute_weights(credit, ro, torch.zeros(2), policy, policy, "pos", name="dgpo").shape == ro.mask.shape
    )
    policy.capabilities = dataclasses.replace(policy.capabilities, full_dists=False)
    with pytest.raises(UserError, match="full next-token distributions"):
        compute_weights(credit, ro, torch.zeros(2), policy, policy, "pos", name="dgpo")
    compute_weights(credit, ro, torch.zeros(2), policy, policy, "pos", name="uniform")  # needs none


def test_the_new_family_guide_lists_every_protocol_member_once():
    """docs/guides/new_family.md#adapter: its member table is the protocol, in the protocol's order."""
    import re

    guide = REPO / "docs" / "guides" / "new_family.md"
    text = guide.read_text().split("## The adapter", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    listed = [re.match(r"\| `(\w+)", line).group(1) for line in rows]
    assert listed == policy_members()
