"""The Show-o adapter (policies/showo.py) on a tiny random checkpoint in the released layout
(tests/showo_fixtures.py): the omni-attention mask against the reference's construction on padded
prompts, the prompt format, the reveal schedule and temperature annealing against the reference's
arithmetic, sampled tokens and recorded log-probs against a reveal loop written here, CFG scale 0,
negative prompts, the remask estimator, a policy-gradient step, LoRA, gradient checkpointing, a kept
reveal order, and the folder's errors (one line each; nothing of the folder runs). The Policy contract:
tests/test_policy_contract.py."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest
import torch

from t2i_gcpo.core.losses import policy_loss
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import Policy, PromptRecord, SamplingParams
from t2i_gcpo.policies.maskgen import reveal_counts
from t2i_gcpo.tasks.loop import group_generators

from showo_fixtures import SHOWO_SIDE, build_tiny_showo

T = SHOWO_SIDE * SHOWO_SIDE
PROMPTS = ["a photo of a red cat", "two dogs left of a bench"]
CONTEXTS = ("pos", "neg", "guided")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_showo(tmp_path_factory.mktemp("showo") / "tiny")


@pytest.fixture(scope="module")
def policy(folder):
    from t2i_gcpo.policies.showo import ShowoPolicy

    return ShowoPolicy.from_pretrained(folder).eval()


def gens(seed: int, n: int) -> list[torch.Generator]:
    return group_generators(seed, "test", range(n))


def roll(policy, texts, group_size, seed, negatives=None, **sampling):
    negatives = negatives or [None] * len(texts)
    recs = [PromptRecord(t, negative=n) for t, n in zip(texts, negatives)]
    return policy.rollout(recs, group_size, SamplingParams(**sampling), gens(seed, len(texts)))


# ----------------------------------------------------------------------------- the reference, spelled out


def reference_tokenizer(folder):
    """The Phi tokenizer as UniversalPrompting prepares it: [PAD] as pad token, then nine task tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder / "phi-1_5"))
    tok.add_special_tokens({"pad_token": "[PAD]"})
    tok.add_tokens(
        ["<|soi|>", "<|eoi|>", "<|sov|>", "<|eov|>", "<|t2i|>", "<|mmu|>", "<|t2v|>", "<|v2v|>", "<|lvg|>"]
    )
    return tok


def reference_prompt(tok, text: str, max_text_len: int = 128 + 1) -> list[int]:
    """t2i_gen_prompt: [<|t2i|>, BOS, text, EOS], left-padded with [PAD] to 129 (or cut, EOS last)."""
    ids = tok(text)["input_ids"]
    if len(ids) == 0:
        ids = [tok.bos_token_id]
    elif ids[0] != tok.bos_token_id:
        ids = [tok.bos_token_id] + ids
    ids = [tok.convert_tokens_to_ids("<|t2i|>")] + ids + [tok.eos_token_id]
    if max_text_len >= len(ids):
        return [tok.pad_token_id] * (max_text_len - len(ids)) + ids
    return ids[: max_text_len - 1] + [tok.eos_token_id]


def reference_mask(seq: torch.Tensor, pad_id: int, soi_id: int, eoi_id: int) -> torch.Tensor:
    """create_attention_mask_predict_next(seq, pad_id, soi_id, eoi_id, rm_pad_in_image=True) as the reference
    builds it, step by step (bool [N, 1, L, L] instead of its inverted additive mask)."""
    n, length = seq.shape
    is_padding = seq == pad_id
    in_image = (
        (torch.cumsum(seq == soi_id, 1) > torch.cumsum(seq == eoi_id, 1)) | (seq == soi_id) | (seq == eoi_id)
    )
    is_text = ~in_image
    causal = torch.tril(torch.ones((length, length), dtype=torch.bool))
    mask_text = is_text[:, :, None] & causal[None]
    is_text_image = is_text | in_image  # every token
    bidirectional = is_text_image[:, :, None] & is_text_image[:, None, :]
    soi_at = torch.where(seq == soi_id)[1]
    for i in range(n):
        pads = torch.where(is_padding[i])[0]
        if len(pads):
            last = pads[-1]
            mask_text[i][last + 1 :, : last + 1] = False  # text after the padding does not see it
        bidirectional[i][soi_at[i] :, pads] = False  # nor does the image
    mask_text[in_image] = bidirectional[in_image]
    return mask_text[:, None]


