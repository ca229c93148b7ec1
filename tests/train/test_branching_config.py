"""Branching as its own capability (docs/concepts/tree_credit.md#running-tree-credit): the `branching.*`
settings read by every scheme that needs "branches" (a user's too), the old `credit.vine.*` names still
read, a scheme refused before the run directory exists on a family that cannot serve it, and no adapter's
private member read from outside its own file."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.config import load_config
from t2i_gcpo.core.tree import Tree
from t2i_gcpo.errors import UserError

from cli_helpers import cli, error_line
from repo_paths import TESTS
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

PACKAGE = Path(trainer_mod.__file__).resolve().parent.parent
FAST = (
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=2",
    "sample_every=0",
    "eval_every=-1",
    "save_every=1",
    "rollout.autocast=none",
    "optim.autocast=none",
)

# a user's scheme that reads the branches: all of a sample's credit after its first branch point, the share
# set by how far its continuations' mean reward is from its own (it records what it was given)
SCHEME = """
import json, os
import torch
from t2i_gcpo import credit_scheme

@credit_scheme(needs=("branches", "rewards"))
def after_first_point(inputs):
    tree = inputs.tree
    with open(os.environ["SEEN_TREE"], "a") as f:
        f.write(json.dumps({"type": type(tree).__name__, "points": tree.points.tolist(),
                            "m": tree.continuations}) + "\\n")
    first = tree.points[:, :1].clamp_min(0)  # [B, 1]
    late = (inputs.step >= first) & (tree.points[:, :1] >= 0)
    w = inputs.mask.float() * (1.0 + late.float())
    return w * inputs.mask.sum(1, keepdim=True) / (w * inputs.mask).sum(1, keepdim=True)
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    (root / "tree_credit.py").write_text(SCHEME)
    return {
        "scheme": root / "tree_credit.py",
        "model": str(tiny_policy_dir(root)),
        "prompts": str(write_prompt_file(root / "p.jsonl")),
    }


@pytest.fixture(autouse=True)
def no_report(monkeypatch):
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)  # matplotlib: seconds per run


def train_args(tiny, out, *sets, credit=None, algo="dapo", model=None):
    args = [
        "train",
        "--prompts",
        tiny["prompts"],
        "--model",
        model or tiny["model"],
        "--reward",
        "train_fixtures:redness",
        "--algo",
        algo,
        "--out",
        str(out),
        "--steps",
        "2",
        "--seed",
        "0",
    ]
    if credit is not None:
        args += ["--credit", credit]
    for s in (*FAST, *sets):
        args += ["--set", s]
    return args


def test_a_user_scheme_that_needs_branches_trains_on_the_branching_settings(
    tiny, tmp_path, capsys, monkeypatch
):
    seen = tmp_path / "seen.jsonl"
    monkeypatch.setenv("SEEN_TREE", str(seen))
    out = tmp_path / "run"
    sets = ("branching.k=5", "branching.continuations=3", "advantage.dynamic_sampling=false")
    code, _, err = cli(capsys, *train_args(tiny, out, *sets, credit=f"{tiny['scheme']}:after_first_point"))
    assert code == 0, err
    calls = [json.loads(line) for line in seen.read_text().splitlines()]
    assert calls and all(c["type"] == "Tree" and c["m"] == 3 for c in calls)
    # the tiny prior's 16 tokens, every 5 steps: points 5, 10, 15 in every sample
    assert all(row == [5, 10, 15] for c in calls for row in c["points"])
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # 2 groups of 4 drawn (and kept), 3 points × 3 continuations of each sample scored
        assert (r["groups_drawn"], r["budget/samples"]) == (2, 2 * 4 + 2 * 4 * 9), r


def test_the_old_vine_keys_are_read_as_the_branching_settings():
    cfg = load_config(
        "vine", overrides=["credit.vine.k=8", "credit.vine.continuations=3", "credit.vine.rule=entropy"]
    )
    assert (cfg.branching.rule, cfg.branching.k, cfg.branching.continuations) == ("entropy", 8, 3)
    assert not hasattr(cfg.credit.vine, "k")  # vine's own options are how it turns rewards into advantages
    assert load_config("vine", overrides=["branching.k=4"]).branching.k == 4
    with pytest.raises(UserError, match="'credit.vine.k' and 'branching.k' are the same setting"):
        load_config("vine", overrides={"credit.vine.k": 8, "branching.k": 4})
    with pytest.raises(UserError, match=r"config key 'branching.continuations': must be in \[1, 64\]"):
        load_config("vine", overrides=["branching.continuations=100000"])


