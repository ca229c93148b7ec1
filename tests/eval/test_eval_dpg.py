"""DPG-Bench: question CSV parsing, 2×2 tiling, parent zeroing and category scores, BLIP VQA adapter."""

import csv
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from t2i_gcpo.errors import UserError
from t2i_gcpo.eval.dpg import (
    DPG_COLUMNS,
    VQAModel,
    generate_dpg,
    is_yes,
    load_dpg_prompts,
    read_dpg_csv,
    score_dpg,
    score_dpg_folder,
    split_2x2,
    tile_2x2,
)
from t2i_gcpo.eval.geneval import image_sampling
from t2i_gcpo.policies.base import SamplingParams, TokenLayout

# item a: 1 "is there a cat?" (entity), 2 "is the cat black?" (attribute, parent 1),
#         3 "is the cat on a sofa?" (relation, parents 1,2)
# item b: 1 "is there a dog?" (entity)
ROWS = [
    ("a", "a cat", "cat", "1", "0", "entity", "entity - whole", "entity - whole (cat)", "is there a cat?"),
    (
        "a",
        "a cat",
        "black",
        "2",
        "1",
        "attribute",
        "attribute - color",
        "attribute (cat, black)",
        "is the cat black?",
    ),
    (
        "a",
        "a cat",
        "sofa",
        "3",
        "1,2",
        "relation",
        "relation - spatial",
        "relation (cat, sofa, on)",
        "is the cat on a sofa?",
    ),
    ("b", "a dog", "dog", "1", "0", "entity", "entity - whole", "entity - whole (dog)", "is there a dog?"),
]


def write_csv(path, rows, header=DPG_COLUMNS):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]


def test_tile_and_split_2x2_offsets():
    tiles = [Image.new("RGB", (6, 4), c) for c in COLOURS]
    grid = tile_2x2(tiles)
    assert grid.size == (12, 8)
    # row-major: [[0, 1], [2, 3]] at pixel offsets (0,0), (6,0), (0,4), (6,4)
    assert [grid.getpixel(xy) for xy in [(0, 0), (6, 0), (0, 4), (6, 4), (5, 3), (11, 7)]] == [
        COLOURS[0],
        COLOURS[1],
        COLOURS[2],
        COLOURS[3],
        COLOURS[0],
        COLOURS[3],
    ]
    back = split_2x2(grid)
    for tile, colour in zip(back, COLOURS):
        assert tile.size == (6, 4)
        assert np.all(np.asarray(tile) == np.array(colour, dtype=np.uint8))
    with pytest.raises(ValueError):
        tile_2x2(tiles[:3])


def test_read_dpg_csv(tmp_path):
    qs = read_dpg_csv(write_csv(tmp_path / "q.csv", ROWS))
    assert [(q.item_id, q.proposition_id, q.parents) for q in qs] == [
        ("a", "1", ()),
        ("a", "2", ("1",)),
        ("a", "3", ("1", "2")),
        ("b", "1", ()),
    ]
    assert qs[1].category_detailed == "attribute - color" and qs[1].question == "is the cat black?"
    assert qs[2].line == 4


@pytest.mark.parametrize(
    "rows, header, message",
    [
        (ROWS, DPG_COLUMNS[:-1], "missing column"),
        (ROWS[:2] + [ROWS[2][:-1]], DPG_COLUMNS, "q.csv:4: expected 9 fields"),
        (ROWS + [ROWS[0]], DPG_COLUMNS, "q.csv:6: duplicate proposition 1 of a"),
        ([ROWS[0], ROWS[1][:4] + ("7",) + ROWS[1][5:]], DPG_COLUMNS, "q.csv:3: dependency 7 is not"),
        ([ROWS[0][:8] + ("",)], DPG_COLUMNS, "q.csv:2: .*must not be empty"),
        ([ROWS[0][:4] + ("1,,2",) + ROWS[0][5:]], DPG_COLUMNS, "q.csv:2: malformed dependency"),
        ([], DPG_COLUMNS, "no questions"),
    ],
)
def test_read_dpg_csv_errors_name_the_line(tmp_path, rows, header, message):
    with pytest.raises(UserError, match=message):
        read_dpg_csv(write_csv(tmp_path / "q.csv", rows, header))


