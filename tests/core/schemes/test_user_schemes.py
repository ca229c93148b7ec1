"""A credit scheme of the user's own (`--credit file.py:function`, docs/guides/custom-credit.md): trained from
the command line, resumed, its options checked against its signature, its mistakes one-line errors; and
the registry's names in the help texts (every preset, every scheme)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.config import load_config, preset_names
from t2i_gcpo.core.schemes import CREDIT_SCHEMES, USER_SCHEMES, CreditInputs, credit_weights
from t2i_gcpo.errors import UserError

from cli_helpers import cli, error_line
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

FAST = (
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=2",
    "optim.lr=3e-3",
    "sample_every=0",
    "eval_every=-1",
    "save_every=1",
)

# the user's file, outside the package: constant credit `value` on every valid token (value=0: no credit,
# so no policy gradient), and the contrast it was given, to check that its declared need was met
SCHEME = """
import torch
from t2i_gcpo import credit_scheme

@credit_scheme(needs=("contrast",))
def constant(inputs, value: float = 1.0):
    assert inputs.logp_pos is not None and inputs.logp_neg is not None  # declared, so fetched
    return inputs.mask.float() * value

def undeclared(inputs):
    return inputs.mask.float()

def wrong_shape(inputs):
    return inputs.mask.float()[:, :-1]

def nan_weights(inputs):
    return inputs.mask.float() * float("nan")

def complex_weights(inputs):
    return inputs.mask.float() * (1 + 1j)

def negative_weights(inputs):
    return inputs.mask.float() * -1

def needs_option(inputs, power: float):
    return inputs.mask.float() ** power

not_a_function = 3
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    (root / "my_credit.py").write_text(SCHEME)
    return {
        "root": root,
        "scheme": root / "my_credit.py",
        "model": str(tiny_policy_dir(root)),
        "prompts": str(write_prompt_file(root / "p.jsonl")),
    }


@pytest.fixture(autouse=True)
def no_report(monkeypatch):
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)  # matplotlib: seconds per run


def train_args(tiny, out, steps, credit, *sets):
    args = [
        "train",
        "--prompts",
        tiny["prompts"],
        "--model",
        tiny["model"],
        "--reward",
        "train_fixtures:redness",
        "--algo",
        "dapo",
        "--credit",
        credit,
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--seed",
        "0",
    ]
    for s in (*FAST, "advantage.dynamic_sampling=false", *sets):
        args += ["--set", s]
    return args


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_scheme_from_a_file_trains_with_the_weights_it_returns_and_resumes(
    tiny, tmp_path, capsys, monkeypatch
):
    zero, two = tmp_path / "zero", tmp_path / "two"
    relative = Path("my_credit.py")  # given relative to the working directory, recorded absolute
    monkeypatch.chdir(tiny["root"])
    code, _, err = cli(capsys, *train_args(tiny, zero, 1, f"{relative}:constant", "credit.options.value=0"))
    assert code == 0, err
    code, _, err = cli(capsys, *train_args(tiny, two, 1, f"{relative}:constant", "credit.options.value=2"))
    assert code == 0, err
    (z,), (t,) = rows(zero), rows(two)
    # the weights it returned are the ones trained with: no credit is no policy loss and no gradient
    assert z["credit/weight_max"] == 0 and z["loss/policy"] == 0 and z["grad_norm"] == 0
    assert t["credit/weight_max"] == 2 and t["grad_norm"] > 0
    saved = yaml.safe_load((zero / "config.yaml").read_text())["credit"]
    assert saved["scheme"] == f"{tiny['scheme'].resolve()}:constant" and saved["options"] == {"value": 0.0}

    monkeypatch.chdir(tmp_path)  # the recorded path, not the working directory, finds the file again
    USER_SCHEMES.clear()  # as in a new process: the resume imports the file again
    code, _, err = cli(capsys, "train", "--resume", zero, "--steps", "2", "--trust-run-code")  # its own code
    assert code == 0, err
    resumed = rows(zero)
    assert [r["step"] for r in resumed] == [1, 2] and resumed[1]["credit/weight_max"] == 0
    assert f"{tiny['scheme'].resolve()}:constant" in USER_SCHEMES


def test_the_options_are_checked_against_the_function_signature(tiny, tmp_path, capsys):
    spec = f"{tiny['scheme']}:constant"
    code, _, err = cli(capsys, *train_args(tiny, tmp_path / "a", 1, spec, "credit.options.valeu=0"))
    assert code == 2 or code == 1
    line = error_line(err)
    assert (
        "'credit.options'" in line
        and f"credit scheme '{spec}' has no option 'valeu' (its options: value)" in line
    )
    code, _, err = cli(capsys, *train_args(tiny, tmp_path / "b", 1, spec, "credit.options.value=lots"))
    assert "config key 'credit.options.value': expected float, got 'lots'" in error_line(err)
    # a built-in scheme's section: a mistyped option names the scheme and its real options
    code, _, err = cli(capsys, *train_args(tiny, tmp_path / "c", 1, "gcpo", "credit.gcpo.tua=2"))
    assert error_line(err) == (
        "error: unknown config key 'credit.gcpo.tua': credit scheme 'gcpo' has no option 'tua' "
        "(its options: normalization, top_fraction, top_mass, tau)"
    )
    code, _, err = cli(capsys, *train_args(tiny, tmp_path / "d", 1, "gcpo", "credit.options.kappa=2"))
    assert "credit scheme 'gcpo' has no option 'kappa'" in error_line(err)
    code, _, err = cli(capsys, *train_args(tiny, tmp_path / "e", 1, f"{tiny['scheme']}:needs_option"))
    assert "needs the option(s) power" in error_line(err)
    assert not any((tmp_path / x).exists() for x in "abcde"), "refused before a run directory is written"


