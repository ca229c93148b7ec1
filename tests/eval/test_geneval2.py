"""GenEval 2 (t2i_gcpo/eval/suites/geneval2.py, t2i_gcpo/scoring/soft_tifa.py): its data format, the
reference's answer lists, and Soft-TIFA AM / GM, TIFA, VQAScore and the analysis tables against the
reference's formulas written again here — on a tiny random Qwen3-VL whose probabilities come from its logits
(checked against `generate`'s scores, as the reference reads them), and on a loopback judge's
log-probabilities; asking resumes without asking again."""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest
from PIL import Image
from scipy.stats import gmean

from t2i_gcpo.errors import UserError
from t2i_gcpo.eval.suites import geneval2 as g2
from t2i_gcpo.eval.suites.judge_client import JudgeClient
from t2i_gcpo.scoring import soft_tifa as st
from t2i_gcpo.scoring.vlm import LocalVLM

from judge_fixtures import LoopbackJudge, completion, message_text, top_logprobs
from vlm_fixtures import GENEVAL2_ROWS, build_tiny_qwen3_vl, reference_probability, write_geneval2_data


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    folder = build_tiny_qwen3_vl(tmp_path_factory.mktemp("vlm") / "qwen3vl")
    return LocalVLM.from_pretrained(folder, dtype="float32", batch_size=4)


def images(count: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (56 + 8 * (i % 3), 64, 3), dtype=np.uint8)) for i in range(count)
    ]


def entries(rows=GENEVAL2_ROWS, per_prompt: int = 2) -> list:
    pics = images(len(rows) * per_prompt)
    return [(i, row, pics[i * per_prompt : (i + 1) * per_prompt]) for i, row in enumerate(rows)]


def digest(image) -> str:
    return str(zlib.crc32(image.tobytes()))


# ----------------------------------------------------------------------------- the data file


def test_the_real_format_reads_and_a_wrong_one_is_one_line_naming_file_and_field(tmp_path):
    path = write_geneval2_data(tmp_path / "geneval2_data.jsonl")
    assert g2.read_geneval2_data(path) == GENEVAL2_ROWS
    cases = [
        ({"prompt": "x", "atom_count": 3, "vqa_list": [["Q?", "Yes"]]}, "field 'skills' is missing"),
        (
            {**GENEVAL2_ROWS[0], "skills": ["count"]},
            "field 'skills' must be a list of one skill per question (4)",
        ),
        (
            {**GENEVAL2_ROWS[0], "skills": ["count", "object", "count", "colour"]},
            "field 'skills[3]' must be one of",
        ),
        ({**GENEVAL2_ROWS[0], "vqa_list": [["Q?"]]}, "field 'vqa_list[0]' must be a [question, answer] pair"),
        ({**GENEVAL2_ROWS[0], "atom_count": "3"}, "field 'atom_count' must be a positive integer"),
        ({**GENEVAL2_ROWS[0], "prompt": ""}, "field 'prompt' must be a non-empty string"),
    ]
    for row, expected in cases:
        bad = write_geneval2_data(tmp_path / "bad.jsonl", [GENEVAL2_ROWS[1], row])
        with pytest.raises(UserError) as e:
            g2.read_geneval2_data(bad)
        assert str(e.value).startswith(f"{bad}:2: ") and expected in str(e.value), str(e.value)
    (tmp_path / "broken.jsonl").write_text('{"prompt": \n')
    with pytest.raises(UserError, match=r"broken.jsonl:1 is not valid JSON"):
        g2.read_geneval2_data(tmp_path / "broken.jsonl")
    with pytest.raises(UserError, match="github.com/facebookresearch/GenEval2"):
        g2.read_geneval2_data(tmp_path / "missing.jsonl")


def test_answer_lists_and_questions_are_the_references():
    assert st.answer_list("How many cows are in the image?", "three") == (
        "three",
        "Three",
        " three",
        " Three",
        "3",
        " 3",
    )
    assert st.answer_list("How many cows are in the image?", "dozens")[-2:] == ("other", " other")
    assert st.answer_list("Are the cows plastic?", "Yes") == ("Yes", "yes", " yes", " Yes")
    assert (
        st.atom_questions(GENEVAL2_ROWS[2])[0][0]
        == "How many triangles are in the image? Answer in one word."
    )
    assert st.vqascore_question(GENEVAL2_ROWS[2])[0] == (
        'Does this image show "a photo of four triangles"? Answer the question with Yes or No.'
    )


# ----------------------------------------------------------------------------- a local VLM


