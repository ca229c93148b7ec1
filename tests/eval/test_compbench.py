"""T2I-CompBench: BLIP-VQA against an independent computation on a tiny random BLIP, CLIPScore's plain
cosine, the spatial and numeracy rules by hand, and the detector-substitute label in every output."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from t2i_gcpo.errors import UserError
from t2i_gcpo.eval import compbench as CB
from t2i_gcpo.eval.layout import write_prompt_folder
from t2i_gcpo.scoring.detections import Detection

from compbench_fixtures import PROMPTS, SIZE, WORDS, build_tiny_blip, write_compbench_data


@pytest.fixture(scope="module")
def blip(tmp_path_factory):
    return build_tiny_blip(tmp_path_factory.mktemp("blip") / "blip")


def images(k: int, seed: int = 0, size: int = 48) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(k)]


def independent_yes(model, image: Image.Image, question: str) -> float:
    """The reference's vqa_prob written out: [ENC] q [SEP] over the image, the decoder's first logits after
    [DEC], P(yes) / (P(yes) + P(no)); the image resized bicubic to 32 px, CLIP's mean and std."""
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073])[:, None, None]
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711])[:, None, None]
    arr = np.asarray(image.convert("RGB").resize((SIZE, SIZE), Image.BICUBIC), dtype=np.float32) / 255
    pix = ((torch.from_numpy(arr).permute(2, 0, 1) - mean) / std)[None]
    words = question.replace("?", " ?").split()
    ids = torch.tensor([[WORDS.index("[ENC]"), *(WORDS.index(w) for w in words), WORDS.index("[SEP]")]])
    with torch.no_grad():
        img = model.vision_model(pixel_values=pix).last_hidden_state
        q = model.text_encoder(input_ids=ids, encoder_hidden_states=img).last_hidden_state
        logits = model.text_decoder(
            input_ids=torch.tensor([[WORDS.index("[DEC]")]]), encoder_hidden_states=q
        ).logits
    p = torch.softmax(logits[0, 0].double(), -1)
    return float(p[WORDS.index("yes")] / (p[WORDS.index("yes")] + p[WORDS.index("no")]))


def test_blip_vqa_score_equals_an_independent_computation(blip):
    from transformers import BlipForQuestionAnswering

    model = BlipForQuestionAnswering.from_pretrained(blip).eval()
    prompts = ["a red circle and a blue square", "a blue circle", "a green triangle and a red square."]
    ims = images(3)
    scorer = CB.BlipVQAScorer.from_pretrained(blip, batch_size=2)
    got = CB.blip_vqa_scores(scorer, ims, prompts, CB.PromptParser("simple"))
    phrases = [["a red circle", "a blue square"], ["a blue circle"], ["a green triangle", "a red square"]]
    for g, im, ps in zip(got, ims, phrases):
        answers = [independent_yes(model, im, f"{p}?") for p in ps]
        assert g["questions"] == [f"{p}?" for p in ps]
        assert g["answers"] == pytest.approx(answers, abs=1e-5)
        assert g["score"] == pytest.approx(math.prod(answers), abs=1e-5)
    assert len({round(a, 4) for g in got for a in g["answers"]}) > 2, "the tiny BLIP's answers vary"
    # batching and batch-mates change nothing
    alone = CB.blip_vqa_scores(
        CB.BlipVQAScorer.from_pretrained(blip, batch_size=1),
        ims[1:2],
        prompts[1:2],
        CB.PromptParser("simple"),
    )
    assert alone[0]["score"] == pytest.approx(got[1]["score"], abs=1e-6)


def test_questions_and_noun_phrases_as_the_reference_asks_them():
    parser = CB.PromptParser("simple")
    assert parser.noun_phrases("a metallic key and fluffy clouds") == ["a metallic key", "fluffy clouds"]
    assert parser.noun_phrases("a red apple, a blue bowl and a green cup.") == [
        "a red apple",
        "a blue bowl",
        "a green cup",
    ]
    assert CB.blip_question('A "Red" Circle.') == "a red circle?"
    assert parser.spatial_objects("a girl next to a cow", "next to") == ("girl", "cow")
    with pytest.raises(UserError, match="noun-phrases must be one of"):
        CB.PromptParser("nltk")


