"""GenEval on real images: Mask2Former adapter, CLIP colour classifier, folder scoring, generation."""

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from t2i_gcpo.errors import UserError
from t2i_gcpo.eval.geneval import generate_geneval, image_sampling, load_geneval_prompts, score_geneval_folder
from t2i_gcpo.eval.layout import (
    existing_samples,
    iter_layout,
    sample_path,
    write_prompt_folder,
)
from t2i_gcpo.policies.base import TokenLayout
from t2i_gcpo.scoring.color_clip import (
    BACKGROUND_RGB,
    GENEVAL_COLORS,
    ClipColorClassifier,
    crop_on_background,
)
from t2i_gcpo.scoring.detections import Detection
from t2i_gcpo.scoring.detector_mask2former import (
    Mask2FormerDetector,
    box_from_mask,
    to_geneval_name,
)
from t2i_gcpo.scoring.geneval_classes import geneval_classes

# COCO names as the hub's Mask2Former COCO checkpoints spell them (3 differ from GenEval's)
HUB_COCO = [
    n.replace("computer mouse", "mouse")
    .replace("tv remote", "remote")
    .replace("computer keyboard", "keyboard")
    for n in geneval_classes()
]


# ---------------------------------------------------------------------------------------------
# Mask2Former adapter
# ---------------------------------------------------------------------------------------------


def tiny_mask2former(labels):
    from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation, SwinConfig

    backbone = SwinConfig(
        embed_dim=16,
        depths=[1, 1, 1, 1],
        num_heads=[1, 1, 1, 1],
        window_size=4,
        image_size=64,
        out_features=["stage1", "stage2", "stage3", "stage4"],
    )
    config = Mask2FormerConfig(
        backbone_config=backbone,
        feature_size=32,
        mask_feature_size=32,
        hidden_dim=32,
        encoder_feedforward_dim=32,
        encoder_layers=1,
        decoder_layers=2,
        num_attention_heads=2,
        dim_feedforward=32,
        num_queries=8,
        id2label=dict(enumerate(labels)),
        label2id={n: i for i, n in enumerate(labels)},
    )
    torch.manual_seed(0)
    return Mask2FormerForUniversalSegmentation(config).eval()


def tiny_processor():
    from transformers import Mask2FormerImageProcessor

    return Mask2FormerImageProcessor(size={"shortest_edge": 64, "longest_edge": 128}, size_divisor=32)


def test_hub_coco_labels_map_to_geneval_names():
    names = set(geneval_classes())
    assert len(names) == 80
    assert to_geneval_name("mouse", names) == "computer mouse"
    assert to_geneval_name("remote", names) == "tv remote"
    assert to_geneval_name("keyboard", names) == "computer keyboard"
    assert to_geneval_name("diningtable", names) == "dining table"
    assert to_geneval_name("Potted_Plant", names) == "potted plant"
    assert to_geneval_name("hair dryer", names) == "hair drier"
    assert to_geneval_name("wall-other-merged", names) is None
    assert {to_geneval_name(n, names) for n in HUB_COCO} == names


def test_mask2former_tiny_checkpoint_round_trip(tmp_path):
    tiny_mask2former(HUB_COCO).save_pretrained(tmp_path / "m2f")
    tiny_processor().save_pretrained(tmp_path / "m2f")
    detector = Mask2FormerDetector.from_pretrained(tmp_path / "m2f", score_floor=0.0)
    image = Image.fromarray(
        (np.random.default_rng(0).random((48, 64, 3)) * 255).astype(np.uint8)
    )  # W 64, H 48
    dets = detector(image)
    assert 0 < len(dets) <= 8  # at most one per query
    names = set(geneval_classes())
    assert [d.score for d in dets] == sorted((d.score for d in dets), reverse=True)
    for d in dets:
        assert isinstance(d, Detection) and d.cls in names
        assert d.mask.shape == (48, 64) and d.mask.dtype == bool and d.mask.any()
        assert d.box == box_from_mask(d.mask)
        x0, y0, x1, y1 = d.box
        assert 0 <= x0 < x1 <= 64 and 0 <= y0 < y1 <= 48
    # the default floor keeps nothing of an untrained model's ~0.01 scores
    assert Mask2FormerDetector.from_pretrained(tmp_path / "m2f")(image) == []