def test_probabilities_are_the_softmax_of_the_logits_that_generate_scores(vlm):
    pics = images(5, seed=1)
    asked = [st.atom_questions(GENEVAL2_ROWS[1])[k % 5] for k in range(5)]
    got = vlm.probabilities(pics, [q for q, _ in asked], [a for _, a in asked])  # batches of 4, left-padded
    for image, (question, answers), (p, pred) in zip(pics, asked, got):
        p_ref, pred_ref = reference_probability(vlm.model, vlm.processor, image, question, answers)
        assert p == pytest.approx(p_ref, rel=1e-4, abs=1e-7) and pred == pred_ref
    alone = [vlm.probabilities([im], [q], [a])[0] for im, (q, a) in zip(pics, asked)]
    assert [p for p, _ in alone] == pytest.approx(
        [p for p, _ in got], rel=1e-4, abs=1e-7
    )  # batch-mates change nothing


def reference_scores(model, processor, ents) -> tuple[list[list[float]], list[list[float]], list[float]]:
    """Per image, the reference's soft_tifa and tifa score lists and vqa_score, computed its way."""
    soft, hard, vqa = [], [], []
    for _, row, pics in ents:
        for image in pics:
            s_list, t_list = [], []
            for question, answer in row["vqa_list"]:
                if question.startswith("How many"):
                    word = {"one": "1", "two": "2", "three": "3", "four": "4"}.get(answer, "other")
                    answers = [
                        answer,
                        answer.capitalize(),
                        " " + answer,
                        " " + answer.capitalize(),
                        word,
                        " " + word,
                    ]
                else:
                    answers = ["Yes", "yes", " yes", " Yes"]
                p, pred = reference_probability(
                    model, processor, image, f"{question} Answer in one word.", answers
                )
                s_list.append(p)
                t_list.append(1 if pred.lower() in answers else 0)
            soft.append(s_list)
            hard.append(t_list)
            q = 'Does this image show "{}"? Answer the question with Yes or No.'.format(row["prompt"])
            vqa.append(reference_probability(model, processor, image, q, ["Yes", "yes", " yes", " Yes"])[0])
    return soft, hard, vqa


def test_soft_tifa_tifa_vqascore_and_tables_equal_the_reference_on_a_tiny_vlm(vlm):
    ents = entries()
    soft, hard, vqa = reference_scores(vlm.model, vlm.processor, ents)
    rows = g2.score_entries(ents, vlm, "soft_tifa_gm", digest=digest, progress=False)
    summary = g2.summarize(rows, "soft_tifa_gm")
    assert [r["soft_tifa"] for r in rows] == [pytest.approx(s, rel=1e-4, abs=1e-8) for s in soft]
    assert [r["tifa_atoms"] for r in rows] == hard
    assert 0 < sum(map(sum, hard)) < sum(map(len, hard))  # some atoms hit, some miss: the rule is exercised
    am = [sum(s) / len(s) for s in soft]
    gm = [float(gmean(s)) for s in soft]
    assert summary["methods"]["soft_tifa_am"] == pytest.approx(np.mean(am), rel=1e-4)
    assert summary["methods"]["soft_tifa_gm"] == pytest.approx(np.mean(gm), rel=1e-4)
    assert summary["methods"]["tifa"] == pytest.approx(np.mean([sum(t) / len(t) for t in hard]))
    assert summary["overall"] == summary["methods"]["soft_tifa_gm"] and [
        r["score"] for r in rows
    ] == pytest.approx(gm, rel=1e-4)
    # soft_tifa_analysis.py: per skill the AM over atoms, per atom count the mean GM over prompts
    skills = [s for _, row, pics in ents for _ in pics for s in [row["skills"]]]
    for skill in ("object", "count", "position"):
        vals = [x for sk, sc in zip(skills, soft) for k, x in zip(sk, sc) if k == skill]
        assert summary["skills"][skill] == pytest.approx(sum(vals) / len(vals), rel=1e-4)
    counts = [row["atom_count"] for _, row, pics in ents for _ in pics]
    for k in (2, 3):
        assert summary["atom_counts"][str(k)] == pytest.approx(
            np.mean([g for c, g in zip(counts, gm) if c == k]), rel=1e-4
        )
    assert summary["categories"] == {
        "atoms_2": pytest.approx(summary["atom_counts"]["2"]),
        "atoms_3": pytest.approx(summary["atom_counts"]["3"]),
    }
    assert [r["key"] for r in rows] == [
        "00000/0000",
        "00000/0001",
        "00001/0000",
        "00001/0001",
        "00002/0000",
        "00002/0001",
    ]
    v_rows = g2.score_entries(ents, vlm, "vqascore", digest=digest, progress=False)
    assert [r["score"] for r in v_rows] == pytest.approx(vqa, rel=1e-4, abs=1e-8)
    assert g2.summarize(v_rows, "vqascore")["overall"] == pytest.approx(np.mean(vqa), rel=1e-4)
    assert "GenEval 2 score (Soft-TIFA GM):" in g2.format_summary({**summary, "scorer": "tiny"})


def test_the_geometric_mean_is_zero_with_a_zero_atom():
    assert st.geometric_mean([0.5, 0.0, 0.9]) == 0.0 == float(np.nan_to_num(gmean([0.5, 0.0, 0.9])))
    assert st.geometric_mean([0.2, 0.8]) == pytest.approx(0.4)


