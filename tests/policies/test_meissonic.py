"""The Meissonic adapter (policies/meissonic.py, meissonic_transformer.py) on tiny random folders in the
released layout (tests/meissonic_fixtures.py): the released parameter names and the real model's size,
sampling equal to a reveal loop written out here (mask, schedule, timestep, micro-conditioning, guidance), the
timestep of every canvas, both estimators, the negative prompt, LoRA and gradient checkpointing, saving in the
released layout, the folder's own code never run, and a bad folder as one line (the Policy contract:
test_policy_contract.py)."""

from __future__ import annotations

import json
import math
import pickle
import shutil
import subprocess
import sys

import pytest
import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import Policy, PromptRecord, SamplingParams
from t2i_gcpo.policies.registry import load_policy, split_spec
from t2i_gcpo.tasks.loop import group_generators

from meissonic_fixtures import (
    MASK_ID,
    MODEL_INDEX,
    PROJECTION,
    PROMPTS,
    SIDE,
    TEXT_WIDTH,
    TRANSFORMER_CONFIG,
    K,
    T,
    build_tiny_meissonic,
    marks,
    released_shapes,
)

CONTEXTS = ("pos", "neg", "guided")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_meissonic(tmp_path_factory.mktemp("meissonic") / "tiny")


@pytest.fixture(scope="module")
def policy(folder):
    return load_policy(f"meissonic:{folder}").eval()


def roll(policy, texts, group_size, seed, negatives=None, **sampling):
    negatives = negatives or [None] * len(texts)
    recs = [PromptRecord(t, negative=n) for t, n in zip(texts, negatives)]
    return policy.rollout(
        recs, group_size, SamplingParams(**sampling), group_generators(seed, "m", range(len(texts)))
    )


# ----------------------------------------------------------------------------- the folder and the model


def test_the_released_folder_loads_with_the_pipelines_conventions(folder, policy):
    from t2i_gcpo.policies.meissonic import MeissonicPolicy

    assert split_spec(str(folder))[0] == "meissonic"  # recognised by its model_index.json alone
    assert isinstance(policy, MeissonicPolicy) and isinstance(policy, Policy)
    assert policy.guidance == "u + s(c − u)"
    assert policy.default_sampling() == SamplingParams(
        guidance_scale=9.0, steps=64, reveal_order="confidence"
    )
    assert (policy.mask_id, policy.codebook_size, policy.layout.grid) == (MASK_ID, K, (SIDE, SIDE))
    assert policy.image_size == 2 * SIDE  # sample_size 8 × the VQ's factor 2
    assert policy.micro_conds(1, torch.float32).tolist() == [[16.0, 16.0, 0.0, 0.0, 6.0]]
    assert policy.text_ids(["a red cat"]).shape == (1, 77)  # src/pipeline.py: max_length=77
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("transformer.") for n in trainable)
    assert policy.default_negative == ""  # the pipeline's negative_prompt None → ""


def test_the_transformer_has_the_released_parameter_names_and_the_released_size(policy):
    from t2i_gcpo.policies.meissonic_transformer import MeissonicTransformerConfig, parameter_count

    got = {k: tuple(v.shape) for k, v in policy.transformer.state_dict().items()}
    assert got == released_shapes(TRANSFORMER_CONFIG)
    # MeissonFlow/Meissonic transformer/: 4.03 GB of float32 (2.01 GB in fp16) for its
    # config.json (the defaults)
    n = parameter_count(MeissonicTransformerConfig())
    assert n == 1_006_946_304 and round(4 * n / 1e9, 2) == 4.03 and round(2 * n / 1e9, 2) == 2.01


def test_a_folder_without_sample_size_renders_the_pipelines_1024_px(tmp_path):
    path = build_tiny_meissonic(tmp_path / "m", transformer={"sample_size": None}, fp16_copy=False)
    policy = load_policy(f"meissonic:{path}")
    assert policy.image_size == 1024 and policy.layout.grid == (512, 512)  # 1024 px / the VQ's factor 2


# ----------------------------------------------------------------------------- sampling, written out here


