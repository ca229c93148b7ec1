"""One plan before anything is written (issue 52, "a check that runs after the folder exists"): every command
checks its whole configuration — scheme × family × decode mode × loss × branching rule × trackers × compare's
every arm — before the run directory, its config.yaml, a settings record or any training exist. Each repro
of the issue is one line, exit 2, and no new file; the cross product of presets × families × the rule /
decode / loss values either plans or is refused so (the plan alone: nothing is trained)."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import torch
import yaml

import t2i_gcpo.policies.registry as registry
import t2i_gcpo.train.draws as draws
import t2i_gcpo.train.run as run_module
from t2i_gcpo.config import ALGORITHMS, BranchingConfig, LossConfig, RolloutConfig
from t2i_gcpo.resources import PROMPTS_DIR

from cli_helpers import cli, error_line
from tiny_models import build_tiny_masked, tiny_policy_dir
from train_fixtures import train_tiny_run, write_prompt_file

FAST = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=2",
    "sample_every=0",
    "eval_every=-1",
    "save_every=1",
]


def tree(root: Path) -> set[Path]:
    """Every path under `root` (what a command may have left)."""
    return set(root.rglob("*"))


def refused(capsys, root: Path, *argv, code: int = 2) -> str:
    """`t2i-gcpo ARGV` is one line and exit `code`, and leaves no new file or folder under `root`."""
    before = tree(root)
    got, _, err = cli(capsys, *argv)
    line = error_line(err, ignore="%|")
    assert got == code, err
    assert tree(root) == before, sorted(map(str, tree(root) - before))
    return line


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("plan")
    lm = root / "lm"
    _tiny_arithmetic_lm(lm)
    return {
        "root": root,
        "ar": str(tiny_policy_dir(root)),
        "masked": "masked:" + build_tiny_masked(root),
        "text": f"text:{lm}",
        "prompts": str(write_prompt_file(root / "p.jsonl")),
        "problems": str(_first_lines(PROMPTS_DIR / "arithmetic_train.jsonl", root / "problems.jsonl", 16)),
    }


def _first_lines(source: Path, copy: Path, n: int) -> Path:
    """The first `n` lines of a shipped prompt file (planning reads and checks every line of it)."""
    copy.write_text("".join(source.read_text().splitlines(keepends=True)[:n]))
    return copy


def _tiny_arithmetic_lm(path: Path) -> None:
    """A 2-layer Llama over the arithmetic world's tokenizer (it takes the shipped problem files)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from t2i_gcpo.worlds.arithmetic import build_tokenizer

    torch.manual_seed(0)
    tok = build_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)


def train_args(models: dict, out: Path, *extra: str, family: str = "ar") -> list:
    prompts = models["problems"] if family == "text" else models["prompts"]
    args = [
        "train",
        "--prompts",
        prompts,
        "--model",
        models[family],
        "--out",
        out,
        "--steps",
        "2",
        "--report-to",
        "none",
    ]
    if family == "text":
        args += ["--set", "rollout.max_new_tokens=16"]
    for s in FAST:
        args += ["--set", s]
    return [*args, *extra]


# ----------------------------------------------------------------- the repros, each before the folder