def independent_phi(folder, vocab_size: int):
    """The backbone read here from the released file (``showo.`` stripped), with eager attention."""
    from safetensors.torch import load_file
    from transformers import PhiConfig, PhiForCausalLM

    cfg = PhiConfig.from_dict(json.loads((folder / "phi-1_5" / "config.json").read_text()))
    cfg.vocab_size, cfg._attn_implementation = vocab_size, "eager"
    phi = PhiForCausalLM(cfg).eval()
    state = {
        k.removeprefix("showo."): v for k, v in load_file(str(folder / "pytorch_model.safetensors")).items()
    }
    phi.load_state_dict(state, strict=True)
    return phi


def reference_reveal_loop(folder, texts, G, S, scale, seed, temperature=1.0, tau0=1.0):
    """Show-o's t2i_generate with this package's draws (each prompt's uniforms from its own generator:
    [G, S, T, 2], the token by inverse CDF, the Gumbel noise from the second half), everything else as the
    reference writes it → (tokens [B, T], reveal step [B, T], log-probs {pos, neg, guided} [B, T])."""
    cfg = json.loads((folder / "config.json").read_text())
    tok = reference_tokenizer(folder)
    llm, K, vocab = cfg["llm_vocab_size"], cfg["codebook_size"], cfg["vocab_size"]
    offset, mask_token = llm + 10, vocab - 1
    soi, eoi = tok.convert_tokens_to_ids("<|soi|>"), tok.convert_tokens_to_ids("<|eoi|>")
    phi = independent_phi(folder, vocab)
    uniforms = torch.cat([torch.rand((G, S, T, 2), generator=g) for g in gens(seed, len(texts))])
    cond = torch.tensor([reference_prompt(tok, t) for t in texts for _ in range(G)])
    uncond = torch.tensor([reference_prompt(tok, "")] * len(cond))
    b = len(cond)
    image = torch.full((b, T), mask_token)
    tokens, step = torch.full((b, T), -1), torch.full((b, T), -1)
    logp = {c: torch.zeros(b, T) for c in CONTEXTS}
    tau = tau0
    for s in range(S):
        seq = torch.cat(
            [
                torch.cat([cond, uncond]),
                torch.full((2 * b, 1), soi),
                image.repeat(2, 1),
                torch.full((2 * b, 1), eoi),
            ],
            dim=1,
        )
        allowed = reference_mask(seq, tok.pad_token_id, soi, eoi)
        additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        with torch.no_grad():
            logits = phi(
                input_ids=seq, attention_mask=additive, position_ids=torch.arange(seq.shape[1])[None]
            ).logits
        logits = logits[:, -(T + 1) : -1, offset:-1].float()  # the image positions, the code rows
        c, u = logits.chunk(2)
        guided = (1 + scale) * c - scale * u
        unknown = image == mask_token
        z = guided / temperature
        probs = z.softmax(-1)
        cdf = probs.cumsum(-1)
        draw = torch.searchsorted(cdf, (uniforms[:, s, :, 0] * cdf[..., -1])[..., None], right=True)
        draw = draw.clamp(max=K - 1).squeeze(-1)  # [B, T]
        lp = {
            n: (x / temperature).log_softmax(-1).gather(-1, draw[..., None]).squeeze(-1)
            for n, x in (("pos", c), ("neg", u), ("guided", guided))
        }
        ratio = 1.0 * (s + 1) / S
        mask_ratio = torch.cos(torch.tensor(ratio) * math.pi * 0.5)
        mask_len = int((T * mask_ratio).floor())
        mask_len = max(1, min(int(unknown[0].sum()) - 1, mask_len))
        tau = tau * (1.0 - ratio)
        noise = -torch.log((-torch.log(uniforms[:, s, :, 1].clamp(1e-20))).clamp(1e-20))
        confidence = torch.where(unknown, lp["guided"] + tau * noise, torch.tensor(float("inf")))
        keep = T - mask_len if s < S - 1 else T  # the last step reveals everything still masked
        kept = torch.zeros_like(unknown).scatter_(1, confidence.topk(keep, dim=-1).indices, True)
        reveal = kept & unknown
        tokens = torch.where(reveal, draw, tokens)
        step = torch.where(reveal, s, step)
        for n in CONTEXTS:
            logp[n] = torch.where(reveal, lp[n], logp[n])
        image = torch.where(reveal, draw + offset, image)
    return tokens, step, logp


