"""Compositional prompts scored by the ShapeWorld reward on rendered images (right and wrong scenes),
in both partial-credit variants, and the reward specs that pick the variant."""

import numpy as np
import pytest
import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards.forms.shapeworld import ShapeWorldReward
from t2i_gcpo.rewards.registry import build_reward
from t2i_gcpo.worlds.shapeworld import ShapeObject, parse_prompt, render, sample_scene


def as_tensor(images: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255  # [B, 3, H, W]


def obj(shape, color, x0, y0):
    """An 8 px object whose box starts at pixel (x0, y0) of the 32 px canvas (on the token grid)."""
    return ShapeObject(shape, color, (x0 + 4) / 32, (y0 + 4) / 32, 8 / 32)


def score(prompt, images, variant="spec"):
    meta = parse_prompt(prompt)
    out = ShapeWorldReward(variant=variant)(as_tensor(images), [prompt] * len(images), [meta] * len(images))
    return [d["strict"] for d in out.details], out.scores.tolist()


EXAMPLES = [
    "a photo of a red circle left of a blue square",
    "a photo of two red circles and a blue square",
    "a photo of a circle, a square and a triangle",
    "a photo of a red circle and a square",
    "a photo of two circles and a bar",
    "a photo of a cross and a bar above a triangle",
    "a photo of two circles left of a square",
    "a photo of two red circles below a blue bar",
]


@pytest.mark.parametrize("prompt", EXAMPLES)
def test_sampled_scenes_of_every_new_tag_score_right(prompt):
    """The renderer draws scenes for the new metadata and the reward finds them right."""
    meta = parse_prompt(prompt)
    rng = np.random.default_rng(0)
    images = [render(sample_scene(meta, rng)) for _ in range(4)]
    for variant in ("spec", "flow_grpo"):
        strict, scores = score(prompt, images, variant)
        assert strict == [True] * 4 and scores == [1.0] * 4, (variant, meta["tag"])


def test_color_position_verdicts():
    prompt = "a photo of a red circle left of a blue square"
    right = render([obj("circle", "red", 0, 12), obj("square", "blue", 24, 12)])
    swapped = render([obj("circle", "red", 24, 12), obj("square", "blue", 0, 12)])
    green = render([obj("circle", "green", 0, 12), obj("square", "blue", 24, 12)])
    strict, spec = score(prompt, [right, swapped, green])
    assert strict == [True, False, False]
    # [square 1, blue 1, circle 1, red 1, left 0] = 4/5; green: [1, 1, 1, red 0, left 0] = 3/5
    assert spec == pytest.approx([1.0, 4 / 5, 3 / 5])
    _, flow = score(prompt, [right, swapped, green], "flow_grpo")
    # swapped: [1, 1, 1, 1, 0, then 1] = 5/6; green: [1, 1, 1, red 0] (no position term) = 3/4
    assert flow == pytest.approx([1.0, 5 / 6, 3 / 4])


def test_color_count_verdicts():
    prompt = "a photo of two red circles and a blue square"
    right = render([obj("circle", "red", 0, 0), obj("circle", "red", 12, 0), obj("square", "blue", 24, 24)])
    one_green = render(
        [obj("circle", "red", 0, 0), obj("circle", "green", 12, 0), obj("square", "blue", 24, 24)]
    )
    three = render(
        [
            obj("circle", "red", 0, 0),
            obj("circle", "red", 12, 0),
            obj("circle", "red", 24, 0),
            obj("square", "blue", 24, 24),
        ]
    )
    strict, spec = score(prompt, [right, one_green, three])
    assert strict == [True, False, False]  # three circles break the exclude (exactly two)
    # one_green: [count 1, red 1 − |2 − 1|/2, square 1, blue 1]; three: [1 − 1/2, red 0, 1, 1]
    assert spec == pytest.approx([1.0, 3.5 / 4, 2.5 / 4])
    _, flow = score(prompt, [right, one_green, three], "flow_grpo")
    assert flow == pytest.approx([1.0, 3.5 / 4, 2.5 / 4])


def test_multi_object_verdicts():
    prompt = "a photo of a circle, a square and a triangle"
    right = render(
        [obj("circle", "red", 0, 0), obj("square", "pink", 12, 12), obj("triangle", "white", 24, 24)]
    )
    no_triangle = render([obj("circle", "red", 0, 0), obj("square", "pink", 12, 12)])
    strict, spec = score(prompt, [right, no_triangle])
    assert strict == [True, False] and spec == pytest.approx([1.0, 2 / 3])


def test_prompt_text_alone_is_parsed_by_the_reward():
    prompt = "a photo of a red circle left of a blue square"
    img = render([obj("circle", "red", 0, 12), obj("square", "blue", 24, 12)])
    out = ShapeWorldReward()(as_tensor([img]), [prompt], [])
    assert out.details[0]["tag"] == "color_position" and out.scores.tolist() == [1.0]


def test_reward_specs_pick_the_variant():
    prompt = "a photo of a red circle left of a blue square"
    swapped = as_tensor([render([obj("circle", "red", 24, 12), obj("square", "blue", 0, 12)])])
    meta = [parse_prompt(prompt)]
    default = build_reward("shapeworld")
    flow = build_reward("shapeworld:flow_grpo")
    assert default.inner.variant == "spec" and flow.inner.variant == "flow_grpo"
    assert default(swapped, [prompt], meta).scores.tolist() == pytest.approx([4 / 5])
    assert flow(swapped, [prompt], meta).scores.tolist() == pytest.approx([5 / 6])
    mix = build_reward("0.5*shapeworld+0.5*shapeworld:flow_grpo")
    assert mix(swapped, [prompt], meta).scores.tolist() == pytest.approx([(4 / 5 + 5 / 6) / 2])
    assert build_reward("shapeworld", grid=(4, 4)).inner.grid == (4, 4)
    with pytest.raises(UserError, match="shapeworld:flow_grpo"):
        build_reward("shapeworld:flowgrpo")
    with pytest.raises(UserError, match="variant"):
        ShapeWorldReward(variant="exact")


def test_geneval_spec_option(monkeypatch):
    from t2i_gcpo.rewards.forms.geneval_reward import GenEvalReward

    seen = []

    def fake_from_paths(detector_dir, clip_checkpoint, clip_model="ViT-L-14", device="cpu", variant="spec"):
        seen.append((detector_dir, clip_checkpoint, clip_model, device, variant))
        return GenEvalReward(lambda image: [], None, variant=variant)

    monkeypatch.setattr(GenEvalReward, "from_paths", staticmethod(fake_from_paths))
    build_reward("geneval:det,clip.pt")
    build_reward("geneval:det,clip.pt,flow_grpo", device="cuda:1")
    build_reward("geneval:det,clip.pt,ViT-B-32,flow_grpo")
    build_reward("geneval:det,clip.pt,ViT-B-32")
    assert seen == [
        ("det", "clip.pt", "ViT-L-14", "cpu", "spec"),
        ("det", "clip.pt", "ViT-L-14", "cuda:1", "flow_grpo"),
        ("det", "clip.pt", "ViT-B-32", "cpu", "flow_grpo"),
        ("det", "clip.pt", "ViT-B-32", "cpu", "spec"),
    ]
    for bad in ("geneval:det,clip.pt,ViT-B-32,flow_grpo,x", "geneval:det,flow_grpo"):
        with pytest.raises(UserError, match=r"geneval:DETECTOR_DIR,CLIP_CKPT\[,MODEL_NAME\]\[,flow_grpo\]"):
            build_reward(bad)
    with pytest.raises(UserError, match="variant"):
        GenEvalReward(lambda image: [], None, variant="exact")
