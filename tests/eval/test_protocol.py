"""The protocol record (eval/records/protocol.py): hashes of data files, folders and contents, checkpoint
revisions, and what makes two evaluations comparable."""

from __future__ import annotations

import hashlib
import json

from t2i_gcpo.eval.records.protocol import (
    content_record,
    data_record,
    folder_revision,
    model_record,
    protocol_mismatch,
    protocol_record,
    read_protocol,
    scorer_record,
    weights_revision,
    write_protocol,
)


def test_data_records_hash_files_folders_and_contents(tmp_path):
    (tmp_path / "a.txt").write_text("one\n")
    rec = data_record(tmp_path / "a.txt")
    assert rec["sha256"] == hashlib.sha256(b"one\n").hexdigest() and rec["bytes"] == 4
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("1")
    before = data_record(tmp_path / "d")
    (tmp_path / "d" / "x").write_text("2")
    assert data_record(tmp_path / "d")["sha256"] != before["sha256"] and before["files"] == 1
    c = content_record("prompts", [{"b": 1, "a": 2}, {"prompt": "x"}])
    expected = hashlib.sha256(b'{"a": 2, "b": 1}\n{"prompt": "x"}\n').hexdigest()
    assert c == {"what": "prompts", "items": 2, "sha256": expected}


def test_revisions_of_folders_snapshots_and_weight_files(tmp_path):
    snap = tmp_path / "snapshots" / ("ab" * 20)
    snap.mkdir(parents=True)
    assert folder_revision(snap) == "ab" * 20
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\0" * 10)
    rev = folder_revision(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\1" * 10)  # weights by name and size only
    assert folder_revision(tmp_path / "m") == rev
    (tmp_path / "m" / "config.json").write_text('{"a": 1}')
    assert folder_revision(tmp_path / "m") != rev
    assert weights_revision(tmp_path / "m" / "model.safetensors") == "model.safetensors:10"
    assert weights_revision("https://example.invalid/x") is None and folder_revision("shapeworld") is None
    assert model_record("shapeworld") == {"spec": "shapeworld", "revision": None}
    assert model_record("<python>:Prior:1.5") == {"spec": "<python>:Prior:1.5", "revision": None}


def test_protocol_mismatch_names_the_first_field_and_ignores_paths(tmp_path):
    for d in ("one", "two"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "prompts.txt").write_text("a cat\n")
        (tmp_path / d / "det").mkdir()
        (tmp_path / d / "det" / "config.json").write_text("{}")

    def record(d, **kw):
        args = dict(
            data=[tmp_path / d / "prompts.txt"],
            model=None,
            seeds={"seed": 0},
            images_per_prompt=4,
            scorer=scorer_record("detector", str(tmp_path / d / "det")),
        )
        return protocol_record("geneval", **{**args, **kw})

    assert protocol_mismatch(record("one"), record("two")) is None  # the same bytes and revision elsewhere
    assert protocol_mismatch(record("one"), record("one", seeds={"seed": 1})).startswith("seeds: {'seed': 0}")
    assert protocol_mismatch(record("one"), record("one", images_per_prompt=2)).startswith(
        "images_per_prompt"
    )
    assert protocol_mismatch(record("one"), protocol_record("dpg")).startswith(
        "suite: 'geneval' against 'dpg'"
    )
    (tmp_path / "two" / "prompts.txt").write_text("a dog\n")
    assert protocol_mismatch(record("one"), record("two")).startswith("data: ")
    # the model and the sampling may differ: that is what a comparison compares
    assert (
        protocol_mismatch(record("one", model="shapeworld"), record("one", sampling={"cfg_scale": 2})) is None
    )
    write_protocol(tmp_path, record("one"))
    assert read_protocol(tmp_path / "protocol.json") == json.loads(json.dumps(record("one")))