# ----------------------------------------------------------------------------- the sequence and the mask


def test_the_attention_mask_is_the_references_on_padded_prompts(folder, policy):
    from t2i_gcpo.policies.showo import omni_attention_mask

    tok = reference_tokenizer(folder)
    texts = ["a red cat", "a much longer prompt about two dogs left of a bench", ""]
    canvas = torch.randint(0, 16, (3, T))
    canvas[0, :5] = policy.mask_id  # partly masked canvases
    seq = policy.sequence(torch.tensor([reference_prompt(tok, t) for t in texts]), canvas)
    ours = omni_attention_mask(seq, policy.pad_id, policy.soi_id, policy.eoi_id)
    ref = reference_mask(seq, policy.pad_id, policy.soi_id, policy.eoi_id)
    assert ours.shape == ref.shape == (3, 1, seq.shape[1], seq.shape[1])
    assert torch.equal(ours, ref)
    p = policy.prompt_len
    assert (seq[:, :p] == policy.pad_id).sum(1).tolist()[0] > (seq[:, :p] == policy.pad_id).sum(1).tolist()[1]
    first = int((seq[0] != policy.pad_id).nonzero()[0])
    assert ours[0, 0, -2, first:].all() and not ours[0, 0, -2, :first].any(), "image rows: all but the pads"
    assert not ours[0, 0, first + 1, first + 2 :].any(), "text rows: causal"
    # and on a prompt without padding (longer than 128 tokens: cut, EOS last)
    long = reference_prompt(tok, "a cat " * 200)
    assert len(long) == 129 and long[-1] == tok.eos_token_id and tok.pad_token_id not in long
    seq = policy.sequence(torch.tensor([long]), canvas[:1])
    assert torch.equal(
        omni_attention_mask(seq, policy.pad_id, policy.soi_id, policy.eoi_id),
        reference_mask(seq, policy.pad_id, policy.soi_id, policy.eoi_id),
    )


def test_the_prompt_format_and_the_token_ids(folder, policy):
    tok = reference_tokenizer(folder)
    cfg = json.loads((folder / "config.json").read_text())
    llm = cfg["llm_vocab_size"]
    assert (policy.pad_id, policy.soi_id, policy.eoi_id, policy.t2i_id) == (llm, llm + 1, llm + 2, llm + 5)
    assert policy.image_offset == llm + 10 and policy.mask_token_id == cfg["vocab_size"] - 1
    assert policy.mask_id + policy.image_offset == policy.mask_token_id, (
        "a masked canvas cell is the mask token"
    )
    texts = ["a red cat", "", "a cat " * 200]
    assert policy.prompt_ids(texts).tolist() == [reference_prompt(tok, t) for t in texts]
    empty = policy.prompt_ids([""])[0].tolist()
    assert empty[-3:] == [policy.t2i_id, tok.bos_token_id, tok.eos_token_id]
    assert set(empty[:-3]) == {policy.pad_id}
    seq = policy.sequence(policy.prompt_ids(["a cat"]), torch.tensor([[3] * (T - 1) + [policy.mask_id]]))
    assert seq.shape == (1, 129 + 1 + T + 1) and seq[0, 129] == policy.soi_id and seq[0, -1] == policy.eoi_id
    assert seq[0, 130] == policy.image_offset + 3 and seq[0, -2] == policy.mask_token_id
    for bad in ("a cat <|soi|>", "[PAD] dog", "a <|endoftext|>"):
        with pytest.raises(UserError, match="reserved token"):
            policy.check_prompts([bad])


