"""The compositional grammar changes nothing the old parser accepted: every shipped prompt, every
official GenEval prompt and every ShapeWorld template prompt parses to the same metadata and tag as
before (the frozen oracle tests/parse_v1_oracle.py), and the train/test splits are unchanged."""

import json
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t2i_gcpo.errors import UserError
from t2i_gcpo.resources import PROMPTS_DIR
from t2i_gcpo.scoring.geneval_classes import geneval_classes
from t2i_gcpo.worlds.shapeworld import TAGS, all_metadata, make_splits, parse_prompt, read_prompt_file
from t2i_gcpo.worlds.shapeworld.parse import EXTENDED_TAGS, metadata_to_prompt, validate_metadata

import parse_v1_oracle as old

# the ShapeWorld prompt files (the arithmetic ones are problems, not prompts of this grammar)
# the template prompt files (the compositional held-out set is grammar the first parser never read)
SHIPPED = sorted(p for p in PROMPTS_DIR.glob("shapeworld_*.*") if "compositional" not in p.name)


def official() -> list[dict]:
    text = resources.files("t2i_gcpo").joinpath("data/geneval/evaluation_metadata.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_shipped_files_exist():
    assert {p.name for p in SHIPPED} >= {
        "shapeworld_train.txt",
        "shapeworld_train.jsonl",
        "shapeworld_test.txt",
        "shapeworld_test.jsonl",
    }


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_prompt_parses_as_before(path):
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix == ".txt":
        prompts, rows = lines, None
    else:
        rows = [json.loads(line) for line in lines]
        prompts = [r["prompt"] for r in rows]
    for i, prompt in enumerate(prompts):
        want = old.parse_prompt(prompt)
        got = parse_prompt(prompt)
        assert got == want and list(got) == list(want), prompt
        if rows is not None:
            assert got == rows[i]
    # the file reader gives the same records as before (jsonl rows as written, txt as parsed)
    assert read_prompt_file(path) == (rows if rows is not None else [old.parse_prompt(p) for p in prompts])


def test_every_official_geneval_prompt_parses_as_before():
    classes = geneval_classes()
    for meta in official():
        want = old.parse_prompt(meta["prompt"], classes)
        got = parse_prompt(meta["prompt"], classes)
        assert got == want == meta
        assert list(got) == list(want)  # key order too


def test_every_template_prompt_parses_as_before():
    for tag in TAGS:
        for meta in all_metadata(tag):
            assert parse_prompt(meta["prompt"]) == old.parse_prompt(meta["prompt"]) == meta


def test_splits_unchanged():
    """make_splits still writes exactly the shipped files' metadata (train and test)."""
    train, test = make_splits()
    for name, data in (("train", train), ("test", test)):
        rows = [json.loads(x) for x in (PROMPTS_DIR / f"shapeworld_{name}.jsonl").read_text().splitlines()]
        assert rows == data
        assert {r["tag"] for r in rows} <= set(TAGS)


WORDS = [
    "a",
    "an",
    "photo",
    "of",
    "a photo of",
    "and",
    ",",
    "two",
    "three",
    "four",
    "five",
    "red",
    "blue",
    "orange",
    "circle",
    "circles",
    "square",
    "squares",
    "crosses",
    "bar",
    "left of",
    "right of",
    "above",
    "below",
]


def _check(text: str, classes=None) -> None:
    try:
        before = old.parse_prompt(text, classes)
    except UserError:
        before = None
    try:
        after = parse_prompt(text, classes)
    except UserError as e:
        assert before is None, f"{text!r} parsed before, now: {e}"
        assert "\n" not in str(e) and len(str(e)) < 600  # one line, bounded
        return
    if before is not None:
        assert after == before and list(after) == list(before)
        return
    # newly parseable: valid metadata that round-trips through its canonical text
    validate_metadata(after, classes)
    assert after["tag"] in TAGS + EXTENDED_TAGS
    again = parse_prompt(metadata_to_prompt(after), classes)
    assert again["include"] == after["include"] and again["tag"] == after["tag"]
    assert again.get("exclude") == after.get("exclude")


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(lambda w: "a photo of " + " ".join(w)))
def test_fuzz_old_results_kept_and_new_results_valid(text):
    _check(text)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(["a", "an", "two", "red", "orange", "and", ",", "left of", "above"])
        | st.sampled_from(geneval_classes())
        | st.sampled_from(["people", "benches", "knifes", "sheep", "buses"]),
        min_size=1,
        max_size=10,
    ).map(lambda w: "a photo of " + " ".join(w))
)
def test_fuzz_coco_old_results_kept(text):
    _check(text, geneval_classes())


_OBJECT = st.tuples(
    st.sampled_from(["a ", "an ", "two ", "three ", "four ", "five "]),
    st.sampled_from(["", "red ", "blue ", "white "]),
    st.sampled_from(
        ["circle", "circles", "square", "squares", "triangle", "cross", "crosses", "bar", "bars"]
    ),
).map("".join)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_OBJECT, min_size=1, max_size=4),
    st.lists(st.sampled_from([" and ", ", ", ", and ", " , "]), min_size=3, max_size=3),
    st.one_of(st.none(), st.tuples(st.sampled_from(["left of", "right of", "above", "below"]), _OBJECT)),
)
def test_fuzz_grammar_shaped_prompts(objects, seps, relation):
    text = "a photo of " + objects[0]
    for sep, obj in zip(seps, objects[1:]):
        text += sep + obj
    if relation is not None:
        text += f" {relation[0]} {relation[1]}"
    _check(text)
