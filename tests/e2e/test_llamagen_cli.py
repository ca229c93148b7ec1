"""`t2i-gcpo … --model llamagen:DIR` on a tiny random LlamaGen release written in the released layout
(tests/llamagen_fixtures.py): train GCPO and `sample` the checkpoint, `eval dpg` with a tiny BLIP and `eval
geneval` with the ShapeWorld detector (the default tier);
DAPO, a branching scheme (vine), critical with LoRA, a resume, credit maps (in a run and `credit-map`) (slow);
every refusal is one line, exit 2, with no run folder made."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import llamagen_fixtures as fx
from cli_helpers import cli, error_line

PROMPTS = [  # GenEval's grammar: the task llamagen trains on by default
    "a photo of a red cat",
    "a photo of two blue dogs left of a green bench",
    "a photo of a yellow car",
    "a photo of a white clock above a black dog",
]
FAST = [
    "--steps",
    "2",
    "--seed",
    "0",
    "--reward",
    "train_fixtures:redness",
    "--set",
    "rollout.prompts_per_step=2",
    "--set",
    "rollout.group_size=2",
    "--set",
    "optim.lr=1e-3",
    "--set",
    "save_every=2",
    "--set",
    "sample_every=0",
    "--set",
    "eval_every=-1",
]  # (no figures: matplotlib's layout is most of a tiny run's time)


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    return fx.build_tiny_llamagen(tmp_path_factory.mktemp("llamagen") / "release")


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n")
    return path


def metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def train(capsys, release, prompts, out: Path, *extra: str) -> list[dict]:
    code, _, err = cli(
        capsys, "train", "--model", f"llamagen:{release}", "--prompts", prompts, "--out", out, *FAST, *extra
    )
    assert code == 0, err[-3000:]
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["loss/policy"] is not None for r in rows if r["groups_kept"])
    return rows


def changed_tensors(release: Path, model: Path) -> list[str]:
    base = torch.load(release / fx.GPT_NAME, weights_only=False)["model"]
    saved = load_file(model / "gpt.safetensors")
    assert set(saved) == set(base)  # the released names
    return [k for k in base if not torch.equal(base[k], saved[k])]


def test_train_gcpo_then_sample_the_checkpoint(capsys, release, prompts, tmp_path):
    out = tmp_path / "run"
    rows = train(capsys, release, prompts, out, "--algo", "gcpo")
    assert all(r["reward/mean"] == r["reward/mean"] for r in rows)  # finite
    model = out / "checkpoints" / "step_000002" / "model"
    changed = changed_tensors(release, model)
    assert any(k.startswith("layers.") for k in changed), "the GPT was trained"
    assert "cls_embedding.uncond_embedding" not in changed  # a buffer: the null caption is not trained
    vq = torch.load(release / "vq_ds16_t2i.pt", weights_only=False)["model"]
    assert all(torch.equal(v, vq[k]) for k, v in load_file(model / "vq.safetensors").items())

    samples = tmp_path / "samples"
    code, _, err = cli(
        capsys,
        "sample",
        "--model",
        model,
        "--prompts",
        prompts,
        "--n",
        "2",
        "--out",
        samples,
        "--top-k",
        "1000",
    )
    assert code == 0, err[-3000:]
    settings = json.loads((samples / "00000" / "generation.json").read_text())
    assert settings["cfg_scale"] == 7.5 and settings["top_k"] == 1000  # the checkpoint's, sample_t2i.py's
    assert len(list(samples.glob("*/samples/*.png"))) == 2 * len(PROMPTS) and (samples / "grid.png").is_file()


@pytest.mark.slow
def test_credit_maps_in_a_run_and_from_the_command_line(capsys, release, prompts, tmp_path):
    out = tmp_path / "run"
    train(capsys, release, prompts, out, "--algo", "gcpo", "--set", "sample_every=2")
    assert (out / "credit_maps" / "step_000002.png").is_file() and (
        out / "samples" / "step_000002.png"
    ).is_file()
    maps = tmp_path / "maps"
    code, _, err = cli(
        capsys,
        "credit-map",
        "--model",
        out / "checkpoints" / "step_000002" / "model",
        "--prompt",
        PROMPTS[0],
        "--group",
        "2",
        "--reward",
        "train_fixtures:redness",
        "--schemes",
        "uniform,gcpo,critical,stage",
        "--out",
        maps,
    )
    assert code == 0, err[-3000:]
    assert (maps / "credit_maps.html").is_file() and list(maps.glob("*.png"))


@pytest.mark.parametrize(
    "damage, message",
    [
        ("pickle", "holds more than weights"),
        ("c2i", "class-conditional (C2I)"),
        ("no_t5", "no FLAN-T5 folder"),
        ("no_size", "match no LlamaGen size"),
    ],
)
def test_a_refused_model_is_one_line_exit_2_and_no_run_folder(
    capsys, release, prompts, tmp_path, damage, message
):
    folder = tmp_path / "bad"
    shutil.copytree(release, folder)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    if damage == "pickle":
        torch.save({"model": fx.gpt_state(), "hook": Payload()}, folder / fx.GPT_NAME)
    elif damage == "c2i":
        state = {k: v for k, v in fx.gpt_state().items() if not k.startswith("cls_embedding.")}
        torch.save(
            {"model": {**state, "cls_embedding.embedding_table.weight": torch.zeros(1001, fx.DIM)}},
            folder / fx.GPT_NAME,
        )
    elif damage == "no_t5":
        shutil.rmtree(folder / "flan-t5-xl")
    else:
        torch.save({"model": fx.gpt_state(dim=48)}, folder / fx.GPT_NAME)
    out = tmp_path / "run"
    code, _, err = cli(
        capsys, "train", "--model", f"llamagen:{folder}", "--prompts", prompts, "--out", out, *FAST
    )
    assert code == 2 and message in error_line(err, ignore="Loading weights")
    assert not out.exists() and not marker.exists()


@pytest.mark.slow
def test_train_dapo_vine_and_lora_then_resume(capsys, release, prompts, tmp_path):
    """DAPO (dynamic sampling redraws groups without spread), vine (continuations from every 4th token scored
    as extra samples), critical with LoRA (the base frozen, the adapters merged into the saved weights); then
    a DAPO run resumed from its step-1 checkpoint to step 2 trains as far as the uninterrupted one."""
    dapo = train(capsys, release, prompts, tmp_path / "dapo", "--algo", "dapo", "--set", "save_every=1")
    assert all(r["groups_drawn"] >= r["groups_kept"] for r in dapo)
    vine = train(capsys, release, prompts, tmp_path / "vine", "--algo", "vine", "--set", "branching.k=4")
    assert any(r["budget/samples"] > r["groups_drawn"] * 2 for r in vine)  # the continuations were scored
    train(
        capsys,
        release,
        prompts,
        tmp_path / "lora",
        "--algo",
        "critical",
        "--set",
        "model_options.lora_rank=2",
    )
    model = tmp_path / "lora" / "checkpoints" / "step_000002" / "model"
    assert not any("lora" in k for k in load_file(model / "gpt.safetensors"))
    assert any(".attention." in k for k in changed_tensors(release, model))  # the merged adapters moved them

    part = tmp_path / "part"
    shutil.copytree(tmp_path / "dapo", part)
    shutil.rmtree(part / "checkpoints" / "step_000002")
    (part / "checkpoints" / "latest").write_text("step_000001\n")
    code, _, err = cli(
        capsys, "train", "--resume", part, "--steps", "2", "--reward", "train_fixtures:redness"
    )
    assert code == 0, err[-3000:]
    a = load_file(tmp_path / "dapo" / "checkpoints" / "step_000002" / "model" / "gpt.safetensors")
    b = load_file(part / "checkpoints" / "step_000002" / "model" / "gpt.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_eval_dpg_on_the_release(capsys, release, tmp_path, monkeypatch):
    """The first two DPG-Bench prompts (long, capitalised, punctuated: cleaned and truncated to the caption
    length as T5Embedder does), 4 images each tiled 2×2, a tiny BLIP answering one question per item."""
    import csv

    from t2i_gcpo.eval import dpg

    from tiny_models import build_tiny_blip_vqa

    items = dpg.load_dpg_prompts()[:2]
    monkeypatch.setattr(dpg, "load_dpg_prompts", lambda: items)
    build_tiny_blip_vqa(tmp_path / "blip")
    questions = tmp_path / "dpg.csv"
    with open(questions, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(dpg.DPG_COLUMNS)
        for item in items:
            w.writerow(
                [
                    item["item_id"],
                    item["prompt"],
                    "cat",
                    "1",
                    "0",
                    "entity",
                    "entity - whole",
                    "entity - whole (cat)",
                    "is there a red cat?",
                ]
            )
    out = tmp_path / "dpg"
    code, _, err = cli(
        capsys,
        "eval",
        "dpg",
        "--model",
        f"llamagen:{release}",
        "--csv",
        questions,
        "--vqa",
        tmp_path / "blip",
        "--out",
        out,
    )
    assert code == 0, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_items"] == 2 and 0 <= summary["score"] <= 100
    assert sorted(p.stem for p in (out / "images").glob("*.png")) == sorted(i["item_id"] for i in items)


def test_eval_geneval_on_the_release(capsys, release, tmp_path, monkeypatch):
    """Two GenEval prompts, 2 images each, scored by the ShapeWorld detector (GenEval's rules without its
    detector weights): the model generates, the folder has GenEval's layout, the summary is written."""
    from t2i_gcpo.eval import geneval

    items = geneval.load_geneval_prompts()[:2]
    monkeypatch.setattr(geneval, "load_geneval_prompts", lambda: items)
    out = tmp_path / "geneval"
    code, _, err = cli(
        capsys,
        "eval",
        "geneval",
        "--model",
        f"llamagen:{release}",
        "--detector",
        "shapeworld",
        "--n",
        "2",
        "--out",
        out,
    )
    assert code == 0, err[-3000:]
    assert len(list((out / "images").glob("*/samples/*.png"))) == 4
    assert (out / "summary.json").is_file()