@pytest.mark.parametrize("tokens", [16, 256, 1024])
def test_the_schedule_is_the_references(tokens):
    """After step s, ⌊T·cos(π/2·(s+1)/S)⌋ stay masked (at least 1, at most one fewer than before), the
    last step reveals the rest — computed here as Show-o's t2i_generate does, for S = 1 … 60."""
    for steps in range(1, 61):
        unknown, counts = tokens, []
        for s in range(steps):
            ratio = 1.0 * (s + 1) / steps
            mask_len = int((tokens * torch.cos(torch.tensor(ratio) * math.pi * 0.5)).floor())
            mask_len = 0 if s == steps - 1 else max(1, min(unknown - 1, mask_len))
            counts.append(unknown - mask_len)
            unknown = mask_len
        assert reveal_counts(tokens, steps, "cosine") == counts, steps


def test_the_choice_temperature_compounds_as_the_references(policy):
    steps, tau, expected = 7, 1.0, []
    for s in range(steps):
        tau = tau * (1.0 - 1.0 * (s + 1) / steps)
        expected.append(tau)
    assert policy.choice_temperatures(steps).tolist() == expected
    assert expected[-1] == 0.0 and expected[1] < 1 - 2 / steps  # not the linear 1 − (s+1)/S


# ----------------------------------------------------------------------------- sampling


def test_is_a_policy_with_show_os_defaults(policy):
    assert isinstance(policy, Policy)
    d = policy.default_sampling()
    assert (d.guidance_scale, d.steps, d.reveal_order) == (5.0, 50, "confidence")
    assert policy.guidance == "(1 + s)c − s·u" and policy.layout.grid == (SHOWO_SIDE, SHOWO_SIDE)
    assert policy.image_size == 8 and policy.default_task == "geneval"


@pytest.mark.parametrize("scale,temperature", [(5.0, 1.0), (1.75, 0.8)])
def test_tokens_and_logprobs_equal_a_reveal_loop_written_here(folder, policy, scale, temperature):
    got = roll(policy, PROMPTS, 2, seed=4, guidance_scale=scale, steps=5, temperature=temperature)
    tokens, step, logp = reference_reveal_loop(folder, PROMPTS, 2, 5, scale, seed=4, temperature=temperature)
    assert torch.equal(got.tokens, tokens) and torch.equal(got.step, step)
    assert sorted(got.step[0].unique().tolist()) == [0, 1, 2, 3, 4]
    for c in CONTEXTS:
        torch.testing.assert_close(got.logp[c], logp[c], atol=1e-5, rtol=0)
    with torch.no_grad():  # teacher forcing replays the same log-probs
        for c in CONTEXTS:
            assert (policy.logprobs(got, c) - got.logp[c]).abs().max().item() < 1e-5, c


def test_cfg_scale_zero_is_conditional_only_and_negatives_are_honoured(policy):
    r = roll(policy, PROMPTS[:1], 2, seed=3, guidance_scale=0.0, steps=3)
    assert torch.allclose(r.logp["guided"], r.logp["pos"], atol=1e-6)
    assert not torch.allclose(r.logp["guided"], r.logp["neg"], atol=1e-3)
    plain = roll(policy, PROMPTS[:1], 2, seed=5, guidance_scale=5.0, steps=3)
    other = roll(policy, PROMPTS[:1], 2, seed=5, negatives=["blurry"], guidance_scale=5.0, steps=3)
    assert torch.equal(plain.state["negative_ids"], policy.prompt_ids(["", ""]))
    assert not torch.equal(other.state["negative_ids"], plain.state["negative_ids"])
    with torch.no_grad():
        assert (policy.logprobs(other, "neg") - other.logp["neg"]).abs().max().item() < 1e-5


