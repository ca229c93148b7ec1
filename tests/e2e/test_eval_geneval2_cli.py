"""`t2i-gcpo eval geneval2` and `eval judge` from the command line, end to end: a tiny ShapeWorld prior
generates, a tiny random Qwen3-VL (or a loopback judge) answers, and the files every evaluation writes
(results.jsonl, summary.json, protocol.json, answers.jsonl) hold what the reference's formulas give on the
saved images; running again asks nothing; bad input is one line with no folder left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image
from scipy.stats import gmean

from t2i_gcpo.eval.records.protocol import file_sha256

from cli_helpers import cli, error_line
from judge_fixtures import LoopbackJudge, completion, message_text
from tiny_models import tiny_policy_dir
from vlm_fixtures import GENEVAL2_ROWS, build_tiny_qwen3_vl, reference_probability, write_geneval2_data


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return str(tiny_policy_dir(root)), str(build_tiny_qwen3_vl(root / "qwen3vl"))


def read_rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.slow  # three commands: ≈ 8 s beside other jobs
def test_geneval2_generates_scores_resumes_and_rescores(tmp_path, capsys, models):
    policy, vlm = models
    data = write_geneval2_data(tmp_path / "geneval2_data.jsonl")
    out = tmp_path / "g2"
    args = (
        "eval",
        "geneval2",
        "--data",
        data,
        "--model",
        policy,
        "--vqa",
        vlm,
        "--vqa-dtype",
        "float32",
        "--n",
        "2",
        "--vqa-batch",
        "3",
        "--out",
        out,
    )
    code, stdout, err = cli(capsys, *args)
    assert code == 0, err
    assert "GenEval 2 score (Soft-TIFA GM):" in stdout and "per skill (Soft-TIFA AM):" in stdout
    rows = read_rows(out / "results.jsonl")
    assert [r["key"] for r in rows] == [f"{i:05d}/{s:04d}" for i in range(3) for s in range(2)]
    assert [r["category"] for r in rows] == ["atoms_3", "atoms_3", "atoms_3", "atoms_3", "atoms_2", "atoms_2"]
    # the reference's probabilities, computed its way on the saved images
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(vlm, dtype="float32").eval()
    processor = AutoProcessor.from_pretrained(vlm)
    for r, row in zip(rows, [x for x in GENEVAL2_ROWS for _ in range(2)]):
        image = Image.open(r["image"]).convert("RGB")
        from t2i_gcpo.scoring.soft_tifa import answer_list

        soft = [
            reference_probability(model, processor, image, f"{q} Answer in one word.", answer_list(q, a))[0]
            for q, a in row["vqa_list"]
        ]
        assert r["soft_tifa"] == pytest.approx(soft, rel=1e-4, abs=1e-8)
        assert r["score"] == pytest.approx(float(gmean(soft)), rel=1e-4)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"] == pytest.approx(sum(r["score"] for r in rows) / 6)
    assert set(summary["methods"]) == {"soft_tifa_am", "soft_tifa_gm", "tifa"} and summary["images"] == 6
    protocol = json.loads((out / "protocol.json").read_text())
    assert protocol["suite"] == "geneval2" and protocol["data"][0]["sha256"] == file_sha256(data)
    assert protocol["scorer"]["kind"] == "vqa" and protocol["scorer"]["revision"].startswith("sha256:")
    assert (
        protocol["images_per_prompt"] == 2
        and protocol["seeds"]["seed"] == 0
        and protocol["method"] == "soft_tifa_gm"
    )
    assert (
        protocol["model"]["spec"] == str(Path(policy).resolve())
        and protocol["sampling"]["temperature"] == 1.0
    )
    answers = (out / "answers.jsonl").read_text()
    assert len(answers.splitlines()) == 2 * sum(len(r["vqa_list"]) for r in GENEVAL2_ROWS)
    # again: nothing generated, nothing asked, the same scores
    stamps = sorted((p.name, p.stat().st_mtime_ns) for p in (out / "images").rglob("*.png"))
    code, _, err = cli(capsys, *args)
    assert code == 0, err
    assert (out / "answers.jsonl").read_text() == answers and read_rows(out / "results.jsonl") == rows
    assert stamps == sorted((p.name, p.stat().st_mtime_ns) for p in (out / "images").rglob("*.png"))
    # the same images scored into another folder, TIFA the headline: the same atoms' scores
    code, stdout, err = cli(
        capsys,
        "eval",
        "geneval2",
        "--data",
        data,
        "--score-only",
        out / "images",
        "--vqa",
        vlm,
        "--vqa-dtype",
        "float32",
        "--method",
        "tifa",
        "--out",
        tmp_path / "g2b",
    )
    assert code == 0, err
    again = json.loads((tmp_path / "g2b" / "summary.json").read_text())
    assert (
        again["methods"] == pytest.approx(summary["methods"], rel=1e-5)
        and again["overall"] == again["methods"]["tifa"]
    )


def test_geneval2_bad_input_is_one_line_and_leaves_no_folder(tmp_path, capsys, models):
    policy, vlm = models
    bad = write_geneval2_data(tmp_path / "bad.jsonl", [{**GENEVAL2_ROWS[0], "skills": ["count"]}])
    good = write_geneval2_data(tmp_path / "good.jsonl")
    cases = [
        (
            ("--data", bad, "--model", policy, "--vqa", vlm),
            f"{bad}:1: field 'skills' must be a list of one skill per question (4)",
        ),
        (
            ("--data", good, "--model", policy, "--vqa", vlm, "--judge", "http://127.0.0.1:1/v1"),
            "give --vqa DIR",
        ),
        (("--data", good, "--vqa", vlm), "give one of --model"),
        (("--data", good, "--model", policy, "--vqa", tmp_path), "not a model folder (no config.json)"),
        (
            ("--data", tmp_path / "none.jsonl", "--model", policy, "--vqa", vlm),
            "GenEval2 (geneval2_data.jsonl",
        ),
    ]
    for extra, expected in cases:
        code, _, err = cli(capsys, "eval", "geneval2", *extra, "--out", tmp_path / "never")
        assert code == 2 and expected in error_line(err), err
        assert not (tmp_path / "never").exists()


WISE_SHAPES = [  # WISE_Verified's format, prompts in ShapeWorld's words so the tiny prior can draw them
    {
        "Prompt": "a photo of a circle",
        "Explanation": "a round shape",
        "Category": "Cultural knowledge",
        "Subcategory": "Art",
        "prompt_id": 1,
    },
    {
        "Prompt": "a photo of two squares",
        "Explanation": "two squares",
        "Category": "Biology",
        "Subcategory": "State",
        "prompt_id": 650,
    },
]


def test_eval_judge_on_a_loopback_judge_records_every_answer_and_resumes(tmp_path, capsys, models):
    policy, _ = models
    data = tmp_path / "merge.json"
    data.write_text(json.dumps(WISE_SHAPES))
    out = tmp_path / "wise"

    def answer(body):
        return completion(f"Score: {1 if 'circle' in message_text(body) else 0}")

    with LoopbackJudge(answer) as judge:
        args = (
            "eval",
            "judge",
            "--suite",
            "wise",
            "--data",
            data,
            "--model",
            policy,
            "--judge",
            judge.url,
            "--judge-model",
            "Qwen3.5-35B-A3B",
            "--n",
            "2",
            "--out",
            out,
        )
        code, stdout, err = cli(capsys, *args)
        assert code == 0, err
        assert len(judge.bodies) == 4 and "wise overall:" in stdout
        code, _, err = cli(capsys, *args)
        assert code == 0 and len(judge.bodies) == 4, err  # resumed: nothing asked again
    rows = read_rows(out / "results.jsonl")
    assert [(r["key"], r["category"], r["score"], r["id"]) for r in rows] == [
        ("00000/0000", "CULTURE", 1.0, "1"),
        ("00000/0001", "CULTURE", 1.0, "1"),
        ("00001/0000", "BIOLOGY", 0.0, "650"),
        ("00001/0001", "BIOLOGY", 0.0, "650"),
    ]
    assert all(r["answer"].startswith("Score: ") for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["categories"] == {"CULTURE": 1.0, "BIOLOGY": 0.0} and summary["overall"] == pytest.approx(
        0.4 / 0.52
    )
    protocol = json.loads((out / "protocol.json").read_text())
    assert protocol["suite"] == "judge:wise" and protocol["scorer"]["model"] == "Qwen3.5-35B-A3B"
    assert protocol["scorer"]["temperature"] == 0.0 and protocol["images_per_prompt"] == 2
    # the reference's own layout: <prompt_id>.png, judged into another folder
    ref = tmp_path / "ref"
    ref.mkdir()
    for r in rows[::2]:
        Image.open(r["image"]).save(ref / f"{r['id']}.png")
    with LoopbackJudge(answer) as judge:
        code, _, err = cli(
            capsys,
            "eval",
            "judge",
            "--suite",
            "wise",
            "--data",
            data,
            "--score-only",
            ref,
            "--judge",
            judge.url,
            "--out",
            tmp_path / "wise-ref",
        )
        assert code == 0 and len(judge.bodies) == 2, err
    code, _, err = cli(
        capsys,
        "eval",
        "judge",
        "--suite",
        "wise",
        "--data",
        tmp_path / "missing.json",
        "--model",
        policy,
        "--judge",
        "http://127.0.0.1:1/v1",
        "--out",
        tmp_path / "never",
    )
    assert code == 2 and "does not exist" in error_line(err) and not (tmp_path / "never").exists()


def test_geneval2_scores_the_references_image_map_through_a_judge(tmp_path, capsys):
    data = write_geneval2_data(tmp_path / "geneval2_data.jsonl")
    images = {}
    for i, row in enumerate(GENEVAL2_ROWS):
        Image.new("RGB", (32, 32), (40 * i, 0, 0)).save(tmp_path / f"{i}.png")
        images[row["prompt"]] = f"{i}.png"  # relative: from the map's folder
    (tmp_path / "map.json").write_text(json.dumps(images))

    def answer(body):  # "Yes" very likely, a number word less so
        return completion("Yes", [("Yes", -0.2), ("one", -2.5), (" 4", -3.0)])

    with LoopbackJudge(answer) as judge:
        code, stdout, err = cli(
            capsys,
            "eval",
            "geneval2",
            "--data",
            data,
            "--images",
            tmp_path / "map.json",
            "--judge",
            judge.url,
            "--out",
            tmp_path / "g2",
        )
        assert code == 0, err
        assert len(judge.bodies) == sum(len(r["vqa_list"]) for r in GENEVAL2_ROWS)
    rows = read_rows(tmp_path / "g2" / "results.jsonl")
    assert [r["key"] for r in rows] == ["00000/0000", "00001/0000", "00002/0000"]
    assert [Path(r["image"]).name for r in rows] == ["0.png", "1.png", "2.png"]
    import math

    yes, one, four = math.exp(-0.2), math.exp(-2.5), math.exp(-3.0)
    # row 0: "How many squares…? one" → one (the list's "one"), "Are there any…?" → Yes
    assert rows[0]["soft_tifa"] == pytest.approx([one, yes, one, yes])
    assert rows[2]["soft_tifa"] == pytest.approx([four, yes])  # "four": its list's " 4"
    assert rows[0]["tifa_atoms"] == [0.0, 1.0, 0.0, 1.0]  # the generated token "Yes" answers the yes/no atoms
    protocol = json.loads((tmp_path / "g2" / "protocol.json").read_text())
    assert protocol["scorer"]["kind"] == "judge" and protocol["scorer"]["top_logprobs"] == 20
    assert protocol["source"].endswith("map.json") and protocol["model"] is None
    del images[GENEVAL2_ROWS[1]["prompt"]]
    (tmp_path / "map.json").write_text(json.dumps(images))
    code, _, err = cli(
        capsys,
        "eval",
        "geneval2",
        "--data",
        data,
        "--images",
        tmp_path / "map.json",
        "--judge",
        "http://127.0.0.1:1/v1",
        "--out",
        tmp_path / "never",
    )
    assert code == 2 and "no image for the prompt 'a photo of a circle above a triangle'" in error_line(err)
    assert not (tmp_path / "never").exists()
