"""ShapeWorldReward: partial / strict scores, details, object grids (docs/worlds/shapeworld.md,
docs/evaluation/geneval.md#geneval-as-a-reward)."""

import numpy as np
import pytest
import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards.forms.shapeworld import ShapeWorldReward, to_uint8_images
from t2i_gcpo.worlds.shapeworld import ShapeObject, object_masks, parse_prompt, render, token_grid_mask


def as_tensor(images: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255  # [B, 3, H, W]


RED_CIRCLE = ShapeObject("circle", "red", 8 / 32, 8 / 32, 10 / 32)
BLUE_SQUARE = ShapeObject("square", "blue", 24 / 32, 24 / 32, 10 / 32)
GREEN_SQUARE = ShapeObject("square", "green", 24 / 32, 24 / 32, 10 / 32)


def test_partial_and_strict_scores_hand_computed():
    prompt = "a photo of a red circle and a blue square"
    meta = parse_prompt(prompt)
    images = [
        render([RED_CIRCLE, BLUE_SQUARE]),  # all right: 1
        render([RED_CIRCLE, GREEN_SQUARE]),  # counts 1, 1; colours 1, 0 → 3/4
        render([RED_CIRCLE]),  # circle count+colour 1, 1; square 0, 0 → 2/4
        render([]),  # 0
    ]
    out = ShapeWorldReward()(as_tensor(images), [prompt] * 4, [meta] * 4)
    assert out.scores.tolist() == pytest.approx([1.0, 0.75, 0.5, 0.0])
    assert [d["strict"] for d in out.details] == [True, False, False, False]
    assert out.details[1]["reason"].startswith("expected blue square>=1, found 0 blue; and 1 green")
    assert all(d["tag"] == "color_attr" for d in out.details)
    strict = ShapeWorldReward(mode="strict")(as_tensor(images), [prompt] * 4, [meta] * 4)
    assert strict.scores.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_counting_partial_credit():
    prompt = "a photo of three circles"
    objs = [
        ShapeObject("circle", c, x / 32, 16 / 32, 9 / 32) for c, x in (("red", 6), ("blue", 16), ("pink", 26))
    ]
    images = [render(objs), render(objs[:2]), render(objs[:1])]
    out = ShapeWorldReward()(as_tensor(images), [prompt] * 3, [])  # metadata parsed from the prompt
    assert out.scores.tolist() == pytest.approx([1.0, 2 / 3, 1 / 3])
    assert [d["strict"] for d in out.details] == [True, False, False]


def test_object_grid_covers_detected_prompt_objects_only():
    prompt = "a photo of a red circle"
    img = render([RED_CIRCLE, BLUE_SQUARE])  # the square is not a prompt class
    out = ShapeWorldReward(grid=(8, 8))(as_tensor([img]), [prompt], [parse_prompt(prompt)])
    grid = out.details[0]["object_grid"]
    assert grid.shape == (8, 8) and grid.dtype == bool
    assert np.array_equal(grid, token_grid_mask(object_masks([RED_CIRCLE], 32), (8, 8)))
    assert grid.any() and not grid[4:, 4:].any()
    assert {d["cls"] for d in out.details[0]["detections"]} == {"circle", "square"}


def test_never_nan_and_input_checks():
    prompt = "a photo of a circle"
    x = torch.full((2, 3, 32, 32), float("nan"))
    out = ShapeWorldReward()(x, [prompt] * 2, [parse_prompt(prompt)] * 2)
    assert torch.isfinite(out.scores).all() and out.scores.tolist() == [0.0, 0.0]
    assert to_uint8_images(x)[0, 0, 0].tolist() == [153, 153, 153]
    with pytest.raises(UserError):
        ShapeWorldReward(mode="best")
    with pytest.raises(UserError, match="cannot parse prompt"):
        ShapeWorldReward()(torch.zeros(1, 3, 32, 32), ["a painting"], [{}])
    with pytest.raises(ValueError):
        ShapeWorldReward()(torch.zeros(1, 3, 32, 32), [prompt, prompt], [])