def test_passes_of_max_rollout_batch_rows_change_no_sample(folder, policy):
    from t2i_gcpo.policies.showo import ShowoPolicy

    small = ShowoPolicy.from_pretrained(folder, max_rollout_batch=3).eval()
    a = roll(policy, PROMPTS, 3, seed=6, guidance_scale=5.0, steps=4, record_predictions=True)
    b = roll(small, PROMPTS, 3, seed=6, guidance_scale=5.0, steps=4, record_predictions=True)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.step, b.step)
    assert torch.equal(a.state["step_predictions"], b.state["step_predictions"])
    for c in CONTEXTS:
        torch.testing.assert_close(a.logp[c], b.logp[c], atol=1e-6, rtol=0)


def test_remask_estimator(folder):
    from t2i_gcpo.policies.showo import ShowoPolicy

    pol = ShowoPolicy.from_pretrained(folder, estimator="remask", remask_count=2).eval()
    ro = roll(pol, PROMPTS, 2, seed=2, guidance_scale=5.0, steps=4)
    masks = ro.state["remask"]
    assert masks.shape == (4, 2, T) and torch.equal(ro.scored, masks.any(1).float())
    with torch.no_grad():
        for c in CONTEXTS:
            assert (ro.logp[c][~masks.any(1)] == 0).all()
            assert (pol.logprobs(ro, c) - ro.logp[c]).abs().max().item() < 1e-5


@pytest.mark.parametrize("estimator", ["trajectory", "remask"])
def test_a_policy_gradient_step_moves_logprobs_with_the_advantage(folder, estimator):
    from t2i_gcpo.policies.showo import ShowoPolicy

    for sign in (1.0, -1.0):
        pol = ShowoPolicy.from_pretrained(folder, estimator=estimator)
        ro = roll(pol, PROMPTS, 2, seed=7, guidance_scale=5.0, steps=4)
        params = [p for p in pol.parameters() if p.requires_grad]
        assert params and all(any(p is q for q in pol.phi.parameters()) for p in params), "the VQ is frozen"
        opt = torch.optim.SGD(params, lr=3e-3)
        loss, _ = policy_loss(pol(ro, "pos"), ro.logp["pos"], torch.full((4,), sign), ro.loss_mask)
        opt.zero_grad()
        loss.backward()
        assert (
            pol.phi.lm_head.weight.grad is not None
            and pol.phi.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
        )
        opt.step()
        with torch.no_grad():
            new = pol.logprobs(ro, "pos")
        gain = ((new - ro.logp["pos"]) * ro.loss_mask).sum() / ro.loss_mask.sum()
        assert sign * gain > 1e-4, (sign, gain)


def test_gradient_checkpointing_gives_the_same_gradients(folder):
    from t2i_gcpo.policies.showo import ShowoPolicy

    grads = []
    for ckpt in (False, True):
        pol = ShowoPolicy.from_pretrained(folder, gradient_checkpointing=ckpt).train()
        ro = roll(pol, PROMPTS[:1], 2, seed=8, guidance_scale=5.0, steps=3)
        pol(ro, "guided").sum().backward()
        grads.append(pol.phi.model.layers[0].mlp.fc1.weight.grad.clone())
    assert pol.phi.model.gradient_checkpointing
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)