def test_graph_decoding_without_cuda_is_refused_before_the_folder(models, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is there: graph decoding runs")
    line = refused(capsys, tmp_path, *train_args(models, tmp_path / "run", "--set", "rollout.decode=graph"))
    assert "rollout.decode=graph needs a CUDA device" in line


@pytest.mark.parametrize("algo", ["tempo", "vine", "tree", "stepwise"])
def test_weighted_token_mean_with_token_advantages_is_refused_before_the_folder(
    models, tmp_path, capsys, algo
):
    family = "masked" if algo == "stepwise" else "ar"
    args = train_args(
        models,
        tmp_path / "run",
        "--algo",
        algo,
        "--set",
        "loss.aggregation=weighted-token-mean",
        family=family,
    )
    line = refused(capsys, tmp_path, *args)
    assert "config key 'loss.aggregation'" in line and "gives token advantages" in line, line


def test_boundary_branching_on_a_masked_model_is_refused_before_the_folder(models, tmp_path, capsys):
    args = train_args(
        models, tmp_path / "run", "--algo", "vine", "--set", "branching.rule=boundary", family="masked"
    )
    line = refused(capsys, tmp_path, *args)
    assert "config key 'branching.rule': boundary" in line and "use every_k or entropy" in line, line


CREDIT = """
from t2i_gcpo import credit_scheme

@credit_scheme(needs=("rewards", "branches"))
def branched(inputs):
    return inputs.mask.float()
"""


@pytest.mark.parametrize("how", ["key", "old key", "user scheme"])
def test_vine_branching_at_spread_points_is_refused_before_the_folder(models, tmp_path, capsys, how):
    """`--algo vine --set branching.rule=spread`: a ValueError traceback at step 1 (pick_points knows
    every_k, entropy and boundary only), also through the old key and a user scheme that needs branches."""
    extra = {
        "key": ["--algo", "vine", "--set", "branching.rule=spread"],
        "old key": ["--algo", "vine", "--set", "credit.vine.rule=spread"],
        "user scheme": ["--credit", f"{tmp_path / 'mine.py'}:branched", "--set", "branching.rule=spread"],
    }[how]
    (tmp_path / "mine.py").write_text(CREDIT)
    line = refused(capsys, tmp_path, *train_args(models, tmp_path / "run", *extra))
    assert "config key 'branching.rule'" in line and "got spread" in line, line


@pytest.fixture
def wandb_without_a_key(monkeypatch, tmp_path):
    """W&B installed but not logged in: wandb.login raises its UsageError, as on a fresh machine."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)

    def login(*args, **kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])")

    monkeypatch.setattr(wandb, "login", login)


def test_report_to_all_checks_every_tracker_before_the_folder(models, tmp_path, capsys, wandb_without_a_key):
    """`--report-to all` skipped the tracker start check: W&B's UsageError traceback, folder left."""
    args = [a if a != "none" else "all" for a in train_args(models, tmp_path / "run")]
    line = refused(capsys, tmp_path, *args)
    assert line.startswith("error: report_to=") and "cannot" in line, line
    compare = [
        "compare",
        "--algos",
        "dapo",
        "--seeds",
        "1",
        "--steps",
        "1",
        "--model",
        models["ar"],
        "--prompts",
        models["prompts"],
        "--report-to",
        "all",
        "--out",
        tmp_path / "cmp",
    ]
    line = refused(capsys, tmp_path, *compare)
    assert line.startswith("error: report_to=") and "cannot" in line, line


def compare_args(models: dict, out: Path, *extra: str) -> list:
    args = [
        "compare",
        "--seeds",
        "1",
        "--steps",
        "1",
        "--eval-every",
        "1",
        "--model",
        models["ar"],
        "--prompts",
        models["prompts"],
        "--out",
        out,
        "--report-to",
        "none",
    ]
    for s in (
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "eval_images_per_prompt=1",
        "sample_every=0",
    ):
        args += ["--set", s]
    return [*args, *extra]


@pytest.fixture
def no_training(monkeypatch):
    """Training replaced by a note of what would train (the plan alone runs)."""
    trained = []

    def run(job):
        trained.append(job.cfg.algo)
        if job.lock is not None:
            job.lock.release()
        return {}

    monkeypatch.setattr(run_module, "run", run)
    return trained


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--algos", "dapo,vine", "--match-budget", "bogus"], "--match-budget must be samples, tokens"),
        (["--algos", "dapo,gcpo", "--match-budget", "samples"], "nothing to match"),
        (
            ["--algos", "dapo,stepwise"],
            "credit scheme 'stepwise' needs a full prediction at every reveal step",
        ),
    ],
    ids=["bogus-unit", "nothing-to-match", "stepwise-on-ar"],
)
def test_compare_refusals_leave_no_out_and_train_nothing(
    models, tmp_path, capsys, no_training, extra, needle
):
    """compare's refusals left their --out with its settings record; `--algos dapo,stepwise` on the AR
    model trained dapo first, then refused stepwise."""
    line = refused(capsys, tmp_path, *compare_args(models, tmp_path / "cmp", *extra))
    assert needle in line, line
    assert no_training == []


def test_compare_with_a_reward_that_is_not_the_tasks_scorer_is_refused_up_front(
    models, tmp_path, capsys, no_training
):
    """`compare --reward r.py:ok`: every run trained, then 'has no eval.json … run the same command again'
    forever. Refused before any run, with the option that gives the runs a held-out score."""
    (tmp_path / "r.py").write_text("def ok(images, prompts, metadata):\n    return images.mean((1, 2, 3))\n")
    line = refused(
        capsys,
        tmp_path,
        *compare_args(models, tmp_path / "cmp", "--algos", "dapo", "--reward", f"{tmp_path / 'r.py'}:ok"),
    )
    assert "has no held-out prompts" in line and "shapeworld_test.jsonl (scored with your reward)" in line, (
        line
    )
    assert no_training == []


@pytest.fixture(scope="module")
def warm(models):
    """A finished 1-step run whose config says it was started with steps 4 and a 3-step warmup (a run
    stopped at step 1 of 4: the issue's 8 and 6, smaller)."""
    run = train_tiny_run(models["root"] / "warm")
    config = run["base"] / "config.yaml"
    data = yaml.safe_load(config.read_text())
    data["steps"], data["optim"]["warmup_steps"] = 4, 3
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    return run