def test_position_score_by_hand():
    left, right = (0, 0, 100, 100), (300, 0, 400, 100)  # centres 50 and 350: dx = 300, dy = 0
    assert CB.position_score("on the left of", left, right) == 1.0
    assert CB.position_score("on the right of", left, right) == 0.0
    assert CB.position_score("on the right of", right, left) == 1.0
    assert CB.position_score("next to", left, right) == 1.0  # |dy| = 0 < 150
    far = (400, 400, 500, 500)  # dx = dy = 400: 150 / 400
    assert CB.position_score("near", left, far) == pytest.approx(150 / 400)
    overlap = (50, 0, 150, 100)  # IoU = 50·100 / (2·10⁴ − 5000) = 1/3 ≥ 0.1: 0.1 / IoU
    assert CB.position_score("on the left of", left, overlap) == pytest.approx(0.1 / (1 / 3))
    below = (0, 300, 100, 400)  # object 2 below object 1 (y down): 1 is on the top of 2
    assert (
        CB.position_score("on the top of", left, below) == 1.0
        and CB.position_score("on the bottom of", left, below) == 0.0
    )
    assert CB.position_score("on top of", left, below) == 0.0  # the reference scores only "on the top of"


def det(cls, box, score=0.9):
    return Detection(cls=cls, box=box, score=score)


def test_spatial_score_follows_the_reference_rule():
    parser, names = CB.PromptParser("simple"), {"cat", "dog", "person", "couch"}
    both = [
        det("cat", (0, 0, 100, 100), 0.8),
        det("dog", (300, 0, 400, 100), 0.6),
        det("dog", (0, 0, 5, 5), 0.3),
    ]
    r = CB.spatial_score("a cat on the left of a dog", both, parser, names)
    assert r["score"] == pytest.approx(0.25 * 0.8 + 0.25 * 0.6 + 0.5) and r["relation"] == "on the left of"
    assert CB.spatial_score("a cat on the right of a dog", both, parser, names)["score"] == 0.0  # 0.35 < 0.5
    assert CB.spatial_score(
        "a girl next to a sofa", [det("person", (0, 0, 9, 9)), det("couch", (20, 0, 29, 9))], parser, names
    )["objects"] == ["person", "couch"]
    assert CB.spatial_score("a cat next to a dog", both[:1], parser, names)["score"] == 0.0  # 0.2 < 0.5


def test_numeracy_counts_objects_once_and_scores_half_for_presence():
    parser, names = CB.PromptParser("simple"), {"cat", "dog", "dining table"}
    objects = (["cat", "dog", "table"], ["cats", "dogs", "tables"])
    assert CB.counted_objects("two cats and a dog", parser, *objects) == [("cat", 2), ("dog", 1)]
    two_cats = [det("cat", (0, 0, 10, 10)), det("cat", (20, 0, 30, 10)), det("dog", (40, 0, 50, 10))]
    assert CB.numeracy_score("two cats and a dog", two_cats, parser, objects, names)["score"] == 1.0
    dup = [
        det("cat", (0, 0, 10, 10)),
        det("cat", (0, 0, 10, 11)),
        det("dog", (40, 0, 50, 10)),
    ]  # one cat, twice
    assert CB.numeracy_score("two cats and a dog", dup, parser, objects, names)["score"] == pytest.approx(
        0.25 + 0.5
    )
    low = [det("cat", (0, 0, 10, 10), 0.4)]  # below the 0.5 confidence
    assert CB.numeracy_score("three cats", low, parser, objects, names)["score"] == 0.0
    table = [det("dining table", (0, 0, 10, 10))]  # "table" matches the label "dining table" (substring rule)
    assert CB.numeracy_score("a table", table, parser, objects, names)["score"] == 1.0


def write_layout(root, prompts: dict[str, list[str]], n: int = 2) -> None:
    for c, ps in prompts.items():
        for i, p in enumerate(ps):
            write_prompt_folder(root / c, i, CB.category_metadata(c, [p])[0], images(n, seed=i, size=40))