def test_is_yes():
    assert is_yes("yes") and is_yes(" Yes.") and is_yes("yes, it is")
    assert not is_yes("no") and not is_yes("") and not is_yes("yesterday") and not is_yes("maybe yes")


class ScriptedVQA:
    """Answers by the tile's colour: ANSWERS[tile index][question]."""

    name = "scripted"

    def __init__(self, answers):
        self.answers = answers
        self.seen = []

    def answer(self, image, question):
        tile = COLOURS.index(image.getpixel((0, 0)))
        self.seen.append((tile, question))
        return self.answers[tile][question]


CAT, BLACK, SOFA, DOG = (r[-1] for r in ROWS)
ANSWERS = [
    {CAT: "yes", BLACK: "yes", SOFA: "yes", DOG: "yes"},  # tile 0: 3/3 for a
    {CAT: "no", BLACK: "yes", SOFA: "yes", DOG: "no"},  # tile 1: parent 1 said no → 2 and 3 zeroed: 0/3
    {CAT: "yes", BLACK: "no", SOFA: "yes", DOG: "yes"},  # tile 2: 3 has parent 2 = no: 1/3
    {CAT: "yes", BLACK: "yes", SOFA: "no", DOG: "No."},  # tile 3: 2/3
]


def grid():
    return tile_2x2([Image.new("RGB", (8, 8), c) for c in COLOURS])


def test_score_dpg_parent_zeroing_and_categories(tmp_path):
    questions = read_dpg_csv(write_csv(tmp_path / "q.csv", ROWS))
    vqa = ScriptedVQA(ANSWERS)
    result = score_dpg({"a": grid(), "b": grid()}, questions, vqa, progress=False)

    assert len(vqa.seen) == 4 * 3 + 4 * 1 and {t for t, _ in vqa.seen} == {0, 1, 2, 3}
    a, b = result["per_item"]["a"], result["per_item"]["b"]
    assert a["tile_scores"] == pytest.approx([1, 0, 1 / 3, 2 / 3])
    assert a["score"] == pytest.approx(100 * 2 / 4)
    assert b["tile_scores"] == [1, 0, 1, 0] and b["score"] == pytest.approx(50)
    assert a["answers"][1] == ["no", "yes", "yes"]
    assert result["score"] == pytest.approx(50)
    assert result["n_items"] == 2 and result["n_missing"] == 0
    assert result["label"] == "DPG-Bench (proxy VQA: scripted)"
    # per (tile, question): entity = a's q1 [1,0,1,1] + b's q1 [1,0,1,0] → 5/8;
    # attribute = q2 after zeroing [1,0,0,1] → 2/4; relation = q3 [1,0,0,0] → 1/4
    assert result["category_broad"] == pytest.approx({"entity": 62.5, "attribute": 50.0, "relation": 25.0})
    assert result["category_detailed"] == pytest.approx(
        {"entity - whole": 62.5, "attribute - color": 50.0, "relation - spatial": 25.0}
    )

    # only items with images count; images without questions are an error
    only_a = score_dpg({"a": grid()}, questions, vqa, progress=False)
    assert only_a["score"] == pytest.approx(50) and only_a["n_missing"] == 1
    with pytest.raises(UserError, match="no questions"):
        score_dpg({"zzz": grid()}, questions, vqa, progress=False)


def test_score_dpg_folder_writes_results(tmp_path):
    write_csv(tmp_path / "q.csv", ROWS)
    (tmp_path / "imgs").mkdir()
    grid().save(tmp_path / "imgs" / "a.png")
    result = score_dpg_folder(
        tmp_path / "imgs", tmp_path / "q.csv", ScriptedVQA(ANSWERS), tmp_path / "out", progress=False
    )
    assert result["score"] == pytest.approx(50)
    (line,) = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    assert json.loads(line)["item_id"] == "a"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["score"] == pytest.approx(50) and "per_item" not in summary
    text = (tmp_path / "out" / "summary.txt").read_text()
    assert "DPG-Bench (proxy VQA: scripted)" in text and "50.00" in text