def test_a_branching_scheme_on_a_family_without_branching_is_one_line_and_no_run_directory(tmp_path, capsys):
    import toy_family

    toy_family.register()
    try:
        spec = toy_family.build_tiny_toy(tmp_path)
        prompts = write_prompt_file(tmp_path / "p.jsonl")
        out = tmp_path / "run"
        tiny = {"prompts": str(prompts)}
        code, _, err = cli(capsys, *train_args(tiny, out, "branching.k=2", algo="vine", model=spec))
        assert code == 2
        assert error_line(err) == (
            "error: credit scheme 'vine' needs branched rollouts, which this ToyPolicy does not give "
            "(PolicyCapabilities.branching); choose another scheme or model"
        )
        assert not out.exists()
        # the same check for every capability a scheme needs: DGPO reads full distributions
        toy_family.ToyPolicy.capabilities = toy_family.PolicyCapabilities(full_dists=False)
        code, _, err = cli(capsys, *train_args(tiny, out, algo="dgpo", model=spec))
        assert code == 2 and "needs full next-token distributions" in error_line(err) and not out.exists()
    finally:
        toy_family.ToyPolicy.capabilities = toy_family.PolicyCapabilities(full_dists=True)
        toy_family.unregister()


def test_trees_select_and_concatenate_row_by_row():
    a = Tree(torch.tensor([[2, 5], [3, -1]]), torch.arange(8.0, dtype=torch.float64).view(2, 2, 2))
    b = Tree.empty(1, 2)
    both = Tree.concat([a, b])
    assert both.points.tolist() == [[2, 5], [3, -1], [-1, -1]]
    assert both.exists.tolist() == [[[True] * 2] * 2, [[True] * 2, [False] * 2], [[False] * 2] * 2]
    assert torch.isnan(both.rewards[2]).all()
    picked = both.select(torch.tensor([1]))
    assert picked.points.tolist() == [[3, -1]] and picked.rewards[0, 0].tolist() == [4.0, 5.0]
    with pytest.raises(ValueError, match="different numbers of continuations"):
        Tree.concat([a, Tree.empty(1, 3)])


def private_members() -> dict[str, set[str]]:
    """file → the private names (one leading underscore) its classes define."""
    out: dict[str, set[str]] = {}
    for path in (PACKAGE / "policies").glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id == "self":
                    names.add(node.attr)
        out[str(path)] = {n for n in names if n.startswith("_") and not n.startswith("__")}
    return out


def test_no_adapter_private_member_is_read_outside_its_own_file():
    members = private_members()
    reads = []
    for path in PACKAGE.rglob("*.py"):
        theirs = set().union(*(names for file, names in members.items() if file != str(path)))
        ours = members.get(str(path), set())
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or node.attr not in theirs - ours:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            reads.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: .{node.attr}")
    assert reads == [], "private adapter members read from outside their adapter:\n" + "\n".join(reads)
    assert "_head" in set().union(*members.values())  # the scan sees the adapters' privates


@pytest.mark.slow
def test_a_new_scheme_is_one_file_and_the_suite_stays_green(tmp_path):
    """A copy of the package with one more file in core/schemes/: the tests that enumerate schemes pass."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "src"
    shutil.copytree(PACKAGE, copy / "t2i_gcpo", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "t2i_gcpo" / "core" / "schemes" / "late_half.py").write_text(
        '"""Half the credit to the second half of a sample (a test scheme)."""\n\n'
        "from torch import Tensor\n\n"
        "from t2i_gcpo.core.schemes.registry import CreditInputs, register_scheme\n\n\n"
        '@register_scheme("late_half", doc="More credit on the second half of the sample (test).")\n'
        "def late_half(inp: CreditInputs) -> Tensor:\n"
        "    m = inp.mask.float()\n"
        "    late = (m.cumsum(1) > m.sum(1, keepdim=True) / 2).float()\n"
        "    w = m * (1 + late)\n"
        "    return w * m.sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp_min(1e-12)\n"
    )
    tests = TESTS
    env = {**__import__("os").environ, "PYTHONPATH": f"{copy}:{tests}", "HF_HUB_OFFLINE": "1"}
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import t2i_gcpo, t2i_gcpo.core as c; print(t2i_gcpo.__file__, 'late_half' in c.CREDIT_SCHEMES)",
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert probe.stdout.split() == [str(copy / "t2i_gcpo" / "__init__.py"), "True"], probe.stderr
    selected = [
        f"{tests}/core/test_credit.py::test_registry_and_uniform",
        f"{tests}/core/schemes/test_scheme_contract.py::test_every_registered_scheme_is_mass_preserving_and_b_by_t",
        f"{tests}/core/schemes/test_user_schemes.py::test_every_preset_and_scheme_is_in_the_help",
        f"{tests}/core/schemes/test_user_schemes.py::test_a_scheme_that_cannot_be_loaded_is_one_line",
        f"{tests}/test_config.py",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selected],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "late_half" in done.stdout or "passed" in done.stdout
