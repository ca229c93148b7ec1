"""Weights the kept decode loop samples from are the weights the optimizer wrote (issue 59, item 1), under
every strategy: FSDP2 (gloo on the CPU, world 1: after each optimizer step the gathered parameters are the
same objects with the same version counters in new storage), DDP, LoRA, tied embeddings, bf16 autocast; and
new values written at the same address without a version bump (what FSDP2 may do on CUDA) are caught by the
trainer's count of optimizer steps. In graph mode the stand-in for CUDA graphs (tests/capture_standin.py,
`addresses`) fails a replay that reads a tensor at an address it has left: the loop captures again instead.

A failed capture leaves the allocator usable: the stand-in fails the way PyTorch's `capture_end` does (the
allocator still allocating to the capture's pool, `empty_cache` failing), and the loop ends and releases the
pool."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import torch.distributed as dist

from t2i_gcpo.policies import decode_loop
from t2i_gcpo.policies.base import PromptRecord, SamplingParams
from t2i_gcpo.policies.decode_loop import weights_changed
from t2i_gcpo.policies.registry import load_policy
from t2i_gcpo.tasks.loop import group_generators

from capture_standin import StandInCuda
from tiny_models import build_tiny_janus, build_tiny_text_tokenizer, tiny_policy_dir, tiny_text_config

SHAPES = ["a photo of a red circle", "a photo of two blue squares"]
CFG = SamplingParams(guidance_scale=3.0, top_k=20, top_p=0.9)


def roll(policy, mode, seed, texts=SHAPES, sampling=CFG):
    records = [PromptRecord(t) for t in texts]
    with torch.no_grad():
        return policy.rollout(
            records,
            2,
            dataclasses.replace(sampling, decode=mode),
            group_generators(seed, "refresh", range(len(texts))),
        )


def assert_same(kept, fresh) -> None:
    assert torch.equal(kept.tokens, fresh.tokens), "the kept loop sampled other tokens than a fresh eager one"
    for c in fresh.logp:
        torch.testing.assert_close(kept.logp[c], fresh.logp[c], atol=1e-4, rtol=0, msg=c)


def loss_of(policy, rollout) -> torch.Tensor:
    return -policy.logprobs(rollout, "guided").mean()


@pytest.fixture
def process_group(tmp_path):
    """A gloo process group of one process (FSDP2 and DDP on the CPU), destroyed after the test."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def fsdp2(policy):
    """The policy sharded as configs/accelerate/fsdp.yaml does (a unit per Llama decoder layer, the root
    holding the rest, no resharding after forward) → its optimizer over the shards. The weights are whole
    after `gather_params`, as the trainer leaves them."""
    from torch.distributed.fsdp import fully_shard

    from t2i_gcpo.train.distributed import gather_params

    for layer in policy.llama.layers:
        fully_shard(layer, reshard_after_forward=False)
    fully_shard(policy, reshard_after_forward=False)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    gather_params(policy)
    return optimizer


def fsdp2_step(policy, optimizer, rollout) -> None:
    """One optimizer step as train/update.optimizer_step takes it under FSDP2: backward (FSDP2 reshards),
    step on the shards, gather the weights whole again, tell the decode loop."""
    from t2i_gcpo.train.distributed import gather_params

    loss_of(policy, rollout).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    gather_params(policy)
    weights_changed(policy)


def test_fsdp2_samples_from_the_weights_each_optimizer_step_wrote(tmp_path, process_group):
    """Two FSDP2 optimizer steps: after each the kept static loop draws the tokens and log-probs of a fresh
    eager loop of the new weights. Before the fix the refresh judged by version counters saw nothing (FSDP2
    gathers into new storage and keeps them): every later pass sampled from the first pass's copies."""
    policy = load_policy(str(tiny_policy_dir(tmp_path))).eval()
    optimizer = fsdp2(policy)
    addresses = [p.data_ptr() for p in policy.parameters()]
    for step in range(3):
        kept, fresh = roll(policy, "static", step), roll(policy, "eager", step)
        assert_same(kept, fresh)
        if step == 2:
            break
        fsdp2_step(policy, optimizer, fresh)
        moved = [p.data_ptr() for p in policy.parameters()]
        assert moved != addresses, "FSDP2 gathered the new weights into new storage (what the test is about)"
        addresses = moved
    assert policy.decode_session.stats["allocations"] == 1 and policy.decode_session.stats["refreshes"] == 2


