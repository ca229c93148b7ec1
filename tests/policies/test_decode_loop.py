"""The static-shape decode loop (t2i_gcpo/policies/decode_loop.py) against each family's eager loop, on
the CPU: for fixed seeds the same tokens, masks and recorded log-probs (float32, to float rounding); its
capture bookkeeping (one capture per span of the cache, each after one real step, then replays) with a
stand-in for the CUDA graph; a sample still depends on its own prompt only; the modes resolve as the
config documents. What only CUDA runs — `torch.cuda.graph` itself — is checked by benchmarks/gpu_check.py.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.policies import decode_loop
from t2i_gcpo.policies.base import PromptRecord, SamplingParams
from t2i_gcpo.policies.decode_loop import StaticDecodeLoop, resolve_mode
from t2i_gcpo.policies.registry import load_policy
from t2i_gcpo.tasks.loop import group_generators

from tiny_models import build_tiny_janus, build_tiny_janus_tokenizer, make_janus, tiny_policy_dir

SHAPES = ["a photo of a red circle", "a photo of two blue squares"]
JANUS = ["a red circle", "two blue squares left of a green cat"]  # different lengths: left padding
SUMS = ["4*14*10=?", "16*7+12*12=?"]
SAMPLINGS = {
    "cfg": SamplingParams(guidance_scale=3.0),
    "truncated": SamplingParams(guidance_scale=5.0, temperature=0.8, top_k=20, top_p=0.9),
}


@pytest.fixture(scope="module")
def prior(tmp_path_factory):
    return load_policy(str(tiny_policy_dir(tmp_path_factory.mktemp("prior")))).eval()  # 4×4 tokens


@pytest.fixture(scope="module")
def janus(tmp_path_factory):
    from t2i_gcpo.policies.janus import JanusPolicy

    return JanusPolicy.from_pretrained(build_tiny_janus(tmp_path_factory.mktemp("janus") / "ckpt", grid=8))


@pytest.fixture(scope="module")
def text():
    return load_policy("arithmetic").eval()


def roll(policy, texts, group, sampling, mode, seed=0):
    records = [PromptRecord(t) for t in texts]
    return policy.rollout(
        records,
        group,
        dataclasses.replace(sampling, decode=mode),
        group_generators(seed, "test", range(len(texts))),
    )


def assert_same(a, b, atol=1e-4):
    assert a.tokens.shape == b.tokens.shape
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(a.mask, b.mask)
    assert sorted(a.logp) == sorted(b.logp)
    for c in a.logp:
        torch.testing.assert_close(a.logp[c], b.logp[c], atol=atol, rtol=0, msg=c)


# --------------------------------------------------------------------------- the static step = the eager loop


@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_ar_prior_static_equals_eager(prior, name):
    eager = roll(prior, SHAPES, 2, SAMPLINGS[name], "eager")
    static = roll(prior, SHAPES, 2, SAMPLINGS[name], "static")
    assert prior.last_decode["mode"] == "static" and prior.last_decode["steps"] == prior.num_tokens - 1
    assert_same(eager, static)


@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_janus_static_equals_eager_and_transformers_loop(janus, name):
    """Left-padded prompts: the static step's key mask hides the padding slots as the eager loop's does;
    both equal transformers' layers and StaticCache (the loop Janus samples through without the fused
    decoder: LoRA, other language models)."""
    static = roll(janus, JANUS, 3, SAMPLINGS[name], "static")
    eager = roll(janus, JANUS, 3, SAMPLINGS[name], "eager")
    assert_same(eager, static)
    janus.fused_sampler = False
    try:
        assert not janus.samples_fused and not janus.capabilities.bf16_sampling
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            theirs = roll(janus, JANUS, 3, SAMPLINGS[name], "static")  # unsupported: the eager loop
        assert any("eager loop" in str(w.message) for w in caught)
    finally:
        janus.fused_sampler = True
    assert janus.samples_fused and janus.capabilities.bf16_sampling
    assert_same(theirs, static)


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(),
        SamplingParams(guidance_scale=2.0, top_k=5, temperature=0.9),
        SamplingParams(top_p=0.8),
    ],
    ids=["plain", "guided", "top_p"],
)
def test_text_static_equals_eager(text, sampling):
    """Rows stop at their EOS: after it pad, mask 0 and log-prob 0, as the eager loop records them."""
    eager = roll(text, SUMS, 4, sampling, "eager")
    static = roll(text, SUMS, 4, sampling, "static")
    assert_same(eager, static)
    assert (eager.mask == 0).any(), "some completions should end before the longest"


def test_static_step_never_reads_what_the_cache_memory_held_before(text):
    """The static step attends over unfilled cache slots with weight 0: the cache must start as zeros, not
    as recycled memory (0 × NaN = NaN). Found by benchmarks/gpu_check.py's dry run: a Janus built right after
    the text model had sampled drew other tokens in the static loop than in the eager loop. Whether the
    allocator hands that memory back is luck; a cache allocated where a NaN-filled one was freed is not."""
    from t2i_gcpo.policies.janus import JanusPolicy

    roll(text, SUMS, 4, SamplingParams(), "static")  # leaves its buffers to the allocator
    tok = build_tiny_janus_tokenizer()
    policy = JanusPolicy(make_janus(tok, grid=8), tok, chat_template=tok.chat_template).eval()
    assert_same(
        roll(policy, JANUS, 4, SAMPLINGS["cfg"], "eager"), roll(policy, JANUS, 4, SAMPLINGS["cfg"], "static")
    )
    decoder = policy.new_cache(2, 8)
    for kv in decoder.kv:
        kv.fill_(float("nan"))  # what recycled memory may hold
    del decoder
    fresh = policy.new_cache(2, 8)
    assert not any(kv.any() for kv in fresh.kv)


def test_static_sample_depends_on_its_own_prompt_only(prior, janus):
    for policy, texts in ((prior, SHAPES), (janus, JANUS)):
        both = roll(policy, texts, 2, SAMPLINGS["cfg"], "static")
        # the second prompt alone, with the generator of its slot in the pair
        gens = group_generators(0, "test", [1])
        alone = policy.rollout(
            [PromptRecord(texts[1])], 2, dataclasses.replace(SAMPLINGS["cfg"], decode="static"), gens
        )
        assert_same(both.select(range(2, 4)), alone)


# ---------------------------------------------------------------------------- capture bookkeeping


def test_graph_captures_each_span_once_then_replays(prior, monkeypatch):
    """With a stand-in capture on the CPU (the CUDA graph's replay is the step itself) and spans of 4
    slots: each span is captured on its first step, after that step ran for real, and replayed after; the
    samples are the uncaptured loop's."""
    monkeypatch.setattr(decode_loop, "CAPTURE_DEVICES", ("cpu",))
    monkeypatch.setattr(decode_loop, "SPAN", 4)
    captured = []

    def fake_capture(self, step, span):
        captured.append(span)
        step(span)  # the warm-up is a real step
        return lambda: step(span)

    monkeypatch.setattr(StaticDecodeLoop, "capture", fake_capture)
    sampling = SAMPLINGS["truncated"]
    pid = prior.encode_prompts(SHAPES).repeat_interleave(2, dim=0)
    uniforms = torch.rand(4, prior.num_tokens, generator=torch.Generator().manual_seed(3))
    want = prior.generate(pid, dataclasses.replace(sampling, decode="static"), uniforms)
    # `graph` on the CPU is refused by the rollout: drive the adapter's static loop directly
    prior.decode_session = decode_loop.DecodeSession()
    got = prior.decode_static(pid, sampling, uniforms, "graph")
    # the token fed at step t (t = 1 … T − 1) sits at slot P + t − 1: spans are multiples of 4 (P = 14,
    # T = 16: 16, 20, 24, 28, 32 — the cache is the span's multiple above P + T − 1 = 29)
    P, T = prior.prefix_len, prior.num_tokens
    assert (P, T) == (14, 16)
    assert captured == [16, 20, 24, 28, 32]
    stats = prior.last_decode
    assert stats["captures"] == 0  # the stand-in counts nothing as a CUDA capture
    assert stats["replays"] == T - 1 - len(captured)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], atol=2e-5, rtol=0)


