"""Prompt-file hygiene: byte-order marks, directories, huge prompts, jsonl rows whose prompt
contradicts their metadata, and compositional prompts in files."""

import json

import pytest

from t2i_gcpo.errors import UserError
from t2i_gcpo.tasks.registry import get_task
from t2i_gcpo.worlds.shapeworld import parse_prompt, read_prompt_file

RED_CIRCLE = {"tag": "colors", "include": [{"class": "circle", "count": 1, "color": "red"}]}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_utf8_bom_is_ignored(tmp_path):
    txt = tmp_path / "p.txt"
    txt.write_bytes("\ufeffa photo of a red circle\na photo of two squares\n".encode())
    assert [m["prompt"] for m in read_prompt_file(txt)] == [
        "a photo of a red circle",
        "a photo of two squares",
    ]
    js = tmp_path / "p.jsonl"
    js.write_bytes(
        ("\ufeff" + json.dumps({**RED_CIRCLE, "prompt": "a photo of a red circle"}) + "\n").encode()
    )
    assert read_prompt_file(js)[0]["tag"] == "colors"
    # a BOM-only file is still empty
    (tmp_path / "bom.txt").write_bytes("\ufeff\n".encode())
    with pytest.raises(UserError, match="no prompts"):
        read_prompt_file(tmp_path / "bom.txt")


def test_directory_and_missing(tmp_path):
    (tmp_path / "dir.txt").mkdir()
    with pytest.raises(UserError, match=r"dir\.txt is a directory") as e:
        read_prompt_file(tmp_path / "dir.txt")
    assert "does not exist" not in str(e.value)
    with pytest.raises(UserError, match="is a directory"):
        read_prompt_file(tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        read_prompt_file(tmp_path / "missing.jsonl")


def test_huge_prompt_is_not_echoed_whole(tmp_path):
    huge = "a photo of " + "x" * 10_000
    f = tmp_path / "p.txt"
    f.write_text(f"a photo of a circle\n{huge}\n")
    with pytest.raises(UserError) as e:
        read_prompt_file(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}:2: cannot parse prompt 'a photo of xxx")
    assert "…'" in msg and len(msg) < 500 + len(str(f)) and "\n" not in msg
    # invalid metadata with a huge prompt: the record is cut too
    js = _jsonl(tmp_path / "p.jsonl", [{"tag": "bogus", "include": [], "prompt": huge}])
    with pytest.raises(UserError) as e:
        read_prompt_file(js)
    assert len(str(e.value)) < 600 + len(str(js)) and "…" in str(e.value)


def test_jsonl_row_contradicting_its_prompt_is_refused(tmp_path):
    good = {**RED_CIRCLE, "prompt": "a photo of a red circle"}
    bad = {
        "tag": "colors",
        "include": [{"class": "square", "count": 1, "color": "blue"}],
        "prompt": "a photo of a red circle",
    }
    js = _jsonl(tmp_path / "bad.jsonl", [good, bad])
    with pytest.raises(UserError) as e:
        read_prompt_file(js)
    assert str(e.value) == (
        f"{js}:2: prompt 'a photo of a red circle' asks for 1 red circle, but its metadata asks for "
        "1 blue square: fix the prompt or the metadata"
    )
    # count, colour and relation differences are contradictions too
    for prompt, include in [
        ("a photo of three circles", [{"class": "circle", "count": 2}]),
        ("a photo of a circle", [{"class": "circle", "count": 1, "color": "red"}]),
        (
            "a photo of a circle left of a square",
            [{"class": "square", "count": 1}, {"class": "circle", "count": 1, "position": ["above", 0]}],
        ),
    ]:
        _jsonl(js, [{"tag": "single_object", "include": include, "prompt": prompt}])
        with pytest.raises(UserError, match=r"bad\.jsonl:1: prompt .* asks for"):
            read_prompt_file(js)


def test_jsonl_unparseable_prompt_keeps_its_metadata(tmp_path):
    """A prompt the grammar cannot read is taken with its metadata as the ground truth."""
    rows = [
        {**RED_CIRCLE, "prompt": "a crimson disc on grey"},
        {"tag": "single_object", "include": [{"class": "dog", "count": 1}], "prompt": "a photo of a dog"},
    ]
    js = _jsonl(tmp_path / "free.jsonl", rows)
    assert read_prompt_file(js) == rows


def test_jsonl_same_content_in_another_clause_order_is_accepted(tmp_path):
    meta = parse_prompt("a photo of a red circle and a blue square")
    rows = [{**meta, "include": meta["include"][::-1]}]
    assert read_prompt_file(_jsonl(tmp_path / "p.jsonl", rows)) == rows


def test_compositional_prompts_in_files_and_task(tmp_path):
    prompts = [
        "a photo of a red circle left of a blue square",
        "a photo of two red circles and a blue square",
        "a photo of a circle, a square and a triangle",
    ]
    txt = tmp_path / "p.txt"
    txt.write_text("\n".join(prompts) + "\n")
    got = read_prompt_file(txt)
    assert [m["tag"] for m in got] == ["color_position", "color_count", "multi_object"]
    js = _jsonl(tmp_path / "p.jsonl", got)
    assert read_prompt_file(js) == got
    records = get_task("shapeworld").load_prompts(js)
    assert [r.text for r in records] == prompts and records[1].meta["exclude"] == [
        {"class": "circle", "count": 3}
    ]
    assert get_task("shapeworld").parse(prompts[0]).meta["tag"] == "color_position"
    coco = get_task("geneval").parse("a photo of a red car left of two dogs")
    assert coco.meta["tag"] == "color_count_position"