@pytest.mark.parametrize(
    ("credit", "message"),
    [
        ("nowhere.py:constant", "credit scheme file '{root}/nowhere.py' does not exist"),
        ("{file}:missing", "credit scheme file '{file}' has no function 'missing'"),
        ("{file}:not_a_function", "credit scheme '{file}:not_a_function' is not a function (it is a int)"),
        ("no_such_module_xyz:fn", "cannot import credit scheme module 'no_such_module_xyz'"),
        (
            "magic",
            f"config key 'credit.scheme': must be one of {', '.join(CREDIT_SCHEMES)}, or a function",
        ),
    ],
)
def test_a_scheme_that_cannot_be_loaded_is_one_line(tiny, tmp_path, capsys, monkeypatch, credit, message):
    monkeypatch.chdir(tiny["root"])
    file, root = tiny["scheme"].resolve(), tiny["root"].resolve()
    code, _, err = cli(capsys, *train_args(tiny, tmp_path / "run", 1, credit.format(file=file)))
    assert code != 0 and message.format(file=file, root=root) in error_line(err)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("wrong_shape", "returned (2, 15), expected (2, 16)"),
        ("nan_weights", "returned NaN/inf weights for 32 valid token(s) of 32"),
        ("complex_weights", "returned torch.complex64 weights, expected real numbers (a float tensor)"),
        ("negative_weights", "returned negative weights for 32 valid token(s) (min -1): weights must be ≥ 0"),
    ],
)
def test_a_scheme_that_returns_unusable_weights_stops_before_the_run_in_one_line(
    tiny, tmp_path, capsys, function, message
):
    """Checked on a dry sample (a group of 2) before the run folder exists — it was at step 1, and complex
    weights were a traceback, negative ones a message naming credit_lift (issue 45)."""
    code, _, err = cli(capsys, *train_args(tiny, tmp_path / "run", 1, f"{tiny['scheme']}:{function}"))
    line = error_line(err)
    assert code == 2 and line.startswith(f"error: credit scheme '{tiny['scheme']}:{function}' {message}"), (
        line
    )
    assert line.endswith("(on a dry sample, before the run started)")
    assert not (tmp_path / "run").exists()


def test_needs_are_declared_and_checked(tiny):
    from t2i_gcpo import credit_scheme

    def late_tokens(inputs):
        return inputs.mask.float()

    with pytest.raises(
        ValueError, match=r"credit scheme 'late_tokens': unknown needs \['contrats'\]; known: contrast"
    ):
        credit_scheme(needs=("contrats",))(late_tokens)  # named: the function it marks, not the decorator
    cfg = load_config("dapo", overrides={"credit.scheme": f"{tiny['scheme']}:undeclared"})
    scheme = USER_SCHEMES[cfg.credit.scheme]
    assert scheme.needs == frozenset() and scheme.options == ()
    constant = USER_SCHEMES[
        load_config("dapo", overrides={"credit.scheme": f"{tiny['scheme']}:constant"}).credit.scheme
    ]
    assert constant.needs == {"contrast"} and constant.options == ("value",)
    with pytest.raises(ValueError, match="needs \\['contrast'\\], which were not given"):
        credit_weights(f"{tiny['scheme']}:constant", CreditInputs(mask=torch.ones(2, 3)))


def test_a_python_function_is_a_scheme_for_the_api(tiny, tmp_path):
    """`api.train(credit=fn)`: an importable function is recorded as module:function (resumable anywhere)."""
    from t2i_gcpo import api

    result = api.train(
        tiny["model"],
        tiny["prompts"],
        "train_fixtures:redness",
        "dapo",
        out=tmp_path / "run",
        steps=1,
        credit=half_credit,
        overrides=[*FAST, "advantage.dynamic_sampling=false"],
    )
    assert result.metrics[0]["credit/weight_max"] == 0.5
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["credit"]["scheme"] == (
        f"{__name__}:half_credit"
    )
    with pytest.raises(UserError, match=f"was trained with the credit scheme '{__name__}:half_credit'"):
        api.train(resume=tmp_path / "run", credit="uniform")  # a resumed run keeps its own


def half_credit(inputs):
    return inputs.mask.float() * 0.5


def test_every_preset_and_scheme_is_in_the_help(capsys):
    code, out, _ = cli(capsys, "train", "--help")
    text = " ".join(out.split())
    assert code == 0 and " | ".join(preset_names()) + " [default: gcpo]" in text
    assert " | ".join(CREDIT_SCHEMES) + ", or your own: 'path/to/file.py:function'" in text
    code, out, _ = cli(capsys, "credit-map", "--help")
    assert code == 0 and ", ".join(CREDIT_SCHEMES) in " ".join(out.split())
    assert set(preset_names()) == {
        p.stem for p in Path(load_config.__code__.co_filename).parent.glob("configs/*.yaml")
    }
    code, _, err = cli(capsys, "train", "--prompts", "x.txt", "--algo", "grop")
    assert error_line(err) == f"error: unknown algorithm 'grop' (choose one of {', '.join(preset_names())})"


def test_credit_map_draws_a_scheme_from_a_file_beside_the_registered_ones(tiny, tmp_path, capsys):
    out = tmp_path / "maps"
    code, text, err = cli(
        capsys,
        "credit-map",
        "--prompt",
        "a photo of a red circle",
        "--model",
        tiny["model"],
        "--schemes",
        f"{tiny['scheme']}:constant,uniform",
        "--group",
        2,
        "--out",
        out,
    )
    assert code == 0, err
    html = (out / "credit_maps.html").read_text()
    assert "constant" in html and "uniform" in html
    assert set(json.loads((out / "lift.json").read_text())) == {f"{tiny['scheme']}:constant", "uniform"}
    assert len(list(out.glob("*.png"))) == 1