def dpg(
    policy,
    prompts,
    root,
    *,
    cfg_scale=5.0,
    temperature=1.0,
    top_k=0,
    steps=None,
    reveal_order=None,
    overwrite=False,
    **kw,
):
    """generate_dpg as `eval dpg` calls it: the sampling built once from the flags."""
    sampling = image_sampling(
        policy,
        cfg_scale=cfg_scale,
        temperature=temperature,
        top_k=top_k,
        steps=steps,
        reveal_order=reveal_order,
    )
    return generate_dpg(policy, prompts, root, sampling, overwrite=overwrite, **kw)


class FakePolicy(torch.nn.Module):
    layout = TokenLayout.image(1, 1)

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.calls = 0

    def check_prompts(self, prompts):
        pass

    def rollout(self, prompts, group_size, sampling, generators):
        assert len(generators) == len(prompts)  # one generator per prompt
        self.calls += 1
        tokens = torch.cat([torch.randint(0, 256, (group_size, 1), generator=g) for g in generators])
        return SimpleNamespace(tokens=tokens)

    def decode(self, rollout):
        return (rollout.tokens.float() / 255).view(-1, 1, 1, 1).expand(-1, 3, 6, 6)


def test_generate_dpg_grids_resume(tmp_path):
    prompts = [{"item_id": f"p{i}", "prompt": f"prompt {i}"} for i in range(3)]
    policy = FakePolicy()
    assert dpg(policy, prompts, tmp_path, batch=2, seed=1, progress=False) == 3
    grids = {p["item_id"]: np.asarray(Image.open(tmp_path / f"{p['item_id']}.png")) for p in prompts}
    assert all(g.shape == (12, 12, 3) for g in grids.values())
    # each tile is one sample: 4 distinct grey levels per grid (with overwhelming probability)
    assert len({int(g[y, x, 0]) for g in grids.values() for y in (0, 6) for x in (0, 6)}) > 4
    os.remove(tmp_path / "p1.png")
    policy.calls = 0
    assert dpg(policy, prompts, tmp_path, batch=2, seed=1, progress=False) == 1
    assert policy.calls == 1
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "p1.png")), grids["p1"])
    # a prompt's grid does not depend on its batch-mates
    assert dpg(policy, prompts, tmp_path / "b1", batch=1, seed=1, progress=False) == 3
    for p in prompts:
        np.testing.assert_array_equal(
            np.asarray(Image.open(tmp_path / "b1" / f"{p['item_id']}.png")), grids[p["item_id"]]
        )
    with pytest.raises(UserError, match="safe file name"):
        dpg(policy, [{"item_id": "../x", "prompt": "p"}], tmp_path, progress=False)


def test_packaged_dpg_prompts():
    prompts = load_dpg_prompts()
    assert len(prompts) == 1065 and len({p["item_id"] for p in prompts}) == 1065
    assert all(p["prompt"].strip() for p in prompts)


# ---------------------------------------------------------------------------------------------
# BLIP VQA adapter
# ---------------------------------------------------------------------------------------------

WORDS = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "[DEC]",
    "yes",
    "no",
    "is",
    "there",
    "a",
    "red",
    "cat",
    "?",
]


def save_tiny_blip(path):
    from transformers import (
        BertTokenizer,
        BlipConfig,
        BlipForQuestionAnswering,
        BlipImageProcessor,
        BlipProcessor,
        BlipTextConfig,
        BlipVisionConfig,
    )

    path.mkdir()
    (path / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    tok = BertTokenizer(str(path / "vocab.txt"), bos_token="[DEC]")
    text = BlipTextConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=32,
        bos_token_id=WORDS.index("[DEC]"),
        sep_token_id=3,
        pad_token_id=0,
        encoder_hidden_size=32,
    )
    vision = BlipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    torch.manual_seed(0)
    model = BlipForQuestionAnswering(BlipConfig(text_config=text.to_dict(), vision_config=vision.to_dict()))
    model.save_pretrained(path)
    BlipProcessor(
        image_processor=BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=tok
    ).save_pretrained(path)


