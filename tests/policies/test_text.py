"""TextPolicy on tiny random causal LMs (tests/tiny_models.py), offline.

What is checked: contexts are built exactly as docs/concepts/credit.md#gcpo says (token ids of pos / empty /
wrong_answer / template / per-prompt negatives, with and without a chat template); the KV-cache sampler's
rollout (shapes, EOS and padding, the length limit) and its recorded pos / neg / guided log-probs equal the
teacher-forced `logprobs`; a padded variable-length batch scores as its rows one by one; a sample
depends on its own generator only; greedy sampling equals transformers' `generate`; dists, gradient,
features, decode, gradient checkpointing and save → reload.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import Policy, PromptRecord, Rollout, SamplingParams
from t2i_gcpo.policies.sampling import ChunkedDists
from t2i_gcpo.policies.text import WRONG_ANSWER_INSTRUCTION, TextPolicy

from tiny_models import TEXT_SPECIAL_TOKENS as SPECIAL_TOKENS
from tiny_models import build_tiny_text_lm


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices: one thread is fastest (6 s against 53 s with two on a loaded 2-core machine);
    restored afterwards, since the setting is process-wide."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


PROMPTS = ["What is 12+7*3 ?", "Solve 4*5"]  # different lengths → left padding
SAMPLING = SamplingParams(temperature=0.8, top_k=20, top_p=0.95, max_new_tokens=12)
TOL = 1e-5


def gens(seed: int, n: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(100 * seed + i) for i in range(n)]


def roll(policy, texts, group_size=3, seed=0, sampling=SAMPLING, negatives=None):
    negatives = negatives or [None] * len(texts)
    records = [PromptRecord(t, negative=n) for t, n in zip(texts, negatives)]
    return policy.rollout(records, group_size, sampling, gens(seed, len(texts)))


def ids_of(policy, words: str) -> list[int]:
    return policy.tokenizer.convert_tokens_to_ids(words.split())


def trimmed(ro: Rollout, i: int) -> Rollout:
    """Row i alone, cut to its own length (what scoring it one by one sees)."""
    one = ro.select([i])
    n = int(one.mask.sum())
    cut = {k: v[:, :n] for k, v in one.logp.items()}
    return dataclasses.replace(
        one, tokens=one.tokens[:, :n], mask=one.mask[:, :n], step=one.step[:, :n], logp=cut
    )


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    return {
        "chat": build_tiny_text_lm(root / "chat", chat_template=True),
        "raw": build_tiny_text_lm(root / "raw", chat_template=False),
        "qwen2": build_tiny_text_lm(root / "qwen2", chat_template=True, arch="qwen2"),
        "gpt2": build_tiny_text_lm(root / "gpt2", chat_template=False, arch="gpt2"),
    }


@pytest.fixture(scope="module")
def chat(dirs):
    return TextPolicy.from_pretrained(dirs["chat"])


@pytest.fixture(scope="module")
def raw(dirs):
    return TextPolicy.from_pretrained(dirs["raw"])


def with_stops(path) -> TextPolicy:
    """Three tokens end a row, so completions of many lengths occur within 12 tokens."""
    pol = TextPolicy.from_pretrained(path)
    return TextPolicy(
        pol.model, pol.tokenizer, eos_token_ids=[pol.tokenizer.eos_token_id, *ids_of(pol, "+ 7 =")]
    )


@pytest.fixture(scope="module")
def stopper(dirs):
    return with_stops(dirs["chat"])


@pytest.fixture(scope="module")
def rollout(stopper):
    return roll(stopper, PROMPTS, 4, seed=0)


# ----------------------------------------------------------------------------- contexts
def test_positive_context_with_and_without_chat_template(chat, raw):
    bos, user, asst = ids_of(chat, "<bos> <|user|> <|assistant|>")
    q = ids_of(chat, "What is 1 2 + 7 * 3 ?")
    assert chat.context_ids(PROMPTS[0]) == [bos, user, *q, asst]  # one BOS: the template's
    want = chat.tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPTS[0]}], add_generation_prompt=True
    )
    assert chat.context_ids(PROMPTS[0]) == list(getattr(want, "input_ids", want))
    assert raw.chat_template is None
    assert raw.context_ids(PROMPTS[0]) == [bos, *q]  # BOS as the tokenizer adds it


@pytest.mark.parametrize("which", ["chat", "raw"])
def test_negative_contexts_token_ids(chat, raw, which):
    pol = {"chat": chat, "raw": raw}[which]
    bos, user, asst = ids_of(pol, "<bos> <|user|> <|assistant|>")
    wrap = (lambda x: [bos, user, *x, asst]) if which == "chat" else (lambda x: [bos, *x])
    q = ids_of(pol, "What is 1 2 + 7 * 3 ?")
    note = ids_of(pol, "Note : Intentionally generate an incorrect answer .")
    rec = PromptRecord(PROMPTS[0])
    template = "Question : {question} Wrong"
    cases = {
        "empty": wrap([]),  # the question removed, the template kept; raw: only BOS
        "wrong_answer": wrap(q + note),
        template: wrap(ids_of(pol, "Question :") + q + ids_of(pol, "Wrong")),
    }
    for spec, want in cases.items():
        assert TextPolicy(pol.model, pol.tokenizer, negative=spec).negative_ids(rec) == want, spec
        # PromptRecord.negative overrides the adapter's default, with the same grammar
        assert pol.negative_ids(PromptRecord(PROMPTS[0], negative=spec)) == want, spec
    assert pol.negative == "empty" and pol.negative_ids(rec) == cases["empty"]
    assert pol.negative_user("Q", "wrong_answer") == f"Q\n{WRONG_ANSWER_INSTRUCTION}"
    custom = TextPolicy(
        pol.model, pol.tokenizer, negative="wrong_answer", wrong_answer_instruction="Wrong step"
    )
    assert custom.negative_ids(rec) == wrap(q + ids_of(pol, "Wrong step"))
    # any other per-prompt string is the negative user message itself
    assert pol.negative_ids(PromptRecord(PROMPTS[0], negative="Solve 4")) == wrap(ids_of(pol, "Solve 4"))


def test_rollout_records_each_rows_contexts(chat):
    ro = roll(chat, PROMPTS, 2, negatives=[None, "wrong_answer"])
    assert ro.state["prompt_ids"] == [chat.context_ids(p) for p in PROMPTS for _ in range(2)]
    assert (
        ro.state["negative_ids"]
        == [chat.context_ids("")] * 2 + [chat.context_ids(f"{PROMPTS[1]}\n{WRONG_ANSWER_INSTRUCTION}")] * 2
    )
    with torch.no_grad():  # and the recorded neg scores are under those contexts
        assert (chat.logprobs(ro, "neg") - ro.logp["neg"]).abs().max() < TOL


def test_empty_context_without_bos_is_the_eos_token(dirs):
    base = TextPolicy.from_pretrained(dirs["raw"])
    tok = base.tokenizer
    tok._tokenizer.post_processor = None  # a tokenizer that adds no BOS and has none (GPT-2 style)
    tok.bos_token = None
    pol = TextPolicy(base.model, tok)
    assert pol.context_ids("") == [pol.tokenizer.eos_token_id]
    assert pol.context_ids("Solve 4") == ids_of(pol, "Solve 4")


# ----------------------------------------------------------------------------- rollout
def test_rollout_shapes_eos_and_padding(stopper, rollout):
    assert isinstance(stopper, Policy) and stopper.output == "text" and stopper.layout.kind == "sequence"
    B, T = rollout.tokens.shape
    assert B == 8 and T <= 12 and rollout.max_len == 12 and rollout.group_size == 4
    assert rollout.texts == [PROMPTS[0]] * 4 + [PROMPTS[1]] * 4
    assert torch.equal(rollout.step, torch.arange(T).expand(B, -1))
    assert set(rollout.logp) == {"pos", "neg", "guided"} and all(
        v.shape == (B, T) for v in rollout.logp.values()
    )
    eos = torch.tensor(stopper.eos_ids)
    lengths = rollout.mask.sum(1).long()
    assert lengths.min() < lengths.max() == T, "the fixture gives completions of different lengths"
    for i, n in enumerate(lengths.tolist()):
        row, m = rollout.tokens[i], rollout.mask[i]
        assert torch.equal(m, (torch.arange(T) < n).float()), "valid tokens are a prefix"
        assert not torch.isin(row[: n - 1], eos).any(), "no EOS before the last valid token"
        if n < 12:  # stopped: the EOS itself is the last valid token, padding follows
            assert int(row[n - 1]) in stopper.eos_ids
            assert (row[n:] == stopper.pad_id).all()
        for lp in rollout.logp.values():
            assert (lp[i, n:] == 0).all() and (lp[i, :n] < 0).all()
    assert torch.equal(rollout.logp["guided"], rollout.logp["pos"])  # s = 1: sampled from pos


def test_max_new_tokens_default_and_override(chat):
    short = TextPolicy(chat.model, chat.tokenizer, max_new_tokens=3)
    ro = roll(short, PROMPTS, 2, sampling=SamplingParams())
    assert ro.max_len == 3 and ro.tokens.shape[1] <= 3
    assert short.default_sampling().max_new_tokens == 3
    assert roll(short, PROMPTS, 2, sampling=SamplingParams(max_new_tokens=5)).max_len == 5


def test_a_sample_depends_on_its_own_generator_only(stopper, rollout):
    again = roll(stopper, PROMPTS, 4, seed=0)
    assert torch.equal(again.tokens, rollout.tokens) and torch.equal(again.logp["pos"], rollout.logp["pos"])
    assert not torch.equal(roll(stopper, PROMPTS, 4, seed=1).tokens, rollout.tokens)
    # prompt 1 alone (its generator seeded as roll(seed=0) seeds it), and prompt 0 next to another prompt
    alone = stopper.rollout([PromptRecord(PROMPTS[1])], 4, SAMPLING, [torch.Generator().manual_seed(1)])
    n = alone.tokens.shape[1]
    assert torch.equal(alone.tokens, rollout.tokens[4:, :n]) and (rollout.mask[4:, n:] == 0).all()
    assert (alone.logp["pos"] - rollout.logp["pos"][4:, :n]).abs().max() < TOL
    mates = stopper.rollout(
        [PromptRecord(PROMPTS[0]), PromptRecord("Solve 1+1")], 4, SAMPLING, [gens(0, 1)[0], torch.Generator()]
    )
    m = min(mates.tokens.shape[1], rollout.tokens.shape[1])
    assert torch.equal(mates.tokens[:4, :m], rollout.tokens[:4, :m])
    assert torch.equal(mates.mask[:4].sum(1), rollout.mask[:4].sum(1))
    stopper.max_rollout_batch = 3  # chunked sampling: the same rows
    try:
        assert torch.equal(roll(stopper, PROMPTS, 4, seed=0).tokens, rollout.tokens)
    finally:
        stopper.max_rollout_batch = None


def test_greedy_sampling_equals_transformers_generate(chat):
    ro = roll(chat, PROMPTS[:1], 1, sampling=SamplingParams(top_k=1, max_new_tokens=10))
    ids = torch.tensor([chat.context_ids(PROMPTS[0])])
    out = chat.model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=10,
        eos_token_id=chat.eos_ids,
        pad_token_id=chat.pad_id,
    )[:, ids.shape[1] :]
    assert torch.equal(ro.tokens, out)


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_fused_llama_loop_equals_transformers_loop(dirs, guidance):
    """A plain Llama samples through our fused loop by default; with left padding, EOS stops and
    guidance (the doubled batch) it draws the same tokens and records the same log-probs as the loop
    through transformers' layers and StaticCache."""
    from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder

    base = with_stops(dirs["chat"])
    ours = TextPolicy(base.model, base.tokenizer, eos_token_ids=base.eos_ids)
    theirs = TextPolicy(base.model, base.tokenizer, eos_token_ids=base.eos_ids, fused_sampler=False)
    assert isinstance(ours.new_cache(2, 8), FusedLlamaDecoder)
    assert not isinstance(theirs.new_cache(2, 8), FusedLlamaDecoder)
    s = dataclasses.replace(SAMPLING, guidance_scale=guidance)
    a, b = roll(ours, PROMPTS, 4, seed=3, sampling=s), roll(theirs, PROMPTS, 4, seed=3, sampling=s)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask)
    assert 0 < a.mask.sum() < a.mask.numel()  # some rows stopped early: padding after EOS is exercised
    for ctx in ("pos", "neg", "guided"):
        assert (a.logp[ctx] - b.logp[ctx]).abs().max() < TOL, ctx


