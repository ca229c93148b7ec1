"""rollout.autocast=bf16: every family samples under bfloat16 autocast (tasks/loop.py
`sampler_precision`), the fused decoder then keeps its weight copies and KV cache in bf16, the recorded
log-probs stay close to their float32 teacher-forced recomputation, and the float32 default is the
same computation as before (no autocast, no cast)."""

from __future__ import annotations

import pytest
import torch

from t2i_gcpo.policies.base import PromptRecord, SamplingParams
from t2i_gcpo.tasks.loop import group_generators, sample_and_decode, sampler_precision

from tiny_models import build_tiny_text_lm, tiny_ar_policy, tiny_masked_policy, tiny_policy_dir
from train_fixtures import write_prompt_file

PROMPTS = ["a photo of a red circle", "a photo of two blue squares"]
PROMPTS_3 = [*PROMPTS, "a photo of a cross above a circle"]  # the in-memory priors' vocabulary


def run_flags(tmp_path, reward: str, steps: int) -> dict:
    """`train` flags for a tiny random prior and a small prompt file under `tmp_path`."""
    return dict(
        prompts=str(write_prompt_file(tmp_path / "p.jsonl")),
        model=str(tiny_policy_dir(tmp_path / "m")),
        reward=reward,
        out=str(tmp_path / "run"),
        steps=steps,
        seed=0,
    )


def _llama():
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaModel(cfg).eval()


def test_fused_decoder_under_autocast_runs_in_bf16_and_stays_close():
    """Built under autocast: bf16 weight copies and cache; every position's final hidden state within
    bf16 rounding of the float32 decoder's. Built outside: float32 throughout."""
    from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder

    llama = _llama()
    seq = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(1))

    def decode(dec):
        return torch.stack(
            [dec.forward(seq[:, :6], 0)] + [dec.forward(seq[:, t : t + 1], t) for t in range(6, 16)], 1
        )

    with torch.no_grad():
        full = FusedLlamaDecoder(llama, rows=4, max_len=16)
        assert full.compute_dtype == torch.float32 and all(kv.dtype == torch.float32 for kv in full.kv)
        want = decode(full)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = FusedLlamaDecoder(llama, rows=4, max_len=16)
            got = decode(low)
    assert low.compute_dtype == torch.bfloat16
    assert all(kv.dtype == torch.bfloat16 for kv in low.kv)  # keys and values, one tensor a layer
    assert all(
        w.dtype == torch.bfloat16 for layer in low.layers for w in (layer[1], layer[2], layer[4], layer[5])
    )
    assert got.dtype == torch.float32  # the residual stream and the final norm stay float32
    err = (got - want).abs().max().item()
    assert 0 < err < 0.05 * want.abs().max().item(), err  # rounded, but only by bf16's 8 mantissa bits

    # rows left-padded as the text adapter passes them (positions and key mask): the same agreement
    keep = torch.ones(4, 16, dtype=torch.bool)
    keep[0, :3] = keep[2, :1] = False
    pos = (keep.long().cumsum(-1) - 1).clamp(min=0)

    def decode_padded(dec):
        first = dec.forward(seq[:, :6], 0, positions=pos[:, :6], key_mask=keep[:, :6])
        rest = [dec.forward(seq[:, t : t + 1], t, pos[:, t : t + 1], keep[:, : t + 1]) for t in range(6, 16)]
        return torch.stack([first, *rest], 1)

    with torch.no_grad():
        want = decode_padded(FusedLlamaDecoder(llama, rows=4, max_len=16))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = decode_padded(FusedLlamaDecoder(llama, rows=4, max_len=16))
    err = (got - want).abs().max().item()
    assert torch.isfinite(got).all() and 0 < err < 0.05 * want.abs().max().item(), err


def test_sampler_precision_is_a_no_op_by_default_and_rejects_unknown_values():
    class NoDevice:  # the "none" path needs nothing from the policy (test doubles have no device)
        pass

    with sampler_precision(NoDevice(), SamplingParams()):
        assert not torch.is_autocast_enabled("cpu")
    with pytest.raises(ValueError, match="'none' or 'bf16'"):
        sampler_precision(NoDevice(), SamplingParams(autocast="fp16"))


def _ar():
    return tiny_ar_policy(PROMPTS_3)


def _masked():
    return tiny_masked_policy(PROMPTS_3, codebook_size=16, steps=4)


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    return build_tiny_text_lm(tmp_path_factory.mktemp("text") / "lm")