def reveal_loop(policy, texts, negatives, group_size, seed, steps, scale, order="confidence"):
    """Meissonic's sampling spelled out (src/pipeline.py + src/scheduler.py), drawn from the prompts' uniforms
    as the adapter draws them: u[…, 0] picks each masked token by inverse CDF, u[…, 1] its Gumbel noise."""
    tf, te, tok = policy.transformer, policy.text_encoder, policy.tokenizer
    gens = group_generators(seed, "m", range(len(texts)))
    u = torch.cat([torch.rand((group_size, steps, T, 2), generator=g) for g in gens])  # [B, S, T, 2]
    b = len(u)

    def encode(strings):
        ids = tok(
            strings, return_tensors="pt", padding="max_length", truncation=True, max_length=77
        ).input_ids
        out = te(ids, output_hidden_states=True)
        return out.text_embeds.repeat_interleave(group_size, 0), out.hidden_states[-2].repeat_interleave(
            group_size, 0
        )

    (pc, hc), (pu, hu) = encode(texts), encode(negatives)
    micro = torch.tensor([[2.0 * SIDE, 2.0 * SIDE, 0, 0, 6]]).expand(
        b, -1
    )  # width, height, crop, crop, aesthetic
    tau = torch.linspace(2, 0, steps)
    canvas = torch.full((b, T), MASK_ID)
    step = torch.full((b, T), -1)
    logp = {c: torch.zeros(b, T) for c in CONTEXTS}
    for s in range(steps):
        masked = canvas == MASK_ID
        t = torch.tensor([steps - 1 - s])  # the scheduler's timesteps: arange(S).flip(0)

        def logits(pooled, states, ids=canvas.view(b, SIDE, SIDE), t=t):
            return tf(ids, micro, pooled, states, t).flatten(2).transpose(1, 2)  # [B, T, K]

        with torch.no_grad():
            c, un = logits(pc, hc), logits(pu, hu)
        g = un + scale * (c - un) if scale > 1 else c
        cdf = g.softmax(-1).cumsum(-1)
        drawn = (cdf <= (u[:, s, :, 0] * cdf[..., -1])[..., None]).sum(-1).clamp(max=K - 1)  # [B, T]
        pick = {
            name: z.log_softmax(-1).gather(-1, drawn[..., None])[..., 0]
            for name, z in (("pos", c), ("neg", un), ("guided", g))
        }
        gumbel = -torch.log((-torch.log(u[:, s, :, 1].clamp(1e-20))).clamp(1e-20))
        conf = gumbel if order == "random" else pick["guided"] + tau[s] * gumbel
        conf = torch.where(masked, conf, torch.tensor(float("-inf")))
        left = int(masked[0].sum())
        keep = (
            0
            if s == steps - 1
            else max(1, min(left - 1, math.floor(T * math.cos(math.pi / 2 * (s + 1) / steps))))
        )
        reveal = torch.zeros_like(masked).scatter_(1, conf.topk(left - keep, dim=1).indices, True)
        canvas = torch.where(reveal, drawn, canvas)
        step = torch.where(reveal, s, step)
        for name in CONTEXTS:
            logp[name] = torch.where(reveal, pick[name], logp[name])
    return canvas, step, logp


@pytest.mark.parametrize("order", ["confidence", "random"])
def test_sampled_tokens_and_log_probs_equal_the_reveal_loop_written_here(policy, order):
    texts, negatives, steps, scale = PROMPTS, ["", "blurry, ugly"], 5, 3.0
    ro = roll(
        policy,
        texts,
        2,
        11,
        negatives=[None, negatives[1]],
        guidance_scale=scale,
        steps=steps,
        reveal_order=order,
    )
    tokens, step, logp = reveal_loop(policy, texts, negatives, 2, 11, steps, scale, order)
    assert torch.equal(ro.tokens, tokens) and torch.equal(ro.step, step)
    for c in CONTEXTS:
        assert (ro.logp[c] - logp[c]).abs().max().item() < 1e-4, c  # float32 rounding of another batch shape
    assert (ro.logp["guided"] - ro.logp["pos"]).abs().max() > 1e-2  # the guidance did something


def test_each_canvas_gets_the_pipelines_timestep(policy):
    from t2i_gcpo.policies.maskgen import reveal_counts

    steps = 6
    counts = reveal_counts(T, steps)
    before = [T - sum(counts[:s]) for s in range(steps)]  # masked tokens at the start of each step
    assert policy.timesteps(torch.tensor(before), steps).tolist() == [steps - 1 - s for s in range(steps)]
    # a re-mask's count no step sees: the step whose canvas it would be, S − 1 − S·γ⁻¹(m/T)
    m = 40
    assert m not in before
    want = steps - 1 - steps * (2 / math.pi) * math.acos(m / T)
    assert policy.timesteps(torch.tensor([m]), steps).item() == pytest.approx(want, abs=1e-5)
    assert policy.timesteps(torch.tensor([1]), steps).item() == 0.0  # clamped at the last step


