"""GenEval folder layout: writing, reading back, resuming, and rejecting other folders."""

import json

import numpy as np
import pytest
from PIL import Image

from t2i_gcpo.errors import UserError
from t2i_gcpo.eval.layout import existing_samples, iter_layout, sample_path, write_prompt_folder

META = {"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"}


def solid(rgb, size=(8, 6)):
    return Image.new("RGB", size, rgb)


def test_write_then_iterate_round_trip(tmp_path):
    meta2 = {**META, "prompt": "a photo of a dog", "include": [{"class": "dog", "count": 1}]}
    write_prompt_folder(tmp_path, 1, meta2, [solid((0, 0, 255))])
    write_prompt_folder(tmp_path, 0, META, [solid((255, 0, 0)), solid((0, 255, 0))])

    assert (tmp_path / "00000" / "metadata.jsonl").read_text() == json.dumps(META) + "\n"
    assert sorted(p.name for p in (tmp_path / "00000" / "samples").iterdir()) == ["0000.png", "0001.png"]

    entries = list(iter_layout(tmp_path))
    assert [(i, m["prompt"], [p.name for p in paths]) for i, m, paths in entries] == [
        (0, "a photo of a cat", ["0000.png", "0001.png"]),
        (1, "a photo of a dog", ["0000.png"]),
    ]
    # pixels survive the PNG round trip exactly; no temporary files are left behind
    assert np.asarray(Image.open(entries[0][2][1]))[0, 0].tolist() == [0, 255, 0]
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]


def test_existing_samples_counts_the_contiguous_prefix_and_resume_keeps_old_files(tmp_path):
    assert existing_samples(tmp_path, 3) == 0
    write_prompt_folder(tmp_path, 3, META, [solid((10, 10, 10)), solid((20, 20, 20))])
    assert existing_samples(tmp_path, 3) == 2
    # writing again from 0 never overwrites finished samples, and `start` continues the numbering
    write_prompt_folder(tmp_path, 3, META, [solid((99, 99, 99))])
    write_prompt_folder(tmp_path, 3, META, [solid((30, 30, 30)), solid((40, 40, 40))], start=2)
    assert existing_samples(tmp_path, 3) == 4
    values = [np.asarray(Image.open(sample_path(tmp_path, 3, k)))[0, 0, 0] for k in range(4)]
    assert values == [10, 20, 30, 40]
    # a gap stops the count: 0000..0003 exist, 0005 does not make it 6
    write_prompt_folder(tmp_path, 3, META, [solid((0, 0, 0))], start=5)
    assert existing_samples(tmp_path, 3) == 4


def test_not_a_layout_folder_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not a directory"):
        list(iter_layout(tmp_path / "missing"))
    (tmp_path / "images").mkdir()
    with pytest.raises(UserError, match="not a GenEval layout"):
        list(iter_layout(tmp_path))
    (tmp_path / "00000" / "samples").mkdir(parents=True)
    with pytest.raises(UserError, match="metadata.jsonl is missing"):
        list(iter_layout(tmp_path))
    (tmp_path / "00000" / "metadata.jsonl").write_text("{not json\n")
    with pytest.raises(UserError, match="not valid JSON"):
        list(iter_layout(tmp_path))
    (tmp_path / "00000" / "metadata.jsonl").write_text(json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(UserError, match="'tag', 'prompt' and 'include'"):
        list(iter_layout(tmp_path))


def test_model_identity_keeps_shipped_names_and_makes_paths_absolute(tmp_path, monkeypatch):
    from t2i_gcpo.policies.registry import model_identity

    monkeypatch.chdir(tmp_path)
    for name in (
        "shapeworld",
        "shapeworld-64",
        "shapeworld-masked",
        "arithmetic",
        "masked:shapeworld-masked",
    ):
        assert model_identity(name) == name
    (tmp_path / "ckpt").mkdir()
    assert model_identity("ckpt") == str(tmp_path / "ckpt")
    assert model_identity("amused:ckpt") == "amused:" + str(tmp_path / "ckpt")
    assert model_identity("janus:./ckpt/") == model_identity(
        f"janus:{tmp_path}/ckpt"
    )  # one checkpoint, one name