@pytest.mark.parametrize("family", ["ar", "masked", "text"])
def test_bf16_rollout_records_logprobs_close_to_float32_recomputation(family, text_dir):
    """Each family under rollout.autocast=bf16: the tokens are mostly those the float32 sampler draws
    with the same generators (the uniforms are shared; bf16 rounding moves only draws near a CDF
    boundary), and every recorded log-prob is within bf16 rounding of the float32 teacher-forced one —
    the quantity the update's importance ratio compares it with."""
    if family == "text":
        from t2i_gcpo.policies.text import TextPolicy

        policy = TextPolicy.from_pretrained(text_dir)
        prompts, extra = [PromptRecord("2 + 3 ="), PromptRecord("7 + 1 =")], {"max_new_tokens": 12}
    else:
        policy = _ar() if family == "ar" else _masked()
        prompts, extra = [PromptRecord(p) for p in PROMPTS], {"guidance_scale": 2.0}
    runs = {}
    for mode in ("none", "bf16"):
        sampling = SamplingParams(temperature=1.0, autocast=mode, **extra)
        runs[mode], _ = sample_and_decode(policy, prompts, 4, sampling, group_generators(3, "test", range(2)))
    fp32, bf16 = runs["none"], runs["bf16"]
    assert bf16.tokens.shape[0] == fp32.tokens.shape[0] == 8
    width = min(fp32.tokens.shape[1], bf16.tokens.shape[1])
    same = (fp32.tokens[:, :width] == bf16.tokens[:, :width]).float().mean().item()
    assert same > 0.6, same
    for context, recorded in bf16.logp.items():
        assert torch.isfinite(recorded[bf16.mask > 0]).all()
        with torch.no_grad():
            recomputed = policy.logprobs(bf16, context)
        gap = (recorded - recomputed).abs()[bf16.mask > 0]
        assert gap.mean().item() < 0.05 and gap.max().item() < 0.5, (
            context,
            gap.mean().item(),
            gap.max().item(),
        )
        assert gap.max().item() > 0  # it did run in bf16: float32 recomputation matches to 1e-5 otherwise


def test_trainer_samples_with_rollout_autocast(tmp_path, monkeypatch):
    """rollout.autocast reaches every rollout of a run (training and held-out evaluation), and a bf16
    run trains."""
    import json

    from t2i_gcpo.tasks import loop
    from t2i_gcpo.train.run import prepare, run

    seen = []

    def spy(policy, sampling):
        seen.append(sampling.autocast)
        return sampler_precision(policy, sampling)

    monkeypatch.setattr(loop, "sampler_precision", spy)

    flags = run_flags(tmp_path, reward="shapeworld", steps=2)
    sets = (
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.autocast=bf16",
        "optim.autocast=bf16",
        "eval_every=2",
        "eval_images_per_prompt=1",
        "sample_every=0",
    )
    job = prepare(algo="gcpo", flags=flags, overrides=sets)
    assert job.cfg.rollout.autocast == "bf16"
    run(job)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "time/rollout" in r] == [1, 2]  # step 0: the base model's evaluation
    assert seen and set(seen) == {"bf16"}, seen
    assert job.eval_prompts and (tmp_path / "run" / "eval.json").is_file()  # held-out evaluation ran


def test_auto_precision_is_bf16_only_where_native_and_the_run_records_it(tmp_path, native_bf16):
    """The default 'auto' resolves per machine (bf16 where the device multiplies bf16 natively, else
    none) before config.yaml is written, so the run directory says what ran and a resume keeps it;
    explicit values are left alone."""
    import yaml

    from t2i_gcpo.config import TrainConfig
    from t2i_gcpo.policies.base import PolicyCapabilities
    from t2i_gcpo.train.run_settings import resolve_autocast

    class Checked:  # a sampler checked under bf16 (the ShapeWorld priors, the fused text decoder)
        capabilities = PolicyCapabilities(bf16_sampling=True)

    class Unchecked:  # a sampler not checked under bf16 (Janus, aMUSEd): 'auto' leaves it alone
        capabilities = PolicyCapabilities(bf16_sampling=False)

    cfg = TrainConfig()
    assert cfg.rollout.autocast == cfg.optim.autocast == "auto"
    resolve_autocast(cfg, "cpu", Checked())
    want = "bf16" if native_bf16 else "none"
    assert cfg.rollout.autocast == cfg.optim.autocast == want
    cfg = TrainConfig()
    cfg.rollout.autocast, cfg.optim.autocast = "none", "bf16"
    resolve_autocast(cfg, "cpu", Checked())
    assert (cfg.rollout.autocast, cfg.optim.autocast) == ("none", "bf16")

    cfg = TrainConfig()
    resolve_autocast(cfg, "cpu", Unchecked())
    assert (cfg.rollout.autocast, cfg.optim.autocast) == ("none", want)

    from t2i_gcpo.train.run import prepare, run

    flags = run_flags(tmp_path, reward="train_fixtures:redness", steps=1)
    sets = ("rollout.prompts_per_step=2", "rollout.group_size=4", "eval_every=-1", "sample_every=0")
    run(prepare(algo="dapo", flags=flags, overrides=sets))
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["rollout"]["autocast"] == saved["optim"]["autocast"] == want
