"""ShapeWorld prompt sets and prompt-file reading/writing (docs/worlds/shapeworld.md,
docs/evaluation/geneval.md schema)."""

import json
from collections import Counter

import pytest

from t2i_gcpo.errors import UserError
from t2i_gcpo.resources import PROMPTS_DIR
from t2i_gcpo.worlds.shapeworld import (
    SHAPES,
    TAGS,
    all_metadata,
    generate_metadata,
    make_splits,
    parse_prompt,
    read_prompt_file,
    validate_metadata,
    write_prompts,
)
from t2i_gcpo.worlds.shapeworld.prompts import main


def test_unique_prompt_counts():
    n = len(SHAPES)
    sizes = {t: len(all_metadata(t)) for t in TAGS}
    assert sizes == {
        "single_object": n,
        "two_object": n * (n - 1),
        "counting": 3 * n,
        "colors": 10 * n,
        "position": 4 * n * (n - 1),
        "color_attr": n * (n - 1) * 90,
    }
    for t in TAGS:
        assert len({m["prompt"] for m in all_metadata(t)}) == sizes[t]


def test_metadata_has_geneval_schema():
    for t in TAGS:
        for m in all_metadata(t)[:20]:
            validate_metadata(m, SHAPES)
            assert list(m) == (
                ["tag", "include", "exclude", "prompt"] if t == "counting" else ["tag", "include", "prompt"]
            )
    c = all_metadata("counting")[0]
    assert c == {
        "tag": "counting",
        "include": [{"class": "circle", "count": 2}],
        "exclude": [{"class": "circle", "count": 3}],
        "prompt": "a photo of two circles",
    }
    p = all_metadata("position")[0]
    assert p["prompt"] == "a photo of a square left of a circle"
    assert p["include"] == [
        {"class": "circle", "count": 1},
        {"class": "square", "count": 1, "position": ["left of", 0]},
    ]
    assert all_metadata("color_attr")[0]["prompt"] == "a photo of a red circle and an orange square"


def test_generate_metadata_deterministic_and_tag_filtered():
    a, b = generate_metadata(50, seed=3), generate_metadata(50, seed=3)
    assert a == b and len(a) == 50
    assert a != generate_metadata(50, seed=4)
    assert {m["tag"] for m in generate_metadata(40, 0, tags=["counting", "colors"])} == {"counting", "colors"}
    assert set(Counter(m["tag"] for m in generate_metadata(600, 0))) == set(TAGS)
    with pytest.raises(UserError, match="unknown GenEval tag"):
        generate_metadata(3, 0, tags=["counting", "bogus"])


def test_splits_disjoint_deterministic_balanced():
    train, test = make_splits(600, 120, seed=0)
    assert (train, test) == make_splits(600, 120, seed=0)
    assert not {m["prompt"] for m in train} & {m["prompt"] for m in test}
    assert len({m["prompt"] for m in test}) == len(test)
    assert Counter(m["tag"] for m in train) == {t: 100 for t in TAGS}
    by_tag = Counter(m["tag"] for m in test)
    assert set(by_tag) == set(TAGS)
    for t in TAGS:  # an equal share, capped at 40 % of the tag's prompts
        assert by_tag[t] == min(20, max(1, int(0.4 * len(all_metadata(t)))))


def test_shipped_prompt_files_are_current(tmp_path):
    main(["--out", str(tmp_path)])
    for name in (
        "shapeworld_train.txt",
        "shapeworld_train.jsonl",
        "shapeworld_test.txt",
        "shapeworld_test.jsonl",
        "shapeworld_compositional_test.txt",
        "shapeworld_compositional_test.jsonl",
    ):
        assert (PROMPTS_DIR / name).read_text() == (tmp_path / name).read_text(), name


def test_write_read_round_trip(tmp_path):
    train, _ = make_splits(60, 12, seed=5)
    write_prompts(train, tmp_path / "p.txt")
    write_prompts(train, tmp_path / "p.jsonl")
    assert read_prompt_file(tmp_path / "p.txt") == train
    assert read_prompt_file(tmp_path / "p.jsonl") == train
    with pytest.raises(UserError, match=r"\.txt or \.jsonl"):
        write_prompts(train, tmp_path / "p.csv")