def test_lora_trains_adapters_only_and_saves_them_merged(folder, tmp_path):
    from t2i_gcpo.policies.showo import ShowoPolicy

    pol = ShowoPolicy.from_pretrained(folder, lora={"r": 4})
    trainable = [n for n, p in pol.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("self_attn.dense.lora_A" in n for n in trainable)
    ro = roll(pol, PROMPTS, 1, seed=9, guidance_scale=5.0, steps=3)
    opt = torch.optim.SGD([p for p in pol.parameters() if p.requires_grad], lr=0.5)
    pol(ro, "pos").sum().backward()
    opt.step()
    with torch.no_grad():
        after = pol.logprobs(ro, "pos")
    assert (after - ro.logp["pos"]).abs().max() > 1e-4, "the adapters moved the model"
    pol.save_pretrained(tmp_path / "merged")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "merged" / "pytorch_model.safetensors"), "pt") as f:
        assert not [k for k in f.keys() if "lora" in k or "base_layer" in k]
    back = ShowoPolicy.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        torch.testing.assert_close(back.logprobs(ro, "pos"), after, atol=1e-5, rtol=0)


def test_bfloat16_weights(folder, policy):
    from t2i_gcpo.policies.showo import ShowoPolicy

    half = ShowoPolicy.from_pretrained(folder, dtype="bfloat16").eval()
    assert (
        half.phi.lm_head.weight.dtype == torch.bfloat16
        and half.vq.decoder.conv_in.weight.dtype == torch.float32
    )
    ro = roll(half, PROMPTS, 1, seed=10, guidance_scale=5.0, steps=3)
    assert all(v.dtype == torch.float32 for v in ro.logp.values())
    with torch.no_grad():
        assert (policy.logprobs(ro, "pos") - ro.logp["pos"]).abs().max().item() < 0.1
    assert half.decode(ro).shape == (2, 3, 8, 8)


# ----------------------------------------------------------------------------- images, persistence, errors


def test_decode_and_features(policy):
    ro = roll(policy, PROMPTS, 1, seed=11, guidance_scale=5.0, steps=3)
    img = policy.decode(ro)
    assert img.shape == (2, 3, 8, 8) and img.min() >= 0 and img.max() <= 1
    expected = ((policy.vq.decode_code(ro.tokens, (SHOWO_SIDE, SHOWO_SIDE)) + 1) / 2).clamp(0, 1)
    assert torch.equal(img, expected)
    feats = policy.token_features(ro)
    assert feats.shape == (2, T, 4) and set(feats.unique().tolist()) <= {-1.0, 1.0}


def test_a_kept_reveal_order_survives_save_and_load_in_the_released_layout(folder, tmp_path):
    from t2i_gcpo.policies.showo import SAMPLING_FILE, ShowoPolicy

    fresh = ShowoPolicy.from_pretrained(folder)
    fresh.keep_reveal_order("random")
    fresh.save_pretrained(tmp_path / "trained")
    names = sorted(p.name for p in (tmp_path / "trained").iterdir())
    assert names == ["config.json", "magvitv2", "phi-1_5", "pytorch_model.safetensors", SAMPLING_FILE]
    assert json.loads((tmp_path / "trained" / "config.json").read_text()) == json.loads(
        (folder / "config.json").read_text()
    )
    back = ShowoPolicy.from_pretrained(tmp_path / "trained")
    assert back.default_sampling().reveal_order == "random"
    (tmp_path / "trained" / SAMPLING_FILE).write_text('{"reveal_order": "raster"}')
    with pytest.raises(UserError, match="unknown reveal order"):
        ShowoPolicy.from_pretrained(tmp_path / "trained")