def test_mask2former_bad_paths_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no config.json"):
        Mask2FormerDetector.from_pretrained(tmp_path / "nothing")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(UserError, match="expected 'mask2former'"):
        Mask2FormerDetector.from_pretrained(tmp_path / "bert")
    # a Mask2Former whose labels are not COCO's 80 classes (e.g. ADE20k) cannot run GenEval
    tiny_mask2former(["wall", "floor", "cat"]).save_pretrained(tmp_path / "ade")
    tiny_processor().save_pretrained(tmp_path / "ade")
    with pytest.raises(UserError, match="do not cover 79 of GenEval's 80"):
        Mask2FormerDetector.from_pretrained(tmp_path / "ade")


class RedSegmenter(torch.nn.Module):
    """A geometry-faithful stand-in for Mask2Former: query 0 is a confident 'dog' whose mask is the
    red pixels of the model input, at the input's 1/4 resolution (as Mask2Former's mask logits)."""

    def __init__(self, labels):
        super().__init__()
        self.config = SimpleNamespace(id2label=dict(enumerate(labels)))
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.dog = labels.index("dog")

    def forward(self, pixel_values, pixel_mask=None):
        q, c = 3, len(self.config.id2label)
        cls = torch.full((1, q, c + 1), -20.0)
        cls[..., -1] = 20.0  # queries 1, 2: "no object"
        cls[0, 0, -1] = -20.0
        cls[0, 0, self.dog] = 20.0
        red = pixel_values[:, :1] - pixel_values[:, 1:2]  # [1, 1, H, W]: ≈ 4.3 on red, ≈ 0 elsewhere
        logits = 20.0 * (torch.nn.functional.avg_pool2d(red, 4) - 2.0)  # [1, 1, H/4, W/4]
        masks = torch.cat([logits, torch.full_like(logits, -20.0).expand(-1, q - 1, -1, -1)], dim=1)
        return SimpleNamespace(class_queries_logits=cls, masks_queries_logits=masks)


def test_mask2former_masks_map_back_to_non_square_images():
    """The processor stretches a 130×128 image to 288×256; the mask of a red box at x 60..120,
    y 20..100 must come back there in the original pixels (to the 4-pixel mask resolution)."""
    from transformers import Mask2FormerImageProcessor

    processor = Mask2FormerImageProcessor(size={"shortest_edge": 256, "longest_edge": 1024}, size_divisor=32)
    detector = Mask2FormerDetector(RedSegmenter(HUB_COCO), processor, score_floor=0.5)
    pixels = np.zeros((128, 130, 3), dtype=np.uint8)
    pixels[20:100, 60:120] = (255, 0, 0)
    (det,) = detector(Image.fromarray(pixels))
    assert det.cls == "dog" and det.score > 0.95  # class prob ≈ 1 × mean mask prob
    assert det.mask.shape == (128, 130)
    np.testing.assert_allclose(det.box, (60, 20, 120, 100), atol=3)
    assert det.box == box_from_mask(det.mask)
    # nothing red, nothing found
    assert detector(Image.new("RGB", (130, 128))) == []


# ---------------------------------------------------------------------------------------------
# CLIP colour classifier
# ---------------------------------------------------------------------------------------------


def test_crop_composites_on_grey_through_the_mask():
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, size=(8, 10, 3), dtype=np.uint8)  # H 8, W 10
    mask = np.zeros((8, 10), dtype=bool)
    mask[2:5, 3:6] = True
    det = Detection(cls="cat", box=(2.5, 1.2, 7.0, 6.0), score=1.0, mask=mask)
    crop = np.asarray(crop_on_background(Image.fromarray(pixels), det))
    # box widened to whole pixels: x 2..7, y 1..6
    assert crop.shape == (5, 5, 3)
    expected = np.where(mask[..., None], pixels, np.array(BACKGROUND_RGB, dtype=np.uint8))[1:6, 2:7]
    np.testing.assert_array_equal(crop, expected)
    assert crop[0, 0].tolist() == [153, 153, 153]  # outside the mask: #999999
    assert crop[1, 1].tolist() == pixels[2, 3].tolist()  # inside the mask: the object's own pixel
    # without a mask the box crop is unchanged
    unmasked = np.asarray(crop_on_background(Image.fromarray(pixels), Detection("cat", (0, 0, 3, 2), 1.0)))
    np.testing.assert_array_equal(unmasked, pixels[:2, :3])


