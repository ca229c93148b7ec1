"""The arithmetic task (docs/worlds/arithmetic.md#step-lift): prompt files, the reward, step lift, the text
heatmap, and the held-out evaluation on a tiny random Llama over the world's character tokenizer."""

from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import PromptRecord, Rollout, SamplingParams
from t2i_gcpo.resources import PROMPTS_DIR
from t2i_gcpo.rewards.combine import RewardError
from t2i_gcpo.rewards.registry import build_reward
from t2i_gcpo.tasks import arithmetic as A
from t2i_gcpo.tasks.loop import group_generators, sample_and_decode
from t2i_gcpo.tasks.registry import get_task
from t2i_gcpo.viz.text_heatmap import TextSample, text_heatmap_html
from t2i_gcpo.worlds.arithmetic import build_tokenizer, make_splits


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


# ---------------------------------------------------------------------------- prompts


def test_shipped_files_are_the_documented_disjoint_splits(tmp_path):
    task = get_task("arithmetic")
    assert task.default_reward == "arithmetic"
    assert task.default_eval_prompts() == str(PROMPTS_DIR / A.TEST_FILE)
    train = task.load_prompts(PROMPTS_DIR / A.TRAIN_FILE)
    test = task.load_prompts(task.default_eval_prompts())
    assert (len(train), len(test)) == (2000, 200)
    assert not {p.text for p in train} & {p.text for p in test}
    ref_train, ref_test = make_splits(2000, 200, 0)
    assert [p.text for p in test] == [p.question for p in ref_test]
    assert [p.text for p in train] == [p.question for p in ref_train]
    r = test[0]  # {"question": "14+9*16-10=?", "answer": "9*16=144\n14+144=158\n158-10=148\n#### 148"}
    assert r.text == "14+9*16-10=?" and r.negative is None
    assert r.meta == {
        "question": "14+9*16-10=?",
        "answer": 148,
        "steps": ["9*16=144", "14+144=158", "158-10=148"],
    }
    # the generator reproduces the shipped bytes
    A.write_prompt_files(tmp_path)
    for name in (A.TRAIN_FILE, A.TEST_FILE):
        assert (tmp_path / name).read_bytes() == (PROMPTS_DIR / name).read_bytes()


def test_gsm8k_rows_txt_and_parse(tmp_path):
    rows = [
        {"question": "12 + 7*3", "answer": "7*3=21\n12+21=33\n#### 33"},
        {"question": "Tom has 1,000 apples and buys 200. How many?", "answer": "1000+200=1200\n#### 1,200"},
        {"prompt": "2*3-1=?", "answer": 5},
    ]
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = A.ArithmeticTask()
    recs = task.load_prompts(f)
    assert [r.text for r in recs] == ["12+7*3=?", "Tom has 1,000 apples and buys 200. How many?", "2*3-1=?"]
    assert [r.meta["answer"] for r in recs] == [33, 1200, 5]
    assert recs[0].meta["steps"] == ["7*3=21", "12+21=33"] and recs[1].meta["steps"] is None
    t = tmp_path / "q.txt"
    t.write_text("# comment\n3+4*2\n\nWhat is two plus two\n")
    recs = task.load_prompts(t)
    assert [(r.text, r.meta["answer"]) for r in recs] == [("3+4*2=?", 11), ("What is two plus two", None)]
    assert task.parse(" 1 + 2*3 =?").meta == {"question": "1+2*3=?", "answer": 7, "steps": ["2*3=6", "1+6=7"]}
    assert task.parse("hello").meta == {"question": "hello", "answer": None, "steps": None}
    with pytest.raises(UserError):
        task.parse("  ")
    f.write_text(json.dumps({"question": "2+2=?", "answer": 5}) + "\n")
    with pytest.raises(UserError, match=r"p\.jsonl:1: answer 5 is wrong"):
        task.load_prompts(f)


