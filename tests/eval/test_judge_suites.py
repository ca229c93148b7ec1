"""The judge-scored suites (t2i_gcpo/eval/suites/) and their driver (t2i_gcpo/eval/suites/driver.py): each
suite reads a small sample of its real data format (written here), asks the reference's question, reads an
answer by the reference's rule and aggregates as its paper does; a file in the wrong format is one line naming
the file and the field; against a loopback judge, every answer is recorded with its score, concurrency is
bounded, a resumed evaluation asks nothing it has, and a judge that stalls, lies or is down is one line after
the bounded retries."""

from __future__ import annotations

import csv
import json
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from t2i_gcpo.errors import UserError
from t2i_gcpo.eval.suites import get_suite, suite_names, suites_help
from t2i_gcpo.eval.suites.asking import BadAnswer
from t2i_gcpo.eval.suites.driver import format_summary, score_suite, summary_of
from t2i_gcpo.eval.suites.judge_client import JudgeClient

from judge_fixtures import LoopbackJudge, closed_port_url, completion, message_text

# ----------------------------------------------------------------------------- samples in the real formats

WISE_ROWS = [
    {
        "Prompt": "The pastry shared at the Mid-Autumn Festival",
        "Explanation": "Mooncakes",
        "Category": "Cultural knowledge",
        "Subcategory": "Festival",
        "prompt_id": 7,
    },
    {
        "Prompt": "A street at noon when it is midnight in Beijing",
        "Explanation": "New York at noon",
        "Category": "time",
        "Subcategory": "Horizontal time",
        "prompt_id": 402,
    },
    {
        "Prompt": "A plant by a one-sided window",
        "Explanation": "It bends toward the light",
        "Category": "Biology",
        "Subcategory": "Behavior",
        "prompt_id": 700,
    },
    {
        "Prompt": "Iron left in rain for a month",
        "Explanation": "Rust",
        "Category": "Chemistry",
        "Subcategory": "Metal Corrosion",
        "prompt_id": 990,
    },
]


def write_wise(path: Path, rows=WISE_ROWS) -> Path:
    path.write_text(json.dumps(rows, indent=2))
    return path


TIIF_EVAL = {  # dimension → eval lines, as data/testmini_eval_prompts/<dimension>_eval_prompts.jsonl
    "2d_spatial_relation": [
        {
            "type": "2d_spatial_relation",
            "yn_question_list": ["Is there a cat in the image?  ", "Is the cat below the microwave?"],
            "yn_answer_list": ["yes", "yes"],
        },
        {
            "type": "2d_spatial_relation",
            "yn_question_list": ["Is there a cup?", "Is the cup left of the pig?", "Is there a pig?"],
            "yn_answer_list": ["yes", "yes", "yes"],
        },
    ],
    "negation": [
        {
            "type": "negation",
            "yn_question_list": ["Is there a dog?", "Is there no cat?"],
            "yn_answer_list": ["Yes", "no"],
        }
    ],
}


def write_tiif(root: Path, eval_lines=TIIF_EVAL) -> Path:
    qdir, pdir = root / "testmini_eval_prompts", root / "testmini_prompts"
    qdir.mkdir(parents=True)
    pdir.mkdir(parents=True)
    for dim, lines in eval_lines.items():
        (qdir / f"{dim}_eval_prompts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        prompts = [
            {
                "type": dim,
                "short_description": f"short {dim} {i}",
                "long_description": f"a long description {dim} {i}",
            }
            for i in range(len(lines))
        ]
        (pdir / f"{dim}_prompts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in prompts))
    return qdir


UGB_EN = [
    (
        "0",
        "Two pandas in ink-painting style before the pyramids.",
        {
            "Primary Categories": "Creative Divergence",
            "Secondary Categories": "Imaginative Thinking",
            "Subjects": "Animal",
            "Sentence Structure": "Descriptive",
            "Testpoints": ["Style", "World Knowledge", "Attribute - Quantity"],
            "Testpoint Description": ["ink painting", "Egyptian pyramids", "two pandas"],
        },
    ),
    (
        "1",
        "A gardener holding up a sunflower with a gloved hand.",
        {
            "Primary Categories": "Art",
            "Secondary Categories": "Graphic Art",
            "Subjects": "Scene",
            "Sentence Structure": "Imperative",
            "Testpoints": ["Action - Hand (Character/Anthropomorphic)", "Style"],
            "Testpoint Description": ["holding up", "picture book"],
        },
    ),
]


def write_ugb(path: Path, rows=UGB_EN, lang: str = "en") -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["index", f"prompt_{lang}", f"sub_dims_{lang}"])
        for index, prompt, dims in rows:
            w.writerow([index, prompt, json.dumps(dims, ensure_ascii=False)])
    return path


