"""ShapeWorld's two scales (render.py): the 32 px world stays bit-identical (shipped checkpoints depend
on it), and the 64 px one — 16×16 tokens, 4×4-token objects with a rim and a pale core — is sampled,
drawn, detected, scored and pretrained end to end."""

import hashlib

import numpy as np
import pytest
from click.testing import CliRunner

from t2i_gcpo.errors import UserError
from t2i_gcpo.scoring.geneval_rules import evaluate_detections, relative_position
from t2i_gcpo.worlds.shapeworld import (
    BACKGROUND_RGB,
    COLOR_RGB,
    COLORS,
    SHAPES,
    TAGS,
    ShapeObject,
    generate_metadata,
    object_masks,
    render,
    sample_scene,
    token_grid_mask,
)
from t2i_gcpo.worlds.shapeworld.detect import detect
from t2i_gcpo.worlds.shapeworld.render import CORE_ALPHA, core_masks, core_rgb


def test_32px_scenes_and_renders_are_bit_identical_to_the_shipped_world():
    """Pinned before the 64 px scale was added: 60 sampled scenes (all six tags) at 32 px."""
    rng = np.random.default_rng(11)
    digest = hashlib.sha256()
    sums = []
    for meta in generate_metadata(60, seed=5):
        img = render(sample_scene(meta, rng))
        digest.update(img.tobytes())
        sums.append(int(img.astype(np.int64).sum()))
    assert sums[:6] == [472280, 455328, 436832, 461440, 444980, 425952]
    assert digest.hexdigest() == "00de02b54a170bccb07d1316b6fe0c58ac5480c56d82409fc23afa39df21e25e"
    assert int(rng.integers(1 << 30)) == 309596929  # the sampler draws the same random numbers


def test_64px_objects_sit_on_4x4_token_boxes_one_free_cell_apart():
    rng = np.random.default_rng(4)
    corners = set()
    for meta in generate_metadata(200, seed=2):
        objs = sample_scene(meta, rng, 64)
        assert len(objs) == sum(c["count"] for c in meta["include"])
        owner = np.zeros((16, 16), int)  # which object covers each 4×4-px token cell
        for k, o in enumerate(objs, start=1):
            x0, y0, x1, y1 = o.box(64)
            assert (x0 % 4, y0 % 4, x1 - x0, y1 - y0) == (0, 0, 16, 16)
            r, c = int(y0) // 4, int(x0) // 4
            assert not owner[max(r - 1, 0) : r + 5, max(c - 1, 0) : c + 5].any(), "one free cell between"
            owner[r : r + 4, c : c + 4] = k
            corners.add((r, c))
            (m,) = object_masks([o], 64)
            assert m.sum() == m[4 * r : 4 * r + 16, 4 * c : 4 * c + 16].sum() > 0  # inside its tokens
        if meta["tag"] == "position":
            rel = meta["include"][1]["position"][0]
            assert rel in relative_position(objs[1].box(64), objs[0].box(64))
    assert len(corners) > 150  # of the 13 × 13 corner cells


@pytest.mark.parametrize("size", [32, 64])
def test_detail_only_at_64px(size):
    """At 64 px an object's pixels hold its colour (rim) and its pale core colour; at 32 px one colour."""
    for shape in SHAPES:
        for color in COLORS:
            obj = ShapeObject(shape, color, 0.5, 0.5, 0.25)
            img = render([obj], size)
            (mask,) = object_masks([obj], size)
            colours = {tuple(p) for p in img[mask]}
            if size == 32:
                assert colours == {COLOR_RGB[color]}
            else:
                assert colours == {COLOR_RGB[color], core_rgb(color)}
                assert (img[~mask] == BACKGROUND_RGB).all()
                (core,) = core_masks([mask], size)
                assert core.sum() >= 32 and not core[mask.sum(1) > 0].all()  # a core inside a rim
    bg, c = np.array(BACKGROUND_RGB), np.array(COLOR_RGB["blue"])
    assert np.allclose(core_rgb("blue"), bg + CORE_ALPHA * (c - bg), atol=0.5)  # on the colour's blend line


@pytest.mark.parametrize("shape", SHAPES)
def test_detector_reads_every_shape_and_colour_on_clean_64px_renders(shape):
    for i, color in enumerate(COLORS):
        obj = ShapeObject(shape, color, cx=(8 + 4 * i + 8) / 64, cy=(4 + 4 * (i % 5) + 8) / 64, size=16 / 64)
        (d,) = detect(render([obj], 64))
        assert (d.cls, d.color) == (shape, color)  # the object's colour, not its core's
        assert d.score > 0.95
        (m,) = object_masks([obj], 64)
        assert d.mask.shape == (64, 64) and np.array_equal(d.mask, m)
        ys, xs = np.nonzero(m)
        assert np.allclose(d.box, (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1), atol=1.0)


def test_strict_geneval_verdict_on_64px_scenes_of_every_tag():
    rng = np.random.default_rng(0)
    for tag in TAGS:
        for meta in generate_metadata(40, seed=1, tags=[tag]):
            objs = sample_scene(meta, rng, 64)
            dets = detect(render(objs, 64))
            assert evaluate_detections(meta, dets).correct, (meta["prompt"], dets)
            assert sorted((d.cls, d.color) for d in dets) == sorted((o.shape, o.color) for o in objs)


def test_64px_faded_core_is_filled_but_enclosed_background_is_not():
    obj = ShapeObject("square", "purple", 0.5, 0.5, 0.25)
    img = render([obj], 64)
    (mask,) = object_masks([obj], 64)
    (core,) = core_masks([mask], 64)
    bg, c = np.array(BACKGROUND_RGB, float), np.array(COLOR_RGB["purple"], float)
    img[core] = np.round(bg + 0.35 * (c - bg))  # a VQ that washes the core out below α = 0.5
    (d,) = detect(img)
    assert (d.cls, d.color) == ("square", "purple") and d.score > 0.9 and np.array_equal(d.mask, mask)
    img[core] = BACKGROUND_RGB  # a hollow square: the gray inside is background
    (d,) = detect(img)
    assert np.array_equal(d.mask, mask & ~core)