def test_text_stops_early_between_checks(text, monkeypatch):
    """Captured, text checks only every STOP_CHECK steps whether every row has ended (each check syncs
    the device): the steps run past the last EOS change nothing that was recorded."""
    sampling = SamplingParams(max_new_tokens=48)
    want = roll(text, SUMS, 2, sampling, "static")
    monkeypatch.setattr(decode_loop, "CAPTURE_DEVICES", ("cpu",))
    monkeypatch.setattr(
        StaticDecodeLoop, "capture", lambda self, step, span: (step(span), lambda: step(span))[1]
    )
    monkeypatch.setattr("t2i_gcpo.policies.text.resolve_mode", lambda *args: "graph")
    got = roll(text, SUMS, 2, sampling, "graph")
    assert text.last_decode["mode"] == "graph"
    last = int(want.mask.sum(1).max())  # the longest completion: every row has ended after it
    assert text.last_decode["steps"] == -(-last // decode_loop.STOP_CHECK) * decode_loop.STOP_CHECK - 1
    assert_same(want, got)


# ---------------------------------------------------------------------------- modes


def test_resolve_mode():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_mode("auto", cpu, True) == "eager"
    assert resolve_mode("auto", cuda, True) == "graph"
    assert resolve_mode("auto", cuda, False) == "eager"
    assert resolve_mode("static", cpu, True) == "static"
    assert resolve_mode("compile", cpu, True) == "compile"
    assert resolve_mode("eager", cuda, True) == "eager"
    with pytest.warns(UserWarning, match="LoRA; sampling with the eager loop"):
        assert resolve_mode("graph", cuda, False, "LoRA") == "eager"
    with pytest.raises(UserError, match="rollout.decode=graph needs a CUDA device"):
        resolve_mode("graph", cpu, True)
    with pytest.raises(UserError, match="rollout.decode must be one of auto, eager, static, graph, compile"):
        resolve_mode("fast", cpu, True)


def test_config_key_reaches_the_sampler():
    from t2i_gcpo.config import load_config
    from t2i_gcpo.train.run_settings import sampling_params

    cfg = load_config(overrides=["rollout.decode=static", "rollout.cfg_scale=3"])
    assert sampling_params(cfg).decode == "static"
    assert load_config().rollout.decode == "auto"
    with pytest.raises(UserError, match="rollout.decode"):
        load_config(overrides=["rollout.decode=fast"])


@pytest.mark.slow
def test_compiled_step_equals_eager_on_cpu(prior):
    """torch.compile of the step (inductor's C++ kernels on the CPU; ≈ 50 s to compile on 1 thread)."""
    eager = roll(prior, SHAPES, 2, SAMPLINGS["cfg"], "eager")
    compiled = roll(prior, SHAPES, 2, SAMPLINGS["cfg"], "compile")
    assert prior.last_decode["mode"] == "compile"
    assert_same(eager, compiled)