def test_read_txt_skips_blank_and_comments(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("# my prompts\n\na photo of a red circle\n  A photo of two squares  \n")
    got = read_prompt_file(f)
    assert [m["tag"] for m in got] == ["colors", "counting"]
    assert got[1]["include"] == [{"class": "square", "count": 2}]


def test_read_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_prompt_file(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(UserError, match="no prompts"):
        read_prompt_file(tmp_path / "empty.txt")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(UserError, match="no prompts"):
        read_prompt_file(tmp_path / "empty.jsonl")
    bad = tmp_path / "bad.txt"
    bad.write_text("a photo of a circle\n\na painting of a dog\n")
    with pytest.raises(UserError, match=r"bad\.txt:3: cannot parse prompt 'a painting of a dog'"):
        read_prompt_file(bad)
    assert read_prompt_file(bad, strict=False)[1] == {"prompt": "a painting of a dog"}
    js = tmp_path / "bad.jsonl"
    js.write_text(json.dumps(all_metadata("colors")[0]) + "\n{not json\n")
    with pytest.raises(UserError, match=r"bad\.jsonl:2: malformed JSON"):
        read_prompt_file(js)
    js.write_text(
        json.dumps({"tag": "colors", "include": [{"class": "circle", "count": 0}], "prompt": "x"}) + "\n"
    )
    with pytest.raises(UserError, match=r"bad\.jsonl:1: invalid GenEval metadata .*count"):
        read_prompt_file(js)
    js.write_text(json.dumps({"tag": "nope", "include": [], "prompt": "x"}) + "\n")
    with pytest.raises(UserError, match=r":1: invalid GenEval metadata .*tag"):
        read_prompt_file(js)
    dog = {"tag": "single_object", "include": [{"class": "dog", "count": 1}], "prompt": "a photo of a dog"}
    js.write_text(json.dumps(dog) + "\n")
    assert read_prompt_file(js) == [dog]  # jsonl accepts any class unless classes are given
    with pytest.raises(UserError, match="unknown class 'dog'"):
        read_prompt_file(js, SHAPES)
    (tmp_path / "p.csv").write_text("a photo of a circle\n")
    with pytest.raises(UserError, match="must end in"):
        read_prompt_file(tmp_path / "p.csv")


def test_parse_matches_generated_metadata_for_every_shapeworld_prompt():
    for t in TAGS:
        for m in all_metadata(t):
            assert parse_prompt(m["prompt"]) == m


# ---- compositional prompts (the grammar of parse.py) ----------------------------------------------


def test_random_compositional_prompts_parse_to_their_tag_and_fit_the_scene():
    import numpy as np

    from t2i_gcpo.worlds.shapeworld.parse import EXTENDED_TAGS
    from t2i_gcpo.worlds.shapeworld.prompts import RELATION_MAX_OBJECTS, random_compositional

    rng = np.random.default_rng(0)
    seen = Counter()
    for tag in EXTENDED_TAGS:
        for _ in range(40):
            meta = random_compositional(tag, rng)
            assert meta["tag"] == tag and parse_prompt(meta["prompt"]) == meta  # the parser's own reading
            objects = sum(c["count"] for c in meta["include"])
            relation = any("position" in c for c in meta["include"])
            assert objects <= (RELATION_MAX_OBJECTS if relation else 6)
            seen.update(sep for sep in (", and ", ", ", " and ") if sep in meta["prompt"])
    assert set(seen) == {", and ", ", ", " and "}  # every separator the grammar accepts is drawn
    with pytest.raises(UserError, match="not a compositional tag"):
        random_compositional("counting", rng)


def test_generate_metadata_mixes_template_and_compositional_tags():
    from t2i_gcpo.worlds.shapeworld.parse import ALL_TAGS

    a = generate_metadata(700, 5, ALL_TAGS)
    assert a == generate_metadata(700, 5, ALL_TAGS)  # deterministic in the seed
    counts = Counter(m["tag"] for m in a)
    assert set(counts) == set(ALL_TAGS) and min(counts.values()) >= 25  # uniform: 50 expected per tag
    # GenEval's six alone draw exactly as before the compositional tags existed
    assert generate_metadata(30, 3) == generate_metadata(30, 3, list(TAGS))


def test_compositional_test_set_is_10_distinct_prompts_per_tag_and_matches_the_shipped_file():
    from t2i_gcpo.worlds.shapeworld.parse import EXTENDED_TAGS
    from t2i_gcpo.worlds.shapeworld.prompts import compositional_test, content_key

    test = compositional_test()
    assert Counter(m["tag"] for m in test) == dict.fromkeys(EXTENDED_TAGS, 10)
    assert len({content_key(m) for m in test}) == 80
    shipped = [json.loads(line) for line in (PROMPTS_DIR / "shapeworld_compositional_test.jsonl").open()]
    assert shipped == test
    assert read_prompt_file(PROMPTS_DIR / "shapeworld_compositional_test.txt") == test


def test_content_key_ignores_wording_and_clause_order():
    from t2i_gcpo.worlds.shapeworld.prompts import content_key

    a = parse_prompt("a photo of a red circle, and two squares left of a bar")
    b = parse_prompt("a photo of two squares and a red circle left of a bar")
    c = parse_prompt("a photo of two squares and a red circle right of a bar")
    assert content_key(a) == content_key(b) != content_key(c)
