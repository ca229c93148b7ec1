"""Arithmetic world (docs/worlds/arithmetic.md): hand-computed solutions, splits, noisy pretraining text,
answer and format rewards, DAPO's overlong penalty, first wrong steps as exact spans, the character
tokenizer, the prompt frame with its negative contexts, and GSM8K-style problem files."""

from __future__ import annotations

import json
import random
import re

import pytest

from t2i_gcpo.errors import UserError
from t2i_gcpo.worlds.arithmetic import (
    ALPHABET,
    MAX_OPERAND,
    MAX_VALUE,
    SPECIAL_TOKENS,
    WRONG_ANSWER_NOTE,
    Problem,
    build_tokenizer,
    check_characters,
    correctness_reward,
    extract_answer,
    first_wrong_step,
    format_prompt,
    format_reward,
    generate_problems,
    make_splits,
    negative_prompt,
    noisy_solution,
    overlong_penalty,
    parse_question,
    read_problem_file,
    solution_text,
    span_to_token_indices,
    unknown_characters,
    write_problems,
)
from t2i_gcpo.worlds.arithmetic.problems import apply


def world(question: str) -> Problem:
    p = parse_question(question)
    assert p is not None, question
    return p


# --- problems and correct solutions ------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "solution"),
    [
        ("12+7*3=?", "7*3=21\n12+21=33\n#### 33"),  # * before +
        ("20-4*3+2=?", "4*3=12\n20-12=8\n8+2=10\n#### 10"),
        ("9-2+3=?", "9-2=7\n7+3=10\n#### 10"),  # left to right: not 9-(2+3)=4
        ("2*3+4*5=?", "2*3=6\n4*5=20\n6+20=26\n#### 26"),  # products first, left to right
        ("10-2+3*4=?", "3*4=12\n10-2=8\n8+12=20\n#### 20"),  # even when a sum could go first
        ("3*4*5-7=?", "3*4=12\n12*5=60\n60-7=53\n#### 53"),
        ("5-8+4=?", "5-8=-3\n-3+4=1\n#### 1"),  # a user's expression may go negative
    ],
)
def test_solution_by_hand(question, solution):
    p = world(question)
    assert solution_text(p) == solution
    assert p.answer == int(solution.rsplit(" ", 1)[1])
    assert first_wrong_step(p, solution) is None


def test_parse_question_normalises_and_refuses():
    assert world(" 12 + 7 * 3 = ? ").question == "12+7*3=?"
    assert world("12+7*3").question == "12+7*3=?"
    assert world("12+7*3=").answer == 33
    assert world("7").steps == () and world("7").answer == 7
    for text in ["what is 2+2?", "2+", "-3+4", "2/4", "2++3", "", "12+7*3=?5"]:
        assert parse_question(text) is None, text
    with pytest.raises(ValueError, match="not an arithmetic-world problem"):
        solution_text(Problem("How many apples?", 3))


def test_generated_problems_stay_in_range_and_are_seeded():
    problems = generate_problems(300, seed=3)
    assert problems == generate_problems(300, seed=3)
    assert problems != generate_problems(300, seed=4)
    for p in problems:
        operands = [int(x) for x in re.findall(r"\d+", p.question)]
        assert 3 <= len(operands) <= 4 and all(1 <= x <= MAX_OPERAND for x in operands)
        assert all(0 <= s.result <= MAX_VALUE and s.is_true for s in p.steps)
        assert p.answer == eval(p.question[:-2])  # Python's precedence agrees
    assert {len(p.steps) for p in problems} == {2, 3}
    assert any("-" in p.question for p in problems) and any("*" in p.question for p in problems)


def test_splits_disjoint_distinct_and_deterministic():
    train, test = make_splits(n_train=800, n_test=100, seed=0)
    assert (len(train), len(test)) == (800, 100)
    q_train, q_test = [p.question for p in train], [p.question for p in test]
    assert len(set(q_train)) == 800 and len(set(q_test)) == 100
    assert not set(q_train) & set(q_test)
    assert make_splits(n_train=800, n_test=100, seed=0) == (train, test)
    assert make_splits(n_train=10, n_test=100, seed=0)[1] == test  # test does not move with n_train
    assert make_splits(n_train=800, n_test=100, seed=1)[1] != test
    with pytest.raises(UserError, match="≥ 0"):
        make_splits(n_train=-1)