REF_RGB = {
    "red": (255, 0, 0),
    "orange": (255, 165, 0),
    "yellow": (255, 255, 0),
    "green": (0, 128, 0),
    "blue": (0, 0, 255),
    "purple": (128, 0, 128),
    "pink": (255, 192, 203),
    "brown": (139, 69, 19),
    "black": (0, 0, 0),
    "white": (255, 255, 255),
}


class RiggedClip(torch.nn.Module):
    """encode_image: histogram of the crop's pixels over the 10 reference colours (grey ignored);
    encode_text: one-hot of the colour named in the prompt. Zero-shot then picks the colour that
    covers most non-background pixels of the crop."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.ref = torch.tensor([REF_RGB[c] for c in GENEVAL_COLORS], dtype=torch.float32)  # [10, 3]

    def encode_image(self, x):  # x [N, H, W, 3]
        flat = x.flatten(1, 2).float()  # [N, P, 3]
        nearest = torch.cdist(flat, self.ref.expand(len(x), -1, -1)).argmin(-1)  # [N, P]
        grey = (flat == torch.tensor(BACKGROUND_RGB, dtype=torch.float32)).all(-1)
        return torch.stack([torch.bincount(n[~g], minlength=10).float() for n, g in zip(nearest, grey)])

    def encode_text(self, ids):  # ids [N] colour index
        return torch.nn.functional.one_hot(ids, 10).float() + 0.01


def rigged_tokenizer(texts):
    return torch.tensor([next(i for i, c in enumerate(GENEVAL_COLORS) if f" {c}" in t) for t in texts])


def test_colour_zero_shot_uses_the_masked_crop():
    """Box: 60 % blue background, 40 % red object under the mask. Through the mask the crop is red;
    without compositing it would be blue."""
    pixels = np.zeros((10, 10, 3), dtype=np.uint8)
    pixels[:] = REF_RGB["blue"]
    mask = np.zeros((10, 10), dtype=bool)
    mask[:, :4] = True
    pixels[mask] = REF_RGB["red"]
    clf = ClipColorClassifier(
        RiggedClip(), lambda im: torch.from_numpy(np.asarray(im).copy()), rigged_tokenizer
    )
    image = Image.fromarray(pixels)
    dets = [
        Detection("car", (0, 0, 10, 10), 0.9, mask=mask),
        Detection("car", (0, 0, 10, 10), 0.9, mask=None),
    ]
    assert clf.classify(image, dets) == ["red", "blue"]
    feats = clf.text_features("car")
    assert feats.shape == (10, 10) and torch.allclose(feats.norm(dim=-1), torch.ones(10))

    calls = []
    clf.classify = lambda im, ds: calls.append(len(ds)) or ["green"]
    color = clf.color_of(image)
    assert color(dets[0]) == color(dets[0]) == "green"
    assert calls == [1]  # cached per detection


@pytest.fixture(scope="module")
def tiny_clip_ckpt(tmp_path_factory):
    import open_clip

    d = tmp_path_factory.mktemp("clip")
    cfg = {
        "embed_dim": 32,
        "quick_gelu": True,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    (d / "cfg").mkdir()
    (d / "cfg" / "t2i-gcpo-tiny-clip.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(d / "cfg")
    torch.manual_seed(0)
    model = open_clip.create_model("t2i-gcpo-tiny-clip", pretrained=None)
    torch.save(model.state_dict(), d / "tiny.pt")
    return d / "tiny.pt"


def test_clip_colour_classifier_loads_a_local_open_clip_file(tiny_clip_ckpt, tmp_path):
    clf = ClipColorClassifier.from_pretrained(tiny_clip_ckpt, model_name="t2i-gcpo-tiny-clip")
    mask = np.zeros((24, 24), dtype=bool)
    mask[4:20, 6:18] = True
    image = Image.new("RGB", (24, 24), (200, 20, 20))
    det = Detection("apple", box_from_mask(mask), 0.9, mask=mask)
    assert clf.color_of(image)(det) in GENEVAL_COLORS
    assert clf.text_features("apple").shape == (10, 32)

    with pytest.raises(UserError, match="not found"):
        ClipColorClassifier.from_pretrained(tmp_path / "nope.pt", model_name="t2i-gcpo-tiny-clip")
    with pytest.raises(UserError, match="unknown open_clip model"):
        ClipColorClassifier.from_pretrained(tiny_clip_ckpt, model_name="no-such-model")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="cannot load"):
        ClipColorClassifier.from_pretrained(tmp_path / "junk.pt", model_name="t2i-gcpo-tiny-clip")


# ---------------------------------------------------------------------------------------------
# scoring a folder
# ---------------------------------------------------------------------------------------------

CAT = {"class": "cat", "count": 1}
PROMPTS = [
    {"tag": "single_object", "include": [CAT], "prompt": "a photo of a cat"},
    {"tag": "colors", "include": [{**CAT, "color": "blue"}], "prompt": "a photo of a blue cat"},
    {
        "tag": "counting",
        "include": [{"class": "cat", "count": 2}],
        "exclude": [{"class": "cat", "count": 3}],
        "prompt": "a photo of two cats",
    },
    {
        "tag": "position",
        "include": [CAT, {"class": "dog", "count": 1, "position": ["right of", 0]}],
        "prompt": "a photo of a dog right of a cat",
    },
]


def box_det(cls, box, score=0.95):
    return Detection(cls=cls, box=box, score=score)


# What the scripted detector sees in each image (keyed by the image's grey level) and the colour the
# scripted classifier answers, with GenEval's verdict.
SCRIPT = {
    10: ([box_det("cat", (0, 0, 8, 8))], None, True),  # single_object: found
    11: ([box_det("dog", (0, 0, 8, 8))], None, False),  # single_object: wrong class
    20: ([box_det("cat", (0, 0, 8, 8))], "blue", True),  # colors: right colour
    21: ([box_det("cat", (0, 0, 8, 8))], "red", False),  # colors: wrong colour
    30: ([box_det("cat", (0, 0, 4, 4)), box_det("cat", (8, 8, 12, 12))], None, True),  # two confident cats
    31: ([box_det("cat", (0, 0, 4, 4)), box_det("cat", (8, 8, 12, 12), 0.5)], None, False),  # < 0.9
    32: ([box_det("cat", (0, 0, 4, 4), 0.95)] * 3, None, False),  # three cats: excluded
    40: ([box_det("cat", (0, 10, 4, 14)), box_det("dog", (20, 10, 24, 14))], None, True),  # dog right of cat
    41: ([box_det("cat", (20, 10, 24, 14)), box_det("dog", (0, 10, 4, 14))], None, False),  # dog left of cat
}
LEVELS = [[10, 11], [20, 21], [30, 31, 32], [40, 41]]


def scripted_detector(image):
    return [Detection(d.cls, d.box, d.score) for d in SCRIPT[image.getpixel((0, 0))[0]][0]]


class ScriptedColours:
    def __init__(self):
        self.asked = 0

    def color_of(self, image):
        def color(det):
            self.asked += 1
            return SCRIPT[image.getpixel((0, 0))[0]][1]

        return color


def test_score_geneval_folder_end_to_end(tmp_path):
    for i, (meta, levels) in enumerate(zip(PROMPTS, LEVELS)):
        write_prompt_folder(
            tmp_path / "imgs", i, meta, [Image.new("RGB", (32, 32), (v, v, v)) for v in levels]
        )
    colours = ScriptedColours()
    summary = score_geneval_folder(
        tmp_path / "imgs", scripted_detector, colours, tmp_path / "out", progress=False
    )

    lines = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [r["correct"] for r in lines] == [SCRIPT[v][2] for levels in LEVELS for v in levels]
    assert [r["tag"] for r in lines] == ["single_object"] * 2 + ["colors"] * 2 + ["counting"] * 3 + [
        "position"
    ] * 2
    assert lines[2]["prompt"] == "a photo of a blue cat"
    assert json.loads(lines[2]["metadata"]) == PROMPTS[1]
    assert lines[5]["filename"].endswith(os.path.join("00002", "samples", "0001.png"))
    assert json.loads(lines[3]["details"])["cat"][0]["color"] == "red"
    assert json.loads(lines[0]["details"]) == {"cat": [{"bbox": [0.0, 0.0, 8.0, 8.0], "score": 0.95}]}
    assert all(isinstance(r["reason"], str) for r in lines) and lines[1]["reason"]
    assert colours.asked == 2  # colour is asked only for the colour prompt's cat

    counts = {"single_object": (1, 2), "colors": (1, 2), "counting": (1, 3), "position": (1, 2)}
    assert summary["tags"] == {t: {"score": c / n, "correct": c, "total": n} for t, (c, n) in counts.items()}
    assert summary["overall"] == pytest.approx((0.5 + 0.5 + 1 / 3 + 0.5) / 4)
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary
    text = (tmp_path / "out" / "summary.txt").read_text()
    assert "counting      = 33.33% (1 / 3)" in text
    assert "Overall score (avg. over 4 tasks): 0.45833" in text


def test_score_geneval_folder_rejects_unfinished_folders(tmp_path):
    write_prompt_folder(tmp_path, 0, PROMPTS[0], [])
    with pytest.raises(UserError, match="have no images"):
        score_geneval_folder(tmp_path, scripted_detector, None, tmp_path / "out", progress=False)


# ---------------------------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------------------------


def gen(policy, metadata, root, *, cfg_scale=5.0, temperature=1.0, top_k=0, overwrite=False, **kw):
    """generate_geneval as `sample` and the eval commands call it: the sampling built once from the
    flags."""
    sampling = image_sampling(policy, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k)
    return generate_geneval(policy, metadata, root, sampling, overwrite=overwrite, **kw)


class FakePolicy(torch.nn.Module):
    """Images whose grey level is a random token drawn from the given generator."""

    layout = TokenLayout.image(1, 1)

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.calls = []
        self.sampling = []

    def check_prompts(self, prompts):
        bad = [p for p in prompts if "forbidden" in p]
        if bad:
            raise UserError(f"unknown words in {bad[0]!r}")

    def rollout(self, prompts, group_size, sampling, generators):
        assert len(generators) == len(prompts)  # one generator per prompt
        self.calls.append([p.text for p in prompts])
        self.sampling.append(sampling)
        tokens = torch.cat([torch.randint(0, 256, (group_size, 1), generator=g) for g in generators])
        return SimpleNamespace(tokens=tokens, prompts=[p for p in prompts for _ in range(group_size)])

    def decode(self, rollout):
        return (rollout.tokens.float() / 255).view(-1, 1, 1, 1).expand(-1, 3, 4, 4)


def grey(path):
    return np.asarray(Image.open(path))[0, 0, 0]


def test_generate_geneval_writes_layout_and_resumes_identically(tmp_path):
    metas = PROMPTS[:3]
    policy = FakePolicy()
    assert gen(policy, metas, tmp_path, n=2, batch=2, cfg_scale=3.0, seed=7, progress=False) == 6
    assert policy.calls == [[metas[0]["prompt"], metas[1]["prompt"]], [metas[2]["prompt"]]]
    assert {s.guidance_scale for s in policy.sampling} == {3.0}
    assert [(i, m, len(p)) for i, m, p in iter_layout(tmp_path)] == [(i, m, 2) for i, m in enumerate(metas)]
    before = {(i, k): grey(sample_path(tmp_path, i, k)) for i in range(3) for k in range(2)}
    assert len(set(before.values())) > 1

    # interrupted run: prompt 1 lost its second sample, prompt 2 everything
    os.remove(sample_path(tmp_path, 1, 1))
    for k in range(2):
        os.remove(sample_path(tmp_path, 2, k))
    policy.calls.clear()
    assert gen(policy, metas, tmp_path, n=2, batch=2, cfg_scale=3.0, seed=7, progress=False) == 3
    assert existing_samples(tmp_path, 1) == 2 and existing_samples(tmp_path, 2) == 2
    assert {(i, k): grey(sample_path(tmp_path, i, k)) for i in range(3) for k in range(2)} == before
    # a prompt's images do not depend on its batch-mates: one prompt per batch gives the same images
    gen(policy, metas, tmp_path / "b1", n=2, batch=1, cfg_scale=3.0, seed=7, progress=False)
    assert {(i, k): grey(sample_path(tmp_path / "b1", i, k)) for i in range(3) for k in range(2)} == before
    # a complete folder makes no policy calls; another seed gives other images
    policy.calls.clear()
    assert gen(policy, metas, tmp_path, n=2, batch=2, cfg_scale=3.0, seed=7, progress=False) == 0
    assert policy.calls == []
    gen(policy, metas[:1], tmp_path / "s8", n=2, batch=2, cfg_scale=3.0, seed=8, progress=False)
    assert [grey(sample_path(tmp_path / "s8", 0, k)) for k in range(2)] != [before[0, 0], before[0, 1]]

    with pytest.raises(UserError, match="unknown words"):
        gen(policy, [{**metas[0], "prompt": "forbidden"}], tmp_path / "x", progress=False)


def test_packaged_geneval_prompts():
    prompts = load_geneval_prompts()
    assert len(prompts) == 553
    tags = {}
    for p in prompts:
        tags[p["tag"]] = tags.get(p["tag"], 0) + 1
    assert tags == {
        "single_object": 80,
        "two_object": 99,
        "counting": 80,
        "colors": 94,
        "position": 100,
        "color_attr": 100,
    }


# ---------------------------------------------------------------------------------------------
# resuming into an existing folder: only the same prompts and settings, else refuse (or overwrite)
# ---------------------------------------------------------------------------------------------

GEN = dict(n=2, batch=2, cfg_scale=3.0, seed=7, progress=False)


def test_generate_geneval_records_its_settings_next_to_the_images(tmp_path):
    gen(FakePolicy(), PROMPTS[:2], tmp_path, model="fake:1", **GEN)
    settings = json.loads((tmp_path / "00001" / "generation.json").read_text())
    assert settings == {
        "model": "fake:1",
        "seed": 7,
        "cfg_scale": 3.0,
        "temperature": 1.0,
        "top_k": 0,
        "n": 2,
    }
    # the layout stays readable by GenEval's scorer: no stray images, metadata untouched
    assert [(i, m, len(p)) for i, m, p in iter_layout(tmp_path)] == [(0, PROMPTS[0], 2), (1, PROMPTS[1], 2)]
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]


@pytest.mark.parametrize(
    "change, word",
    [
        ({"seed": 8}, "seed"),
        ({"cfg_scale": 5.0}, "cfg_scale"),
        ({"n": 3}, "n"),
        ({"temperature": 0.5}, "temperature"),
        ({"top_k": 4}, "top_k"),
        ({"model": "fake:2"}, "model"),
    ],
)
def test_generate_geneval_refuses_a_folder_made_with_other_settings(tmp_path, change, word):
    policy = FakePolicy()
    gen(policy, PROMPTS[:2], tmp_path, model="fake:1", **GEN)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    policy.calls.clear()
    with pytest.raises(UserError, match=rf"{word}=.*--overwrite") as e:
        gen(policy, PROMPTS[:2], tmp_path, **{**GEN, "model": "fake:1", **change})
    assert "\n" not in str(e.value) and "00000" in str(e.value)
    assert policy.calls == [] and {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    # --overwrite regenerates with the new settings
    args = {**GEN, "model": "fake:1", **change}
    assert gen(policy, PROMPTS[:2], tmp_path, overwrite=True, **args) == 2 * args["n"]
    assert json.loads((tmp_path / "00000" / "generation.json").read_text())[word] == args[word]
    assert [len(p) for _, _, p in iter_layout(tmp_path)] == [args["n"]] * 2


def test_generate_geneval_refuses_other_prompts_and_stale_extra_folders(tmp_path):
    """A one-prompt run into a folder that held other prompts' images must not reuse or keep them."""
    policy = FakePolicy()
    gen(policy, PROMPTS[:3], tmp_path, model="fake", **GEN)
    with pytest.raises(UserError, match=r"00000.*'a photo of a cat'.*'a photo of a blue cat'.*--overwrite"):
        gen(policy, PROMPTS[1:2], tmp_path, model="fake", **GEN)
    # same first prompt, fewer prompts: the other two folders are stale and would be scored
    with pytest.raises(UserError, match=r"2 prompt folder\(s\) .*00001.*--overwrite"):
        gen(policy, PROMPTS[:1], tmp_path, model="fake", **GEN)
    # metadata differing beyond the prompt text is a mismatch too
    other = {**PROMPTS[0], "include": [{"class": "dog", "count": 1}]}
    with pytest.raises(UserError, match=r"00000.*metadata"):
        gen(policy, [other, *PROMPTS[1:3]], tmp_path, model="fake", **GEN)
    assert gen(policy, PROMPTS[1:2], tmp_path, model="fake", overwrite=True, **GEN) == 2
    assert [(i, m) for i, m, _ in iter_layout(tmp_path)] == [(0, PROMPTS[1])]


