"""The memory options of a real-model step (issue 46): the frozen reference in bf16 (loss.reference_dtype),
rollouts in passes of at most model_options.max_rollout_batch samples, bf16 sampling declared by Janus
where its fused decoder samples."""

from __future__ import annotations

import pytest
import torch

from t2i_gcpo.config import load_config
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.registry import load_policy
from t2i_gcpo.train.run import prepare

from tiny_models import build_tiny_janus, tiny_policy_dir
from train_fixtures import write_prompt_file

FAST = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.cfg_scale=2",
    "eval_every=-1",
    "rollout.autocast=none",
    "optim.autocast=none",
    "loss.beta=0.03",
]


@pytest.mark.parametrize("dtype", ["same", "bfloat16"])
def test_reference_dtype(tmp_path, dtype):
    """The KL reference is a frozen copy in the dtype asked for; the trained policy stays float32, and a
    step's KL term is finite and near the float32 reference's (0 before the first update)."""
    from t2i_gcpo.train.trainer import Trainer

    flags = dict(
        prompts=str(write_prompt_file(tmp_path / "p.jsonl")),
        model=str(tiny_policy_dir(tmp_path)),
        reward="train_fixtures:redness",
        out=str(tmp_path / "run"),
        steps=1,
        seed=0,
    )
    job = prepare(algo="grpo", flags=flags, overrides=(*FAST, f"loss.reference_dtype={dtype}"))
    t = Trainer(job.cfg, job.run_dir, job.prompts, job.policy, job.reward, job.task, job.eval_prompts)
    try:
        want = torch.float32 if dtype == "same" else torch.bfloat16
        assert {p.dtype for p in t.ref.parameters()} == {want}
        assert {p.dtype for p in t.policy.parameters()} == {torch.float32}
        metrics = t.train_step(1)
    finally:
        t._shutdown()
    kl = metrics["loss/kl"]
    assert kl == kl and abs(kl) < (1e-6 if dtype == "same" else 1e-2), kl  # bf16 rounding of the reference


def test_max_rollout_batch_reaches_janus_and_text_only(tmp_path):
    cfg = load_config(overrides=["model_options.max_rollout_batch=3"])
    janus = load_policy(str(build_tiny_janus(tmp_path / "janus")), cfg.model_options)
    assert janus.max_rollout_batch == 3
    assert load_policy("arithmetic", cfg.model_options).max_rollout_batch == 3
    with pytest.raises(
        UserError,
        match="model_options.max_rollout_batch=3 applies to janus, llamagen, showo and text models only",
    ):
        load_policy(str(tiny_policy_dir(tmp_path)), cfg.model_options)
    with pytest.raises(UserError, match="model_options.max_rollout_batch"):
        load_config(overrides=["model_options.max_rollout_batch=0"])


def test_janus_declares_bf16_sampling_where_its_fused_decoder_samples(tmp_path):
    """rollout.autocast=auto samples Janus in bf16 on hardware with native bf16 (the fused decoder takes bf16
    copies of its weights; transformers' StaticCache cannot), with LoRA too (the adapters' deltas merged into
    the copies), not through transformers' layers."""
    ckpt = build_tiny_janus(tmp_path / "janus")
    assert load_policy(str(ckpt)).capabilities.bf16_sampling
    lora = load_policy(str(ckpt), load_config(overrides=["model_options.lora_rank=2"]).model_options)
    assert lora.samples_fused and lora.capabilities.bf16_sampling
    lora.fused_sampler = False
    assert not lora.capabilities.bf16_sampling
