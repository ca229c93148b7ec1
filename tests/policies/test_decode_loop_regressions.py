"""The decode loop's four breakages (issue 51), each checked on the CPU by a test that failed before the fix:

1. a failed CUDA-graph capture changes no sample (a stand-in for torch.cuda's streams and graphs that
   behaves as a capture does: the captured body runs nothing, a replay runs it);
2. branched rollouts run in the rollout's precision for every autoregressive family (Janus
   under bf16 crashed);
3. `rollout.decode=compile` serves a run with one compilation (no recompile for another prompt width or a
   smaller batch);
4. the GPU check's `janus_scale` rows each record their own failure (a Janus `generate` that raises, as
   transformers 5.17's does, used to lose the whole section).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import warnings

import pytest
import torch

from t2i_gcpo.policies.base import PromptRecord, SamplingParams
from t2i_gcpo.policies.branching import continuation_keys
from t2i_gcpo.policies.decode_loop import StaticDecodeLoop
from t2i_gcpo.policies.registry import load_policy
from t2i_gcpo.tasks.loop import group_generators, sampler_precision

from decode_fixtures import CFG, JANUS, SHAPES, SUMS, assert_same, install_fake_cuda, roll
from repo_paths import REPO
from tiny_models import build_tiny_janus, tiny_policy_dir

sys.path.insert(0, str(REPO))  # the repository root holds benchmarks/


@pytest.fixture(scope="module")
def prior(tmp_path_factory):
    return load_policy(str(tiny_policy_dir(tmp_path_factory.mktemp("prior")))).eval()  # 4×4 tokens


@pytest.fixture(scope="module")
def janus(tmp_path_factory):
    from t2i_gcpo.policies.janus import JanusPolicy

    return JanusPolicy.from_pretrained(build_tiny_janus(tmp_path_factory.mktemp("janus") / "ckpt"))


@pytest.fixture(scope="module")
def text():
    return load_policy("arithmetic").eval()


# ---------------------------------------------------------------------------- 1. a failed capture


@pytest.mark.parametrize("fail_at", range(5))
def test_a_failed_capture_changes_no_sample(prior, monkeypatch, fail_at):
    """The AR prior's 15 token steps span 5 blocks of 4 cache slots (16, 20, 24, 28 and 32): the capture of
    each in turn fails. Before the fix, every span after the failed one skipped a token step (the last
    tokens stayed 0 with log-prob 0 under a valid mask), and the capture stream stayed current."""
    want = roll(prior, SHAPES, 2, CFG, "eager")
    fake = install_fake_cuda(monkeypatch, fail_at, prior)
    monkeypatch.setattr("t2i_gcpo.policies.ar.resolve_mode", lambda *args: "graph")
    with pytest.warns(UserWarning, match="capture"):
        got = roll(prior, SHAPES, 2, CFG, "graph")
    assert_same(want, got)
    assert fake.current is fake.default, "the capture stream must not stay current"
    assert fake.captures >= fail_at + 1
    assert prior.last_decode["fallback"]
    from t2i_gcpo.train.collect import decode_fallbacks

    assert decode_fallbacks(prior) == prior.decode_session.stats["fallbacks"] == 1  # rollout/decode_fallback


def test_a_failed_capture_changes_no_sample_janus_and_text(janus, text, monkeypatch):
    """The same for left-padded prompts (Janus) and rows that stop at their EOS (text), the first capture
    failing."""
    fake = install_fake_cuda(monkeypatch, 0, janus, text)
    for policy, texts, sampling, module in (
        (janus, JANUS, CFG, "janus"),
        (text, SUMS, SamplingParams(max_new_tokens=24), "text"),
    ):
        want = roll(policy, texts, 2, sampling, "eager")
        fake.captures = 0  # this policy's first capture fails
        with monkeypatch.context() as m:
            m.setattr(f"t2i_gcpo.policies.{module}.resolve_mode", lambda *args: "graph")
            with pytest.warns(UserWarning, match="capture"):
                got = roll(policy, texts, 2, sampling, "graph")
        assert_same(want, got)
        assert fake.current is fake.default


# ---------------------------------------------------------------------------- 2. branching in bf16


def branch_from_start(policy, texts, sampling, points):
    """A rollout of one sample per prompt under `sampling`'s precision, and its continuations from `points`
    [B, 1] drawn with the rollout's own generators: from point 0 they are the rollout's samples again."""
    gens = lambda: group_generators(0, "test", range(len(texts)))  # noqa: E731
    with torch.no_grad(), sampler_precision(policy, sampling):
        ro = policy.rollout([PromptRecord(t) for t in texts], 1, sampling, gens())
        keys = continuation_keys(list(range(len(texts))), 1, points, 1)
        assert [k[0] for k in keys] == list(range(len(texts)))
        br = policy.branch(ro, points, 1, gens())
    return ro, br.rollout


@pytest.mark.parametrize("family", ["ar", "janus", "text"])
def test_branching_runs_in_the_rollouts_precision(prior, janus, text, family):
    """Under bf16 sampling (rollout.autocast=bf16, the GPU default) a continuation from point 0 with the
    rollout's own generator is the rollout's sample: the same tokens, and log-probs as close as bf16's
    rounding allows — it runs through the same static loop, in the same precision. Before the fix Janus
    raised (transformers' StaticCache under autocast: index_copy_ of bf16 keys into a float32 cache)."""
    policy, texts = {"ar": (prior, SHAPES), "janus": (janus, JANUS), "text": (text, SUMS)}[family]
    sampling = SamplingParams(
        guidance_scale=3.0,
        autocast="bf16",
        decode="static",
        **({"max_new_tokens": 16} if family == "text" else {}),
    )
    runs = []
    real = StaticDecodeLoop.run

    def spy(self, *args, **kwargs):
        runs.append(self.decoder.compute_dtype)
        return real(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(StaticDecodeLoop, "run", spy)
        ro, again = branch_from_start(policy, texts, sampling, torch.zeros(len(texts), 1, dtype=torch.long))
    assert len(runs) >= 2 and set(runs) == {torch.bfloat16}, "rollout and continuations: the bf16 static loop"
    assert torch.equal(ro.tokens, again.tokens)
    for c in ro.logp:
        torch.testing.assert_close(ro.logp[c], again.logp[c], atol=0.05, rtol=0, msg=c)


def test_janus_branching_under_native_bf16_auto(janus, native_bf16):
    """Where the CPU has native bf16, rollout.autocast=auto samples Janus in bf16, and every branching
    scheme continues those samples: it must run (both ways of the test switch)."""
    from t2i_gcpo.config import load_config
    from t2i_gcpo.train.run_settings import resolve_autocast, sampling_params

    cfg = load_config(overrides=["rollout.cfg_scale=3"])
    resolve_autocast(cfg, "cpu", janus)
    sampling = sampling_params(cfg)
    assert sampling.autocast == ("bf16" if native_bf16 else "none")
    points = torch.tensor([[3], [9]])
    ro, br = branch_from_start(janus, JANUS, sampling, points)
    assert torch.equal(br.tokens[0, :3], ro.tokens[0, :3]) and torch.equal(br.tokens[1, :9], ro.tokens[1, :9])


# ---------------------------------------------------------------------------- 3. one compilation a run


def test_compile_serves_a_run_with_one_compilation(janus, monkeypatch):
    """rollout.decode=compile: the step's shapes are bucketed (rows to the run's largest pass, the cache to
    a multiple of the span) and its sampling constants are tensors, so a pass with another prompt width, a
    smaller batch or another guidance scale reuses the first pass's compilation (dynamo's count of compiled
    graphs does not grow).
    Dynamo's own backend stands in for inductor here (the guards and recompiles are dynamo's)."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    first = roll(janus, JANUS, 2, CFG, "compile")
    frames = counters["stats"]["unique_graphs"]
    assert frames > before
    roll(janus, JANUS[:1], 2, CFG, "compile")  # another prompt width, half the rows
    roll(janus, JANUS[1:], 1, dataclasses.replace(CFG, guidance_scale=5.0, temperature=0.8), "compile")
    assert counters["stats"]["unique_graphs"] == frames, "no recompilation within the run"
    assert janus.last_decode["compiles"] == 0 and janus.decode_session.stats["compiles"] == frames - before
    assert_same(roll(janus, JANUS, 2, CFG, "eager"), first)


def test_a_recompilation_warns_but_a_first_compilation_after_static_passes_does_not(janus, monkeypatch):
    """A loop that ran static passes before its first compiled one (the benchmarks and gpu_check do) compiles
    for the first time: no warning (it said "compiled again in pass 2" before). A pass whose sampling changes
    the step's code (top-k on) compiles again: one warning says so."""
    from t2i_gcpo.policies.decode_loop import DecodeSession

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    monkeypatch.setattr(janus, "decode_session", DecodeSession())
    torch._dynamo.reset()
    roll(janus, JANUS, 2, CFG, "static")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        roll(janus, JANUS, 2, CFG, "compile")
    with pytest.warns(UserWarning, match="compiled again in compiled pass 2"):
        roll(janus, JANUS, 2, dataclasses.replace(CFG, top_k=5), "compile")


# ---------------------------------------------------------------------------- 4. the GPU check survives


def test_janus_scale_rows_record_their_own_errors(monkeypatch):
    """A Janus `generate` that raises (transformers 5.17's on the GPU machine) costs its rows only: they say
    why, and the other loops' rows are measured. Before the fix `race` caught only out-of-memory errors and
    the whole section was lost."""
    from transformers import JanusForConditionalGeneration

    from benchmarks.suite import janus_scale
    from benchmarks.suite.common import Context

    def broken(self, *args, **kwargs):
        raise TypeError("stand-in: generate() got an unexpected keyword argument")

    monkeypatch.setattr(JanusForConditionalGeneration, "generate", broken)
    rows = janus_scale.race(
        Context(quick=True, threads=1, device="cpu"), "tiny", [4], [4], janus_scale.LOOPS, 1, 1e10
    )
    by = {r["loop"]: r for r in rows}
    assert set(by) == set(janus_scale.LOOPS)
    assert by["graph"]["seconds"] > 0 and by["eager"]["seconds"] > 0
    assert by["generate"]["seconds"] is None and "TypeError" in (
        by["generate"].get("error") or by["generate"]["skipped"]
    )