# --- noisy solutions ---------------------------------------------------------------------------


def test_noisy_solution_extremes():
    p = world("12+7*3=?")
    clean = noisy_solution(p, 0.0, rng=5)
    assert clean.text == solution_text(p) and clean.corrupted == () and clean.answer == 33
    always = noisy_solution(p, 1.0, rng=5)
    assert always.corrupted == (0, 1) and always.answer != 33
    assert not any(s.is_true for s in always.steps)
    # a slip is small, and the next step computes from the wrong value
    first, second = always.steps
    assert 1 <= abs(first.result - 21) <= 3 and second.left == 12 and second.right == first.result
    assert noisy_solution(p, 0.5, rng=7) == noisy_solution(p, 0.5, rng=random.Random(7))
    with pytest.raises(ValueError):
        noisy_solution(p, 1.5, rng=0)


def test_noisy_solution_wrong_exactly_when_a_step_slipped():
    rng = random.Random(0)
    n_wrong = 0
    for p in generate_problems(400, seed=1):
        ns = noisy_solution(p, 0.3, rng)
        assert (ns.answer != p.answer) == bool(ns.corrupted)
        assert [i for i, s in enumerate(ns.steps) if not s.is_true] == list(ns.corrupted)
        for i in ns.corrupted:  # a slip keeps a product ≥ 1 (never hides later slips) and a sum ≥ 0
            step, floor = ns.steps[i], 1 if ns.steps[i].op == "*" else 0
            assert step.result >= floor or apply(step.op, step.left, step.right) < floor
        assert ns.text.split("\n") == [s.text for s in ns.steps] + [f"#### {ns.answer}"]
        assert extract_answer(ns.text) == ns.answer
        span = first_wrong_step(p, ns.text)
        if ns.corrupted:
            n_wrong += 1
            assert ns.text[span[0] : span[1]] == ns.steps[ns.corrupted[0]].text
        else:
            assert span is None
    assert 0.3 < n_wrong / 400 < 0.75  # 1 - 0.7^2 … 1 - 0.7^3


def test_slips_keep_products_positive_and_sums_non_negative():
    # 1*1 slipping to 0 would make every later product 0 and hide the slip; 6-6 stays ≥ 0
    for seed in range(40):
        assert noisy_solution(world("1*1*7=?"), 1.0, rng=seed).steps[0].result in (2, 3, 4)
        assert noisy_solution(world("6-6+2=?"), 1.0, rng=seed).steps[0].result in (1, 2, 3)


class _Scripted(random.Random):
    """Slips at every step, with the offsets given in order (to force two slips to cancel)."""

    def __init__(self, offsets):
        super().__init__(0)
        self.offsets = list(offsets)

    def random(self):
        return 0.0

    def choice(self, seq):
        return self.offsets.pop(0)


def test_cancelling_slips_are_repaired():
    p = world("2*3+4*5=?")  # 2*3=7 (+1), 4*5=19 (-1), 7+19=26 (+0 is not a slip: 3 steps need 3)
    ns = noisy_solution(p, 1.0, _Scripted([1, -1, 2]))
    assert ns.answer != 26 and ns.corrupted == (0, 1, 2)
    # the +2 on the last step would not cancel: kept as drawn
    assert ns.steps[2].result == ns.steps[2].left + ns.steps[2].right + 2
    ns = noisy_solution(p, 1.0, _Scripted([1, 1, -2]))  # 7, 21, 28-2 = 26: the last slip cancels
    assert ns.answer != 26 and ns.corrupted == (0, 1, 2)
    assert ns.steps[2].result not in (28, 26)


# --- answers and rewards -----------------------------------------------------------------------


def test_extract_answer_and_rewards():
    assert extract_answer("7*3=21\n12+21=33\n#### 33") == 33
    assert extract_answer("####33") == 33 and extract_answer("  #### -4 \n") == -4
    assert extract_answer("#### 3\n#### 4") == 3  # the first answer line counts
    for bad in ["7*3=21", "#### x", "#### 3 3", "12+21=33 #### 33", "", "#### "]:
        assert extract_answer(bad) is None, bad
    p = world("12+7*3=?")
    assert correctness_reward(p, "#### 33") == 1.0 and correctness_reward(p, "#### 34") == 0.0
    assert format_reward("7*3=21\n12+21=33\n#### 33") == 1.0
    assert format_reward("7*3=22\n12+22=34\n#### 34\n") == 1.0  # wrong but well formed
    assert format_reward("#### 7") == 1.0
    for bad in [
        "7 * 3=21\n#### 33",  # spaces
        "7*3=21\n\n#### 33",  # blank line
        "7*3=21\n#### 33\n7*3",  # text after the answer
        "7*3=21\n12+21=33",  # no answer line
        "#### 33\n\n",
        "so 7*3=21\n#### 33",
    ]:
        assert format_reward(bad) == 0.0, bad