# ----------------------------------------------------------------------------- a judge


def judge_answer(body: dict) -> dict:
    """Log-probabilities that depend on the question: a few answer tokens and others."""
    h = zlib.crc32(message_text(body).encode())
    weights = {
        "Yes": 1 + h % 7,
        " yes": 1 + h % 3,
        "No": 1 + h % 5,
        "four": 1 + h % 4,
        " 4": 2,
        "one": 1 + h % 6,
        "One": 1,
        "1": 1 + h % 2,
        "maybe": 3,
    }
    table = top_logprobs(weights)
    return completion(table[0][0], table)


def test_on_a_loopback_judge_the_scores_are_the_exp_sum_of_its_logprobs(tmp_path):
    ents = entries(per_prompt=1)
    with LoopbackJudge(judge_answer) as judge:
        client = JudgeClient(judge.url, model="qwen", timeout=5)
        rows = g2.score_entries(ents, client, "soft_tifa_am", digest=digest, concurrency=3, progress=False)
        body = judge.bodies[0]
    assert (
        body["max_tokens"] == 1
        and body["logprobs"] is True
        and body["top_logprobs"] == 20
        and body["model"] == "qwen"
    )
    content = body["messages"][0]["content"]
    assert content[0]["type"] == "image_url" and content[0]["image_url"]["url"].startswith(
        "data:image/png;base64,"
    )
    for row, (_, data, _) in zip(rows, ents):
        soft, hard = [], []
        for question, answer in data["vqa_list"]:
            body = {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": f"{question} Answer in one word."}]}
                ]
            }
            table = dict(
                judge_answer(body)["choices"][0]["logprobs"]["content"][0]["top_logprobs"][i].values()
                for i in range(9)
            )
            answers = st.answer_list(question, answer)
            soft.append(sum(math.exp(table[a]) for a in answers if a in table))
            top = max(table, key=table.get)
            hard.append(1.0 if top.lower() in answers else 0.0)
        assert row["soft_tifa"] == pytest.approx(soft) and row["tifa_atoms"] == hard
        assert row["score"] == pytest.approx(sum(soft) / len(soft)) and row["soft_tifa_gm"] == pytest.approx(
            gmean(soft)
        )


def test_a_judge_without_logprobs_serves_tifa_only():
    ents = entries(per_prompt=1)
    with LoopbackJudge(lambda body: completion("Yes")) as judge:
        client = JudgeClient(judge.url, timeout=5)
        with pytest.raises(UserError, match="returns no log-probabilities: Soft-TIFA and VQAScore"):
            g2.score_entries(ents, client, "soft_tifa_gm", digest=digest, progress=False)
        rows = g2.score_entries(ents, client, "tifa", digest=digest, progress=False)
    assert all(
        r["tifa_atoms"] == [1.0 if not q.startswith("How many") else 0.0 for q, _ in row["vqa_list"]]
        for r, (_, row, _) in zip(rows, ents)
    )
    assert g2.summarize(rows, "tifa")["methods"] == {
        "tifa": pytest.approx(np.mean([r["tifa"] for r in rows]))
    }


def test_resumed_scoring_asks_nothing_it_has_and_again_what_changed(tmp_path):
    ents = entries(per_prompt=1)
    log = tmp_path / "answers.jsonl"
    with LoopbackJudge(judge_answer) as judge:
        client = JudgeClient(judge.url, timeout=5)
        first = g2.score_entries(ents, client, "soft_tifa_gm", log=log, digest=digest, progress=False)
        asked = len(judge.bodies)
        assert asked == sum(len(r["vqa_list"]) for r in GENEVAL2_ROWS) == len(log.read_text().splitlines())
        again = g2.score_entries(ents, client, "soft_tifa_am", log=log, digest=digest, progress=False)
        assert len(judge.bodies) == asked and [r["soft_tifa"] for r in again] == [
            r["soft_tifa"] for r in first
        ]
        lines = log.read_text().splitlines()
        log.write_text("\n".join(lines[:-2]) + "\n" + lines[-2][:17])  # two answers lost, the last line torn
        changed = [(0, ents[0][1], images(1, seed=9)), *ents[1:]]  # prompt 0's image is new: its atoms again
        rows = g2.score_entries(changed, client, "soft_tifa_gm", log=log, digest=digest, progress=False)
        assert len(judge.bodies) == asked + 2 + len(GENEVAL2_ROWS[0]["vqa_list"])
    kept = [json.loads(x) for x in log.read_text().splitlines()]  # whole lines only: the torn one was cut
    assert len(kept) == asked - 2 + 2 + len(GENEVAL2_ROWS[0]["vqa_list"])
    soft = [r["soft_tifa"] for r in rows]
    assert soft == [r["soft_tifa"] for r in again]  # the fake judge's answers depend on the question alone
