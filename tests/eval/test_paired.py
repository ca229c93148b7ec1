"""The paired change of two evaluations over the same items (eval/records/paired.py) against the formulas
written out, the stratified overall, refusals, and the interval narrowing that pairing buys."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from t2i_gcpo.errors import UserError
from t2i_gcpo.eval.records.paired import (
    category_means,
    change_headline,
    change_metrics,
    format_change,
    index_rows,
    paired_change,
)
from t2i_gcpo.stats import linear_ci95, mean_ci95, welch_ci95


def rows(scores, categories):
    return [
        {"key": f"{i:05d}/0000", "category": c, "score": float(s)}
        for i, (s, c) in enumerate(zip(scores, categories))
    ]


def t_interval(values):
    a = np.asarray(values, dtype=float)
    half = st.t.ppf(0.975, a.size - 1) * a.std(ddof=1) / math.sqrt(a.size)
    return a.mean() - half, a.mean() + half


def test_linear_ci95_is_mean_ci95_welch_and_the_stratified_formula():
    rng = np.random.default_rng(1)
    a, b, c = rng.normal(size=12), rng.normal(1, 2, size=9), rng.normal(0.5, 0.3, size=20)
    assert linear_ci95([(1, a)]) == pytest.approx(mean_ci95(a)[:3])
    assert linear_ci95([(1, b), (-1, a)]) == pytest.approx(welch_ci95(b, a))
    # the mean of three group means: variance Σ s²/n / 9, Welch–Satterthwaite dof, written out
    v = [x.var(ddof=1) / x.size / 9 for x in (a, b, c)]
    dof = sum(v) ** 2 / sum(vk**2 / (x.size - 1) for vk, x in zip(v, (a, b, c)))
    m = (a.mean() + b.mean() + c.mean()) / 3
    half = st.t.ppf(0.975, dof) * math.sqrt(sum(v))
    assert linear_ci95([(1 / 3, a), (1 / 3, b), (1 / 3, c)]) == pytest.approx((m, m - half, m + half))
    assert linear_ci95([(1, [0.5, 0.5])]) == (0.5, 0.5, 0.5)  # no spread: a point
    assert all(math.isnan(x) for x in linear_ci95([(1, [0.5])])[1:])  # one value: no interval


def test_paired_change_per_category_and_overall_by_hand():
    rng = np.random.default_rng(0)
    cats = ["x"] * 30 + ["y"] * 20
    before = rng.random(50)
    after = np.clip(before + rng.normal(0.1, 0.2, 50), 0, 1)
    result = paired_change(rows(before, cats), rows(after, cats), "categories")
    for c, sl in (("x", slice(0, 30)), ("y", slice(30, 50))):
        e = result["categories"][c]
        d = after[sl] - before[sl]
        assert e["change"] == pytest.approx(d.mean()) and e["n"] == d.size
        assert e["paired"] == pytest.approx(list(t_interval(d)))
        assert e["unpaired"] == pytest.approx(list(welch_ci95(after[sl], before[sl])[1:]))
        assert (e["before"], e["after"]) == pytest.approx((before[sl].mean(), after[sl].mean()))
    o = result["overall"]
    dx, dy = after[:30] - before[:30], after[30:] - before[30:]
    assert o["change"] == pytest.approx((dx.mean() + dy.mean()) / 2)  # the mean of the category means
    v = [dx.var(ddof=1) / 30 / 4, dy.var(ddof=1) / 20 / 4]
    dof = sum(v) ** 2 / (v[0] ** 2 / 29 + v[1] ** 2 / 19)
    half = st.t.ppf(0.975, dof) * math.sqrt(sum(v))
    assert o["paired"] == pytest.approx([o["change"] - half, o["change"] + half])
    items = paired_change(rows(before, cats), rows(after, cats), "items")["overall"]
    assert items["change"] == pytest.approx((after - before).mean())
    assert items["paired"] == pytest.approx(list(t_interval(after - before)))


def test_pairing_narrows_the_interval_when_items_agree():
    """Scores of the same item agree across the two sides (the same prompt, the same noise): the paired
    interval of the change is narrower than the unpaired one."""
    rng = np.random.default_rng(3)
    before = (rng.random(400) < 0.7).astype(float)
    flip = rng.random(400) < 0.08
    after = np.where(flip, 1 - before, before)
    cats = [("a", "b", "c", "d")[i % 4] for i in range(400)]
    o = paired_change(rows(before, cats), rows(after, cats), "categories")["overall"]
    assert (o["paired"][1] - o["paired"][0]) < 0.5 * (o["unpaired"][1] - o["unpaired"][0])


def test_the_prompt_is_the_unit_of_the_intervals():
    """Several images per prompt: each prompt's mean score on each side, then the formulas over prompts (the
    images of one prompt are not independent draws), written out here."""
    rng = np.random.default_rng(5)
    prompts, per = 12, 4
    hard = rng.random(prompts)  # a prompt's difficulty, shared by its images and by both sides
    before = (rng.random((prompts, per)) < hard[:, None]).astype(float)
    after = np.where(rng.random((prompts, per)) < 0.15, 1 - before, before)
    keyed = lambda s: [  # noqa: E731
        {"key": f"{p:05d}/{i:04d}", "category": "x", "score": float(s[p, i])}
        for p in range(prompts)
        for i in range(per)
    ]
    e = paired_change(keyed(before), keyed(after))["categories"]["x"]
    x, y = before.mean(1), after.mean(1)
    assert e["change"] == pytest.approx((y - x).mean()) and (e["n"], e["prompts"]) == (48, 12)
    assert e["paired"] == pytest.approx(list(t_interval(y - x)))
    assert e["unpaired"] == pytest.approx(list(welch_ci95(y, x)[1:]))
    assert (e["paired"][1] - e["paired"][0]) < (e["unpaired"][1] - e["unpaired"][0])  # difficulty paired away


def test_nan_scores_are_left_out_of_both_sides():
    a = rows([1.0, 0.0, 1.0, 0.5], ["x"] * 4)
    b = rows([1.0, float("nan"), 0.0, 0.5], ["x"] * 4)
    e = paired_change(a, b)["categories"]["x"]
    assert e["n"] == 3 and e["change"] == pytest.approx(-1 / 3) and e["before"] == pytest.approx(2.5 / 3)


def test_refusals_are_one_line():
    a = rows([1, 0, 1], ["x", "x", "y"])
    with pytest.raises(UserError, match=r"B lacks 1 of A's 3 items \(first: 00002/0000\)"):
        paired_change(a, a[:2])
    with pytest.raises(UserError, match="B holds 1 items A lacks"):
        paired_change(a[:2], a)
    moved = [dict(r, category="z") if r["key"] == "00000/0000" else r for r in a]
    with pytest.raises(UserError, match="item 00000/0000 is in category 'x' in A, 'z' in B"):
        paired_change(a, moved)
    with pytest.raises(UserError, match="appears twice"):
        index_rows(a + a[:1], "A")
    with pytest.raises(UserError, match="row 1 has no 'key'"):
        index_rows([{"category": "x", "score": 1.0}], "A")
    with pytest.raises(UserError, match=r"row 1 \(k\) has no numeric 'score'"):
        index_rows([{"key": "k", "category": "x", "score": "1"}], "A")
    with pytest.raises(UserError, match="aggregate must be one of"):
        paired_change(a, a, "median")


def test_metrics_headline_and_table():
    a = rows([1, 0, 1, 0, 1, 1], ["x", "x", "x", "y", "y", "y"])
    b = rows([1, 1, 1, 0, 1, 0], ["x", "x", "x", "y", "y", "y"])
    change = paired_change(a, b, "categories")
    m = change_metrics(change)
    assert m["eval/change/x"] == pytest.approx(1 / 3) and m["eval/change/y"] == pytest.approx(-1 / 3)
    assert m["eval/change/overall"] == pytest.approx(0.0)
    assert m["eval/change_ci/x"] == pytest.approx(change["categories"]["x"]["paired"][1] - 1 / 3)
    assert "eval/change_unpaired_ci/overall" in m
    suite = change_metrics(change, prefix="eval/geneval2")
    assert (
        suite["eval/geneval2/change/x"] == m["eval/change/x"]
        and "eval/geneval2/change_unpaired_ci/overall" in suite
    )
    assert change_headline(change).startswith("change from step 0 +0.000 ± ")
    table = format_change(change)
    assert table.splitlines()[0].split()[:3] == ["category", "A", "B"] and "overall" in table.splitlines()[-1]
    assert category_means(a) == {"x": pytest.approx(2 / 3), "y": pytest.approx(2 / 3)}