def test_overlong_penalty_boundaries():
    # L_max = 20, L_cache = 4: free up to 16 tokens, linear to -1 at 20, -1 beyond
    assert [overlong_penalty(n, 20, 4) for n in (0, 16, 17, 18, 20, 21, 100)] == [
        0.0,
        0.0,
        -0.25,
        -0.5,
        -1.0,
        -1.0,
        -1.0,
    ]
    assert overlong_penalty(20, 20, 0) == 0.0 and overlong_penalty(21, 20, 0) == -1.0
    assert overlong_penalty(1, 20, 20) == pytest.approx(-0.05)
    with pytest.raises(ValueError):
        overlong_penalty(5, 10, 11)


# --- first wrong step --------------------------------------------------------------------------


def _span_of(text: str, line: str) -> tuple[int, int]:
    start = text.index(line)
    return start, start + len(line)


@pytest.mark.parametrize(
    ("question", "completion", "wrong_line"),
    [
        ("12+7*3=?", "7*3=21\n12+21=34\n#### 34", "12+21=34"),  # false arithmetic
        ("12+7*3=?", "12+7=19\n19*3=57\n#### 57", "12+7=19"),  # true, but precedence broken
        ("9-2+3=?", "2+3=5\n9-5=4\n#### 4", "2+3=5"),  # true, but not left to right
        ("12+7*3=?", "7*3=21\n12+20=32\n#### 32", "12+20=32"),  # operand not on the board
        ("12+7*3=?", "7*3=21\nso\n12+21=33\n#### 3", "so"),  # garbage
        ("12+7*3=?", "7*3=21\n12+21=33\n#### 34", "#### 34"),  # all steps right, answer wrong
        ("12+7*3=?", "7*3=21\n#### 21", "#### 21"),  # stopped early
        ("12+7*3=?", "7*3=21\n12+21=33\n#### x", "#### x"),  # unreadable answer
        ("12+7*3=?", "7*3=21\n12+21=33\n33+0=33\n#### 34", "33+0=33"),  # nothing left to reduce
        ("12+7*3=?", "7*3=21\n\n 12+21=34\n#### 34", " 12+21=34"),  # blank line skipped
        # any order that respects the tree is right: the answer line is the first wrong one
        ("2*3+4*5=?", "4*5=20\n2*3=6\n6+20=26\n#### 27", "#### 27"),
        # two redexes read alike ("2*3"): both readings are followed
        ("2*3*5+2*3*7=?", "2*3=6\n6*7=42\n2*3=6\n6*5=30\n30+42=72\n#### 73", "#### 73"),
    ],
)
def test_first_wrong_step(question, completion, wrong_line):
    span = first_wrong_step(world(question), completion)
    assert span == _span_of(completion, wrong_line)
    assert completion[span[0] : span[1]] == wrong_line


def test_first_wrong_step_none_missing_answer_and_free_text():
    p = world("12+7*3=?")
    assert first_wrong_step(p, "7*3=21\n12+21=33\n#### 33") is None
    assert first_wrong_step(p, "7*3=20\n#### 33") is None  # the reward is 1: not a failure
    text = "7*3=21\n12+21=33\n"
    assert first_wrong_step(p, text) == (len(text), len(text))  # the stop was wrong
    with pytest.raises(ValueError, match="not an arithmetic-world problem"):
        first_wrong_step(Problem("How many apples?", 3), "#### 4")


# --- tokenizer ---------------------------------------------------------------------------------