def test_resume_checks_the_config_with_its_steps_applied(warm, tmp_path, capsys, no_training):
    """`--resume --steps 4` on a run with warmup 6 and steps 8 was checked against the saved 8, accepted,
    ended mid-warmup, and the config it rewrote refused `--resume --steps 8` forever (here: 3, 3 and 4)."""
    import shutil

    run = Path(shutil.copytree(warm["base"], tmp_path / "run"))
    saved = (run / "config.yaml").read_text()
    line = refused(capsys, tmp_path, "train", "--resume", run, "--steps", 3)
    expected = (
        f"cannot resume {run} with --steps 3: config key 'optim.warmup_steps': must be less than steps (3)"
    )
    assert expected in line, line
    assert (run / "config.yaml").read_text() == saved and no_training == []
    code, _, err = cli(capsys, "train", "--resume", run, "--steps", 4)  # planned: it would train to step 4
    assert code == 0 and no_training == ["gcpo"], err


# ------------------------------------------------------------------ the cross product, the plan alone

FAMILIES = ("ar", "masked", "text")


def literal_values(cls: type, name: str) -> tuple:
    """The values a config field's Literal type takes."""
    return typing.get_args(typing.get_type_hints(cls)[name])


VALUES = [("branching.rule", v) for v in literal_values(BranchingConfig, "rule")]
VALUES += [("rollout.decode", v) for v in literal_values(RolloutConfig, "decode")]
VALUES += [("loss.aggregation", v) for v in literal_values(LossConfig, "aggregation")]
TOKEN_ADVANTAGES = ("tempo", "vine", "tree", "stepwise")  # presets whose scheme gives token advantages


@pytest.fixture(scope="module")
def cached_policies():
    """Each tiny model loaded, and its memory model measured, once for the whole cross product (planning
    changes neither; the memory model's own tests: tests/train/test_draws.py)."""
    return {}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("preset", ALGORITHMS)
def test_every_preset_family_and_value_plans_or_is_one_line_before_the_folder(
    models, tmp_path, capsys, monkeypatch, no_training, cached_policies, preset, family
):
    """presets × families × the branching rules, decode modes and loss aggregations, one value at a time:
    `train` either plans (and would train) or is refused in one line, exit 2, leaving no file."""
    load, measure = registry.load_policy, draws.measure_profile

    def cached_load(spec, options=None):
        key = (spec, repr(options))
        if key not in cached_policies:
            cached_policies[key] = load(spec, options)
        return cached_policies[key]

    def cached_measure(cfg, policy, prompt):  # the memory model, measured once a model and scheme
        key = ("profile", id(policy), cfg.credit.scheme, cfg.rollout.group_size)
        if key not in cached_policies:
            cached_policies[key] = measure(cfg, policy, prompt)
        return cached_policies[key]

    monkeypatch.setattr(registry, "load_policy", cached_load)
    monkeypatch.setattr(draws, "measure_profile", cached_measure)
    outcomes = {}
    for key, value in VALUES:
        out = tmp_path / "run"
        before = tree(tmp_path)
        code, _, err = cli(
            capsys, *train_args(models, out, "--algo", preset, "--set", f"{key}={value}", family=family)
        )
        assert tree(tmp_path) == before, (key, value, sorted(map(str, tree(tmp_path) - before)))
        if code == 0:
            outcomes[(key, value)] = "planned"
            continue
        line = error_line(err, ignore="note: credit scheme")
        assert code == 2 and "Traceback" not in err, (key, value, err)
        outcomes[(key, value)] = line
    assert no_training == [preset] * sum(v == "planned" for v in outcomes.values())
    # what the plan must refuse, whatever else it accepts
    if family != "masked" and not torch.cuda.is_available():
        assert "needs a CUDA device" in outcomes[("rollout.decode", "graph")]
    if preset == "vine":
        assert "got spread" in outcomes[("branching.rule", "spread")]
    if preset == "tree":
        assert "spread or entropy" in outcomes[("branching.rule", "every_k")]
    if preset in TOKEN_ADVANTAGES:
        assert "cannot weight" in outcomes[("loss.aggregation", "weighted-token-mean")]
    if preset == "stepwise" and family != "masked":  # a full prediction at every reveal step: masked only
        assert "planned" not in outcomes.values()
    if preset == "dapo":  # the plain preset plans with every rule and aggregation
        assert all(o == "planned" for (k, _), o in outcomes.items() if k != "rollout.decode"), outcomes


def test_the_cross_product_covers_every_value():
    assert {v for k, v in VALUES if k == "rollout.decode"} == {"auto", "eager", "static", "graph", "compile"}
    assert {v for k, v in VALUES if k == "branching.rule"} == {"every_k", "entropy", "boundary", "spread"}
    assert len(VALUES) == 13 and set(TOKEN_ADVANTAGES) <= set(ALGORITHMS)