def test_chat_template_gives_the_world_frame(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    from t2i_gcpo.policies.text import TextPolicy

    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    policy = TextPolicy(LlamaForCausalLM(cfg), tok)
    assert policy.format_prompt("12+7*3=?") == "Q: 12+7*3=?\nA:\n"
    assert tok.decode(policy.context_ids("12+7*3=?")) == "Q: 12+7*3=?\nA:\n"
    assert policy.format_prompt(policy.negative_user("12+7*3=?")) == "Q: \nA:\n"  # `empty`


# ---------------------------------------------------------------------------- reward

GOOD = "7*3=21\n12+21=33\n#### 33"  # 12+7*3=?


def test_reward_correctness_format_and_overlong():
    meta = A.ArithmeticTask().parse("12+7*3=?").meta
    texts = [
        GOOD,
        "7*3=21\n12+21=34\n#### 34",
        "7*3 = 21\n12+21=33\n#### 33",
        "7*3=21\n12+21=33",
        GOOD + "\n",
    ]
    out = build_reward("arithmetic")(texts, ["12+7*3=?"] * 5, [meta] * 5)
    assert out.scores.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]
    d = out.details
    assert [x["correct"] for x in d] == [True, False, True, False, True]
    assert [x["answer"] for x in d] == [33, 34, 33, None, 33] and d[0]["target"] == 33
    assert [x["first_wrong_span"] for x in d] == [None, (7, 15), None, (15, 15), None]
    assert [x["format"] for x in d] == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert [x["length"] for x in d] == [23, 23, 25, 15, 24] and d[0]["completion"] == GOOD

    fmt = build_reward("arithmetic:format=0.5")(texts, ["12+7*3=?"] * 5, [meta] * 5)
    assert fmt.scores.tolist() == [1.5, 0.5, 1.0, 0.0, 1.5]
    # DAPO overlong: L_max = 24, L_cache = 4 → 0 up to 20, (20 − L)/4 up to 24, −1 beyond
    over = build_reward(" arithmetic:format=0.5, overlong=24/4 ")
    lengths = {"": 0, "1" * 20: 0.0, "1" * 21: -0.25, "1" * 23: -0.75, "1" * 24: -1.0, "1" * 30: -1.0}
    out = over(list(lengths), ["1+1*1=?"] * 6, [{}] * 6)
    assert out.scores.tolist() == pytest.approx(list(lengths.values()))
    assert out.scores[0] == 0.0 and out.details[0]["first_wrong_span"] == (0, 0)


def test_reward_overlong_adds_to_correct_and_format():
    over = build_reward("arithmetic:format=0.5,overlong=24/4")
    out = over([GOOD], ["12+7*3=?"], [{}])  # 23 characters: (20 − 23)/4 = −0.75
    assert out.scores.tolist() == [1.0 + 0.5 - 0.75]
    assert out.details[0]["overlong"] == -0.75


@pytest.mark.parametrize(
    "spec, match",
    [
        ("arithmetic:format=x", "format=W"),
        ("arithmetic:overlong=10", "overlong=L_MAX/L_CACHE"),
        ("arithmetic:bogus=1", "format=W"),
        ("arithmetic:format=1,format=2", "format=W"),
        ("arithmetic:overlong=4/10", "L_cache ≤ L_max"),
        ("arithmetic:format=nan", "finite"),
    ],
)
def test_reward_spec_errors(spec, match):
    with pytest.raises(UserError, match=re.escape(match)):
        build_reward(spec)


def test_reward_errors_and_weighted_sum():
    r = build_reward("arithmetic")
    with pytest.raises(RewardError, match="no answer to score against"):
        r(["#### 4"], ["What is two plus two"], [{"question": "What is two plus two", "answer": None}])
    with pytest.raises(RewardError, match="text completions"):
        r(torch.zeros(1, 3, 4, 4), ["1+1=?"], [{}])
    free = r(["#### 4"], ["x"], [{"question": "What is two plus two", "answer": 4, "steps": None}])
    assert free.scores.tolist() == [1.0] and free.details[0]["first_wrong_span"] is None
    both = build_reward("0.5*arithmetic+0.5*arithmetic:format=1")
    out = both([GOOD, "#### 1"], ["12+7*3=?"] * 2, [{}] * 2)
    assert out.scores.tolist() == [1.5, 0.5]
    assert out.details[1]["arithmetic/correct"] is False
    # the task's step metrics find the prefixed keys
    m = A.ArithmeticTask().step_metrics(out.details)
    assert m == {A.ACCURACY: 0.5, A.FORMAT_RATE: 1.0, A.LENGTH_MEAN: (23 + 6) / 2}


# ---------------------------------------------------------------------------- step lift