def test_tokenizer_round_trip_offsets_and_span_tokens():
    tok = build_tokenizer()
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == len(SPECIAL_TOKENS) + len(ALPHABET)
    p = world("2*3+4*5=?")
    texts = [
        ALPHABET,
        format_prompt(p.question) + solution_text(p),
        negative_prompt(p.question, "wrong_answer"),
        negative_prompt(p.question, "empty"),
        "  \n\n 12 +  3\n",
    ]
    for s in texts:
        enc = tok(s, return_offsets_mapping=True)
        assert len(enc["input_ids"]) == len(s) and tok.unk_token_id not in enc["input_ids"]
        assert enc["offset_mapping"] == [(i, i + 1) for i in range(len(s))]
        assert tok.decode(enc["input_ids"]) == s
    assert tok("1$2")["input_ids"] == [tok.convert_tokens_to_ids("1"), 3, tok.convert_tokens_to_ids("2")]
    # the wrong step's tokens, from the completion's offsets
    completion = "4*5=20\n2*3=7\n7+20=27\n#### 27"
    span = first_wrong_step(p, completion)
    offsets = tok(completion, return_offsets_mapping=True)["offset_mapping"]
    assert span_to_token_indices(span, offsets) == list(range(7, 12))
    # a BOS with a zero-width offset is never in a span
    ids = [tok.bos_token_id] + tok(completion)["input_ids"]
    assert span_to_token_indices(span, [(0, 0)] + offsets) == list(range(8, 13))
    assert tok.decode([ids[i] for i in range(8, 13)]) == "2*3=7"


def test_span_to_token_indices_with_multi_character_tokens():
    offsets = [(0, 0), (0, 2), (2, 5), (5, 6), (6, 9)]
    assert span_to_token_indices((3, 4), offsets) == [2]
    assert span_to_token_indices((1, 6), offsets) == [1, 2, 3]
    assert span_to_token_indices((5, 5), offsets) == []


def test_tokenizer_save_load(tmp_path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = build_tokenizer()
    tok.save_pretrained(tmp_path)
    s = format_prompt("12+7*3=?") + "7*3=21\n12+21=33\n#### 33"
    for loaded in (
        PreTrainedTokenizerFast.from_pretrained(tmp_path),
        AutoTokenizer.from_pretrained(tmp_path),
    ):
        ids = loaded(s)["input_ids"]
        assert ids == tok(s)["input_ids"] and loaded.decode(ids) == s
        assert loaded.pad_token_id == 0 and loaded.eos_token_id == 2
        batch = loaded(["12", "1+2=3"], padding=True)["input_ids"]
        assert batch[0] == ids[:0] + loaded("12")["input_ids"] + [0, 0, 0]
        assert loaded.batch_decode(batch, skip_special_tokens=True) == ["12", "1+2=3"]


def test_unknown_characters():
    assert unknown_characters("12+7*3=?") == set()
    assert unknown_characters("12/4 = $3 é") == {"/", "$", "é"}
    assert unknown_characters("Q: \t") == {"\t"}
    assert check_characters("12+7*3=?") == "12+7*3=?"
    with pytest.raises(UserError) as e:
        check_characters("what is 12/4 (in $)?", what="question")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("question 'what is 12/4 (in $)?'")
    assert "'$' '(' ')' '/'" in msg


# --- prompts and negative contexts -------------------------------------------------------------


def test_prompt_and_negative_contexts():
    q = "12+7*3=?"
    assert format_prompt(q) == "Q: 12+7*3=?\nA:\n"
    assert negative_prompt(q, "empty") == "Q: \nA:\n"
    assert negative_prompt(q, "wrong_answer") == (
        "Q: 12+7*3=?\nNote: Intentionally generate an incorrect answer.\nA:\n"
    )
    assert WRONG_ANSWER_NOTE in negative_prompt(q, "wrong_answer")
    assert negative_prompt(q, "Solve badly: {question}") == "Q: Solve badly: 12+7*3=?\nA:\n"
    for s in (format_prompt(q), negative_prompt(q, "empty"), negative_prompt(q, "wrong_answer")):
        assert unknown_characters(s) == set() and s.endswith("A:\n")
    with pytest.raises(UserError, match="neither one of empty, wrong_answer"):
        negative_prompt(q, "wrong")


def test_chat_template_builds_the_same_contexts(tmp_path):
    """A text policy that fills the chat template's user turn gets exactly these inputs."""
    from transformers import AutoTokenizer

    build_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    q = "12+7*3=?"

    def chat(content):
        return tok.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )

    assert chat(q) == format_prompt(q)
    assert chat("") == negative_prompt(q, "empty")
    assert chat(f"{q}\n{WRONG_ANSWER_NOTE}") == negative_prompt(q, "wrong_answer")
    turns = [{"role": "user", "content": q}, {"role": "assistant", "content": "7*3=21\n12+21=33\n#### 33"}]
    assert tok.apply_chat_template(turns, tokenize=False) == format_prompt(q) + "7*3=21\n12+21=33\n#### 33"


