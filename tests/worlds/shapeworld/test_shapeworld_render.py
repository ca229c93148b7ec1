"""ShapeWorld renderer, scene sampler and token-grid masks (docs/worlds/shapeworld.md)."""

import itertools

import numpy as np
import pytest

from t2i_gcpo.errors import UserError
from t2i_gcpo.scoring.geneval_rules import relative_position
from t2i_gcpo.worlds.shapeworld import (
    BACKGROUND_RGB,
    COLOR_RGB,
    COLORS,
    SHAPES,
    ShapeObject,
    all_metadata,
    generate_metadata,
    object_masks,
    render,
    sample_scene,
    token_grid_mask,
)


def test_palette_is_distinct_and_far_from_background():
    assert COLORS == ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white"]
    rgb = [np.array(COLOR_RGB[c], float) for c in COLORS] + [np.array(BACKGROUND_RGB, float)]
    dists = [np.linalg.norm(a - b) for a, b in itertools.combinations(rgb, 2)]
    assert min(dists) >= 70


@pytest.mark.parametrize("size", [32, 48, 64])
def test_empty_canvas_is_background(size):
    img = render([], size)
    assert img.shape == (size, size, 3) and img.dtype == np.uint8
    assert (img == np.array([153, 153, 153], np.uint8)).all()


@pytest.mark.parametrize("shape", SHAPES)
def test_object_drawn_where_placed(shape):
    obj = ShapeObject(shape, "blue", cx=0.25, cy=0.75, size=0.3)
    img = render([obj], 32)
    (mask,) = object_masks([obj], 32)
    assert (img[mask] == COLOR_RGB["blue"]).all()
    assert (img[~mask] == BACKGROUND_RGB).all()
    ys, xs = np.nonzero(mask)
    # box is 9.6 px wide centred at (8, 24): every pixel lies inside it, the centroid is near the centre
    assert xs.min() >= 3 and xs.max() <= 12 and ys.min() >= 19 and ys.max() <= 28
    assert abs(xs.mean() + 0.5 - 8) < 1.0 and abs(ys.mean() + 0.5 - 24) < 2.0
    assert 0.4 * 9.6**2 < mask.sum() <= 9.6**2 + 12


def test_shapes_fill_their_box_differently():
    area = {s: object_masks([ShapeObject(s, "red", 0.5, 0.5, 0.75)], 32)[0].mean() / 0.75**2 for s in SHAPES}
    assert area["square"] == pytest.approx(1.0, abs=0.05)
    assert area["circle"] == pytest.approx(np.pi / 4, abs=0.05)
    assert area["triangle"] == pytest.approx(0.5, abs=0.05)
    assert area["bar"] == pytest.approx(0.5, abs=0.05)
    assert area["cross"] == pytest.approx(5 / 9, abs=0.05)


def test_triangle_points_up_and_bar_lies_flat():
    (m,) = object_masks([ShapeObject("triangle", "red", 0.5, 0.5, 0.75)], 32)
    ys, _ = np.nonzero(m)
    top, bottom = m[ys.min()].sum(), m[ys.max()].sum()
    assert top < bottom
    (bar,) = object_masks([ShapeObject("bar", "red", 0.5, 0.5, 0.75)], 32)
    ys, xs = np.nonzero(bar)
    assert xs.max() - xs.min() + 1 == 24 and ys.max() - ys.min() + 1 == 12


def test_whole_pixel_boxes_give_one_pattern_per_shape_and_size():
    for shape in SHAPES:
        a = object_masks([ShapeObject(shape, "red", 10.5 / 32, 10.5 / 32, 9 / 32)], 32)[0]
        b = object_masks([ShapeObject(shape, "red", 20.5 / 32, 15.5 / 32, 9 / 32)], 32)[0]
        assert np.array_equal(a[6:15, 6:15], b[11:20, 16:25])


