"""Compositional prompts beyond GenEval's six templates: parsed into GenEval metadata, tagged by what
they test, refused in one line that shows the grammar."""

import pytest

from t2i_gcpo.errors import UserError
from t2i_gcpo.scoring.geneval_classes import geneval_classes
from t2i_gcpo.worlds.shapeworld import SHAPES, parse_prompt, validate_metadata
from t2i_gcpo.worlds.shapeworld.parse import (
    ALL_TAGS,
    EXTENDED_TAGS,
    GRAMMAR,
    describe,
    metadata_conflict,
    metadata_to_prompt,
)

from repo_paths import REPO


def test_color_position():
    m = parse_prompt("a photo of a red circle left of a blue square")
    assert m == {
        "tag": "color_position",
        "include": [
            {"class": "square", "count": 1, "color": "blue"},
            {"class": "circle", "count": 1, "color": "red", "position": ["left of", 0]},
        ],
        "prompt": "a photo of a red circle left of a blue square",
    }
    assert list(m["include"][1]) == ["class", "count", "color", "position"]  # GenEval's key order
    # a colour on one side is enough
    assert parse_prompt("a photo of a circle above a green bar")["tag"] == "color_position"


def test_color_count():
    m = parse_prompt("a photo of two red circles and a blue square")
    assert m == {
        "tag": "color_count",
        "include": [
            {"class": "circle", "count": 2, "color": "red"},
            {"class": "square", "count": 1, "color": "blue"},
        ],
        "exclude": [{"class": "circle", "count": 3}],  # a number means exactly that many
        "prompt": "a photo of two red circles and a blue square",
    }
    assert list(m) == ["tag", "include", "exclude", "prompt"]
    assert parse_prompt("a photo of three white crosses")["tag"] == "color_count"


def test_multi_object_and_separators():
    want = [{"class": c, "count": 1} for c in ("circle", "square", "triangle")]
    for text in (
        "a photo of a circle, a square and a triangle",
        "a photo of a circle, a square, and a triangle",
        "a photo of a circle and a square and a triangle",
        "a photo of a circle,a square ,  a triangle",
    ):
        m = parse_prompt(text)
        assert m["tag"] == "multi_object" and m["include"] == want and "exclude" not in m, text


@pytest.mark.parametrize(
    "text, tag",
    [
        ("a photo of a red circle and a square", "multi_color"),
        ("a photo of a red circle, a blue square and a green triangle", "multi_color"),
        ("a photo of two circles and a square", "multi_count"),
        ("a photo of a circle and a bar above a cross", "multi_position"),
        ("a photo of two circles left of a square", "count_position"),
        ("a photo of a circle below three bars", "count_position"),
        ("a photo of two red circles below a blue bar", "color_count_position"),
        # written differently from a template but with a template's shape: the template's tag
        ("a photo of a circle, a square", "two_object"),
        ("a photo of a circle , and a square", "two_object"),
    ],
)
def test_tags(text, tag):
    m = parse_prompt(text)
    assert m["tag"] == tag
    validate_metadata(m, SHAPES)
    again = parse_prompt(metadata_to_prompt(m))
    assert (again["tag"], again["include"], again.get("exclude")) == (tag, m["include"], m.get("exclude"))


def test_tag_list_is_documented():
    """Every extended tag has its row in the grammar's table on the ShapeWorld docs page."""

    page = (REPO / "docs" / "worlds" / "shapeworld.md").read_text()
    assert ALL_TAGS[:6] == ["single_object", "two_object", "counting", "colors", "position", "color_attr"]
    for tag in EXTENDED_TAGS:
        assert f"\n    {tag} " in page


def test_relation_holds_for_every_object_before_it():
    m = parse_prompt("a photo of a red circle and two squares right of a bar")
    assert m["include"] == [
        {"class": "bar", "count": 1},
        {"class": "circle", "count": 1, "color": "red", "position": ["right of", 0]},
        {"class": "square", "count": 2, "position": ["right of", 0]},
    ]
    assert m["exclude"] == [{"class": "square", "count": 3}]
    assert m["tag"] == "color_count_position"
    assert metadata_to_prompt(m) == "a photo of a red circle and two squares right of a bar"


def test_coco_classes_and_plurals():
    coco = geneval_classes()
    m = parse_prompt("a photo of two people, an orange orange and a hot dog", coco)
    assert m["include"] == [
        {"class": "person", "count": 2},
        {"class": "orange", "count": 1, "color": "orange"},
        {"class": "hot dog", "count": 1},
    ]
    assert m["tag"] == "color_count"
    m = parse_prompt("a photo of four benches left of a red stop sign", coco)
    assert m["tag"] == "color_count_position" and m["include"][1] == {
        "class": "bench",
        "count": 4,
        "position": ["left of", 0],
    }
    # no 6-object cap outside ShapeWorld
    assert parse_prompt("a photo of four cats and four dogs", coco)["tag"] == "multi_count"


@pytest.mark.parametrize(
    "text, why",
    [
        ("a photo of a red circle and a blue circle and a bar", "'circle' is named twice"),
        ("a photo of a red circle left of a blue circle", "named twice"),
        ("a photo of two circle and a bar", "'two circle' needs a plural after 'two' (e.g. 'circles')"),
        ("a photo of a circles and a bar", "'a circles' needs a singular"),
        ("a photo of four circles and three squares", "7 objects; a ShapeWorld scene holds at most 6"),
        ("a photo of a circle left of a square and a bar", "one object after it"),
    ],
)
def test_specific_errors(text, why):
    with pytest.raises(UserError, match="cannot parse prompt") as e:
        parse_prompt(text)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_grammar_error_is_one_short_line():
    with pytest.raises(UserError) as e:
        parse_prompt("a painting of a circle")
    msg = str(e.value)
    assert msg.startswith("cannot parse prompt 'a painting of a circle': expected ")
    assert GRAMMAR in msg and "classes: circle, square, triangle, cross, bar" in msg and "\n" not in msg
    with pytest.raises(UserError) as e:
        parse_prompt("a photo of a " + "very " * 2000 + "red circle")
    msg = str(e.value)
    assert len(msg) < 450 and "…'" in msg  # the 10k-character prompt is cut to 80 characters
    with pytest.raises(UserError, match="80 classes such as person"):
        parse_prompt("a photo of a unicorn", geneval_classes())


def test_metadata_conflict():
    meta = parse_prompt("a photo of a red circle and a blue square")
    assert metadata_conflict(meta) is None
    swapped = {**meta, "include": meta["include"][::-1]}  # clause order does not matter
    assert metadata_conflict(swapped) is None
    wrong = {**meta, "include": [{"class": "square", "count": 1, "color": "blue"}]}
    msg = metadata_conflict(wrong)
    assert msg == (
        "prompt 'a photo of a red circle and a blue square' asks for 1 red circle, 1 blue square, "
        "but its metadata asks for 1 blue square"
    )
    pos = parse_prompt("a photo of a circle left of a square")
    flipped = {**pos, "include": [pos["include"][0], {**pos["include"][1], "position": ["right of", 0]}]}
    assert "circle left of square" in metadata_conflict(flipped)
    assert describe(flipped) == "1 circle, 1 square; circle right of square"
    # unparseable prompts contradict nothing: the metadata is the ground truth
    free = {
        "tag": "colors",
        "include": [{"class": "circle", "count": 1, "color": "red"}],
        "prompt": "a ruby disc",
    }
    assert metadata_conflict(free) is None
    # tags and excludes are not compared
    counting = parse_prompt("a photo of two circles")
    assert metadata_conflict({**counting, "exclude": []}) is None