def test_vqa_adapter_on_tiny_random_blip(tmp_path):
    save_tiny_blip(tmp_path / "blip")
    vqa = VQAModel.from_pretrained(tmp_path / "blip", batch_size=3, max_new_tokens=3)
    assert vqa.name == "blip"
    tiles = split_2x2(grid())
    answers = vqa.answer_batch(tiles + [tiles[0]], ["is there a red cat?"] * 5)
    assert len(answers) == 5 and all(isinstance(a, str) for a in answers)
    assert set(" ".join(answers).split()) <= set(WORDS[5:])  # decoded from the tiny vocabulary
    assert answers[4] == answers[0] == vqa.answer(tiles[0], "is there a red cat?")  # batching changes nothing
    result = score_dpg(
        {"x": grid()}, [read_dpg_csv(write_csv(tmp_path / "q.csv", [("x",) + ROWS[0][1:]]))[0]], vqa
    )
    assert result["label"] == "DPG-Bench (proxy VQA: blip)" and 0 <= result["score"] <= 100

    with pytest.raises(UserError, match="no config.json"):
        VQAModel.from_pretrained(tmp_path / "nothing")
    (tmp_path / "m2f").mkdir()
    (tmp_path / "m2f" / "config.json").write_text(json.dumps({"model_type": "mask2former"}))
    with pytest.raises(UserError, match="BLIP VQA checkpoint"):
        VQAModel.from_pretrained(tmp_path / "m2f")


def test_eval_dpg_cli_score_only_with_tiny_blip(tmp_path):
    from click.testing import CliRunner

    from t2i_gcpo.cli import cli

    save_tiny_blip(tmp_path / "blip")
    write_csv(tmp_path / "q.csv", ROWS)
    (tmp_path / "imgs").mkdir()
    grid().save(tmp_path / "imgs" / "a.png")
    args = [
        "eval",
        "dpg",
        "--score-only",
        str(tmp_path / "imgs"),
        "--csv",
        str(tmp_path / "q.csv"),
        "--vqa",
        str(tmp_path / "blip"),
        "--out",
        str(tmp_path / "out"),
    ]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "DPG-Bench (proxy VQA:" in result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert 0 <= summary["score"] <= 100 and summary["n_items"] == 1
    bad = CliRunner().invoke(cli, [*args[:-2], "--out", str(tmp_path / "o2"), "--model", "shapeworld"])
    assert bad.exit_code != 0 and "either --model" in str(bad.exception)


# ---------------------------------------------------------------------------------------------
# resuming into an existing folder: only the same prompts and settings, else refuse (or overwrite)
# ---------------------------------------------------------------------------------------------

DPG_PROMPTS = [{"item_id": f"p{i}", "prompt": f"prompt {i}"} for i in range(3)]


@pytest.mark.parametrize(
    "change, word",
    [
        ({"seed": 2}, "seed"),
        ({"cfg_scale": 2.0}, "cfg_scale"),
        ({"model": "other"}, "model"),
        ({"temperature": 0.5}, "temperature"),
        ({"top_k": 3}, "top_k"),
    ],
)
def test_generate_dpg_refuses_grids_made_with_other_settings(tmp_path, change, word):
    policy = FakePolicy()
    args = dict(batch=2, seed=1, cfg_scale=5.0, model="fake", progress=False)
    dpg(policy, DPG_PROMPTS, tmp_path, **args)
    settings = json.loads((tmp_path / "generation.json").read_text())
    assert settings["settings"] == {
        "model": "fake",
        "seed": 1,
        "cfg_scale": 5.0,
        "temperature": 1.0,
        "top_k": 0,
        "n": 4,
    }
    before = (tmp_path / "p0.png").read_bytes()
    policy.calls = 0
    with pytest.raises(UserError, match=rf"{word}=.*--overwrite") as e:
        dpg(policy, DPG_PROMPTS, tmp_path, **{**args, **change})
    assert "\n" not in str(e.value) and policy.calls == 0
    assert (tmp_path / "p0.png").read_bytes() == before
    assert dpg(policy, DPG_PROMPTS, tmp_path, overwrite=True, **{**args, **change}) == 3


