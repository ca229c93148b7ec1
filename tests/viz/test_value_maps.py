"""Value maps (docs/concepts/tree_credit.md#value-maps): V(prefix) per token against hand-computed values, the
V(prefix) column of credit-map's PNG and page for the vine scheme only (images and text), and the value
maps of a vine run in its report."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from t2i_gcpo import api
from t2i_gcpo.cli import main
from t2i_gcpo.core.tree import Tree
from t2i_gcpo.core.tree_credit import prefix_values, segment_advantages
from t2i_gcpo.train.run import prepare, run
from t2i_gcpo.viz.credit_map import VALUE_COLUMN, credit_figure, value_path_text, write_credit_html
from t2i_gcpo.viz.report import write_run_report

from text_fixtures import REWARD, ROWS, cli_train, problems
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

NAN = float("nan")
# G = 2: rewards 1 and 0, V_0 = 0.5. Row 0 branches at 2 and 4; row 1 at 3 only (slot 2 unused, NaN).
REWARDS = torch.tensor([1.0, 0.0])
POINTS = torch.tensor([[2, 4], [3, -1]])
CONT = torch.tensor([[[0.0, 1.0], [1.0, 1.0]], [[0.0, 0.5], [NAN, NAN]]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])


def close(got: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(
        got, torch.tensor(expected, dtype=torch.float64), atol=1e-9, rtol=0, equal_nan=True
    )


# ---------------------------------------------------------------- the values


def test_each_token_gets_the_value_of_the_prefix_it_was_decided_under():
    v = prefix_values(REWARDS, 2, Tree(POINTS, CONT), MASK)
    # with the root: V(t=2) = (1 + 0 + 1) / 3, V(t=4) = (1 + 1 + 1) / 3; row 1: V(t=3) = (0 + 0 + 0.5) / 3
    close(v.token, [[0.5, 0.5, 2 / 3, 2 / 3, 1.0, 1.0], [0.5, 0.5, 0.5, 1 / 6, 1 / 6, NAN]])
    close(v.path, [[0.5, 2 / 3, 1.0, 1.0], [0.5, 1 / 6, 0.0, 0.0]])  # V_{K+1} = r_i last
    without = prefix_values(REWARDS, 2, Tree(POINTS, CONT), MASK, include_root=False)
    close(without.token, [[0.5, 0.5, 0.5, 0.5, 1.0, 1.0], [0.5, 0.5, 0.5, 0.25, 0.25, NAN]])


def test_masked_tokens_take_the_value_at_their_reveal_step():
    step = torch.tensor([[2, 0, 1, 1, 0, 2]] * 2)  # masked samples: 3 reveal steps, branched at 1 and 2
    cont = torch.tensor([[[0.0], [1.0]]] * 2)
    v = prefix_values(torch.ones(2), 2, Tree(torch.tensor([[1, 2]] * 2), cont), torch.ones(2, 6), step=step)
    # V_0 = 1 (both rewards 1), V(step 1) = (1 + 0) / 2, V(step 2) = (1 + 1) / 2
    close(v.token[0], [1.0, 1.0, 0.5, 0.5, 1.0, 1.0])


def test_the_next_value_minus_a_tokens_value_is_its_segment_advantage():
    v = prefix_values(REWARDS, 2, Tree(POINTS, CONT), MASK)
    adv = segment_advantages(REWARDS, 2, Tree(POINTS, CONT), MASK, scale="none").double()
    seg = (POINTS[:, None, :].ge(0) & (POINTS[:, None, :] <= torch.arange(6)[None, :, None])).sum(2)
    after = torch.gather(v.path, 1, seg + 1)
    m = MASK.bool()
    torch.testing.assert_close((after - v.token)[m], adv[m])
    with pytest.raises(ValueError, match="after its sample's last step"):
        prefix_values(REWARDS, 2, Tree(torch.tensor([[2, 4], [5, -1]]), CONT), MASK)


# ---------------------------------------------------------------- drawing


def _sample(value: bool) -> dict:
    s = {
        "image": np.zeros((8, 8, 3), np.uint8),
        "reward": 1.0,
        "advantage": 0.5,
        "weights": {"uniform": np.ones((2, 2))},
    }
    if value:
        s.update(
            value_grid=np.array([[0.5, 0.5], [2 / 3, 1.0]]),
            value_centre=0.5,
            value_path=[0.5, 2 / 3, 1.0],
            value_points=[2],
        )
    return s


def test_the_value_column_and_its_path_appear_only_for_samples_with_values(tmp_path):
    with_v = Image.open(credit_figure([_sample(True)], ["uniform"], tmp_path / "v.png")).size
    without = Image.open(credit_figure([_sample(False)], ["uniform"], tmp_path / "n.png")).size
    assert with_v[0] - without[0] == 200  # one more 2-inch panel at 100 dpi
    assert value_path_text([0.5, 2 / 3, 1.0], [2]) == "V₀ 0.500 → t=2 0.667 → r 1.000"
    page = write_credit_html(tmp_path, [{"prompt": "p", "samples": [_sample(True)]}]).read_text()
    assert "V(prefix) along the branch points" in page and "t=2 0.667" in page
    page = write_credit_html(tmp_path, [{"prompt": "p", "samples": [_sample(False)]}]).read_text()
    assert "V(prefix)" not in page


# ---------------------------------------------------------------- credit-map


def _png_width(path) -> int:
    with Image.open(path) as im:
        return im.width


def test_credit_map_branches_for_vine_and_draws_its_value_column(tmp_path):
    prompts = ["a photo of a red circle"]
    out = tmp_path / "vine"
    summary = api.credit_maps(prompts, out, model="shapeworld", schemes=("uniform", "vine"), group_size=2)
    # 64 raster tokens branched every 16: 3 points × 2 continuations × 2 samples
    assert "branching: 12 continuations" in summary
    # columns: image, uniform, vine (its credit share), V(prefix): the figure is 2·4 + 1.35 inches at 100 dpi
    assert _png_width(out / "00000.png") == 935
    page = (out / "credit_maps.html").read_text()
    assert "V(prefix) along the branch points" in page and page.count("t=16 ") == 2
    plain = tmp_path / "plain"
    summary = api.credit_maps(prompts, plain, model="shapeworld", schemes=("uniform", "gcpo"), group_size=2)
    assert "vine" not in summary and "V(prefix)" not in (plain / "credit_maps.html").read_text()
    assert _png_width(plain / "00000.png") == 735


def test_credit_map_on_text_shades_each_token_by_its_value(tiny_lm, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "maps"
    try:
        main(
            [
                "credit-map",
                "--model",
                f"text:{tiny_lm}",
                "--prompt",
                "12+7*3=?",
                "--schemes",
                "uniform,vine",
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
    assert "branching:" in capsys.readouterr().out
    page = (out / "credit_maps.html").read_text()
    assert page.count(f"<h4>{VALUE_COLUMN} · V₀") == 4 and "centred on its group" in page
    assert 'title="t=0 V=' in page and (out / "00000.png").is_file()


# ---------------------------------------------------------------- a vine run's report


FAST = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=2",
    "sample_every=2",
    "save_every=2",
    "eval_every=-1",
    "rollout.autocast=none",
    "optim.autocast=none",
    "branching.k=4",
    "branching.continuations=2",
]


def test_a_vine_run_draws_value_maps_and_its_report_shows_them(tmp_path):
    root = tmp_path / "tiny"
    root.mkdir()
    flags = dict(
        prompts=str(write_prompt_file(root / "p.jsonl")),
        model=str(tiny_policy_dir(root)),
        reward="train_fixtures:redness",
        out=str(tmp_path / "run"),
        steps=2,
        seed=0,
    )
    run(prepare(algo="vine", flags=flags, overrides=FAST))
    out = tmp_path / "run"
    assert (out / "value_maps" / "step_000002.png").is_file()
    report = (out / "report.html").read_text()
    assert "Latest value maps (step 2)" in report and "V(prefix)" in report
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["reward/mean"]) for r in rows)
    # a run without continuations writes none, and its report has no such section
    (out / "value_maps" / "step_000002.png").unlink()
    assert "Latest value maps" not in write_run_report(out).read_text()


def test_a_text_vine_run_adds_a_value_column_to_its_token_heatmap(tiny_lm, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    cli_train(tiny_lm, problems(tmp_path, ROWS), out, "vine", 1e-6, extra=("branching.k=4",))
    page = (out / "credit_maps" / "step_000001.html").read_text()
    assert page.count(f"<h4>{VALUE_COLUMN} · V₀") == 4  # G = 4 samples of the first group
    assert "<iframe" in (out / "report.html").read_text()