def _rollout(tok, texts: list[str], eos: list[bool]) -> Rollout:
    rows = [
        tok(t, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if e else [])
        for t, e in zip(texts, eos)
    ]
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), tok.pad_token_id)
    mask = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    prompts = [PromptRecord("2+3*4=?", meta=A.ArithmeticTask().parse("2+3*4=?").meta) for _ in rows]
    step = torch.arange(width).expand(len(rows), -1)
    return Rollout(tokens, mask, step, {}, prompts, group_size=len(rows))


def test_step_lift_by_hand(tok):
    texts = [
        "3*4=12\n2+12=15\n#### 15",  # 22 chars + EOS = 23 tokens; wrong step "2+12=15" = tokens 7..13
        "3*4=12\n2+12=14\n#### 14",  # correct: left out
        "3*4=12\n",  # no answer line: the wrong decision is the EOS (token 7 of 8)
        "3*4=12\n2+",  # truncated (no EOS), no answer line: the empty span has no token → left out
    ]
    ro = _rollout(tok, texts, eos=[True, True, True, False])
    reward = build_reward("arithmetic")
    details = reward(texts, ro.texts, [p.meta for p in ro.prompts]).details
    assert [d["first_wrong_span"] for d in details] == [(7, 14), None, (7, 7), (7, 9)]
    steps = A.first_wrong_step_mask(tok, ro, details)
    assert steps[0].nonzero().flatten().tolist() == list(range(7, 14))
    assert not steps[1].any() and steps[2].nonzero().flatten().tolist() == [7]
    assert steps[3].nonzero().flatten().tolist() == [7, 8]  # "2+" is the first wrong step there

    task = A.ArithmeticTask(tokenizer=tok)
    uniform = ro.mask.clone()
    lifts = A.step_lift(uniform, ro, details, tok)
    assert np.isnan(lifts[1]) and lifts[[0, 2, 3]].tolist() == [1.0, 1.0, 1.0]  # exactly 1
    assert task.credit_metrics(uniform, ro, details) == {A.STEP_LIFT: 1.0, A.STEP_LIFT_N: 3.0}

    w = ro.mask.clone()
    w[0, 7:14] = 3.0  # row 0: credit share 21/37 over token share 7/23
    w[2, 7] = 2.0  # row 2: credit share 2/9 over token share 1/8
    w[3, :] = 0.0
    w[3, 0] = 1.0  # row 3: no credit on its step → lift 0
    lifts = A.step_lift(w, ro, details, tok)
    assert lifts[0] == pytest.approx(69 / 37) and lifts[2] == pytest.approx(16 / 9) and lifts[3] == 0.0
    got = task.credit_metrics(w, ro, details)
    assert got[A.STEP_LIFT] == pytest.approx((69 / 37 + 16 / 9 + 0.0) / 3)  # mean of per-sample ratios
    assert got[A.STEP_LIFT] > 1.0

    # ids from another tokenizer than the one the completion was decoded with: left out, not guessed
    details[0] = {**details[0], "completion": "something else"}
    assert np.isnan(A.step_lift(w, ro, details, tok)[0])