# ----------------------------------------------------------------------------- log-probs
@pytest.mark.parametrize("arch", ["chat", "raw", "qwen2", "gpt2"])
def test_recorded_logprobs_equal_teacher_forced(dirs, arch):
    pol = TextPolicy.from_pretrained(dirs[arch], negative="wrong_answer")
    ro = roll(pol, PROMPTS, 3)
    with torch.no_grad():
        for ctx in ("pos", "neg", "guided"):
            lp, dists = pol.logprobs_and_dists(ro, ctx)
            assert (lp - ro.logp[ctx]).abs().max() < TOL, ctx
            assert torch.equal(pol(ro, ctx), lp)  # forward = logprobs
    assert (ro.logp["pos"] - ro.logp["neg"]).abs().max() > 0.05, "the two contexts really differ"


def test_without_score_negative_the_neg_pass_is_skipped_and_scored_on_demand(chat, monkeypatch):
    from t2i_gcpo.config import CreditConfig
    from t2i_gcpo.train.credit import compute_weights

    full = roll(chat, PROMPTS, 3)
    scored = []
    real = TextPolicy.logprobs_and_dists  # every teacher-forced pass (logprobs and forward) goes through it

    def counted(self, ro, context="pos"):
        scored.append(context)
        return real(self, ro, context)

    monkeypatch.setattr(TextPolicy, "logprobs_and_dists", counted)
    lean = roll(chat, PROMPTS, 3, sampling=dataclasses.replace(SAMPLING, score_negative=False))
    assert scored == [] and set(lean.logp) == {"pos", "guided"}  # no teacher-forced pass at all
    assert torch.equal(lean.tokens, full.tokens) and torch.equal(lean.mask, full.mask)
    for ctx in ("pos", "guided"):
        assert torch.equal(lean.logp[ctx], full.logp[ctx])
    # a contrast scheme given such a rollout scores c⁻ itself: the same weights as from the recorded one
    adv = torch.linspace(-1, 1, len(full))
    cfg = CreditConfig(scheme="gcpo")
    w_full = compute_weights(cfg, full, adv, chat, None, "pos")
    w_lean = compute_weights(cfg, lean, adv, chat, None, "pos")
    assert scored == ["neg"] and torch.allclose(w_lean, w_full, atol=1e-5)
    assert not torch.allclose(w_full, torch.ones_like(w_full) * full.mask)  # gcpo weights, not uniform
    # guided sampling samples from c⁻, so it records neg whatever the flag says
    guided = dataclasses.replace(SAMPLING, guidance_scale=3.0, score_negative=False)
    assert "neg" in roll(chat, PROMPTS, 2, sampling=guided).logp