# ----------------------------------------------------------------------------- log-probs and estimators


def test_the_remask_estimator_records_what_it_replays(folder):
    pol = load_policy(f"meissonic:{folder}").eval()
    pol.set_estimator("remask", 2)
    ro = roll(pol, PROMPTS, 2, 3, guidance_scale=3.0, steps=4)
    masks = ro.state["remask"]
    assert masks.shape == (4, 2, T) and torch.equal(ro.scored, masks.any(1).float())
    with torch.no_grad():
        for c in CONTEXTS:
            assert (ro.logp[c][~masks.any(1)] == 0).all()
            assert (pol.logprobs(ro, c) - ro.logp[c]).abs().max().item() < 1e-4, c


def test_negative_prompts_per_record_by_option_and_saved_with_the_model(folder, policy, tmp_path):
    from t2i_gcpo.config import ModelOptions
    from t2i_gcpo.policies.muse_common import SAMPLING_FILE

    plain = roll(policy, PROMPTS[:1], 2, 5, guidance_scale=3.0, steps=3)
    named = roll(policy, PROMPTS[:1], 2, 5, negatives=["blurry"], guidance_scale=3.0, steps=3)
    assert torch.equal(plain.state["negative_ids"], policy.text_ids(["", ""]))
    assert not torch.equal(named.state["negative_ids"], plain.state["negative_ids"])
    negative = "worst quality, low quality"
    chosen = load_policy(f"meissonic:{folder}", ModelOptions(negative_prompt=negative))
    by_option = roll(chosen, PROMPTS[:1], 2, 5, guidance_scale=3.0, steps=3)
    assert torch.equal(by_option.state["negative_ids"], policy.text_ids([negative] * 2))
    chosen.save_pretrained(tmp_path / "trained")
    saved = json.loads((tmp_path / "trained" / SAMPLING_FILE).read_text())
    assert saved == {"reveal_order": "confidence", "negative_prompt": negative}
    assert load_policy(str(tmp_path / "trained")).default_negative == negative  # eval and sample use it
    assert load_policy(str(tmp_path / "trained"), ModelOptions(negative_prompt="")).default_negative == ""


def test_lora_trains_only_its_adapters_and_saves_merged(folder, tmp_path):
    from t2i_gcpo.config import ModelOptions

    lora = load_policy(f"meissonic:{folder}", ModelOptions(lora_rank=2)).eval()
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".attn.")[1].split(".lora_")[0] for n in trainable} == {
        "to_q",
        "to_k",
        "to_v",
        "to_out.0",
        "add_q_proj",
        "add_k_proj",
        "add_v_proj",
        "to_add_out",
    }
    with torch.no_grad():  # peft's B starts at 0: move it, so the merge has something to merge
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    ro = roll(lora, PROMPTS, 1, 2, guidance_scale=3.0, steps=3)
    lora.save_pretrained(tmp_path / "merged")
    merged = load_policy(str(tmp_path / "merged")).eval()
    assert merged.lora_adapter is None and not any("lora" in k for k in merged.state_dict())
    with torch.no_grad():
        for c in CONTEXTS:
            assert (merged.logprobs(ro, c) - ro.logp[c]).abs().max().item() < 1e-4, c


def test_gradient_checkpointing_gives_the_same_log_probs_and_gradients(folder):
    from t2i_gcpo.config import ModelOptions

    plain = load_policy(f"meissonic:{folder}")
    ckpt = load_policy(f"meissonic:{folder}", ModelOptions(gradient_checkpointing=True))
    assert ckpt.transformer.gradient_checkpointing and not plain.transformer.gradient_checkpointing
    ro = roll(plain, PROMPTS, 1, 4, guidance_scale=3.0, steps=3)
    grads = []
    for pol in (plain, ckpt):
        lp = pol.logprobs(ro, "guided")
        lp.sum().backward()
        grads.append(pol.transformer.transformer_blocks[0].attn.to_q.weight.grad.clone())
        assert (lp.detach() - ro.logp["guided"]).abs().max().item() < 1e-4
    assert torch.allclose(grads[0], grads[1], atol=1e-6) and grads[0].abs().sum() > 0


# ----------------------------------------------------------------------------- saving, and what never runs