def test_fsdp2_in_graph_mode_captures_again_where_the_weights_moved(tmp_path, process_group, monkeypatch):
    """Graph mode under FSDP2: the head's weights move at every gather, so a graph captured before would read
    freed memory (the stand-in's replay fails then); the loop drops its graphs and captures again, and samples
    what a fresh eager loop does."""
    policy = load_policy(str(tiny_policy_dir(tmp_path))).eval()
    optimizer = fsdp2(policy)
    fake = StandInCuda(addresses=True)
    for step in range(3):
        fresh = roll(policy, "eager", step)
        with fake.installed(span=4), monkeypatch.context() as m:
            m.setattr("t2i_gcpo.policies.ar.resolve_mode", lambda *args: "graph")
            kept = roll(policy, "graph", step)
        assert_same(kept, fresh)
        assert policy.last_decode["replays"] > 0
        if step < 2:
            fsdp2_step(policy, optimizer, fresh)
    session = policy.decode_session.stats
    assert session["recaptures"] == 2 and session["captures"] == 3 * 5 and session["allocations"] == 1


def test_new_values_at_the_same_address_are_caught_by_the_trainers_count(tmp_path):
    """Weights rewritten in place with their version counters kept (FSDP2's copy-out into storage that may be
    reused at the same address on CUDA): neither the counters nor the addresses change; the trainer's count of
    optimizer steps (`weights_changed`, called by train/update.optimizer_step) refreshes the copies."""
    policy = load_policy(str(tiny_policy_dir(tmp_path))).eval()
    roll(policy, "static", 0)
    with torch.no_grad():
        for p in policy.parameters():
            with torch.autograd._unsafe_preserve_version_counter(p):
                p.add_(torch.randn_like(p), alpha=0.3)
    weights_changed(policy)
    assert_same(roll(policy, "static", 1), roll(policy, "eager", 1))
    assert policy.decode_session.stats["refreshes"] == 1


def test_the_trainer_tells_the_loop_after_every_optimizer_step(tmp_path, monkeypatch):
    """A two-step run with the static loop: train/update.optimizer_step bumps the
    session's count each step."""
    from t2i_gcpo.train.run import prepare, run

    from train_fixtures import write_prompt_file

    seen = []
    real = decode_loop.DecodeSession.weights_changed
    monkeypatch.setattr(
        decode_loop.DecodeSession, "weights_changed", lambda self: (seen.append(1), real(self))
    )
    monkeypatch.setattr("t2i_gcpo.train.trainer.Trainer._report", lambda self: None)
    flags = dict(
        prompts=str(write_prompt_file(tmp_path / "p.jsonl")),
        model=str(tiny_policy_dir(tmp_path)),
        reward="train_fixtures:redness",
        out=str(tmp_path / "run"),
        steps=2,
        seed=0,
        report_to="none",
    )
    overrides = (
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.decode=static",
        "sample_every=0",
        "eval_every=-1",
        "save_every=10",
    )
    job = prepare(algo="grpo", flags=flags, overrides=overrides)
    run(job)
    assert len(seen) == 2 and job.policy.decode_session.generation == 2
    assert job.policy.decode_session.stats["refreshes"] == 1  # the pass after step 1 (step 2's was the last)


def test_ddp_steps_in_place_and_the_loop_follows(tmp_path, process_group):
    """DDP (gloo, world 1) keeps the weights where they are and steps them in place: the copies follow."""
    from torch.nn.parallel import DistributedDataParallel

    policy = load_policy(str(tiny_policy_dir(tmp_path))).eval()
    ddp = DistributedDataParallel(policy)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    for step in range(2):
        fresh = roll(policy, "eager", step)
        assert_same(roll(policy, "static", step), fresh)
        ddp(fresh, context="guided").mean().neg().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        weights_changed(policy)


def tied_text_policy(folder):
    """A tiny Llama causal LM whose head is its token embedding (tie_word_embeddings)."""
    from transformers import AutoModelForCausalLM

    from t2i_gcpo.policies.text import TextPolicy

    tokenizer = build_tiny_text_tokenizer()
    torch.manual_seed(0)
    config = tiny_text_config(tokenizer)
    config.tie_word_embeddings = True
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    policy = TextPolicy.from_pretrained(str(folder))
    lm = policy.model
    assert lm.get_output_embeddings().weight is lm.get_input_embeddings().weight
    return policy