def test_generate_dpg_refuses_other_prompts_and_stale_grids(tmp_path):
    policy = FakePolicy()
    args = dict(batch=2, seed=1, model="fake", progress=False)
    dpg(policy, DPG_PROMPTS, tmp_path, **args)
    # the same item id for another prompt text
    with pytest.raises(UserError, match=r"p0\.png.*another prompt.*--overwrite"):
        dpg(policy, [{"item_id": "p0", "prompt": "something else"}], tmp_path, **args)
    # fewer prompts: the other grids are stale and would be scored
    with pytest.raises(UserError, match=r"2 grid\(s\).*p1.*--overwrite"):
        dpg(policy, DPG_PROMPTS[:1], tmp_path, **args)
    # grids of unknown provenance
    (tmp_path / "legacy").mkdir()
    grid().save(tmp_path / "legacy" / "p0.png")
    with pytest.raises(UserError, match=r"generation.json.*--overwrite"):
        dpg(policy, DPG_PROMPTS, tmp_path / "legacy", **args)
    assert dpg(policy, DPG_PROMPTS[:1], tmp_path, overwrite=True, **args) == 1
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["p0.png"]


def test_score_dpg_folder_scores_only_this_runs_items(tmp_path):
    write_csv(tmp_path / "q.csv", ROWS)
    (tmp_path / "imgs").mkdir()
    grid().save(tmp_path / "imgs" / "a.png")
    grid().save(tmp_path / "imgs" / "b.png")
    vqa = ScriptedVQA(ANSWERS)
    with pytest.raises(UserError, match=r"1 grid\(s\).*b"):
        score_dpg_folder(
            tmp_path / "imgs", tmp_path / "q.csv", vqa, tmp_path / "out", items=["a"], progress=False
        )
    os.remove(tmp_path / "imgs" / "b.png")
    with pytest.raises(UserError, match=r"b\.png"):
        score_dpg_folder(
            tmp_path / "imgs", tmp_path / "q.csv", vqa, tmp_path / "out", items=["a", "b"], progress=False
        )
    result = score_dpg_folder(
        tmp_path / "imgs", tmp_path / "q.csv", vqa, tmp_path / "out", items=["a"], progress=False
    )
    assert result["n_items"] == 1


class FakeMaskedPolicy(FakePolicy):
    """Decodes in steps (a masked model's default_sampling names its steps); records what it was asked."""

    def default_sampling(self):
        return SamplingParams(guidance_scale=3.0, steps=8, reveal_order="confidence")

    def rollout(self, prompts, group_size, sampling, generators):
        self.sampling = sampling
        return super().rollout(prompts, group_size, sampling, generators)


def test_generate_dpg_passes_and_records_a_masked_models_steps_and_reveal_order(tmp_path):
    policy = FakeMaskedPolicy()
    args = dict(batch=2, seed=1, cfg_scale=5.0, model="fake", progress=False)
    dpg(policy, DPG_PROMPTS, tmp_path, steps=3, reveal_order="random", **args)
    assert (policy.sampling.steps, policy.sampling.reveal_order) == (3, "random")
    settings = json.loads((tmp_path / "generation.json").read_text())["settings"]
    assert (settings["steps"], settings["reveal_order"]) == (3, "random")
    with pytest.raises(UserError, match=r"steps=3, this run asks for steps=4"):
        dpg(policy, DPG_PROMPTS, tmp_path, steps=4, reveal_order="random", **args)
    with pytest.raises(UserError, match="unknown reveal order"):
        dpg(policy, DPG_PROMPTS, tmp_path / "x", reveal_order="raster", **args)
    autoregressive = FakePolicy()
    autoregressive.default_sampling = lambda: SamplingParams(guidance_scale=3.0)  # steps None: token by token
    with pytest.raises(UserError, match="--steps and --reveal-order apply to masked models only"):
        dpg(autoregressive, DPG_PROMPTS, tmp_path / "y", steps=3, reveal_order="random", **args)