def test_reward_object_grid_is_16x16_at_64px():
    from t2i_gcpo.rewards.forms.shapeworld import ShapeWorldReward

    objs = [
        ShapeObject("square", "red", 8 / 64, 24 / 64, 16 / 64),  # tokens rows 4–7, columns 0–3
        ShapeObject("circle", "blue", 40 / 64, 24 / 64, 16 / 64),  # rows 4–7, columns 8–11
    ]
    img = render(objs, 64)
    meta = {
        "tag": "position",
        "include": [
            {"class": "square", "count": 1},
            {"class": "circle", "count": 1, "position": ["right of", 0]},
        ],
    }
    out = ShapeWorldReward(grid=(16, 16)).score_image(img, meta)
    assert out["strict"] and out["partial"] == 1.0
    grid = out["object_grid"]
    assert grid.shape == (16, 16) and grid.dtype == bool
    want = np.zeros((16, 16), bool)
    want[4:8, 0:4] = True  # the square fills its 4×4 tokens
    assert grid[4:8, 0:4].all() and not grid[:, 4:8].any()
    assert grid[4:8, 8:12].sum() >= 12 and grid.sum() == want.sum() + grid[4:8, 8:12].sum()
    assert np.array_equal(token_grid_mask(object_masks(objs[:1], 64), (16, 16)), want)


def test_64px_config_gives_a_16x16_vq_and_a_256_token_prior():
    from t2i_gcpo.policies.ar import ARConfig, ARPolicy
    from t2i_gcpo.policies.prompt_tokenizer import PromptTokenizer
    from t2i_gcpo.pretrain.shapeworld_ar import PretrainConfig
    from t2i_gcpo.tokenizers.vq import VQTokenizer

    cfg = PretrainConfig.for_size(64, seed=3)
    assert (cfg.image_size, cfg.seed, cfg.vq.image_size, cfg.vq.codebook_size) == (64, 3, 64, 1024)
    assert PretrainConfig.for_size(32) == PretrainConfig()
    with pytest.raises(UserError, match="32 and 64"):
        PretrainConfig.for_size(48)
    vq = VQTokenizer(cfg.vq)
    assert vq.grid_shape == (16, 16)
    words = PromptTokenizer.build(m["prompt"] for m in generate_metadata(50, 0))
    policy = ARPolicy(
        ARConfig(prompt_len=words.max_len, hidden_size=32, intermediate_size=64, num_layers=1), words, vq
    )
    assert policy.grid_shape == (16, 16) and policy.num_tokens == 256 and policy.config.codebook_size == 1024
    assert tuple(policy.layout.grid) == (16, 16)


def test_pretrain_refuses_a_vq_of_the_other_size_before_rendering(tmp_path):
    from t2i_gcpo.pretrain.shapeworld_ar import PretrainConfig, pretrain
    from t2i_gcpo.tokenizers.vq import VQConfig

    with pytest.raises(UserError, match="is for 32 px images, the scenes are 64 px"):
        pretrain(str(tmp_path / "m"), PretrainConfig.for_size(64, vq=VQConfig(image_size=32)))


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--arch", "masked"], "--size 64 applies to --arch ar only"),
        (["--world", "arithmetic"], "--size applies to --world shapeworld only"),
    ],
)
def test_cli_size_64_errors_are_one_line(tmp_path, extra, needle):
    from t2i_gcpo.cli import cli

    err = (
        CliRunner().invoke(cli, ["pretrain", "--size", "64", "--out", str(tmp_path / "m"), *extra]).exception
    )
    assert isinstance(err, UserError) and needle in str(err) and "\n" not in str(err), err
    assert not (tmp_path / "m").exists()


def test_the_shipped_64px_prior_samples_64px_scenes_its_reward_scores_on_16x16_tokens():
    """`--model shapeworld-64`: the shipped 64 px prior (`pretrain --size 64`) rolls out 256 tokens,
    decodes 64 px images that its reward reads, and, with guidance, mostly draws what is asked."""
    import torch

    from t2i_gcpo.analysis.credit_maps import base_model
    from t2i_gcpo.policies.base import SamplingParams
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.rewards.registry import build_reward
    from t2i_gcpo.tasks.loop import group_generators, sample_and_score
    from t2i_gcpo.tasks.registry import get_task

    policy = load_policy("shapeworld-64")
    assert tuple(policy.layout.grid) == (16, 16) and policy.num_tokens == 256
    assert policy.default_task == "shapeworld" and base_model(policy) == "shapeworld-64"
    assert base_model(load_policy("shapeworld")) == "shapeworld"
    task = get_task("shapeworld", policy)
    prompts = [task.parse(t) for t in ("a photo of a red square", "a photo of a blue circle")]
    reward = build_reward("shapeworld", grid=policy.layout.grid)
    sampling = SamplingParams(guidance_scale=policy.default_sampling().guidance_scale)
    scored = sample_and_score(policy, reward, prompts, 4, sampling, group_generators(0, "test", [0, 1]))
    assert scored.rollout.tokens.shape == (8, 256) and scored.outputs.shape == (8, 3, 64, 64)
    assert all(d["object_grid"].shape == (16, 16) for d in scored.reward.details)
    assert torch.isfinite(scored.rollout.logp["pos"]).all()
    assert scored.reward.scores.mean() >= 0.5, scored.reward.scores  # single objects: the easy tag
