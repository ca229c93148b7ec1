"""Prompt text → GenEval metadata: the 553 official prompts, ShapeWorld round trips, errors, fuzz."""

import json
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t2i_gcpo.errors import UserError
from t2i_gcpo.scoring.geneval_classes import geneval_classes
from t2i_gcpo.worlds.shapeworld import SHAPES, TAGS, all_metadata, metadata_to_prompt, parse_prompt
from t2i_gcpo.worlds.shapeworld.parse import (
    english_plural,
    geneval_plural,
    validate_metadata,
)


def official() -> list[dict]:
    text = resources.files("t2i_gcpo").joinpath("data/geneval/evaluation_metadata.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_packaged_geneval_data():
    assert len(official()) == 553
    assert len(geneval_classes()) == 80 and geneval_classes()[0] == "person"
    assert "hair drier" in geneval_classes()


def test_reproduces_every_official_prompt_exactly():
    classes = geneval_classes()
    for meta in official():
        got = parse_prompt(meta["prompt"], classes)
        assert got == meta
        assert list(got) == list(meta)  # GenEval's key order too
        validate_metadata(meta, classes)
        assert metadata_to_prompt(meta) == meta["prompt"]


def test_plural_rule():
    # GenEval's rule, derived from its counting prompts: "es" after a final "s", else "s"
    assert geneval_plural("bus") == "buses"
    assert geneval_plural("bench") == "benchs" and geneval_plural("sheep") == "sheeps"
    assert geneval_plural("knife") == "knifes" and geneval_plural("wine glass") == "wine glasses"
    assert geneval_plural("cross") == "crosses"
    # English plurals are accepted too
    assert english_plural("bench") == "benches" and english_plural("knife") == "knives"
    assert english_plural("person") == "people" and english_plural("sheep") == "sheep"
    coco = geneval_classes()
    assert parse_prompt("a photo of three benches", coco)["include"] == [{"class": "bench", "count": 3}]
    assert parse_prompt("a photo of two people", coco)["include"] == [{"class": "person", "count": 2}]
    assert parse_prompt("a photo of four sheep", coco)["exclude"] == [{"class": "sheep", "count": 5}]


def test_articles_and_case_are_lenient():
    assert parse_prompt("a photo of an orange orange", geneval_classes())["include"] == [
        {"class": "orange", "count": 1, "color": "orange"}
    ]
    assert parse_prompt("a photo of an orange", geneval_classes())["tag"] == "single_object"
    m = parse_prompt("  A Photo of a RED   circle ")
    assert m["include"] == [{"class": "circle", "count": 1, "color": "red"}]
    assert m["prompt"] == "A Photo of a RED   circle"


def test_shapeworld_round_trip():
    for tag in TAGS:
        for meta in all_metadata(tag):
            assert parse_prompt(metadata_to_prompt(meta)) == meta


@pytest.mark.parametrize(
    "text",
    [
        "",
        "a photo of a dog",  # not a ShapeWorld class
        "a photo of five circles",  # counting is 2–4
        "a photo of a teal circle",
        "a circle",
        "a photo of a circle next to a square",
        "a photo of a circle and",
        "a photo of a circle left of",
        "a photo of a red",
    ],
)
def test_unparseable_prompts_raise_user_error(text):
    with pytest.raises(UserError, match=r'cannot parse prompt .*: expected "a photo of <object> \['):
        parse_prompt(text)


def test_error_lists_shapeworld_classes():
    with pytest.raises(UserError, match=", ".join(SHAPES)):
        parse_prompt("a photo of a dog")


def test_non_string_is_user_error():
    with pytest.raises(UserError):
        parse_prompt(None)  # type: ignore[arg-type]


WORDS = [
    "a",
    "an",
    "photo",
    "of",
    "and",
    "two",
    "three",
    "red",
    "circle",
    "circles",
    "left",
    "right",
    "above",
]


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=60),
        st.lists(st.sampled_from(WORDS), max_size=10).map(" ".join),
    )
)
def test_fuzz_any_string_gives_metadata_or_user_error(text):
    try:
        meta = parse_prompt(text)
    except UserError:
        return
    validate_metadata(meta, SHAPES)
    assert parse_prompt(metadata_to_prompt(meta))["include"] == meta["include"]


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_fuzz_coco_classes(text):
    try:
        parse_prompt("a photo of a " + text, geneval_classes())
    except UserError:
        pass


def test_longest_prompt_words_is_the_longest_prompt_the_grammar_accepts():
    from t2i_gcpo.policies.prompt_tokenizer import words_of
    from t2i_gcpo.worlds.shapeworld.parse import longest_prompt_words

    assert longest_prompt_words() == 26
    subjects = ", and ".join(f"a red {c}" for c in SHAPES[:4])  # the 2-word separator everywhere
    for text in (
        f"a photo of {subjects} left of a red {SHAPES[4]}",
        f"a photo of {subjects}, and a red {SHAPES[4]}",
    ):
        assert len(parse_prompt(text)["include"]) == 5
        assert len(words_of(text)) == longest_prompt_words()
    with pytest.raises(UserError, match="named twice"):  # a sixth phrase must repeat a class
        parse_prompt(f"a photo of {subjects}, and a red {SHAPES[4]}, and a red {SHAPES[0]}")


def test_prompt_tokenizer_reads_a_comma_as_a_word():
    from t2i_gcpo.policies.prompt_tokenizer import words_of

    assert words_of("A photo of a circle,a square , and  a bar") == [
        "a",
        "photo",
        "of",
        "a",
        "circle",
        ",",
        "a",
        "square",
        ",",
        "and",
        "a",
        "bar",
    ]