class FakeDetector:
    def __call__(self, image):
        return [det("cat", (0, 0, 10, 10), 0.9), det("dog", (200, 0, 210, 10), 0.9)]


def test_score_only_writes_rows_summary_and_protocol_and_labels_the_detector(blip, tmp_path, monkeypatch):
    from t2i_gcpo.scoring import detector_mask2former

    monkeypatch.setattr(
        detector_mask2former.Mask2FormerDetector,
        "from_pretrained",
        classmethod(lambda cls, path, device="cpu": FakeDetector()),
    )
    data = write_compbench_data(tmp_path / "data")
    wanted = {c: PROMPTS[c] for c in ("color", "spatial", "numeracy")}
    write_layout(tmp_path / "imgs", wanted)
    (tmp_path / "m2f").mkdir()
    summary = CB.run_compbench(
        data,
        tmp_path / "out",
        score_only=tmp_path / "imgs",
        vqa=str(blip),
        detector=str(tmp_path / "m2f"),
        noun_phrases="simple",
        progress=False,
    )
    out = tmp_path / "out"
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [r["key"] for r in rows][:3] == ["color/00000/0000", "color/00000/0001", "color/00001/0000"]
    assert len(rows) == 2 * sum(len(v) for v in wanted.values())
    assert {r["category"] for r in rows} == set(wanted)
    for r in rows:
        assert (r.get("label") == CB.DETECTOR_LABEL) == (r["category"] in ("spatial", "numeracy"))
    # cat left of dog: 0.25·0.9·2 + 0.5; next to: within 150 px vertically, 1 too; two cats: one cat found
    spatial = {r["prompt"]: r["score"] for r in rows if r["category"] == "spatial"}
    assert spatial["a cat on the left of a dog"] == pytest.approx(0.95)
    assert spatial["a cat next to a dog"] == pytest.approx(0.95)
    numeracy = {r["prompt"]: r["score"] for r in rows if r["category"] == "numeracy"}
    assert numeracy == {"two cats and a dog": pytest.approx(0.75), "three dogs": pytest.approx(0.5)}
    saved = json.loads((out / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    assert (
        saved["categories"]["spatial"]["label"] == CB.DETECTOR_LABEL
        and "label" not in saved["categories"]["color"]
    )
    assert CB.DETECTOR_LABEL in saved["overall_label"]
    color = [r["score"] for r in rows if r["category"] == "color"]
    assert saved["categories"]["color"]["score"] == pytest.approx(sum(color) / len(color))
    assert CB.DETECTOR_LABEL in (out / "summary.txt").read_text()
    protocol = json.loads((out / "protocol.json").read_text())
    assert protocol["suite"] == "compbench" and protocol["aggregate"] == "categories"
    assert (
        protocol["scorer"]["detector"]["label"] == CB.DETECTOR_LABEL
        and CB.DETECTOR_LABEL in protocol["label"]
    )
    assert protocol["scorer"]["blip-vqa"]["question_start"] == "[ENC]"
    assert [d["path"].rsplit("/", 1)[-1] for d in protocol["data"]] == [
        "color_val.txt",
        "spatial_val.txt",
        "numeracy_val.txt",
        "new_objects.txt",
    ]
    assert protocol["images_per_prompt"] == 2


def test_reference_layout_is_scored_by_its_file_names(blip, tmp_path):
    data = write_compbench_data(tmp_path / "data")
    (tmp_path / "imgs" / "color" / "samples").mkdir(parents=True)
    for k, im in enumerate(images(2)):
        im.save(tmp_path / "imgs" / "color" / "samples" / f"a blue circle_{k:06d}.png")
    CB.run_compbench(
        data,
        tmp_path / "out",
        score_only=tmp_path / "imgs",
        vqa=str(blip),
        noun_phrases="simple",
        progress=False,
    )
    rows = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert json.loads((tmp_path / "out" / "protocol.json").read_text())["images_per_prompt"] is None
    assert [(r["key"], r["prompt"], r["questions"]) for r in rows] == [
        ("color/000000", "a blue circle", ["a blue circle?"]),
        ("color/000001", "a blue circle", ["a blue circle?"]),
    ]


def test_non_spatial_is_the_plain_cosine_of_clip(tmp_path):
    import open_clip

    from t2i_gcpo.rewards.forms.clip_score import ClipScoreReward

    from tiny_models import tiny_open_clip

    name = tiny_open_clip("t2i-gcpo-tiny-compbench-clip", tmp_path / "configs", quick_gelu=True)
    torch.manual_seed(0)
    model = open_clip.create_model(name, pretrained=None)
    torch.save(model.state_dict(), tmp_path / "clip.bin")
    clip = ClipScoreReward(str(tmp_path / "clip.bin"), name)
    ims = images(3, size=40)
    write_layout(tmp_path / "imgs", {"non_spatial": ["a red circle and a blue square"]}, n=3)
    items = CB.folder_items(tmp_path / "imgs", "non_spatial")
    rows = CB.score_images("non_spatial", items, clip=clip, progress=False)
    _, _, preprocess = open_clip.create_model_and_transforms(
        name, pretrained=str(tmp_path / "clip.bin"), force_quick_gelu=True
    )
    tok = open_clip.get_tokenizer(name)
    with torch.no_grad():
        e_t = torch.nn.functional.normalize(
            clip.model.encode_text(tok(["a red circle and a blue square"])), dim=-1
        )
        for r, im in zip(rows, ims):
            e_i = torch.nn.functional.normalize(clip.model.encode_image(preprocess(im)[None]), dim=-1)
            assert r["score"] == pytest.approx(float((e_i * e_t).sum()), abs=1e-5)
    assert any(r["score"] < 0 for r in rows) or all(
        abs(r["score"]) < 1 for r in rows
    )  # not clipped, not scaled


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give a scorer: --vqa"),
        (("--categories", "color", "--clip", "x"), "category color is scored by blip-vqa: give --vqa"),
        (("--categories", "colour", "--vqa", "x"), "--categories: unknown 'colour'"),
        (("--vqa", "x", "--categories", "color", "--split", "train"), "color_train.txt: not found"),
        (("--vqa", "x"), "holds no folder of color, shape, texture"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, message):
    from cli_helpers import cli, error_line

    data = write_compbench_data(tmp_path / "data")
    code, _, err = cli(
        capsys,
        "eval",
        "compbench",
        "--data",
        data,
        "--score-only",
        tmp_path,
        "--out",
        tmp_path / "out",
        *args,
    )
    assert code == 2 and message in error_line(err), err
    assert not (tmp_path / "out").exists()


def test_generation_into_geneval_layout_resumes_and_scores(blip, tmp_path):
    from t2i_gcpo.policies.registry import load_policy

    from tiny_models import tiny_policy_dir

    data = write_compbench_data(tmp_path / "data")
    model = str(tiny_policy_dir(tmp_path))
    args = dict(
        model=model,
        categories="color",
        vqa=str(blip),
        noun_phrases="simple",
        n=2,
        batch=2,
        load_policy=lambda m: load_policy(m).eval(),
        progress=False,
    )
    summary = CB.run_compbench(data, tmp_path / "out", **args)
    made = sorted((tmp_path / "out" / "images" / "color").glob("*/samples/*.png"))
    assert len(made) == 2 * len(PROMPTS["color"]) and summary["categories"]["color"]["images"] == len(made)
    protocol = json.loads((tmp_path / "out" / "protocol.json").read_text())
    assert (
        protocol["seeds"]["seed"] == 0
        and protocol["images_per_prompt"] == 2
        and protocol["model"]["spec"] == model
    )
    stamps = [p.stat().st_mtime_ns for p in made]
    again = CB.run_compbench(data, tmp_path / "out", **args)  # resumed: nothing new, the same scores
    assert stamps == [p.stat().st_mtime_ns for p in made] and again == summary
    with pytest.raises(UserError, match="seed"):
        CB.run_compbench(data, tmp_path / "out", **args, seed=1)