def test_guided_sampling_records_all_three_contexts(chat):
    s = dataclasses.replace(SAMPLING, guidance_scale=3.0)
    ro = roll(chat, PROMPTS, 2, sampling=s, negatives=[None, "wrong_answer"])
    assert not torch.equal(ro.logp["guided"], ro.logp["pos"])
    with torch.no_grad():
        for ctx in ("pos", "neg", "guided"):  # neg here comes from the second half of the KV cache
            assert (chat.logprobs(ro, ctx) - ro.logp[ctx]).abs().max() < 1e-4, ctx
        z = {c: chat.logprobs_and_dists(ro, c)[1].full() for c in ("pos", "neg", "guided")}
    assert torch.allclose(z["guided"], z["neg"] + 3.0 * (z["pos"] - z["neg"]), atol=1e-4)


def test_teacher_forced_logits_equal_the_models_own(chat, rollout):
    row = trimmed(rollout, 0)
    seq = torch.tensor([row.state["prompt_ids"][0] + row.tokens[0, :-1].tolist()])
    with torch.no_grad():
        want = chat.model(seq).logits[0, len(row.state["prompt_ids"][0]) - 1 :] / SAMPLING.temperature
        got = chat.logprobs_and_dists(row, "pos")[1].full()[0]
    assert (got - want).abs().max() < TOL


