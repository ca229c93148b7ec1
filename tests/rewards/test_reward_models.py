"""The model rewards against their references, on tiny random weights of the same architectures
(tests/tiny_models.py): each score equals the reference's computation written out here independently
(the reference repositories' own steps: t2i_gcpo/rewards/<name>.py names each), and each preprocessing
equals the reference's on a non-square image."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards.registry import build_reward

from tiny_models import (
    BLIP_SIZE,
    PICK_SIZE,
    TINY_AESTHETIC_CLIP,
    TINY_HPS,
    build_tiny_aesthetic,
    build_tiny_blip_vqa,
    build_tiny_hps,
    build_tiny_pickscore,
)

OPENAI_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
OPENAI_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)
PROMPTS = ["a red circle", "a blue photo of a circle", "red"]


def samples(n: int = 3, h: int = 40, w: int = 56, seed: int = 0) -> torch.Tensor:
    """[n, 3, h, w] in [0, 1], non-square, smooth enough that resampling matters."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(n, 3, h // 4, w // 4, generator=g)
    return torch.nn.functional.interpolate(low, size=(h, w), mode="bilinear", align_corners=False).clamp(0, 1)


def as_pil(images: torch.Tensor) -> list[Image.Image]:
    arr = (images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return [Image.fromarray(a) for a in arr]


def normalise(x: np.ndarray) -> torch.Tensor:
    """HWC uint8 → CHW float32, CLIP's mean and std."""
    return torch.from_numpy(
        ((x.astype(np.float32) / 255.0 - OPENAI_MEAN) / OPENAI_STD).transpose(2, 0, 1).copy()
    )


# ----------------------------------------------------------------------------- PickScore
@pytest.fixture(scope="module")
def pick_dir(tmp_path_factory):
    return build_tiny_pickscore(tmp_path_factory.mktemp("pickscore") / "PickScore_v1")


def hf_clip_pixels(image: Image.Image, size: int) -> torch.Tensor:
    """transformers 4.27's CLIPImageProcessor, step by step: short side to `size` (long side int(size·long/
    short)) by PIL bicubic, centre crop with floor offsets, ×1/255, CLIP's mean and std."""
    w, h = image.size
    if w <= h:
        new = (size, int(size * h / w))
    else:
        new = (int(size * w / h), size)
    x = np.asarray(image.resize(new, Image.Resampling.BICUBIC))
    top, left = (x.shape[0] - size) // 2, (x.shape[1] - size) // 2
    return normalise(x[top : top + size, left : left + size])


def test_pickscore_is_the_readme_computation(pick_dir):
    from transformers import AutoTokenizer, CLIPModel

    reward = build_reward(f"pickscore:{pick_dir},batch_size=2")
    images = samples()
    out = reward(images, PROMPTS, [{}] * 3)

    pixels = torch.stack([hf_clip_pixels(im, PICK_SIZE) for im in as_pil(images)])
    assert torch.allclose(reward.inner.pixel_values(as_pil(images)), pixels, atol=1e-6)  # non-square input

    model = CLIPModel.from_pretrained(pick_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(pick_dir)
    with torch.no_grad():  # the README: features / their norm, logit_scale.exp() · text @ image.T
        image_embs = model.get_image_features(pixel_values=pixels)
        image_embs = getattr(image_embs, "pooler_output", image_embs)
        image_embs = image_embs / torch.norm(image_embs, dim=-1, keepdim=True)
        text = tokenizer(PROMPTS, padding=True, truncation=True, max_length=77, return_tensors="pt")
        text_embs = model.get_text_features(**text)
        text_embs = getattr(text_embs, "pooler_output", text_embs)
        text_embs = text_embs / torch.norm(text_embs, dim=-1, keepdim=True)
        want = model.logit_scale.exp() * (text_embs @ image_embs.T).diagonal()
    assert torch.allclose(out.scores, want, atol=1e-5)
    assert out.scores.std() > 0 and [d["cosine"] for d in out.details] == pytest.approx(
        (want / model.logit_scale.exp()).tolist(), abs=1e-5
    )


def test_pickscore_folder_checks(tmp_path, pick_dir):
    (tmp_path / "file").write_text("x")
    for spec, match in [
        (f"pickscore:{tmp_path}/none", "does not exist"),
        (f"pickscore:{tmp_path}/file", "is a file, expected a folder"),
        (f"pickscore:{tmp_path}", "holds no config.json"),
        (f"pickscore:{pick_dir},batch_size=0", r"batch_size must be in \[1, 4096\], got 0"),
        (f"pickscore:{pick_dir},batch=2", "no option 'batch'"),
    ]:
        with pytest.raises(UserError, match=match):
            build_reward(spec)
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        (bare / f).write_bytes((pick_dir / f).read_bytes())
    with pytest.raises(UserError, match="processor=FOLDER"):
        build_reward(f"pickscore:{bare}")
    assert build_reward(f"pickscore:{bare},processor={pick_dir}").name == "pickscore"


# ----------------------------------------------------------------------------- HPSv2
@pytest.fixture(scope="module")
def hps_file(tmp_path_factory):
    return build_tiny_hps(tmp_path_factory.mktemp("hps") / "HPS_v2.1_compressed.pt")


def hps_val_transform(image: Image.Image, size: int) -> torch.Tensor:
    """HPSv2's preprocess_val (light_augmentation=True): RGB, ToTensor, ResizeMaxSize (long side to `size`,
    bicubic on the tensor, pad with 0: left/top the floor half), Normalize."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as TF

    x = T.ToTensor()(image.convert("RGB"))
    h, w = x.shape[1:]
    scale = size / float(max(h, w))
    new = tuple(round(d * scale) for d in (h, w))
    x = TF.resize(x, new, T.InterpolationMode.BICUBIC)
    ph, pw = size - new[0], size - new[1]
    x = TF.pad(x, padding=[pw // 2, ph // 2, pw - pw // 2, ph - ph // 2], fill=0)
    return T.Normalize(OPENAI_MEAN.tolist(), OPENAI_STD.tolist())(x)


def test_hps_is_img_score(hps_file):
    import open_clip

    reward = build_reward(f"hps:{hps_file},arch={TINY_HPS},batch_size=2")
    images = samples()
    out = reward(images, PROMPTS, [{}] * 3)

    pixels = torch.stack([hps_val_transform(im, 28) for im in as_pil(images)])
    got = reward.inner.pixel_values(as_pil(images))
    assert got.shape == (3, 3, 28, 28) and torch.allclose(got, pixels, atol=1e-6)
    assert (
        got[:, :, :4] == torch.tensor(-OPENAI_MEAN / OPENAI_STD)[:, None, None]
    ).all()  # black padding on top

    model = open_clip.create_model(TINY_HPS, pretrained=None, output_dict=True)
    model.load_state_dict(torch.load(hps_file, weights_only=True)["state_dict"])
    model.eval()
    tokenizer = open_clip.get_tokenizer(TINY_HPS)
    with torch.no_grad():  # img_score.py: one image and its prompt at a time, the diagonal of image @ text.T
        want = []
        for px, prompt in zip(pixels, PROMPTS):
            o = model(px[None], tokenizer([prompt]))
            want.append(torch.diagonal(o["image_features"] @ o["text_features"].T)[0])
    assert torch.allclose(out.scores, torch.stack(want), atol=1e-5) and out.scores.std() > 0


def test_hps_checkpoint_checks(tmp_path, hps_file):
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    torch.save({"state_dict": {"visual.proj": torch.zeros(2)}}, tmp_path / "other.pt")
    for spec, match in [
        (f"hps:{tmp_path}", "is a folder, expected a file"),
        (f"hps:{tmp_path}/none.pt", "does not exist"),
        (f"hps:{tmp_path}/bad.pt,arch={TINY_HPS}", "cannot read the HPS checkpoint"),
        (f"hps:{tmp_path}/other.pt,arch={TINY_HPS}", "is not an HPS checkpoint.*missing"),
        (f"hps:{hps_file},arch=ViT-Nope", "unknown open_clip architecture"),
        (f"hps:{hps_file},antialias=maybe", "expected true or false"),
    ]:
        with pytest.raises(UserError, match=match):
            build_reward(spec)


# ----------------------------------------------------------------------------- aesthetic
@pytest.fixture(scope="module")
def aesthetic_files(tmp_path_factory):
    return build_tiny_aesthetic(tmp_path_factory.mktemp("aesthetic"))


def test_aesthetic_is_simple_inference(aesthetic_files):
    import open_clip
    import torchvision.transforms as T

    clip_path, head_path = aesthetic_files
    assert "+" in head_path.name  # the released file's name: a '+' inside a term, not a sum
    reward = build_reward(f"aesthetic:{clip_path},{head_path},clip_model={TINY_AESTHETIC_CLIP}")
    images = samples()
    out = reward(images, PROMPTS, [{}] * 3)

    # clip.load's preprocess: Resize(n, bicubic), CenterCrop(n), RGB, ToTensor, Normalize
    preprocess = T.Compose(
        [
            T.Resize(28, interpolation=T.InterpolationMode.BICUBIC),
            T.CenterCrop(28),
            lambda im: im.convert("RGB"),
            T.ToTensor(),
            T.Normalize(OPENAI_MEAN.tolist(), OPENAI_STD.tolist()),
        ]
    )
    pixels = torch.stack([preprocess(im) for im in as_pil(images)])
    assert torch.allclose(reward.inner.pixel_values(as_pil(images)), pixels, atol=1e-6)

    clip = open_clip.create_model(TINY_AESTHETIC_CLIP, pretrained=None)  # QuickGELU, as OpenAI's ViT-L/14
    clip.load_state_dict(torch.load(clip_path, weights_only=True))
    clip.eval()
    mlp = torch.nn.Sequential(
        torch.nn.Linear(16, 24),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(24, 12),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(12, 8),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(8, 4),
        torch.nn.Linear(4, 1),
    )
    mlp.load_state_dict(
        {k.removeprefix("layers."): v for k, v in torch.load(head_path, weights_only=True).items()}
    )
    mlp.eval()
    with torch.no_grad():
        features = clip.encode_image(pixels).numpy()
        l2 = np.atleast_1d(np.linalg.norm(features, 2, -1))  # simple_inference.py's `normalized`
        l2[l2 == 0] = 1
        want = mlp(torch.from_numpy(features / l2[:, None]).float())[:, 0]
    assert torch.allclose(out.scores, want, atol=1e-5) and out.scores.std() > 0


def test_aesthetic_head_checks(tmp_path, aesthetic_files):
    clip_path, head_path = aesthetic_files
    torch.save({"fc.weight": torch.zeros(1, 16)}, tmp_path / "head.pth")
    wide = {k: v for k, v in torch.load(head_path, weights_only=True).items()}
    wide["layers.0.weight"] = torch.zeros(24, 32)
    torch.save(wide, tmp_path / "wide.pth")
    opts = f"clip_model={TINY_AESTHETIC_CLIP}"
    for spec, match in [
        (f"aesthetic:{clip_path}", "HEAD missing"),
        (f"aesthetic:{tmp_path}/none.bin,{head_path},{opts}", "CLIP_CKPT .* does not exist"),
        (f"aesthetic:{clip_path},{tmp_path}/head.pth,{opts}", "not an aesthetic predictor head"),
        (f"aesthetic:{clip_path},{tmp_path}/wide.pth,{opts}", "takes 32-d embeddings"),
    ]:
        with pytest.raises(UserError, match=match):
            build_reward(spec)


# ----------------------------------------------------------------------------- VQAScore
@pytest.fixture(scope="module")
def blip_dir(tmp_path_factory):
    return build_tiny_blip_vqa(tmp_path_factory.mktemp("blip") / "blip-vqa")


def test_vqa_is_the_answer_likelihood(blip_dir):
    from transformers import BertTokenizer, BlipForQuestionAnswering

    reward = build_reward(f"vqa:{blip_dir},batch_size=2")
    images, prompts = (
        samples(4),
        [*PROMPTS, PROMPTS[0]],
    )  # questions of two lengths, one batched with its like
    out = reward(images, prompts, [{}] * 4)

    # BLIP's transform: Resize((384, 384), bicubic) on the PIL image, ToTensor, Normalize (CLIP's)
    pixels = torch.stack(
        [
            normalise(np.asarray(im.resize((BLIP_SIZE, BLIP_SIZE), Image.Resampling.BICUBIC)))
            for im in as_pil(images)
        ]
    )
    assert torch.allclose(reward.inner.pixel_values(as_pil(images)), pixels, atol=1e-6)

    model = BlipForQuestionAnswering.from_pretrained(blip_dir).eval()
    tok = BertTokenizer.from_pretrained(blip_dir)
    bos, sep = model.config.text_config.bos_token_id, model.config.text_config.sep_token_id
    want = []
    with (
        torch.no_grad()
    ):  # one sample at a time, the answer decoded token by token: Π p(a_t | a_<t), then ^(1/n)
        for px, prompt in zip(pixels, prompts):
            q = tok(f'Does this figure show "{prompt}"? Please answer yes or no.', return_tensors="pt")
            image_embeds = model.vision_model(pixel_values=px[None])[0]
            q_embeds = model.text_encoder(
                input_ids=q["input_ids"],
                attention_mask=q["attention_mask"],
                encoder_hidden_states=image_embeds,
            )[0]
            answer = [tok.convert_tokens_to_ids("yes"), sep]
            prefix, logp = [bos], 0.0
            for a in answer:
                logits = model.text_decoder(
                    input_ids=torch.tensor([prefix]), encoder_hidden_states=q_embeds
                ).logits
                logp += torch.log_softmax(logits[0, -1], -1)[a].item()
                prefix.append(a)
            want.append(np.exp(logp / len(answer)))
    assert out.scores.tolist() == pytest.approx(want, abs=1e-5)
    assert out.scores.std() > 1e-3 and ((out.scores > 0) & (out.scores <= 1)).all()


def test_vqa_options_and_checks(tmp_path, blip_dir):
    images = samples(2)
    other = build_reward(f"vqa:{blip_dir},answer=no,question='Is this \"{{}}\"?'")
    out = other(images, PROMPTS[:2], [{}] * 2)
    assert out.details[0]["question"] == 'Is this "a red circle"?'
    (tmp_path / "config.json").write_text('{"model_type": "clip"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match="not a BLIP VQA model"):
        build_reward(f"vqa:{tmp_path}")
    with pytest.raises(UserError, match=r"question must hold \{\}"):
        build_reward(f"vqa:{blip_dir},question=what")