def pictures(n: int) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]


def digest(image) -> str:
    return str(zlib.crc32(image.tobytes()))


def entries(items, per_prompt: int = 1) -> list:
    pics = pictures(len(items) * per_prompt)
    return [(i, it, pics[i * per_prompt : (i + 1) * per_prompt]) for i, it in enumerate(items)]


def test_the_suites_are_listed_from_one_place():
    assert suite_names() == ("geneval2", "tiif", "unigenbench", "wise")
    assert suite_names("vqa") == ("geneval2",)
    assert all(f"{name}:" in suites_help("judge") for name in suite_names("judge"))
    with pytest.raises(UserError, match="unknown judge suite 'geneval2': use one of tiif, unigenbench, wise"):
        get_suite("geneval2", "judge")
    from t2i_gcpo.commands.eval import GENEVAL2_METHODS
    from t2i_gcpo.eval.suites.geneval2 import METHODS

    assert GENEVAL2_METHODS == METHODS


# ----------------------------------------------------------------------------- WISE


def test_wise_reads_asks_parses_and_weights_as_its_reference(tmp_path):
    wise = get_suite("wise")
    items = wise.read(write_wise(tmp_path / "merge.json"))
    assert [(it.id, it.category) for it in items] == [
        ("7", "CULTURE"),
        ("402", "TIME"),
        ("700", "BIOLOGY"),
        ("990", "CHEMISTRY"),
    ]
    system, user = wise.messages(items[0], "data:image/png;base64,AA")
    assert system["role"] == "system" and system["content"][0]["text"].startswith(
        "You are a professional text-to-image"
    )
    text = user["content"][0]["text"]
    assert text.startswith(
        "Please evaluate this generated image for the WISE benchmark and return ONLY one binary score."
    )
    assert text.endswith(
        'PROMPT: "The pastry shared at the Mid-Autumn Festival"\nEXPLANATION: "Mooncakes"\n\n'
        "Return only `Score: 0` or `Score: 1`."
    )
    assert user["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}
    for answer, score in (
        ("Score: 1", 1.0),
        ("**Score**: 0", 0.0),
        ("<think>Score: 1?</think>score:0", 0.0),
        ("The image shows it.\n1\n", 1.0),
    ):
        assert wise.parse(answer, items[0])["score"] == score
    for answer in ("Score: 2", "I cannot tell", "0\n1"):
        with pytest.raises(BadAnswer):
            wise.parse(answer, items[0])
    rows = [
        {"category": c, "score": s}
        for c, s in (
            ("CULTURE", 1),
            ("CULTURE", 0),
            ("TIME", 1),
            ("SPACE", 0),
            ("BIOLOGY", 1),
            ("PHYSICS", 1),
            ("CHEMISTRY", 0),
        )
    ]
    full = wise.summarize(rows)
    assert full["overall"] == pytest.approx(0.40 * 0.5 + 0.12 * (1 + 0 + 1 + 1 + 0)) and "note" not in full
    part = wise.summarize(rows[:3])  # CULTURE and TIME only: weights 0.4 and 0.12 renormalised
    assert part["overall"] == pytest.approx((0.4 * 0.5 + 0.12) / 0.52) and "renormalised" in part["note"]


def test_wise_in_the_wrong_format_is_one_line_naming_file_and_field(tmp_path):
    wise = get_suite("wise")
    for change, field in (
        ({"prompt_id": "7"}, "'prompt_id' must be an integer"),
        ({"prompt_id": 1200}, "'prompt_id' 1200 is outside"),
        ({"Explanation": ""}, "'Explanation' must be a non-empty string"),
    ):
        path = write_wise(tmp_path / "w.json", [WISE_ROWS[0], {**WISE_ROWS[1], **change}])
        with pytest.raises(UserError, match=rf"^{path}: entry 1: field {field}"):
            wise.read(path)
    path = write_wise(tmp_path / "w.json", [{k: v for k, v in WISE_ROWS[0].items() if k != "Prompt"}])
    with pytest.raises(UserError, match=rf"^{path}: entry 0: field 'Prompt' is missing"):
        wise.read(path)
    (tmp_path / "d.json").write_text('{"Prompt": "x"}')
    with pytest.raises(UserError, match="expected a JSON list of WISE prompts"):
        wise.read(tmp_path / "d.json")


# ----------------------------------------------------------------------------- TIIF-Bench


def test_tiif_reads_both_descriptions_parses_and_groups_as_its_reference(tmp_path):
    tiif = get_suite("tiif")
    items = tiif.read(write_tiif(tmp_path))
    assert [it.id for it in items] == [
        "2d_spatial_relation/short/0",
        "2d_spatial_relation/long/0",
        "2d_spatial_relation/short/1",
        "2d_spatial_relation/long/1",
        "negation/short/0",
        "negation/long/0",
    ]
    assert (
        items[1].prompt == "a long description 2d_spatial_relation 0"
        and items[0].category == "2d_spatial_relation"
    )
    system, user = tiif.messages(items[0], "data:,")
    assert system == {"role": "system", "content": "You are a professional image critic."}
    text = user["content"][0]["text"]
    assert "Questions:\nIs there a cat in the image?\nIs the cat below the microwave?\n\nNote that:" in text
    assert text.startswith("\nYou are tasked with conducting a careful examination of the provided image.")
    got = tiif.parse("Yes, a cat.\n\nno, it is on top.\n", items[0])
    assert got["score"] == 0.5 and got["correct"] == 1 and got["predictions"] == ["yes", "no"]
    assert tiif.parse("yes\nno", items[4])["score"] == 1.0  # "Yes"/"no" expected, case ignored
    with pytest.raises(BadAnswer, match="1 yes/no answers to 2 questions"):
        tiif.parse("Yes.\nMaybe.", items[0])
    # a dimension's accuracy pools its questions; groups average dimensions; the overall averages groups
    rows = [
        {
            "category": "2d_spatial_relation",
            "description": "short",
            "correct": 1,
            "questions": 2,
            "score": 0.5,
        },
        {
            "category": "2d_spatial_relation",
            "description": "short",
            "correct": 3,
            "questions": 3,
            "score": 1.0,
        },
        {"category": "negation", "description": "short", "correct": 0, "questions": 2, "score": 0.0},
        {
            "category": "2d_spatial_relation",
            "description": "long",
            "correct": 2,
            "questions": 5,
            "score": 0.4,
        },
        {"category": "negation", "description": "long", "correct": 2, "questions": 2, "score": 1.0},
    ]
    s = tiif.summarize(rows)
    assert s["dimensions"]["short"] == {"2d_spatial_relation": 0.8, "negation": 0.0}
    assert s["groups"]["short"] == {"Basic Relation": 0.8, "Basic Reasoning": 0.0}
    assert s["overall_by_description"] == {"short": pytest.approx(0.4), "long": pytest.approx(0.7)}
    assert s["overall"] == pytest.approx(0.55)
    assert s["categories"]["2d_spatial_relation"] == pytest.approx(6 / 10)


def test_tiif_in_the_wrong_format_is_one_line_naming_file_and_field(tmp_path):
    tiif = get_suite("tiif")
    bad = {
        "negation": [
            {"type": "negation", "yn_question_list": ["Is there a dog?"], "yn_answer_list": ["maybe"]}
        ]
    }
    folder = write_tiif(tmp_path / "a", bad)
    with pytest.raises(
        UserError, match=r"negation_eval_prompts.jsonl:1: field 'yn_answer_list' must hold one 'yes' or 'no'"
    ):
        tiif.read(folder)
    folder = write_tiif(tmp_path / "b", {"negation": [{"type": "negation", "yn_answer_list": ["yes"]}]})
    with pytest.raises(
        UserError, match=r"negation_eval_prompts.jsonl:1: field 'yn_question_list' is missing"
    ):
        tiif.read(folder)
    folder = write_tiif(tmp_path / "c")
    (folder.parent / "testmini_prompts" / "negation_prompts.jsonl").unlink()
    with pytest.raises(UserError, match="its prompts .*negation_prompts.jsonl are missing"):
        tiif.read(folder)


# ----------------------------------------------------------------------------- UniGenBench++


def reference_question(prompt: str, points: list[str], descs: list[str], definitions: dict[str, str]) -> str:
    """The reference's build_system_prompt (English), written again: definitions and
    descriptions framed by 「」."""
    explanation = "Checkpoints Defination:「" + "".join(f"\n{p}: {definitions[p]}" for p in points) + "\n」"
    described = "Checkpoints Description:「" + "".join(f"\n{p}: {d}" for p, d in zip(points, descs)) + "\n」"
    return (
        f"1. The prompt for the generated image is: 「{prompt}」. You are to analyze the image content in "
        f"detail from the angles specified in {points!s}. Detailed definitions of these checkpoints are "
        f"provided here: {explanation}. The specific description of each checkpoint in the context of the "
        f"prompt is: {described}."
    )


def test_unigenbench_reads_asks_parses_and_averages_primary_dimensions(tmp_path):
    ugb = get_suite("unigenbench")
    items = ugb.read(write_ugb(tmp_path / "test_prompts_en.csv"))
    assert [(it.id, it.category) for it in items] == [("0", "Creative Divergence"), ("1", "Art")]
    (user,) = ugb.messages(items[0], "data:,")
    assert user["content"][0]["type"] == "image_url"  # image first, as its vLLM client sends it
    text = user["content"][1]["text"]
    definitions = {
        "Style": "Art, painting, photography, design styles, and corresponding artist names",
        "World Knowledge": "Covers knowledge of celebrities, architecture, basic domain knowledge, and "
        "internet slang. Celebrities with modern copyright risk should be avoided",
        "Attribute - Quantity": "Focuses on the challenge of depicting three or more items accurately",
    }
    points, descs = UGB_EN[0][2]["Testpoints"], UGB_EN[0][2]["Testpoint Description"]
    assert reference_question(UGB_EN[0][1], points, descs, definitions) in text
    assert text.startswith("You are a precise and objective English-language image description system.")
    answer = (
        "<description><analysis>['ok', 'no pyramids', 'two']</analysis><score>[1, 0, 1]</score></description>"
    )
    got = ugb.parse(answer, items[0])
    assert got["score"] == pytest.approx(2 / 3) and got["testpoint_scores"] == [1, 0, 1]
    for bad in (
        "<score>[1, 0, 1]</score>",
        "<analysis>['a','b','c']</analysis><score>[1, 0]</score>",
        "<analysis>['a','b','c']</analysis><score>[1, 2, 1]</score>",
        "<analysis>[</analysis><score>[1]</score>",
    ):
        with pytest.raises(BadAnswer):
            ugb.parse(bad, items[0])
    rows = [
        {
            "category": "Creative Divergence",
            "score": 2 / 3,
            "testpoints": points,
            "testpoint_scores": [1, 0, 1],
        },
        {
            "category": "Art",
            "score": 0.5,
            "testpoints": UGB_EN[1][2]["Testpoints"],
            "testpoint_scores": [0, 1],
        },
    ]
    s = ugb.summarize(rows)
    assert s["primary_dimensions"] == {"Style": 1.0, "World Knowledge": 0.0, "Attribute": 1.0, "Action": 0.0}
    assert s["overall"] == pytest.approx(0.5) and s["sub_dimensions"]["Attribute - Quantity"] == 1.0
    zh = [
        (
            "3",
            "两只熊猫",
            {"一级垂类": "创意发散", "考点": ["风格", "属性-数量"], "考点对应描述": ["水墨画", "两只熊猫"]},
        )
    ]
    (z,) = ugb.read(write_ugb(tmp_path / "test_prompts_zh.csv", zh, "zh"))
    assert (
        z.category == "创意发散"
        and "考点说明:「\n风格: 艺术、绘画、摄影、设计风格，及对应艺术家名称"
        in ugb.messages(z, "x")[0]["content"][1]["text"]
    )


def test_unigenbench_in_the_wrong_format_is_one_line_naming_file_and_field(tmp_path):
    ugb = get_suite("unigenbench")
    dims = dict(UGB_EN[0][2])
    for change, expected in (
        (
            {"Testpoints": ["Style", "Colour", "Style"]},
            "field 'sub_dims_en.Testpoints': 'Colour' is not one of",
        ),
        ({"Testpoint Description": ["one"]}, "field 'sub_dims_en.Testpoint Description' must hold one"),
    ):
        path = write_ugb(tmp_path / "p.csv", [UGB_EN[0], ("1", "x", {**dims, **change})])
        with pytest.raises(UserError, match=rf"^{path}:3: {expected}"):
            ugb.read(path)
    path = tmp_path / "q.csv"
    path.write_text("id,prompt\n0,a cat\n")
    with pytest.raises(
        UserError, match=r"expected UniGenBench's columns index, prompt_en, sub_dims_en .* found id, prompt"
    ):
        ugb.read(path)


# ---------------------------------------------------------------------------- the driver, on a loopback judge


def wise_judge(body: dict) -> dict:
    text = message_text(body)
    return completion(f"The image is fine.\nScore: {len(text) % 2}")


def test_every_answer_is_recorded_with_its_score_and_a_resume_asks_nothing(tmp_path):
    wise = get_suite("wise")
    items = wise.read(write_wise(tmp_path / "merge.json"))
    ents = entries(items, per_prompt=2)
    log = tmp_path / "answers.jsonl"
    with LoopbackJudge(wise_judge, delay=0.05) as judge:
        client = JudgeClient(judge.url, model="Qwen3.5-35B-A3B", timeout=5)
        rows = score_suite(wise, ents, client, log=log, concurrency=3, digest=digest, progress=False)
        assert len(judge.bodies) == 8 and 1 < judge.max_in_flight <= 3
        body = judge.bodies[0]
        assert body["temperature"] == 0.0 and body["max_tokens"] == 500 and body["model"] == "Qwen3.5-35B-A3B"
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        again = score_suite(wise, ents, client, log=log, concurrency=3, digest=digest, progress=False)
        assert len(judge.bodies) == 8 and again == rows  # nothing asked again
    answers = [json.loads(x) for x in log.read_text().splitlines()]
    assert sorted(a["id"] for a in answers) == sorted(r["key"] for r in rows)
    for a in answers:
        assert a["answer"].startswith("The image is fine.") and a["score"] == float(a["answer"][-1])
    for r, item in zip(rows, [it for it in items for _ in range(2)]):
        expected = len(message_text({"messages": wise.messages(item, "x")})) % 2
        assert r["score"] == expected and r["category"] == item.category and r["id"] == item.id
    summary = {**summary_of(wise, rows), "scorer": client.name}
    by_cat = {
        c: np.mean([r["score"] for r in rows if r["category"] == c])
        for c in ("CULTURE", "TIME", "BIOLOGY", "CHEMISTRY")
    }
    assert (
        summary["categories"] == pytest.approx(by_cat) and summary["images"] == 8 and summary["prompts"] == 4
    )
    assert summary["overall"] == pytest.approx(
        (0.4 * by_cat["CULTURE"] + 0.12 * (by_cat["TIME"] + by_cat["BIOLOGY"] + by_cat["CHEMISTRY"])) / 0.76
    )
    assert "wise overall:" in format_summary(summary)


@pytest.mark.parametrize("mode", ["stall", "lie", "garbage", "down"])
def test_a_judge_that_stalls_lies_or_is_down_is_one_line_after_bounded_retries(tmp_path, mode):
    ugb = get_suite("unigenbench")
    items = ugb.read(write_ugb(tmp_path / "p.csv"))
    answers = {
        "stall": lambda b: None,
        "lie": lambda b: completion("<analysis>['a','b','c']</analysis><score>[1, 7, 1]</score>"),
        "garbage": lambda b: b"<html>busy</html>",
    }
    log = tmp_path / "answers.jsonl"
    tic = time.perf_counter()
    if mode == "down":
        client = JudgeClient(closed_port_url(), timeout=0.5)
        with pytest.raises(UserError) as e:
            score_suite(
                ugb,
                entries(items),
                client,
                log=log,
                retries=2,
                backoff=0.01,
                concurrency=2,
                digest=digest,
                progress=False,
            )
        asked = None
    else:
        with LoopbackJudge(answers[mode]) as judge:
            client = JudgeClient(judge.url, timeout=0.3)
            with pytest.raises(UserError) as e:
                score_suite(
                    ugb,
                    entries(items),
                    client,
                    log=log,
                    retries=2,
                    backoff=0.01,
                    concurrency=1,
                    digest=digest,
                    progress=False,
                )
            asked = len(judge.bodies)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"judge {client.url}: question 0000")
    assert "/0000 has no usable answer after 3 tries: " in message  # the first to fail of the two in flight
    reason = {
        "stall": "no complete answer within the deadline",
        "lie": "checkpoint scores must be 0 or 1",
        "garbage": "not a chat completion",
        "down": "Connection refused",
    }[mode]
    assert reason in message and "kept in" in message
    assert asked in (None, 3)  # the first question's 3 tries, then it stops: the second is never asked
    assert time.perf_counter() - tic < 5
