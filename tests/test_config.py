"""The config system: presets, layering, dotted overrides and their errors."""

from pathlib import Path

import pytest
import yaml

from t2i_gcpo.config import ALGORITHMS, CONFIG_DIR, describe, from_dict, load_config, nest, parse_set, to_dict
from t2i_gcpo.errors import UserError


def all_yaml_files():
    return sorted(p for p in CONFIG_DIR.rglob("*.yaml") if "accelerate" not in p.parts)


@pytest.mark.parametrize("path", all_yaml_files(), ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_every_config_file_loads_and_opens_with_a_header(path: Path):
    text = path.read_text()
    assert text.startswith("#"), f"{path} must open with a header comment"
    data = yaml.safe_load(text)
    cfg = load_config(data.get("algo"), config_file=path)
    assert cfg.algo in ALGORITHMS


def test_presets_match_the_spec_table():
    rows = {a: load_config(a) for a in ALGORITHMS}
    table = {  # docs/concepts/algorithms.md#presets: ε_low / ε_high, aggregation, dynamic sampling, β, credit
        "grpo": (0.2, 0.2, "seq-mean-token-mean", False, 0.03, "uniform"),
        "dapo": (0.2, 0.28, "token-mean", True, 0.0, "uniform"),
        "gcpo": (0.2, 0.28, "token-mean", True, 0.0, "gcpo"),
        "dgpo": (0.2, 0.28, "token-mean", True, 0.0, "dgpo"),
        "gcpo-official": (0.2, 0.2, "weighted-token-mean", False, 0.03, "gcpo"),
        "critical": (0.2, 0.28, "token-mean", True, 0.0, "critical"),
        "stage": (0.2, 0.28, "token-mean", True, 0.0, "stage"),
        "vine": (0.2, 0.28, "token-mean", True, 0.0, "vine"),
        "tempo": (0.2, 0.28, "token-mean", True, 0.0, "tempo"),
        "eg-grpo": (0.2, 0.28, "token-mean", True, 0.0, "eg_grpo"),
        "balanced": (0.2, 0.28, "token-mean", True, 0.0, "uniform"),
        "tree": (0.2, 0.28, "token-mean", True, 0.0, "tree"),
        "pods": (0.2, 0.28, "token-mean", True, 0.0, "uniform"),
        "knapsack": (0.2, 0.28, "token-mean", True, 0.0, "uniform"),
    }
    for algo, expected in table.items():
        c = rows[algo]
        got = (
            c.loss.eps_low,
            c.loss.eps_high,
            c.loss.aggregation,
            c.advantage.dynamic_sampling,
            c.loss.beta,
            c.credit.scheme,
        )
        assert got == expected, algo
    assert rows["gcpo-official"].loss.kl_reweight and not rows["gcpo"].loss.kl_reweight
    # gcpo, critical and stage differ from dapo only in credit
    dapo = to_dict(rows["dapo"])
    for algo in ("gcpo", "critical", "stage", "vine", "tempo", "eg-grpo"):
        other = to_dict(rows[algo])
        assert {k for k in dapo if dapo[k] != other[k]} == {"algo", "credit"}, algo
        assert {k for k in dapo["credit"] if dapo["credit"][k] != other["credit"][k]} == {"scheme"}, algo
    for algo in ("pods", "knapsack"):  # DAPO with a budget allocation
        other = to_dict(rows[algo])
        assert {k for k in dapo if dapo[k] != other[k]} == {"algo", "rollout"}, algo
        assert {k for k in dapo["rollout"] if dapo["rollout"][k] != other["rollout"][k]} == {"allocation"}, (
            algo
        )


def test_layering_preset_file_flags_then_set(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("loss:\n  beta: 0.5\nsteps: 7\n")
    cfg = load_config(
        "dapo", f, flags={"steps": 9, "seed": None}, overrides=["loss.beta=0.25", "credit.gcpo.tau=2"]
    )
    assert cfg.loss.eps_high == 0.28  # preset
    assert cfg.steps == 9  # flag beats file
    assert cfg.seed == 0  # None flag = not given
    assert cfg.loss.beta == 0.25 and cfg.credit.gcpo.tau == 2.0  # --set wins, int accepted for float


@pytest.mark.parametrize(
    "override, message",
    [
        ("loss.betta=1", "unknown config key 'loss.betta'"),
        ("nope=1", "unknown config key 'nope'"),
        ("loss.beta=abc", "config key 'loss.beta': expected float"),
        ("rollout.group_size=2.5", "config key 'rollout.group_size': expected int"),
        ("rollout.train_logp=logits", "config key 'rollout.train_logp': expected one of 'cond' | 'cfg'"),
        ("credit=gcpo", "config key 'credit' is a section"),
        ("advantage.dynamic_sampling=3", "config key 'advantage.dynamic_sampling': expected bool"),
        ("rollout.group_size=1", "config key 'rollout.group_size': must be in [2, 4096]"),
        (
            "credit.gcpo.top_fraction=1.5",
            "config key 'credit.gcpo.top_fraction': must be in [1e-06, 0.999999]",
        ),
        ("credit.contrast=cached", "config key 'credit.contrast': expected one of 'recorded' | 'recompute'"),
        ("credit.scheme=magic", "config key 'credit.scheme': must be one of"),
        ("credit.gcpo.recompute=true", "unknown config key 'credit.gcpo.recompute'"),  # now credit.contrast
        ("beta", "--set expects key=value"),
        ("save_every=0", "config key 'save_every': must be ≥ 1"),  # was a ZeroDivisionError at the first step
        ("sample_every=-1", "config key 'sample_every': must be ≥ 0"),
        ("eval_every=-2", "config key 'eval_every': must be ≥ -1"),
        ("eval_images_per_prompt=0", "config key 'eval_images_per_prompt': must be in [1, 4096]"),
        ("log_every=5", "unknown config key 'log_every'"),  # retired: it never did anything
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(UserError, match=None) as e:
        load_config("gcpo", overrides=[override])
    assert message in str(e.value)


def test_resume_reads_configs_that_hold_a_retired_key():
    from t2i_gcpo.config import from_dict, to_dict

    saved = {**to_dict(load_config("dapo", overrides=["steps=7"])), "log_every": 1}  # a run from before
    assert from_dict(saved).steps == 7


def test_unknown_algorithm_and_missing_or_bad_file(tmp_path):
    with pytest.raises(UserError, match="unknown algorithm 'ppo'"):
        load_config("ppo")
    with pytest.raises(UserError, match="config file not found"):
        load_config("gcpo", tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("loss: [1, 2\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config("gcpo", bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("3\n")
    with pytest.raises(UserError, match="must hold a mapping"):
        load_config("gcpo", scalar)


def test_dual_clip_accepts_null_and_numbers():
    assert load_config("gcpo", overrides=["loss.dual_clip=3"]).loss.dual_clip == 3.0
    assert load_config("gcpo", overrides=["loss.dual_clip=null"]).loss.dual_clip is None


def test_round_trip_and_helpers():
    cfg = load_config("dgpo", overrides=["optim.lr=5e-6"])
    assert cfg.optim.lr == 5e-6
    assert from_dict(to_dict(cfg)) == cfg
    assert parse_set("a.b=[1, 2]") == ("a.b", [1, 2])
    assert nest({"a.b": 1, "a.c": 2, "d": 3}) == {"a": {"b": 1, "c": 2}, "d": 3}
    keys = [k for k, _, _ in describe()]
    assert "credit.gcpo.normalization" in keys and "rollout.cfg_scale" in keys
    assert {
        "credit.contrast",
        "credit.reference",
        "credit.granularity",
        "credit.critical.first_fraction",
    } <= set(keys)
    assert all(text for _, _, text in describe()), "every field is documented"


def test_the_preset_list_is_the_configs_folder_and_train_help_names_every_preset(tmp_path, monkeypatch):
    """`train --help` lists the presets found on disk (it once listed 5 of 7): a preset file added to the
    folder shows up, and the list matches the algorithms the config accepts."""
    from click.testing import CliRunner

    import t2i_gcpo.config as config
    from t2i_gcpo.cli import cli
    from t2i_gcpo.config import preset_names

    assert preset_names() == tuple(sorted(ALGORITHMS))
    help_text = " ".join(CliRunner().invoke(cli, ["train", "--help"], terminal_width=200).output.split())
    assert " | ".join(sorted(ALGORITHMS)) + " [default: gcpo]" in help_text
    (tmp_path / "mine.yaml").write_text("algo: mine\n")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "full_run.yaml").write_text("algo: gcpo\n")
    monkeypatch.setattr(config, "CONFIG_DIR", tmp_path)
    assert preset_names() == ("mine",)
