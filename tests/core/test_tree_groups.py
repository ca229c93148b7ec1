"""Tree groups (docs/concepts/tree_credit.md#tree-groups): the advantages against hand-computed values, the
spread points, the batch a step trains on (every leaf, each continuation on its own segment), the budget
it counts, and the `tree` preset trained from the command line on every family with branched rollouts."""

from __future__ import annotations

import json
import math

import pytest
import torch

import t2i_gcpo.train.trainer as trainer_mod
import t2i_gcpo.train.update as update_mod
from t2i_gcpo.core.branch_points import spread
from t2i_gcpo.core.schemes import credit_weights, get_scheme
from t2i_gcpo.core.schemes.registry import CreditInputs
from t2i_gcpo.core.tree import Leaves
from t2i_gcpo.core.tree_groups import own_segment, tree_group_advantages

from cli_helpers import cli, error_line
from text_fixtures import ROWS, cli_train, problems
from tiny_models import TINY_MODELS, tiny_policy_dir
from train_fixtures import write_prompt_file

# one group: roots 0 (r = 1) and 1 (r = 0); root 0 continued twice from t = 2 (rows 2, 3), root 1 twice from
# t = 3 (rows 4, 5); 4 tokens each, decided in order
REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
LEAVES = Leaves(torch.tensor([0, 1, 0, 0, 1, 1]), torch.tensor([-1, -1, 2, 2, 3, 3]))
MASK, STEP = torch.ones(6, 4), torch.arange(4).expand(6, 4)


def test_tree_group_advantages_by_hand():
    a = tree_group_advantages(REWARDS, 6, LEAVES, MASK, STEP, scale="none")
    # V₀ = 4/6; node (0, 2) = mean(1, 1, 0) = 2/3; node (1, 3) = mean(0, 1, 1) = 2/3. Root 0's steps 0–1 lead
    # into node (0, 2) from the prompt: (2/3 − 2/3) + (2/3 − 2/3) = 0; its steps 2–3 into itself from (0, 2):
    # (1 − 2/3) + (1 − 2/3) = 2/3. Row 3 (r = 0) from (0, 2): −4/3; before its point: nothing (not its own).
    third = 1 / 3
    expected = torch.tensor(
        [
            [0, 0, 2 * third, 2 * third],
            [0, 0, 0, -4 * third],
            [0, 0, 2 * third, 2 * third],
            [0, 0, -4 * third, -4 * third],
            [0, 0, 0, 2 * third],
            [0, 0, 0, 2 * third],
        ]
    )
    torch.testing.assert_close(a, expected)
    own = own_segment(LEAVES, MASK, STEP)
    assert own[:2].all() and own[2:4].tolist() == [[False, False, True, True]] * 2
    scaled = tree_group_advantages(REWARDS, 6, LEAVES, MASK, STEP, scale="group", eps=0.0)
    torch.testing.assert_close(scaled, a / REWARDS.std())
    assert (tree_group_advantages(torch.ones(6), 6, LEAVES, MASK, STEP) == 0).all()  # no spread, no signal


def test_a_continuation_from_the_prompt_and_deeper_nodes():
    # root 0 (r = 0) continued from t = 1 (row 2, r = 1) and t = 3 (row 3, r = 1); root 1 (r = 0) continued
    # from t = 0 (row 4, r = 1: a child of the prompt node) and t = 2 (row 5, r = 0)
    rewards = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    leaves = Leaves(torch.tensor([0, 1, 0, 0, 1, 1]), torch.tensor([-1, -1, 1, 3, 0, 2]))
    a = tree_group_advantages(rewards, 6, leaves, MASK, STEP, scale="none").double()
    # V₀ = 1/2; root 0's nodes: (0, 1) = mean(0, 1, 1) = 2/3, (0, 3) = mean(0, 1) = 1/2; root 1's: (1, 2) =
    # mean(0, 0) = 0 (its t = 0 continuation hangs from the prompt node, not below root 1)
    expected = [
        [2 * (2 / 3 - 0.5), (0.5 - 0.5) + (0.5 - 2 / 3), (0.5 - 0.5) + (0.5 - 2 / 3), 2 * (0 - 0.5)],
        [2 * (0 - 0.5), 2 * (0 - 0.5), (0 - 0.5) + (0 - 0), (0 - 0.5) + (0 - 0)],
        [0] + [(1 - 0.5) + (1 - 2 / 3)] * 3,  # from (0, 1): its steps 1–3
        [0, 0, 0, (1 - 0.5) + (1 - 0.5)],  # from (0, 3)
        [(1 - 0.5) + (1 - 0.5)] * 4,  # from the prompt
        [0, 0, (0 - 0.5) + (0 - 0), (0 - 0.5) + (0 - 0)],  # from (1, 2)
    ]
    torch.testing.assert_close(a, torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=0)