@pytest.mark.parametrize("arch", ["chat", "gpt2"])  # gpt2: learned absolute positions
def test_variable_length_batch_equals_one_by_one(dirs, arch):
    pol = with_stops(dirs[arch])
    ro = roll(pol, PROMPTS, 4)
    assert len({len(r) for r in ro.state["prompt_ids"]}) == 2, "prompts of different lengths"
    assert ro.mask.sum(1).unique().numel() > 1, "completions of different lengths"
    with torch.no_grad():
        batch = {c: pol.logprobs(ro, c) for c in ("pos", "neg")}
        for i in range(len(ro)):
            one = trimmed(ro, i)
            n = one.tokens.shape[1]
            for c in ("pos", "neg"):
                assert (pol.logprobs(one, c)[0] - batch[c][i, :n]).abs().max() < TOL, (i, c)
                assert (one.logp[c] - batch[c][i, :n]).abs().max() < TOL, (i, c)


def test_dists_shapes_and_normalisation(stopper, rollout):
    with torch.no_grad():
        lp, dists = stopper.logprobs_and_dists(rollout, "pos")
    assert isinstance(dists, ChunkedDists)
    z = dists.full()
    assert z.shape == (*rollout.tokens.shape, stopper.vocab_size) and not z.requires_grad
    assert torch.allclose(z.log_softmax(-1).exp().sum(-1), torch.ones(rollout.tokens.shape), atol=1e-5)
    at_token = z.log_softmax(-1).gather(-1, rollout.tokens[..., None]).squeeze(-1)
    assert torch.allclose(at_token * rollout.mask, lp, atol=1e-6)
    rank = (z > z.gather(-1, rollout.tokens[..., None])).sum(-1)  # top-k shaped what was sampled
    assert rank[rollout.mask > 0].max() < SAMPLING.top_k
    assert sum(1 for _ in dists) >= 1