def test_token_offsets_when_pieces_do_not_concatenate():
    """A byte-level BPE splits "→" over bytes, which decode alone to U+FFFD: the prefix path applies."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        ["3*4=12\n2+12=14\n#### 14"] * 20, vocab_size=300, min_frequency=2, special_tokens=["<eos>"]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<eos>")
    text = "3*4=12 → 2+12=15\n#### 15"
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    pieces = tok.batch_decode([[t] for t in ids], skip_special_tokens=True)
    assert "".join(pieces) != text  # the fast path does not hold
    decoded, offsets = A.token_offsets(tok, ids)
    assert decoded == text and offsets[-1] == (len(text), len(text))  # EOS: empty at the end
    assert [s for s, _ in offsets[1:]] == [e for _, e in offsets[:-1]]  # contiguous
    assert offsets[0][0] == 0 and offsets[-2][1] == len(text)
    arrow = text.index("→")
    covering = [k for k, (s, e) in enumerate(offsets) if s <= arrow < e]
    assert len(covering) == 1  # the byte that completes "→" carries it; the earlier byte(s) are empty
    assert any(s == e for s, e in offsets[:-1])
    # the tokens whose pieces decode cleanly get exactly their piece
    for p, (s, e) in zip(pieces[:-1], offsets[:-1]):
        if "\ufffd" not in p:
            assert text[s:e] == p


# ---------------------------------------------------------------------------- heatmap


def _colour_luminance(hex_colour: str) -> float:
    r, g, b = (int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_text_heatmap_html(tok):
    tokens = ["<b>", "&", "1", "\n", "#", "x"]
    conc = [0.0, 0.5, 1.0, 2.0, 3.0, 4.0]
    samples = [
        TextSample(
            tokens,
            {"uniform": [1.0] * 6, "gcpo": conc},
            prompt="Q: <i>2+2</i>?",
            reward=0.0,
            advantage=-1.25,
            highlight=[2, 3],
        ),
        TextSample(["a", "b"], {"gcpo": torch.tensor([1.0, float("nan")])}, prompt="p", reward=1.0),
    ]
    html = text_heatmap_html(samples, title="credit <test>")
    body = html.split("<body>", 1)[1]
    assert "&lt;b&gt;" in body and "<b>" not in body and "&amp;" in body
    assert "Q: &lt;i&gt;2+2&lt;/i&gt;?" in body and "credit &lt;test&gt;" in html
    assert "↵" in body and "reward 0.000" in body and "advantage -1.250" in body
    spans = re.findall(
        r'<span class="(tok(?: wrong)?)" title="t=(\d+) w=([^"]+)" style="background:(#[0-9a-f]{6})', body
    )
    assert len(spans) == 6 * 2 + 2  # tokens × schemes, sample 1 has one scheme (the other: "not given")
    assert sum(c == "tok wrong" for c, *_ in spans) == 2 * 2
    assert body.count("not given") == 1
    gcpo = spans[6:12]  # sample 0, second column
    assert [float(w) for _, _, w, _ in gcpo] == conc
    lum = [_colour_luminance(c) for *_, c in gcpo]
    assert all(a > b for a, b in zip(lum, lum[1:]))  # darker as the weight grows
    assert len({c for *_, c in spans[:6]}) == 1  # uniform: one colour
    assert spans[-1][3] == "#d9d9d9"  # NaN: grey
    assert "http" not in html and "<link" not in html  # self-contained
    with pytest.raises(UserError, match="2 tokens but 3 weights"):
        text_heatmap_html([TextSample(["a", "b"], {"u": [1, 1, 1]})])
    with pytest.raises(UserError, match="highlight"):
        text_heatmap_html([TextSample(["a"], {"u": [1]}, highlight=[4])])


def test_heatmap_samples_of_a_rollout(tok, tmp_path):
    from t2i_gcpo.viz.text_heatmap import write_text_heatmap

    texts = ["3*4=12\n2+12=15\n#### 15", "3*4=12\n2+12=14\n#### 14"]
    ro = _rollout(tok, texts, eos=[True, True])
    out = build_reward("arithmetic")(texts, ro.texts, [p.meta for p in ro.prompts])
    w = {"uniform": ro.mask.clone(), "gcpo": ro.mask * torch.linspace(0, 2, ro.tokens.shape[1])}
    samples = A.heatmap_samples(tok, ro, w, out.details, out.scores, torch.tensor([-1.0, 1.0]))
    assert samples[0].tokens == list(texts[0]) + ["<eos>"]
    assert list(samples[0].highlight) == list(range(7, 14)) and list(samples[1].highlight) == []
    assert samples[0].reward == 0.0 and samples[1].advantage == 1.0
    assert samples[0].notes == ["answer 15 (target 14)"]
    page = write_text_heatmap(tmp_path / "h.html", samples).read_text()
    assert len(re.findall(r'<span class="tok wrong"', page)) == 7 * 2


# ---------------------------------------------------------------------------- evaluate


@pytest.fixture(scope="module")
def tiny_policy(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    from t2i_gcpo.policies.text import TextPolicy

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return TextPolicy(model, tok, max_new_tokens=12)


def test_evaluate_on_a_tiny_random_lm(tiny_policy, monkeypatch):
    task = get_task("arithmetic")
    prompts = task.load_prompts(task.default_eval_prompts())[:5]
    reward = build_reward("arithmetic:format=0.1")
    sampling = SamplingParams(max_new_tokens=12)
    contexts = []  # teacher-forced passes: evaluation reads only the completions, so none
    real = type(tiny_policy).logprobs_and_dists  # every teacher-forced pass goes through it
    monkeypatch.setattr(
        type(tiny_policy),
        "logprobs_and_dists",
        lambda self, ro, context="pos": contexts.append(context) or real(self, ro, context),
    )
    res = task.evaluate(tiny_policy, reward, prompts, 3, sampling, seed=7, prompts_per_batch=2)
    assert contexts == []
    monkeypatch.undo()
    assert {
        "accuracy",
        "pass_at_k",
        "k",
        "format_rate",
        "length",
        "samples",
        "prompts",
        "metrics",
        "headline",
    } <= set(res)
    assert set(res["metrics"]) == {
        A.EVAL_ACCURACY,
        A.EVAL_PASS_K,
        A.EVAL_FORMAT_RATE,
        A.EVAL_LENGTH_MEAN,
        "eval/accuracy_se",
    }
    assert (res["samples"], res["prompts"], res["k"]) == (15, 5, 3)
    assert 0.0 <= res["accuracy"] <= res["pass_at_k"] <= 1.0
    assert res["headline"].startswith("held-out accuracy")
    assert task.tokenizer is tiny_policy.tokenizer  # learned from the policy for step lift
    # the same numbers from an independent sample → decode → score with the same seeding
    ro, texts = sample_and_decode(tiny_policy, prompts, 3, sampling, group_generators(7, "eval", range(5)))
    d = reward(texts, ro.texts, [p.meta for p in ro.prompts]).details
    assert res["accuracy"] == pytest.approx(np.mean([x["correct"] for x in d]))
    assert res["length"] == pytest.approx(np.mean([len(t) for t in texts]))
    assert 0 < res["length"] <= 12
    # a prompt's samples do not depend on the batch size
    again = task.evaluate(tiny_policy, reward, prompts, 3, sampling, seed=7, prompts_per_batch=5)
    assert again["metrics"] == res["metrics"]
    # uniform credit on these samples: every defined step lift is exactly 1
    lifts = A.step_lift(ro.mask, ro, d, task.tokenizer)
    defined = lifts[~np.isnan(lifts)]
    assert defined.size > 0 and np.all(defined == 1.0)


def test_summarize_pass_at_k_by_hand():
    rows = [(0, 1.0, 1.0, 10.0), (0, 0.0, 1.0, 20.0), (1, 0.0, 0.0, 30.0), (1, 0.0, math.nan, 40.0)]
    res = A.summarize(rows, 2)
    assert (res["accuracy"], res["pass_at_k"], res["format_rate"], res["length"]) == (0.25, 0.5, 2 / 3, 25.0)


def test_evaluate_split_across_processes_gives_the_single_process_rows(tiny_policy, monkeypatch):
    """The shared held-out loop (tasks/loop.py): each rank scores every world-th prompt from its own
    generator, so the ranks' rows together are the rows of one process."""
    import accelerate.utils

    from t2i_gcpo.tasks.loop import held_out_rows

    task = get_task("arithmetic")
    prompts = task.load_prompts(task.default_eval_prompts())[:5]
    reward = build_reward("arithmetic:format=0.1")
    sampling = SamplingParams(max_new_tokens=12, score_negative=False)

    def rows_of(chunk, scored):
        n = len(scored.rollout.prompts) // len(chunk)
        return [(chunk[b // n], text) for b, text in enumerate(scored.outputs)]

    one = held_out_rows(tiny_policy, reward, prompts, 2, sampling, 7, rows_of, prompts_per_batch=2)
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda rows: rows)  # each rank's own rows
    ranks = [
        held_out_rows(
            tiny_policy,
            reward,
            prompts,
            2,
            sampling,
            7,
            rows_of,
            accelerator=SimpleNamespace(process_index=r, num_processes=2),
            prompts_per_batch=1,
        )
        for r in (0, 1)
    ]
    assert {i for i, _ in ranks[0]} == {0, 2, 4} and {i for i, _ in ranks[1]} == {1, 3}
    assert sorted(ranks[0] + ranks[1]) == sorted(one) and len(one) == 10
    assert not tiny_policy.training  # the eval mode it came in with is restored