@pytest.mark.parametrize("kind", ["tied", "lora", "bf16"])
def test_every_strategy_samples_the_stepped_weights_in_graph_mode(kind, tmp_path, monkeypatch):
    """Tied embeddings (a text LM whose head is its embedding: the decoder's embedding copy and the head the
    adapter reads both follow), LoRA (Janus: the adapters merged into the copies), bf16 autocast (the prior:
    bf16 copies): after an optimizer step the kept graph-mode loop draws what a fresh eager loop draws (bf16:
    a fresh static loop, whose sums are the graph's in the same order)."""
    texts, sampling, module = SHAPES, CFG, "ar"
    if kind == "tied":
        policy, texts, module = tied_text_policy(tmp_path / "tied"), ["What is 12+7*3 ?", "Solve 4*5"], "text"
        sampling = SamplingParams(max_new_tokens=6)
    elif kind == "lora":
        from t2i_gcpo.policies.janus import JanusPolicy

        policy, module = (
            JanusPolicy.from_pretrained(build_tiny_janus(tmp_path / "janus"), lora={"r": 4}),
            "janus",
        )
        texts = ["a red circle", "two blue squares left of a green cat"]
        with torch.no_grad():  # peft starts B at 0: a visible delta
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    else:
        policy = load_policy(str(tiny_policy_dir(tmp_path))).eval()
    precision = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if kind == "bf16"
        else torch.autocast("cpu", enabled=False)
    )
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=3e-2)
    fake = StandInCuda(addresses=True)
    for step in range(2):
        with precision:
            if kind == "bf16":  # bf16 sums round by order: the reference is a fresh static loop of the
                kept_session, policy.decode_session = policy.decode_session, decode_loop.DecodeSession()
                with fake.installed(span=4):  # same spans, which the graphs replay
                    fresh = roll(policy, "static", step, texts, sampling)
                policy.decode_session = kept_session
            else:
                fresh = roll(policy, "eager", step, texts, sampling)
            with fake.installed(span=4), monkeypatch.context() as m:
                m.setattr(f"t2i_gcpo.policies.{module}.resolve_mode", lambda *args: "graph")
                kept = roll(policy, "graph", step, texts, sampling)
        assert_same(kept, fresh)
        (-policy.logprobs(fresh, "guided").mean()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        weights_changed(policy)
    assert policy.decode_session.stats["refreshes"] == 1 and policy.decode_session.stats["allocations"] == 1


def test_a_failed_capture_releases_its_pool_and_leaves_the_allocator_usable(tmp_path, monkeypatch):
    """The stand-in fails the first capture as `capture_end` does (cudaStreamEndCapture's error thrown before
    endAllocateToPool): before the fix the allocator still allocated to that pool and the next
    `torch.cuda.empty_cache()` (the one benchmarks/gpu_check.py calls after every part) failed."""
    policy = load_policy(str(tiny_policy_dir(tmp_path))).eval()
    want = roll(policy, "static", 0)
    fake = StandInCuda(fail_at=0)
    with fake.installed(span=4), monkeypatch.context() as m:
        m.setattr("t2i_gcpo.policies.ar.resolve_mode", lambda *args: "graph")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = roll(policy, "graph", 0)
        assert any("capture" in str(w.message) for w in caught)
        assert fake.routed == [] and len(fake.released) == 1, (fake.routed, fake.released)
        torch.cuda.empty_cache()  # the stand-in's: fails while a pool is still routed
    assert_same(got, want)


@pytest.mark.slow  # the shipped prior on the CPU: ≈ 35 s beside other jobs
def test_gpu_checks_failing_capture_leaves_the_allocator_usable():
    """benchmarks/gpu_check.py's failure_paths part on the CPU (its --tiny dry run: the stand-in failing the
    shipped prior's first capture): the same tokens, the stream put back, `empty_cache` after it usable."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root holds benchmarks/
    from benchmarks import gpu_check

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = gpu_check.failing_capture()
    assert out["allocator_usable"] is True and out["stream_restored"] and out["fallback"], out
    assert out["tokens_equal"], out