def test_gradient_reaches_the_weights(stopper, rollout):
    stopper.zero_grad(set_to_none=True)
    (stopper.logprobs(rollout, "pos") * rollout.mask).sum().backward()
    for name in ("lm_head.weight", "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"):
        g = dict(stopper.model.named_parameters())[name].grad
        assert g is not None and g.abs().sum() > 0, name
    stopper.zero_grad(set_to_none=True)


def test_gradient_checkpointing(dirs):
    plain = TextPolicy.from_pretrained(dirs["chat"])
    ckpt = TextPolicy.from_pretrained(dirs["chat"], gradient_checkpointing=True).train()
    ro = roll(ckpt, PROMPTS, 2)  # the sampler switches to eval mode (the KV cache is used) …
    assert ckpt.training and ckpt.model.is_gradient_checkpointing
    assert torch.equal(ro.tokens, roll(plain, PROMPTS, 2).tokens)
    loss = ckpt.logprobs(ro, "pos").sum()  # … and back: a checkpointed forward with gradient
    loss.backward()
    plain.logprobs(ro, "pos").sum().backward()
    for (n, a), b in zip(ckpt.model.named_parameters(), plain.model.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-5), n


def test_dropout_is_disabled_unless_asked(dirs):
    ro = roll(TextPolicy.from_pretrained(dirs["gpt2"]), PROMPTS, 2)  # GPT-2 carries dropout 0.1
    for keep, same in ((False, True), (True, False)):
        pol = TextPolicy.from_pretrained(dirs["gpt2"], disable_dropout=not keep).train()
        with torch.no_grad():
            a, b = pol.logprobs(ro, "pos"), pol.logprobs(ro, "pos")
        assert torch.equal(a, b) is same
        if same:
            assert (a - ro.logp["pos"]).abs().max() < TOL
    assert not TextPolicy(pol.model.eval(), pol.tokenizer).training  # the wrapper follows the model


