"""`t2i-gcpo train` on a local causal LM through the CLI (`text:DIR`, the arithmetic task from the
model): a step changes the weights and lowers the loss it took on its own batch; the run writes
token heatmaps (also embedded in the report) and logs accuracy and step lift; prompts the model's
vocabulary cannot express are a one-line error."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from t2i_gcpo.cli import main
from t2i_gcpo.config import from_dict
from t2i_gcpo.core.advantages import group_advantages
from t2i_gcpo.core.losses import policy_loss
from t2i_gcpo.policies.registry import load_policy
from t2i_gcpo.train.credit import compute_weights

from text_fixtures import FAST, REWARD, ROWS, cli_train, problems


@pytest.mark.parametrize("algo", ["gcpo", "dgpo", "dapo"])
def test_a_cli_step_trains_the_lm_toward_positive_advantages(tiny_lm, tmp_path, monkeypatch, algo):
    scored = []
    out = tmp_path / "run"
    rows = cli_train(
        tiny_lm, problems(tmp_path, ROWS), out, algo, 1e-6, capture=scored, monkeypatch=monkeypatch
    )
    row = rows[0]
    assert row["step"] == 1 and row["groups_kept"] == 2
    assert row["accuracy"] == 0.0  # a random model solves nothing
    # every sample failed and has a first wrong step: step lift is defined (1 exactly for uniform credit)
    assert row["step_lift/samples"] == 8
    if algo == "dapo":
        assert row["step_lift"] == pytest.approx(1.0)

    base = load_policy(f"text:{tiny_lm}").eval()
    trained = load_policy(str(out / "checkpoints" / "step_000001" / "model")).eval()  # found by its files
    ro = scored[0].rollout
    # the sampler scores the negative context only for the scheme that reads it (the figure's gcpo
    # column of a dapo / dgpo run scores it on demand, checked by the page below)
    assert ("neg" in ro.logp) == (algo == "gcpo")
    with torch.no_grad():
        before, after = base.logprobs(ro, "pos"), trained.logprobs(ro, "pos")
    assert torch.allclose(before * ro.mask, ro.logp["pos"] * ro.mask, atol=1e-4), "recorded = recomputed"
    assert not torch.allclose(before, after)
    # the step lowered the loss it took on its own batch (Adam's first step moves against the gradient sign)
    cfg = from_dict(yaml.safe_load((out / "config.yaml").read_text()))
    adv = group_advantages(scored[0].reward.scores, ro.group_size)
    weights = compute_weights(cfg.credit, ro, adv, base, base, "pos")

    def loss(logp):
        return policy_loss(
            logp,
            ro.logp["pos"],
            adv,
            ro.mask,
            weights=weights,
            aggregation=cfg.loss.aggregation,
            max_len=ro.max_len,
        )[0]

    assert loss(after) < loss(before)
    # positive-advantage samples gained log-prob relative to negative ones
    gain = ((after - before) * ro.mask).sum(1)
    assert gain[adv > 0].mean() > gain[adv < 0].mean()

    page = (out / "credit_maps" / "step_000001.html").read_text()
    assert "first wrong step" in page and page.count("sample ") >= 4
    assert cfg.credit.scheme in page and "uniform" in page and "gcpo" in page
    assert "<iframe" in (out / "report.html").read_text()


def test_a_prompt_the_vocabulary_cannot_express_is_one_line(tiny_lm, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("12+7*3=?\nwhat is 5 € 3\n")
    with pytest.raises(SystemExit) as e:
        main(
            [
                "train",
                "--prompts",
                str(prompts),
                "--model",
                f"text:{tiny_lm}",
                "--out",
                str(tmp_path / "r"),
                "--steps",
                "1",
            ]
        )
    assert e.value.code != 0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip() and "Loading weights" not in x]  # transformers' bar
    assert len(lines) == 1 and lines[0].startswith("error:") and "€" in lines[0] and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_compare_on_a_text_model_tabulates_accuracy_and_step_lift(tiny_lm, tmp_path):
    out = tmp_path / "cmp"
    args = [
        "compare",
        "--algos",
        "dapo,gcpo",
        "--seeds",
        "2",
        "--steps",
        "1",
        "--eval-every",
        "1",
        "--model",
        f"text:{tiny_lm}",
        "--prompts",
        problems(tmp_path, ROWS),
        "--reward",
        REWARD,
        "--out",
        str(out),
    ]
    fast = [kv for kv in FAST if not kv.startswith("eval_every")]  # compare sets its own
    for kv in (
        *fast,
        "sample_every=0",
        "eval_images_per_prompt=1",
        "eval_prompts=" + problems(tmp_path, ROWS),
    ):
        args += ["--set", kv]
    try:
        main(args)
    except SystemExit as e:
        assert e.code in (0, None), f"exit {e.code}"
    result = json.loads((out / "comparison.json").read_text())
    assert result["metric"].startswith("held-out accuracy")
    assert result["columns"] == ["pass@k", "format", "step lift (training mean)", "overall"]
    dapo, gcpo = result["table"]["dapo"], result["table"]["gcpo"]
    assert dapo["step lift (training mean)"][0] == pytest.approx(1.0)  # uniform credit: exactly 1
    assert gcpo["step lift (training mean)"][0] != pytest.approx(1.0)
    assert dapo["overall"][3] == 2 and (out / "curves.png").stat().st_size > 1000
    assert "| gcpo |" in (out / "comparison.md").read_text()
    # measured against dapo, seed by seed: each difference is of two accuracies on the same problems
    assert result["baseline"] == "dapo" and set(result["paired"]) == {"gcpo"}
    per_seed = result["paired"]["gcpo"]["per_seed"]
    for s in (0, 1):
        finals = [json.loads((out / a / f"seed{s}" / "eval.json").read_text()) for a in ("gcpo", "dapo")]
        assert per_seed[str(s)] == pytest.approx(finals[0]["eval/accuracy"] - finals[1]["eval/accuracy"])


def test_credit_map_on_text_writes_heatmaps_and_step_lift(tiny_lm, tmp_path, capsys):
    out = tmp_path / "maps"
    try:
        main(
            [
                "credit-map",
                "--model",
                f"text:{tiny_lm}",
                "--prompt",
                "12+7*3=?",
                "--prompt",
                "4*5-6=?",
                "--schemes",
                "gcpo,uniform",
                "--group",
                "4",
                "--reward",
                REWARD,
                "--out",
                str(out),
            ]
        )
    except SystemExit as e:
        assert e.code in (0, None), f"exit {e.code}"
    printed = capsys.readouterr().out
    assert "step lift" in printed and "uniform" in printed
    lifts = json.loads((out / "lift.json").read_text())
    assert len(lifts["uniform"]) == 8 and all(v == pytest.approx(1.0) for v in lifts["uniform"])
    page = (out / "credit_maps.html").read_text()
    assert page.count("first wrong step") >= 1 and "12+7*3=?" in page