def _copy(folder, tmp_path, name="bad"):
    dst = tmp_path / name
    shutil.copytree(folder, dst)
    return dst


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_a_missing_or_wrong_part_of_the_folder_is_one_line(folder, tmp_path):
    from t2i_gcpo.policies.showo import ShowoPolicy

    def refused(path, pattern):
        with pytest.raises(UserError, match=pattern) as e:
            ShowoPolicy.from_pretrained(path)
        assert "\n" not in str(e.value)

    refused(tmp_path / "nope", "not a directory")
    bad = _copy(folder, tmp_path, "no_vq")
    shutil.rmtree(bad / "magvitv2")
    refused(bad, "no magvitv2/ folder")
    bad = _copy(folder, tmp_path, "no_phi")
    shutil.rmtree(bad / "phi-1_5")
    refused(bad, "phi-1_5' has no config.json")
    bad = _copy(folder, tmp_path, "unknown_key")
    _edit_json(bad / "config.json", guidance_scale=3)
    refused(bad, "unknown config key 'guidance_scale'")
    bad = _copy(folder, tmp_path, "other_class")
    _edit_json(bad / "config.json", _class_name="Showo2")
    refused(bad, "expected 'Showo'")
    bad = _copy(folder, tmp_path, "vocab")
    _edit_json(bad / "config.json", vocab_size=999)
    refused(bad, "vocab_size 999 must be")
    bad = _copy(folder, tmp_path, "clip")
    _edit_json(bad / "config.json", w_clip_vit=True)
    refused(bad, "w_clip_vit")
    bad = _copy(folder, tmp_path, "width")  # a Phi config of another width than the weights
    _edit_json(bad / "phi-1_5" / "config.json", hidden_size=48, intermediate_size=96)
    refused(bad, r"tensor showo\.\S+ has shape")
    bad = _copy(folder, tmp_path, "vq_width")
    _edit_json(bad / "magvitv2" / "config.json", ch=64)
    refused(bad, r"tensor \S+ has shape")
    bad = _copy(folder, tmp_path, "vq_codes")
    _edit_json(bad / "magvitv2" / "config.json", z_channels=5)
    refused(bad, "shape|codes")
    bad = _copy(folder, tmp_path, "no_weights")
    (bad / "pytorch_model.safetensors").unlink()
    refused(bad, "no Show-o weights")
    bad = _copy(folder, tmp_path, "remote_phi")
    _edit_json(bad / "phi-1_5" / "config.json", model_type="phi-msft")
    refused(bad, "model_type 'phi-msft'")


def test_nothing_in_the_folder_is_executed(folder, tmp_path):
    """Python files and auto_map entries in the folder are never imported: the Phi config's auto_map is
    dropped, the tokenizer is read with trust_remote_code=False (refused in one line when
    it asks for code)."""
    from t2i_gcpo.policies.showo import ShowoPolicy

    bad = _copy(folder, tmp_path, "code")
    marker = tmp_path / "ran.txt"
    payload = f"open({str(marker)!r}, 'w').write('ran')\n"
    for name in (
        "modeling_showo.py",
        "phi-1_5/modeling_phi.py",
        "phi-1_5/configuration_phi.py",
        "phi-1_5/tokenization_phi.py",
        "magvitv2/modeling_magvitv2.py",
    ):
        (bad / name).write_text(payload)
    _edit_json(
        bad / "phi-1_5" / "config.json",
        auto_map={
            "AutoConfig": "configuration_phi.PhiConfig",
            "AutoModelForCausalLM": "modeling_phi.PhiForCausalLM",
        },
    )
    ShowoPolicy.from_pretrained(bad)  # loads, ignoring them
    _edit_json(
        bad / "phi-1_5" / "tokenizer_config.json",
        auto_map={"AutoTokenizer": ["tokenization_phi.PhiTok", None]},
        tokenizer_class="PhiTok",
    )
    with pytest.raises(UserError) as e:
        ShowoPolicy.from_pretrained(bad)
    assert "\n" not in str(e.value)
    assert not marker.exists()


def test_a_batch_samples_each_prompt_as_alone_and_the_steps_record_the_predictions(policy):
    s = dataclasses.replace(policy.default_sampling(), steps=4, record_predictions=True)
    ro = policy.rollout([PromptRecord(p) for p in PROMPTS], 2, s, gens(12, 2))
    x = ro.state["step_predictions"]
    assert x.shape == (4, 4, T) and torch.equal(x[:, -1], ro.tokens) and (x != policy.mask_id).all()
    for k in range(4):
        assert torch.equal(x[:, k][ro.step <= k], ro.tokens[ro.step <= k])