# ----------------------------------------------------------------------------- outputs
def test_decode_and_token_features(stopper, rollout):
    texts = stopper.decode(rollout)
    assert len(texts) == len(rollout)
    for i, text in enumerate(texts):
        n = int(rollout.mask[i].sum())
        words = [
            w
            for w in stopper.tokenizer.convert_ids_to_tokens(rollout.tokens[i, :n].tolist())
            if w not in SPECIAL_TOKENS
        ]
        assert text.split() == words
    feats = stopper.token_features(rollout)
    assert feats.shape == (*rollout.tokens.shape, 32) and (feats[rollout.mask == 0] == 0).all()
    one = trimmed(rollout, 5)
    seq = torch.tensor([one.state["prompt_ids"][0] + one.tokens[0].tolist()])
    with torch.no_grad():
        want = stopper.model.base_model(seq).last_hidden_state[0, -one.tokens.shape[1] :]
    assert (feats[5, : one.tokens.shape[1]] - want).abs().max() < TOL
    emb = TextPolicy(stopper.model, stopper.tokenizer, features="embedding").token_features(rollout)
    assert torch.equal(emb[0, 0], stopper.model.get_input_embeddings().weight[rollout.tokens[0, 0]])


def test_save_and_reload(chat, rollout, tmp_path):
    chat.save_pretrained(tmp_path / "saved")
    back = TextPolicy.from_pretrained(tmp_path / "saved")
    assert back.chat_template == chat.chat_template
    assert back.context_ids(PROMPTS[0]) == chat.context_ids(PROMPTS[0])
    assert back.eos_ids == chat.eos_ids and back.pad_id == chat.pad_id
    with torch.no_grad():
        assert torch.equal(back.logprobs(rollout, "pos"), chat.logprobs(rollout, "pos"))
    half = TextPolicy.from_pretrained(tmp_path / "saved", dtype="bfloat16")
    assert half.model.dtype == torch.bfloat16
    assert roll(half, PROMPTS, 2).logp["pos"].dtype == torch.float32  # logits in float32


# ----------------------------------------------------------------------------- errors
def test_user_errors(chat, tmp_path):
    with pytest.raises(UserError, match="not a directory"):
        TextPolicy.from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.json"):
        TextPolicy.from_pretrained(tmp_path / "empty")
    with pytest.raises(UserError, match="negative context"):
        TextPolicy(chat.model, chat.tokenizer, negative="wrong-answer")
    with pytest.raises(UserError, match="literal braces"):
        TextPolicy(chat.model, chat.tokenizer, negative="{question} {x}")
    with pytest.raises(UserError, match="dtype"):
        TextPolicy.from_pretrained(tmp_path / "empty", dtype="fp8")
    with pytest.raises(UserError, match="temperature"):
        roll(chat, PROMPTS, 1, sampling=SamplingParams(temperature=0.0))
    with pytest.raises(UserError, match="cannot express banana"):
        chat.check_prompts(["What is banana ?"])
    with pytest.raises(ValueError, match="one generator per prompt"):
        chat.rollout([PromptRecord("Solve 1")], 1, SAMPLING, [])