def test_generate_geneval_refuses_images_of_unknown_provenance(tmp_path):
    # a folder written by another tool (or an older version): images but no recorded settings
    write_prompt_folder(tmp_path, 0, PROMPTS[0], [Image.new("RGB", (4, 4))] * 2)
    policy = FakePolicy()
    with pytest.raises(UserError, match=r"00000.*generation.json.*--overwrite"):
        gen(policy, PROMPTS[:1], tmp_path, model="fake", **GEN)
    assert policy.calls == []
    # a prompt folder with metadata but no images yet (an interrupted run) is simply filled in
    write_prompt_folder(tmp_path / "b", 0, PROMPTS[0], [])
    assert gen(policy, PROMPTS[:1], tmp_path / "b", model="fake", **GEN) == 2


def test_score_geneval_folder_scores_only_this_runs_prompts(tmp_path):
    for i, (meta, levels) in enumerate(zip(PROMPTS, LEVELS)):
        write_prompt_folder(tmp_path, i, meta, [Image.new("RGB", (32, 32), (v, v, v)) for v in levels])
    out = tmp_path / "out"
    with pytest.raises(UserError, match=r"3 prompt folder\(s\).*00001"):
        score_geneval_folder(
            tmp_path, scripted_detector, ScriptedColours(), out, metadata_list=PROMPTS[:1], progress=False
        )
    with pytest.raises(UserError, match=r"00001.*'a photo of a blue cat'.*'a photo of a cat'"):
        score_geneval_folder(
            tmp_path,
            scripted_detector,
            ScriptedColours(),
            out,
            metadata_list=[PROMPTS[0], PROMPTS[0], *PROMPTS[2:]],
            progress=False,
        )
    with pytest.raises(UserError, match=r"00002.*3 image\(s\).*2"):
        score_geneval_folder(
            tmp_path, scripted_detector, ScriptedColours(), out, metadata_list=PROMPTS, n=2, progress=False
        )
    summary = score_geneval_folder(
        tmp_path, scripted_detector, ScriptedColours(), out, metadata_list=PROMPTS, progress=False
    )
    assert sum(t["total"] for t in summary["tags"].values()) == 9


def test_overwrite_removes_only_generated_prompt_folders(tmp_path):
    policy = FakePolicy()
    gen(policy, PROMPTS[:2], tmp_path, model="fake", **GEN)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "00001" / "samples" / "notes.txt").write_text("mine too")
    with pytest.raises(UserError, match=r"--overwrite: .*00001 .*notes.txt"):
        gen(policy, PROMPTS[:1], tmp_path, model="fake", overwrite=True, **GEN)
    assert existing_samples(tmp_path, 0) == 2  # nothing removed
    os.remove(tmp_path / "00001" / "samples" / "notes.txt")
    gen(policy, PROMPTS[:1], tmp_path, model="fake", overwrite=True, **GEN)
    assert sorted(os.listdir(tmp_path)) == ["00000", "notes.txt"]
