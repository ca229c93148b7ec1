"""LlamaGenPolicy on a tiny random LlamaGen release (tests/llamagen_fixtures.py), offline.

What is checked: the sampler's recorded log-probs equal a teacher-forced forward written here from the
released state dict alone (T5 features left-padded with the padding masked and the diagonal kept, the 2D
rotary table with zero caption positions, the null caption's learned embedding under the same mask, CFG on the
first token too, cfg_interval), with CFG on and off; the static and (stand-in) graph loops draw the eager
loop's tokens; the VQ decodes l2-normalised code vectors laid out [B, 8, h, w]; the loader refuses a pickle
holding anything but tensors (nothing in it runs), a C2I checkpoint, a missing T5 folder, shapes no size has;
LoRA, checkpointing, save → reload.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from t2i_gcpo.config import ModelOptions
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import PromptRecord, SamplingParams
from t2i_gcpo.policies.registry import load_policy, split_spec
from t2i_gcpo.tasks.loop import group_generators

import llamagen_fixtures as fx
from capture_standin import StandInCuda

TOL = 1e-4  # float32; the tiny model's logits are of order 10
PROMPTS = fx.PROMPTS  # different lengths: left padding


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    return fx.build_tiny_llamagen(tmp_path_factory.mktemp("llamagen") / "release")


@pytest.fixture(scope="module")
def policy(release):
    return load_policy(f"llamagen:{release}").eval()


def roll(policy, texts=PROMPTS, group=2, seed=0, **sampling):
    base = dataclasses.replace(policy.default_sampling(), temperature=0.8)
    return policy.rollout(
        [PromptRecord(t) for t in texts],
        group,
        dataclasses.replace(base, **sampling),
        group_generators(seed, "llamagen", range(len(texts))),
    )


def copy_release(release: Path, dest: Path) -> Path:
    shutil.copytree(release, dest)
    return dest


# ----------------------------------------------------------------------------- an independent forward
def reference_features(release: Path, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_t2i.py's caption input: T5 features of the (already clean) prompts, padded to L, then the valid
    rows moved to the end and the rest zeroed; the mask flipped with them."""
    from transformers import AutoTokenizer, T5EncoderModel

    tok = AutoTokenizer.from_pretrained(release / "flan-t5-xl")
    enc = T5EncoderModel.from_pretrained(release / "flan-t5-xl").eval()
    batch = tok(texts, max_length=fx.CAPTION_LEN, padding="max_length", truncation=True, return_tensors="pt")
    with torch.no_grad():
        h = enc(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    feats, mask = torch.zeros_like(h), torch.zeros(h.shape[:2], dtype=torch.bool)
    for i, n in enumerate(batch["attention_mask"].sum(1).tolist()):
        feats[i, fx.CAPTION_LEN - n :], mask[i, fx.CAPTION_LEN - n :] = h[i, :n], True
    return feats, mask


def reference_logits(
    state: dict, feats: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor, null: bool
) -> torch.Tensor:
    """gpt.py's teacher-forced forward spelled out on the state dict: logits [N, T, K] of
    the T image tokens."""
    L, heads, grid = fx.CAPTION_LEN, fx.HEADS, fx.GRID
    n, T = tokens.shape
    fc1, fc2 = state["cls_embedding.cap_proj.fc1.weight"], state["cls_embedding.cap_proj.fc2.weight"]
    caption = state["cls_embedding.uncond_embedding"].expand(n, -1, -1) if null else feats
    x = torch.cat(
        [F.gelu(caption @ fc1.T, approximate="tanh") @ fc2.T, state["tok_embeddings.weight"][tokens[:, :-1]]],
        1,
    )
    S, dim = x.shape[1], x.shape[2]
    hd = dim // heads
    # the rotary angle of each position and pair: 0 for the caption (cos = sin = 0 there), image token k in
    # grid cell (k // grid, k % grid): its first hd/4 pairs turn by row·θ_i, the last hd/4 by column·θ_i
    cos, sin = torch.zeros(S, hd // 2), torch.zeros(S, hd // 2)
    for pos in range(L, S):
        row, col = divmod(pos - L, grid)
        for i in range(hd // 2):
            theta = 10000.0 ** (-(2 * (i % (hd // 4))) / (hd // 2))
            angle = (row if i < hd // 4 else col) * theta
            cos[pos, i], sin[pos, i] = torch.cos(torch.tensor(angle)), torch.sin(torch.tensor(angle))

    def rope(v):  # [n, S, H, hd], pairs (2i, 2i + 1)
        a, b = v[..., 0::2], v[..., 1::2]
        c, s = cos[None, :, None], sin[None, :, None]
        return torch.stack([a * c - b * s, b * c + a * s], -1).flatten(-2)

    def rms(v, w):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    keys = torch.cat([mask, torch.ones(n, S - L, dtype=torch.bool)], 1)  # [n, S]
    j, p = torch.arange(S)[None, :], torch.arange(S)[:, None]
    visible = ((j <= p)[None] & keys[:, None, :]) | (j == p)[None]  # [n, query, key]
    for i in range(fx.LAYERS):
        pre = f"layers.{i}."
        h = rms(x, state[pre + "attention_norm.weight"])
        q, k, v = (h @ state[pre + "attention.wqkv.weight"].T).split(dim, -1)
        q, k, v = (t.reshape(n, S, heads, hd) for t in (q, k, v))
        q, k = rope(q), rope(k)
        scores = torch.einsum("nqhd,nkhd->nhqk", q, k) / hd**0.5
        scores = scores.masked_fill(~visible[:, None], float("-inf"))
        attn = torch.einsum("nhqk,nkhd->nqhd", scores.softmax(-1), v).reshape(n, S, dim)
        x = x + attn @ state[pre + "attention.wo.weight"].T
        h = rms(x, state[pre + "ffn_norm.weight"])
        w1, w2, w3 = (state[pre + f"feed_forward.{w}.weight"] for w in ("w1", "w2", "w3"))
        x = x + (F.silu(h @ w1.T) * (h @ w3.T)) @ w2.T
    return (rms(x, state["norm.weight"]) @ state["output.weight"].T)[:, L - 1 :]


def reference_logprobs(release, rollout, cfg_interval: int = -1) -> dict[str, torch.Tensor]:
    state = torch.load(release / fx.GPT_NAME, weights_only=False)["model"]
    from t2i_gcpo.policies.llamagen_t5 import clean_caption

    assert all(clean_caption(t) == t for t in rollout.texts)  # these prompts are clean already
    feats, mask = reference_features(release, rollout.texts)
    c = reference_logits(state, feats, mask, rollout.tokens, null=False)
    u = reference_logits(state, feats, mask, rollout.tokens, null=True)
    s = torch.full((rollout.tokens.shape[1],), rollout.sampling.guidance_scale)
    if cfg_interval >= 0:  # generate.py: decode step i (token i + 1) unguided once i > cfg_interval
        s[cfg_interval + 2 :] = 1.0
    temperature = rollout.sampling.temperature
    out = {}
    for name, z in (("pos", c), ("neg", u), ("guided", u + s[None, :, None] * (c - u))):
        out[name] = (z / temperature).log_softmax(-1).gather(-1, rollout.tokens[..., None]).squeeze(-1)
    return out


@pytest.mark.parametrize("cfg", ["guided", "unguided"])
def test_recorded_logprobs_equal_a_forward_written_from_the_state_dict(release, policy, cfg):
    """CFG on (s = 7.5, the first token guided too) and off (s = 1, nothing reading the contrast: only the
    conditional rows run, no "neg" is recorded)."""
    sampling = {} if cfg == "guided" else {"guidance_scale": 1.0, "score_negative": False}
    ro = roll(policy, **sampling)
    want = reference_logprobs(release, ro)
    assert set(ro.logp) == ({"pos", "neg", "guided"} if cfg == "guided" else {"pos", "guided"})
    for name, recorded in ro.logp.items():
        assert (recorded - want[name]).abs().max().item() < TOL, name
        with torch.no_grad():
            assert (policy.logprobs(ro, name) - want[name]).abs().max().item() < TOL, name
    if cfg == "guided":
        assert (ro.logp["guided"][:, 0] - ro.logp["pos"][:, 0]).abs().max() > 1e-2  # the prefill is guided
    else:
        assert torch.equal(ro.logp["pos"], ro.logp["guided"])
        with torch.no_grad():  # the null caption is there to score all the same
            assert (policy.logprobs(ro, "neg") - want["neg"]).abs().max().item() < TOL


def test_cfg_interval_leaves_the_later_tokens_unguided(release):
    policy = load_policy(f"llamagen:{release}", ModelOptions(cfg_interval=1)).eval()
    ro = roll(policy, seed=3)
    want = reference_logprobs(release, ro, cfg_interval=1)
    for name, recorded in ro.logp.items():
        assert (recorded - want[name]).abs().max().item() < TOL, name
        with torch.no_grad():
            assert (policy.logprobs(ro, name) - want[name]).abs().max().item() < TOL, name
    guided_gap = (ro.logp["guided"] - ro.logp["pos"]).abs()
    assert guided_gap[:, :3].min() > 1e-3 and guided_gap[:, 3:].max() < 1e-5  # tokens 0, 1, 2 guided
    static = roll(policy, seed=3, decode="static")
    assert torch.equal(static.tokens, ro.tokens)


# ----------------------------------------------------------------------------- the decode loops
SAMPLINGS = {
    "cfg": {},
    "truncated": {"guidance_scale": 4.0, "top_k": 5, "top_p": 0.9},
    "unguided": {"guidance_scale": 1.0, "score_negative": False},
}


@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_static_loop_draws_the_eager_loops_tokens(policy, name):
    eager = roll(policy, group=3, seed=5, **SAMPLINGS[name])
    static = roll(policy, group=3, seed=5, decode="static", **SAMPLINGS[name])
    assert policy.last_decode["mode"] == "static" and policy.last_decode["steps"] == fx.GRID**2 - 1
    assert torch.equal(eager.tokens, static.tokens)
    for c in eager.logp:
        torch.testing.assert_close(eager.logp[c], static.logp[c], atol=TOL, rtol=0)


def test_graph_loop_captures_once_and_replays_the_eager_tokens(release, monkeypatch):
    """rollout.decode=graph with a stand-in for the CUDA graph on the CPU (tests/capture_standin.py): spans of
    4 slots captured after a real step each, then replayed; a second pass replays only; the
    tokens are eager's."""
    policy = load_policy(f"llamagen:{release}").eval()
    eager = roll(policy, seed=6)
    monkeypatch.setattr("t2i_gcpo.policies.llamagen.resolve_mode", lambda *args: "graph")
    with StandInCuda().installed(span=4) as fake:
        first = roll(policy, seed=6)
        captured = fake.captures
        second = roll(policy, seed=6)
    L, T = fx.CAPTION_LEN, fx.GRID**2
    assert captured == len(range(L + 4, L + T + 1, 4)) and fake.captures == captured  # no capture in pass 2
    assert policy.last_decode["replays"] == T - 1 and policy.decode_session.stats["allocations"] == 1
    for got in (first, second):
        assert torch.equal(got.tokens, eager.tokens)
        torch.testing.assert_close(got.logp["guided"], eager.logp["guided"], atol=TOL, rtol=0)


def test_a_sample_does_not_depend_on_the_rollout_batch(policy):
    whole = roll(policy, seed=7, group=3)
    policy.max_rollout_batch = 2
    try:
        parts = roll(policy, seed=7, group=3)
        static = roll(policy, seed=7, group=3, decode="static")
    finally:
        policy.max_rollout_batch = None
    assert torch.equal(whole.tokens, parts.tokens) and torch.equal(whole.tokens, static.tokens)


def test_continuations_reproduce_their_root_with_and_without_the_null_rows(policy):
    for sampling in ({}, {"guidance_scale": 1.0, "score_negative": False}):
        ro = roll(policy, group=1, seed=8, **sampling)
        points = torch.tensor([[0, 5], [3, -1]])
        keys = [0, 0, 1]
        br = policy.branch(ro, points, 1, group_generators(8, "llamagen", keys))
        base = ro.select(br.root)
        assert torch.equal(br.rollout.tokens, base.tokens) and set(br.rollout.logp) == set(ro.logp)
        for c in ro.logp:
            torch.testing.assert_close(br.rollout.logp[c], base.logp[c], atol=TOL, rtol=0)
        other = policy.branch(ro, points, 2, group_generators(9, "other", range(6)))
        for j, t in enumerate(other.point.tolist()):  # the prefix kept, the rest re-drawn
            assert torch.equal(other.rollout.tokens[j, :t], ro.tokens[other.root[j], :t])
        assert not torch.equal(other.rollout.tokens[0::2], other.rollout.tokens[1::2])


# ----------------------------------------------------------------------------- captions, images
def test_captions_are_left_padded_t5_features_of_the_cleaned_prompt(release, policy):
    from t2i_gcpo.policies.llamagen_t5 import clean_caption

    feats, mask = policy.captions(PROMPTS)
    want, want_mask = reference_features(release, PROMPTS)
    assert torch.equal(mask, want_mask) and (feats - want).abs().max() < 1e-5
    assert mask[:, -1].all() and not mask[0, 0] and (feats[~mask] == 0).all()
    n = policy.tokenizer(PROMPTS[0])["input_ids"]
    assert int(mask[0].sum()) == len(n) and n[-1] == 1  # the words and T5's EOS
    assert clean_caption("  A  Photo of a RED+cat!  ") == "a photo of a red cat!"
    assert clean_caption("a dog (left) & a cat") == "a dog left a cat"
    assert clean_caption("a photo of a bench") == "a photo of a bench"
    # the outputs of LlamaGen's own language/t5.py clean_caption (run once outside the suite, ftfy.fix_text
    # stubbed as the identity; it and this code also gave the same text for all 1,618 DPG-Bench
    # and GenEval prompts)
    cases = {
        "Visit http://x.com/a for <b>bold</b> cats": "visit for bold cats",
        "this-is-my-cute-cat_yes": "this is my cute cat yes",
        "café — “nice” ‘x’ ...end": "café - \"nice\" 'x' end",
        "@user hi #12 at 192.168.0.1, page 3": "hi at",
        "a 1024x768 jpg image of IMG1234.png": "a of",
        "A photo of a Red Cat.": "a photo of a red cat.",
    }
    assert {t: clean_caption(t) for t in cases} == cases
    upper, _ = policy.captions(["A Photo Of A Red Cat"])  # T5 is case-sensitive: the cleaning lower-cases
    assert torch.equal(upper[0], feats[0])


def test_the_caption_cache_is_bounded_and_a_call_may_hold_more_prompts(policy, monkeypatch):
    from t2i_gcpo.policies import llamagen_t5

    monkeypatch.setattr(llamagen_t5, "CACHE", 3)
    captions = policy.frozen.captions
    texts = [f"a photo of {n} cats" for n in ("two", "three", "four")] + PROMPTS + ["a red car"]
    feats, mask = captions.features(texts)  # six prompts, a cache of three
    assert len(captions._cache) == 3 and list(captions._cache) == texts[-3:]
    for i, text in enumerate(texts):  # each row is what the prompt alone gives
        one, one_mask = captions.features([text])
        assert torch.equal(one_mask[0], mask[i]) and torch.allclose(one[0], feats[i], atol=1e-6)


def test_decode_reads_l2_normalised_code_vectors(policy):
    ro = roll(policy, seed=9)
    seen = []
    hook = policy.vq.post_quant_conv.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    try:
        images = policy.decode(ro)
    finally:
        hook.remove()
    table = F.normalize(policy.vq.quantize.embedding.weight, dim=-1)
    want = table[ro.tokens].reshape(len(ro), fx.GRID, fx.GRID, fx.CODE_DIM).permute(0, 3, 1, 2)
    assert seen[0].shape == (len(ro), fx.CODE_DIM, fx.GRID, fx.GRID) and torch.allclose(seen[0], want)
    assert images.shape == (len(ro), 3, 2 * fx.GRID, 2 * fx.GRID) and 0 <= images.min() <= images.max() <= 1
    assert torch.allclose(policy.token_features(ro), table[ro.tokens])
    assert policy.image_size == 8 and policy.layout.grid == (fx.GRID, fx.GRID)


def test_defaults_and_size(policy):
    assert policy.default_sampling() == SamplingParams(guidance_scale=7.5, top_k=1000)  # sample_t2i.py's
    assert policy.guidance == "u + s(c − u)" and policy.default_task == "geneval"
    assert policy.config.size == fx.TINY_SIZE and policy.config.caption_len == fx.CAPTION_LEN


# ----------------------------------------------------------------------------- loading
def test_released_nestings_load_alike(release, policy, tmp_path):
    """{"model": …} with the training's optimizer, steps and argparse args; a bare state dict; safetensors."""
    from safetensors.torch import save_file

    ro = roll(policy, seed=10)
    state = torch.load(release / fx.GPT_NAME, weights_only=False)["model"]
    for name, write in (
        ("bare", lambda p: torch.save(state, p.with_suffix(".pt"))),
        ("safetensors", lambda p: save_file(state, p.with_suffix(".safetensors"))),
    ):
        folder = copy_release(release, tmp_path / name)
        os.remove(folder / fx.GPT_NAME)
        write(folder / Path(fx.GPT_NAME).stem)
        other = load_policy(f"llamagen:{folder}").eval()
        with torch.no_grad():
            assert torch.equal(other.logprobs(ro, "guided"), policy.logprobs(ro, "guided")), name
    assert split_spec(str(release))[0] == "llamagen"  # the release is found by its files


def test_a_pickle_holding_more_than_tensors_is_refused_and_nothing_in_it_runs(release, tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    folder = copy_release(release, tmp_path / "evil")
    torch.save({"model": fx.gpt_state(), "extra": Payload()}, folder / fx.GPT_NAME)
    with pytest.raises(UserError) as err:
        load_policy(f"llamagen:{folder}")
    message = str(err.value)
    assert "holds more than weights" in message and "never runs" in message and "\n" not in message
    assert not marker.exists()


def _gpt(folder: Path, state: dict) -> Path:
    torch.save({"model": state}, folder / fx.GPT_NAME)
    return folder


@pytest.mark.parametrize(
    "change, message",
    [
        ("c2i", "class-conditional (C2I) LlamaGen checkpoint"),
        ("no_t5", "no FLAN-T5 folder in"),
        ("no_size", "match no LlamaGen size"),
        ("vq_as_gpt", "is not a LlamaGen text-to-image GPT checkpoint: no tok_embeddings.weight"),
        ("damaged", "(truncated or damaged file?)"),
        ("no_vq", "no VQ tokenizer in"),
        ("two_gpts", "2 GPT checkpoints: name one"),
        ("unnamed", "cannot tell the image size of t2i_tiny.pt"),
        ("wide_t5", "gives features of width 24, the GPT takes 16"),
        ("gpt_size", "has dim 32 and 2 layers, but GPT-XL has dim 1280 and 36"),
        ("nan", "holds 1 NaN/inf values"),
    ],
)
def test_what_is_not_a_t2i_release_is_one_line(release, tmp_path, change, message):
    folder = copy_release(release, tmp_path / change)
    options = ModelOptions()
    if change == "c2i":
        state = fx.gpt_state()
        del state["cls_embedding.cap_proj.fc1.weight"], state["cls_embedding.cap_proj.fc2.weight"]
        del state["cls_embedding.uncond_embedding"]
        state["cls_embedding.embedding_table.weight"] = torch.zeros(1001, fx.DIM)
        _gpt(folder, state)
    elif change == "no_t5":
        shutil.rmtree(folder / "flan-t5-xl")
    elif change == "no_size":
        _gpt(folder, fx.gpt_state(dim=48, heads=4))
    elif change == "vq_as_gpt":
        _gpt(folder, fx.vq_state())
    elif change == "damaged":
        (folder / fx.GPT_NAME).write_bytes((folder / fx.GPT_NAME).read_bytes()[:3000])
    elif change == "no_vq":
        os.remove(folder / "vq_ds16_t2i.pt")
    elif change == "two_gpts":
        shutil.copy(folder / fx.GPT_NAME, folder / "t2i_tiny_stage2_16.pt")
    elif change == "unnamed":
        os.rename(folder / fx.GPT_NAME, folder / "t2i_tiny.pt")
    elif change == "wide_t5":
        shutil.rmtree(folder / "flan-t5-xl")
        fx.write_t5(folder / "flan-t5-xl", d_model=24)
    elif change == "gpt_size":
        options = ModelOptions(gpt_size="GPT-XL")
    elif change == "nan":
        state = fx.gpt_state()
        state["norm.weight"][3] = float("nan")
        _gpt(folder, state)
    with pytest.raises(UserError) as err:
        load_policy(f"llamagen:{folder}", options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_named_gpt_file_and_image_size_load(release, policy, tmp_path):
    folder = copy_release(release, tmp_path / "named")
    os.rename(folder / fx.GPT_NAME, folder / "t2i_tiny.pt")
    shutil.copy(folder / "t2i_tiny.pt", folder / "t2i_other.pt")
    other = load_policy(f"llamagen:{folder / 't2i_tiny.pt'}", ModelOptions(image_size=8)).eval()
    ro = roll(policy, seed=11)
    with torch.no_grad():
        assert torch.equal(other.logprobs(ro, "pos"), policy.logprobs(ro, "pos"))


# ----------------------------------------------------------------------------- training, saving
def _pg_step(pol, ro, opt) -> None:
    loss = -pol(ro, "pos").mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_train_step_then_save_and_reload(release, tmp_path):
    from safetensors.torch import load_file

    pol = load_policy(f"llamagen:{release}")
    ro = roll(pol, seed=12)
    frozen = [p for p in pol.parameters() if not p.requires_grad]
    assert not frozen and not pol.gpt.cls_embedding.uncond_embedding.requires_grad  # a buffer, never trained
    assert not any(p.requires_grad for p in pol.vq.parameters())
    with torch.no_grad():
        before = pol.logprobs(ro, "pos")
    pol.train()
    _pg_step(pol, ro, torch.optim.SGD([p for p in pol.parameters() if p.requires_grad], lr=1e-2))
    with torch.no_grad():
        after = pol.logprobs(ro, "pos")
    assert after.mean() > before.mean() + 0.01
    pol.save_pretrained(tmp_path / "saved")
    keys = set(load_file(tmp_path / "saved" / "gpt.safetensors"))
    assert keys == set(fx.gpt_state())  # the released names, and nothing else
    meta = json.loads((tmp_path / "saved" / "llamagen.json").read_text())
    assert meta["gpt_size"] == fx.TINY_SIZE and meta["image_size"] == 8
    assert split_spec(str(tmp_path / "saved"))[0] == "llamagen"
    again = load_policy(str(tmp_path / "saved")).eval()
    with torch.no_grad():
        assert (again.logprobs(ro, "pos") - after).abs().max().item() < 1e-6
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "saved", moved)
    meta["t5"] = str(tmp_path / "nowhere")
    (moved / "llamagen.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="names the T5 folder"):
        load_policy(str(moved))
    shutil.copytree(release / "flan-t5-xl", moved / "t5")  # a t5/ folder beside the weights is used first
    assert load_policy(str(moved)).image_size == 8


def test_lora_and_gradient_checkpointing(release, tmp_path):
    torch.manual_seed(0)  # peft draws A from the global generator: the same adapters whatever ran before
    pol = load_policy(f"llamagen:{release}", ModelOptions(lora_rank=4, gradient_checkpointing=True))
    trainable = {n for n, p in pol.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert any(".attention.wqkv.lora_A" in n for n in trainable) and any(
        ".attention.wo." in n for n in trainable
    )
    base = pol.gpt.layers[0].attention.wqkv.base_layer.weight.clone()
    pol.train()
    ro = roll(pol, seed=13)
    assert pol.training
    opt = torch.optim.Adam([p for p in pol.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):  # B starts at 0: the second step moves A too
        _pg_step(pol, ro, opt)
    assert torch.equal(pol.gpt.layers[0].attention.wqkv.base_layer.weight, base)
    after = roll(pol, seed=13)  # the fused decoder samples with the adapters merged into its copies
    with torch.no_grad():
        tuned = pol.logprobs(after, "guided")
    # float rounding of peaked logits times s = 7.5 (measured up to 1.6e-4); unmerged adapters: off by ≈ 15
    assert (tuned - after.logp["guided"]).abs().max().item() < 1e-3
    pol.save_pretrained(tmp_path / "merged")
    merged = load_policy(str(tmp_path / "merged")).eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        assert (merged.logprobs(after, "pos") - pol.logprobs(after, "pos")).abs().max().item() < TOL
        assert (merged.logprobs(after, "guided") - tuned).abs().max().item() < 1e-3