def test_unknown_shape_or_colour_is_user_error():
    with pytest.raises(UserError, match="unknown ShapeWorld shape"):
        render([ShapeObject("hexagon", "red", 0.5, 0.5, 0.3)])
    with pytest.raises(UserError, match="unknown colour"):
        render([ShapeObject("circle", "teal", 0.5, 0.5, 0.3)])
    with pytest.raises(UserError, match="cannot draw class"):
        sample_scene(
            {"tag": "single_object", "include": [{"class": "dog", "count": 1}]}, np.random.default_rng(0)
        )


def test_token_grid_mask_threshold():
    m = np.zeros((32, 32), bool)
    m[0:4, 0:4] = True  # token (0, 0) fully covered
    m[4:5, 4:8] = True  # token (1, 1): 4 of 16 pixels = 25 % → on
    m[0:3, 8:9] = True  # token (0, 2): 3 of 16 pixels → off
    grid = token_grid_mask([m], (8, 8))
    assert grid.shape == (8, 8) and grid.dtype == bool
    assert grid[0, 0] and grid[1, 1] and not grid[0, 2]
    assert grid.sum() == 2
    assert not token_grid_mask([], (4, 4)).any()
    # non-divisible grid: blocks still tile the image
    assert token_grid_mask([np.ones((32, 32), bool)], (5, 3)).all()


def test_scene_matches_metadata_for_every_shapeworld_prompt_kind():
    rng = np.random.default_rng(0)
    for meta in generate_metadata(300, seed=1):
        objs = sample_scene(meta, rng)
        want = sum(c["count"] for c in meta["include"])
        assert len(objs) == want
        for clause in meta["include"]:
            mine = [o for o in objs if o.shape == clause["class"]]
            assert len(mine) >= clause["count"]
            if "color" in clause:
                assert sum(o.color == clause["color"] for o in mine) >= clause["count"]
        for clause in meta.get("exclude", []):
            assert sum(o.shape == clause["class"] for o in objs) < clause["count"]
        boxes = [o.box(32) for o in objs]
        for b in boxes:
            assert b[0] >= 0 and b[1] >= 0 and b[2] <= 32 and b[3] <= 32
        masks = object_masks(objs, 32)
        assert sum(m.sum() for m in masks) == np.logical_or.reduce(masks).sum()  # no overlap
        if meta["tag"] == "position":
            rel = meta["include"][1]["position"][0]
            assert rel in relative_position(boxes[1], boxes[0])


def test_sampled_objects_sit_on_the_token_grid_without_sharing_a_token():
    rng = np.random.default_rng(4)
    cells_seen = set()
    for meta in generate_metadata(200, seed=2):
        objs = sample_scene(meta, rng)
        owner = np.zeros((8, 8), int)  # which object covers each 4×4-px token cell
        for k, o in enumerate(objs, start=1):
            x0, y0, x1, y1 = o.box(32)
            assert (x0 % 4, y0 % 4, x1 - x0, y1 - y0) == (0, 0, 8, 8)
            r, c = int(y0) // 4, int(x0) // 4
            assert not owner[r : r + 2, c : c + 2].any()
            grown = owner[max(r - 1, 0) : r + 3, max(c - 1, 0) : c + 3]
            assert not grown.any(), "one free cell between objects"
            owner[r : r + 2, c : c + 2] = k
            cells_seen.add((r, c))
            # the object's pixels stay inside its 2×2 cells
            (m,) = object_masks([o], 32)
            assert m.sum() == m[4 * r : 4 * r + 8, 4 * c : 4 * c + 8].sum() > 0
    assert len(cells_seen) == 49, "every corner cell position is used"


def test_position_scenes_cover_all_relations():
    rng = np.random.default_rng(3)
    for meta in all_metadata("position")[:8]:  # square vs circle, all four relations, both ways
        for _ in range(5):
            a, b = sample_scene(meta, rng)
            assert meta["include"][1]["position"][0] in relative_position(b.box(32), a.box(32))


def test_scene_sampling_is_deterministic():
    meta = all_metadata("counting")[2]
    a = sample_scene(meta, np.random.default_rng(7))
    b = sample_scene(meta, np.random.default_rng(7))
    assert a == b
    assert all(type(v) is float for o in a for v in (o.cx, o.cy, o.size))