# --- problem files -----------------------------------------------------------------------------


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_read_gsm8k_style_rows(tmp_path):
    gsm = {
        "question": "Natalia sold clips to 48 of her friends in April, and half as many in May.",
        "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn total 48+24 = <<48+24=72>>72.\n#### 72",
    }
    f = _jsonl(
        tmp_path / "p.jsonl",
        [
            gsm,
            "",
            {"question": "A big number?", "answer": "#### 1,200"},
            {"prompt": "How many legs has a cat?", "answer": 4},
            {"question": "12 + 7*3", "answer": "7*3=21\n12+21=33\n#### 33"},
            {"prompt": "9-2+3=?", "answer": 10},
        ],
    )
    problems = read_problem_file(f)
    assert [p.answer for p in problems] == [72, 1200, 4, 33, 10]
    assert problems[0] == Problem(gsm["question"], 72, None)
    assert problems[2].question == "How many legs has a cat?" and problems[2].steps is None
    assert problems[3] == world("12+7*3=?") and problems[4].steps is not None


def test_read_txt_and_round_trip(tmp_path):
    f = tmp_path / "q.txt"
    f.write_bytes("\ufeff12 + 7*3\n\n# a comment\nHow many apples?\n9-2+3=?\n".encode())
    problems = read_problem_file(f)
    assert problems == [world("12+7*3=?"), Problem("How many apples?", None, None), world("9-2+3=?")]
    _, test = make_splits(n_train=0, n_test=20, seed=2)
    for ext in ("jsonl", "txt"):
        write_problems(test, tmp_path / f"t.{ext}")
        assert read_problem_file(tmp_path / f"t.{ext}") == test
    assert json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])["answer"] == solution_text(test[0])


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ('{"question": "2+2=?", "answer": ', "malformed JSON"),
        ("[1, 2]", 'expected a JSON object with "question"'),
        ({"answer": 4}, 'no "question" \\(or "prompt"\\) text'),
        ({"question": "  ", "answer": 4}, 'no "question"'),
        ({"question": "How many?"}, "no \"answer\" for question 'How many\\?'"),
        ({"question": "How many?", "answer": "four"}, 'answer text has no "#### N" line'),
        (
            {"question": "How many?", "answer": "so #### four"},
            "the answer after \"####\" is not an integer: 'four'",
        ),
        ({"question": "How many?", "answer": "#### 2.5"}, ".*not an integer: '2.5'"),
        ({"question": "How many?", "answer": True}, '"answer" must be an integer or a text'),
        ({"question": "How many?", "answer": 4.0}, '"answer" must be an integer'),
        ({"question": "12+7*3=?", "answer": 34}, r"answer 34 is wrong: 12\+7\*3=\? gives 33"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, row, reason):
    f = _jsonl(tmp_path / "p.jsonl", [{"question": "1+1=?", "answer": 2}, row])
    with pytest.raises(UserError, match=rf"^{re.escape(str(f))}:2: {reason}") as e:
        read_problem_file(f)
    assert "\n" not in str(e.value)


def test_bad_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    with pytest.raises(UserError, match="has no problems"):
        read_problem_file(tmp_path / "empty.jsonl")
    (tmp_path / "comments.txt").write_text("# only a comment\n")
    with pytest.raises(UserError, match="has no problems"):
        read_problem_file(tmp_path / "comments.txt")
    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(UserError, match="is a directory"):
        read_problem_file(tmp_path / "d.jsonl")
    with pytest.raises(UserError, match="does not exist"):
        read_problem_file(tmp_path / "missing.jsonl")
    import os

    os.mkfifo(tmp_path / "fifo.txt")  # opened, it would block: refused before reading
    with pytest.raises(UserError, match=r"fifo.txt is a named pipe \(FIFO\), not a regular file"):
        read_problem_file(tmp_path / "fifo.txt")
    (tmp_path / "p.csv").write_text("question,answer\n")
    with pytest.raises(UserError, match=r"must end in \.txt"):
        read_problem_file(tmp_path / "p.csv")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe1+1\n")
    with pytest.raises(UserError, match="not UTF-8"):
        read_problem_file(tmp_path / "bin.txt")