def test_the_scheme_reads_the_leaves_and_refuses_a_continuation_of_a_continuation():
    assert get_scheme("tree").needs == frozenset({"rewards", "leaves"})
    inp = CreditInputs(
        mask=MASK,
        step=STEP,
        tokens=torch.zeros(6, 4, dtype=torch.long),
        rewards=REWARDS,
        group_size=6,
        leaves=LEAVES,
    )
    torch.testing.assert_close(
        credit_weights("tree", inp, {"normalisation": "none"}),
        tree_group_advantages(REWARDS, 6, LEAVES, MASK, STEP, scale="none"),
    )
    bad = Leaves(torch.tensor([0, 1, 2, 0, 1, 1]), LEAVES.point)
    with pytest.raises(ValueError, match="must continue a root of its group"):
        tree_group_advantages(REWARDS, 6, bad, MASK, STEP)


def test_spread_points_by_hand():
    assert spread(torch.tensor([16, 9, 2]), 2).tolist() == [[5, 10], [3, 6], [0, 1]]


# ---------------------------------------------------------------- end to end


@pytest.fixture(autouse=True)
def no_report(monkeypatch):
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)  # matplotlib: seconds per run


FAST = (
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.cfg_scale=2",
    "sample_every=0",
    "eval_every=-1",
    "save_every=1",
    "rollout.autocast=none",
    "optim.autocast=none",
    "advantage.dynamic_sampling=false",
)


def test_a_tree_step_trains_on_every_leaf_and_counts_its_budget(tmp_path, capsys, monkeypatch):
    model = str(tiny_policy_dir(tmp_path))  # 4 × 4 tokens: points at 5 and 10
    prompts = write_prompt_file(tmp_path / "p.jsonl")
    batches = []
    real = update_mod.update

    def spy(cfg, batch, *args, **kwargs):
        batches.append(batch)
        return real(cfg, batch, *args, **kwargs)

    monkeypatch.setattr(trainer_mod, "update_policy", spy)
    args = [
        "train",
        "--prompts",
        prompts,
        "--model",
        model,
        "--reward",
        "train_fixtures:redness",
        "--algo",
        "tree",
        "--out",
        tmp_path / "run",
        "--steps",
        "1",
        "--seed",
        "0",
    ]
    for s in FAST:
        args += ["--set", s]
    code, _, err = cli(capsys, *args)
    assert code == 0, err
    (batch,) = batches
    G = 2 * (1 + 2 * 2)  # 2 roots, 2 points, 2 continuations each
    assert batch.rollout.group_size == G and len(batch.rollout) == 2 * G
    point = batch.leaves.point.view(2, G)
    assert (point[:, :2] == -1).all() and point[:, 2:].tolist() == [[5, 5, 10, 10] * 2] * 2
    trained = batch.rollout.loss_mask.view(2, G, 16).bool()
    assert trained[:, :2].all()  # roots: every token
    assert (trained[:, 2:].sum(-1) == 16 - point[:, 2:]).all()  # continuations: from their point on
    (row,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # 2 prompts: 2 roots of 16 tokens, 8 continuations (4 of 11 tokens, 4 of 6)
    assert (row["budget/samples"], row["budget/tokens"]) == (2 * G, 2 * (2 * 16 + 4 * 11 + 4 * 6))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["ar", "masked", "amused", "janus", "meissonic", "llamagen"])
def test_the_tree_preset_trains_on_every_image_family(family, tmp_path, capsys):
    model = TINY_MODELS[family][0](tmp_path)
    prompts = tmp_path / "p.txt"  # prompts of the family's task: ShapeWorld's shapes or GenEval's classes
    thing = "circle" if family in ("ar", "masked") else "cat"
    prompts.write_text(f"a photo of a red {thing}\na photo of two {thing}s\n")
    out = tmp_path / "run"
    args = [
        "train",
        "--prompts",
        prompts,
        "--model",
        model,
        "--reward",
        "train_fixtures:redness",
        "--algo",
        "tree",
        "--out",
        out,
        "--steps",
        "2",
        "--seed",
        "0",
        "--set",
        "branching.k=1",
    ]
    for s in FAST:
        args += ["--set", s]
    code, _, err = cli(capsys, *args)
    assert code == 0, err
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["budget/samples"] == 2 * 2 * (1 + 2) for r in rows)  # 2 prompts × 2 roots × (1 + 1 · 2)


def test_tree_groups_refuse_settings_that_vary_the_leaves(tmp_path, capsys):
    model = str(tiny_policy_dir(tmp_path))
    prompts = write_prompt_file(tmp_path / "p.jsonl")
    base = [
        "train",
        "--prompts",
        prompts,
        "--model",
        model,
        "--reward",
        "train_fixtures:redness",
        "--algo",
        "tree",
        "--out",
        tmp_path / "run",
        "--steps",
        "1",
    ]
    code, _, err = cli(capsys, *base, "--set", "branching.rule=every_k")
    assert code == 2 and "branching.rule=spread or entropy" in error_line(err)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_tree_preset_trains_on_text(tiny_lm, tmp_path):  # noqa: F811
    extra = ("rollout.group_size=2", "advantage.dynamic_sampling=false", "branching.k=2")
    rows = cli_train(tiny_lm, problems(tmp_path, ROWS), tmp_path / "run", "tree", 1e-4, extra=extra)
    (row,) = rows
    assert row["budget/samples"] == 2 * 2 * (1 + 2 * 2)  # 2 prompts × 2 roots × (1 + 2 points · 2)
    assert math.isfinite(row["loss/policy"])
