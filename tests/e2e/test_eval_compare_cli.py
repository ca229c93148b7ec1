"""`t2i-gcpo eval compare A B` on two `eval shapeworld` folders and two runs: the paired table, its JSON,
and one-line refusals for other seeds, other items and folders that are not evaluations."""

from __future__ import annotations

import json
import shutil

import pytest

from t2i_gcpo.resources import PROMPTS_DIR

from cli_helpers import cli, error_line
from tiny_models import tiny_policy_dir

pytestmark = pytest.mark.slow  # three `eval shapeworld` runs first


@pytest.fixture(scope="module")
def evals(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    prompts = root / "p.jsonl"
    prompts.write_text("".join((PROMPTS_DIR / "shapeworld_test.jsonl").read_text().splitlines(True)[::13]))
    models = [
        "shapeworld",
        tiny_policy_dir(root / "m1", seed=1),
    ]  # the shipped prior scores, the tiny one not
    from t2i_gcpo.cli import main

    for name, model, seed in (("a", models[0], 0), ("b", models[1], 0), ("c", models[0], 1)):
        try:
            main(
                [
                    "eval",
                    "shapeworld",
                    "--model",
                    str(model),
                    "--prompts",
                    str(prompts),
                    "--n",
                    "2",
                    "--seed",
                    str(seed),
                    "--out",
                    str(root / name),
                ]
            )
        except SystemExit as e:
            assert e.code in (0, None)
    return root


def test_compare_prints_the_paired_table_and_writes_json(evals, capsys):
    code, out, err = cli(capsys, "eval", "compare", evals / "a", evals / "b", "--json", evals / "cmp.json")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "shapeworld" and lines[1].endswith("(model shapeworld)") and "m1" in lines[2]
    table = [
        ln.split()[0]
        for ln in lines
        if ln.split() and ln.split()[0] in ("single_object", "colors", "overall")
    ]
    assert table == ["single_object", "colors", "overall"] and "overall: the mean of the categories" in out
    result = json.loads((evals / "cmp.json").read_text())
    rows = {}
    for name in ("a", "b"):
        rows[name] = {
            r["key"]: r for r in map(json.loads, (evals / name / "results.jsonl").read_text().splitlines())
        }
    assert result["change"]["overall"]["n"] == 12 and set(rows["a"]) == set(rows["b"])
    assert result["change"]["overall"]["change"] < 0, "the tiny random prior scores below the shipped one"
    by_tag: dict[str, list[float]] = {}
    for k, r in rows["a"].items():
        assert r["score"] == float(r["correct"]) and r["category"] == r["tag"]  # GenEval's fields kept
        by_tag.setdefault(r["category"], []).append(rows["b"][k]["score"] - r["score"])
    for tag, d in by_tag.items():
        assert result["change"]["categories"][tag]["change"] == pytest.approx(sum(d) / len(d))
    overall = sum(sum(d) / len(d) for d in by_tag.values()) / len(by_tag)
    assert result["change"]["overall"]["change"] == pytest.approx(overall)
    protocol = json.loads((evals / "a" / "protocol.json").read_text())
    assert (
        protocol["suite"] == "shapeworld"
        and protocol["seeds"]["seed"] == 0
        and protocol["images_per_prompt"] == 2
    )
    assert protocol["sampling"]["cfg_scale"] > 0 and protocol["model"]["spec"] == "shapeworld"


def test_an_evaluation_against_itself_changes_by_exactly_zero(evals, capsys):
    code, out, _ = cli(capsys, "eval", "compare", evals / "a", evals / "a")
    overall = next(ln for ln in out.splitlines() if ln.startswith("overall")).split()
    assert code == 0 and overall[3] == "+0.000"


def test_other_seeds_other_items_and_non_evaluations_are_refused_in_one_line(evals, tmp_path, capsys):
    code, _, err = cli(capsys, "eval", "compare", evals / "a", evals / "c")
    assert code == 2 and error_line(err).startswith("error: protocol_mismatch: seeds: {'seed': 0")
    shutil.copytree(evals / "b", tmp_path / "d")
    kept = (tmp_path / "d" / "results.jsonl").read_text().splitlines()[1:]
    (tmp_path / "d" / "results.jsonl").write_text("\n".join(kept) + "\n")
    code, _, err = cli(capsys, "eval", "compare", evals / "a", tmp_path / "d")
    assert code == 2 and "not the same items: B lacks 1 of A's 12 items (first: 00000/0000)" in error_line(
        err
    )
    code, _, err = cli(capsys, "eval", "compare", evals / "a", tmp_path)
    assert code == 2 and "neither an evaluation's output folder" in error_line(err)
    (tmp_path / "d" / "protocol.json").unlink()
    code, _, err = cli(capsys, "eval", "compare", evals / "a", tmp_path / "d")
    assert code == 2 and "no protocol.json beside results.jsonl" in error_line(err)