def test_save_pretrained_writes_the_released_layout(policy, tmp_path):
    from safetensors import safe_open

    out = tmp_path / "copy"
    policy.save_pretrained(out)
    index = json.loads((out / "model_index.json").read_text())
    assert {k: v for k, v in index.items() if k != "_diffusers_version"} == {
        k: v for k, v in MODEL_INDEX.items() if k != "_diffusers_version"
    }
    config = json.loads((out / "transformer" / "config.json").read_text())
    assert {k: v for k, v in config.items() if k != "_diffusers_version"} == {
        k: v for k, v in TRANSFORMER_CONFIG.items() if k != "_diffusers_version"
    }
    with safe_open(str(out / "transformer" / "diffusion_pytorch_model.safetensors"), "pt") as f:
        assert {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()} == released_shapes(TRANSFORMER_CONFIG)
    sched = json.loads((out / "scheduler" / "scheduler_config.json").read_text())
    assert sched["_class_name"] == "Scheduler" and sched["mask_token_id"] == MASK_ID
    for part in ("vqvae", "text_encoder", "tokenizer"):
        assert (out / part).is_dir()
    assert split_spec(str(out))[0] == "meissonic"


def test_nothing_of_the_folder_is_executed(folder, tmp_path):
    """The folder's transformer.py, scheduler.py and a pickle beside the weights leave a mark when run (shown
    by running one); loading, sampling, scoring and saving leave none."""
    pol = load_policy(f"meissonic:{folder}")
    ro = roll(pol, PROMPTS, 1, 0, guidance_scale=3.0, steps=3)
    pol.logprobs(ro, "pos")
    pol.decode(ro)
    pol.save_pretrained(tmp_path / "saved")
    assert marks(folder) == [] and marks(tmp_path / "saved") == []
    # the traps work when something does run them: the code (a copy of it), and the pickle (then cleaned up)
    trap = tmp_path / "trap"
    shutil.copytree(folder / "transformer", trap)
    subprocess.run([sys.executable, str(trap / "transformer.py")], capture_output=True)
    assert marks(trap) == [str(trap / "EXECUTED")]
    pickle.loads((folder / "transformer" / "diffusion_pytorch_model.bin").read_bytes())
    assert marks(folder) == [str(folder / "transformer" / "EXECUTED")]
    (folder / "transformer" / "EXECUTED").unlink()


def test_a_folder_with_only_the_fp16_weights_loads_them(folder, policy, tmp_path):
    copy = tmp_path / "half"
    shutil.copytree(folder, copy)
    (copy / "transformer" / "diffusion_pytorch_model.safetensors").unlink()
    half = load_policy(f"meissonic:{copy}")
    for k, v in policy.transformer.state_dict().items():
        assert torch.equal(half.transformer.state_dict()[k], v.half().float()), k


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize(
    "change,message",
    [
        ("no vqvae", "missing vqvae/"),
        (
            "text width",
            f"a text encoder of width 40 (projection {PROJECTION}), but the transformer takes {TEXT_WIDTH}",
        ),
        ("projection", "projection 48"),
        ("unknown key", "unknown config key 'num_experts'"),
        ("class", "_class_name 'FluxTransformer2DModel', not Meissonic's 'Transformer2DModel'"),
        ("guidance", "guidance_embeds=true"),
        ("rope", "axes_dims_rope [4, 6, 4] must be even and sum to attention_head_dim 16"),
        ("weights", "missing embed.conv.weight"),
        ("mask id", "mask_token_id 5 is not a mask row"),
        ("not clip", "not a CLIP text encoder"),
    ],
)
def test_a_wrong_folder_is_one_line(tmp_path, change, message):
    from safetensors.torch import load_file, save_file

    over = {
        "unknown key": {"num_experts": 4},
        "class": {"_class_name": "FluxTransformer2DModel"},
        "guidance": {"guidance_embeds": True},
        "rope": {"axes_dims_rope": [4, 6, 4]},
    }.get(change)
    kw = {"text width": {"text_width": 40}, "projection": {"projection": 48}}.get(change, {})
    path = build_tiny_meissonic(tmp_path / "m", transformer=over, fp16_copy=False, **kw)
    if change == "no vqvae":
        shutil.rmtree(path / "vqvae")
    if change == "weights":
        file = path / "transformer" / "diffusion_pytorch_model.safetensors"
        state = load_file(str(file))
        state.pop("embed.conv.weight")
        save_file(state, str(file))
    if change == "mask id":
        sched = path / "scheduler" / "scheduler_config.json"
        sched.write_text(json.dumps({**json.loads(sched.read_text()), "mask_token_id": 5}))
    if change == "not clip":
        (path / "text_encoder" / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(UserError) as e:
        load_policy(f"meissonic:{path}")
    assert message in one_line(e)
