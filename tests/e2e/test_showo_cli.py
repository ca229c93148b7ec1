"""`--model showo:DIR` through the command line on a tiny random Show-o in the released layout
(tests/showo_fixtures.py): two training steps under GCPO, DAPO and `stepwise` (the Phi backbone trains,
the VQ stays frozen, the checkpoint is a Show-o folder found by its files), LoRA with gradient
checkpointing, tree groups over reveal steps, an exact resume, `credit-map`, `sample` and `eval`; a
missing or wrong part of the folder is one line, exit 2, before any run folder exists."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from t2i_gcpo.policies.registry import load_policy, split_spec

from cli_helpers import cli, error_line
from showo_fixtures import build_tiny_showo

FAST = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.steps=4",
    "rollout.cfg_scale=5",
    "sample_every=0",
    "save_every=1",
    "eval_every=-1",
    "rollout.autocast=none",
    "optim.autocast=none",
    "advantage.dynamic_sampling=false",
]
GENEVAL = "a photo of a cat\na photo of two dogs\na photo of a red car\na photo of a bench\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("showo_cli")
    (root / "geneval.txt").write_text(GENEVAL)
    return {"model": build_tiny_showo(root / "showo"), "prompts": root / "geneval.txt"}


def train(capsys, tiny, out, algo, extra=(), steps=2, model=None):
    args = [
        "train",
        "--prompts",
        tiny["prompts"],
        "--model",
        f"showo:{model or tiny['model']}",
        "--reward",
        "train_fixtures:redness",
        "--algo",
        algo,
        "--out",
        out,
        "--steps",
        str(steps),
        "--seed",
        "0",
        "--set",
        "optim.lr=3e-3",
    ]
    for kv in (*FAST, *extra):
        args += ["--set", kv]
    return cli(capsys, *args)


def rows_of(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def weights(path):
    return {k: v.detach().clone() for k, v in load_policy(str(path)).state_dict().items()}


@pytest.mark.parametrize("algo", ["gcpo", "dapo", "stepwise"])
def test_two_training_steps_train_the_backbone_and_save_a_show_o_folder(capsys, tiny, tmp_path, algo):
    out = tmp_path / "run"
    code, stdout, err = train(capsys, tiny, out, algo)
    assert code == 0, err
    rows = rows_of(out)
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss/policy"]) for r in rows)
    if algo == "stepwise":  # 8 samples; x̂_0 … x̂_2 of each scored in 3 more calls
        assert "scores the model's prediction after each of the 4 reveal steps" in stdout
        assert all((r["budget/samples"], r["budget/step_predictions"]) == (8, 24) for r in rows)
    model = out / "checkpoints" / "step_000002" / "model"
    assert split_spec(str(model))[0] == "showo", "found again by its own files"
    assert (model / "magvitv2" / "pytorch_model.safetensors").is_file() and (model / "phi-1_5").is_dir()
    before, after = weights(tiny["model"]), weights(model)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.startswith("phi.model.layers.") for k in changed)
    assert not [k for k in changed if k.startswith("vq.")], "the VQ is frozen"


def test_lora_with_gradient_checkpointing_trains_the_adapters(capsys, tiny, tmp_path):
    out = tmp_path / "run"
    extra = [
        "model_options.lora_rank=4",
        "model_options.gradient_checkpointing=true",
        "model_options.estimator=remask",
        "model_options.remask_count=2",
    ]
    code, _, err = train(capsys, tiny, out, "gcpo", extra, steps=1)
    assert code == 0, err
    before, after = weights(tiny["model"]), weights(out / "checkpoints" / "step_000001" / "model")
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".self_attn." in k for k in changed), "the merged LoRA deltas, attention only"


def test_tree_groups_branch_over_reveal_steps(capsys, tiny, tmp_path):
    out = tmp_path / "run"
    code, _, err = train(capsys, tiny, out, "tree", ["branching.k=1"], steps=1)
    assert code == 0, err
    (row,) = rows_of(out)
    # 2 prompts × 4 roots × (the root + 1 branch point · 2 continuations)
    assert row["budget/samples"] == 2 * 4 * (1 + 2)


@pytest.mark.slow
def test_a_resumed_run_matches_an_uninterrupted_one(capsys, tiny, tmp_path):
    assert train(capsys, tiny, tmp_path / "full", "dapo", ["sample_every=2"])[0] == 0
    assert (tmp_path / "full" / "credit_maps" / "step_000002.png").is_file()  # the run's credit maps
    assert train(capsys, tiny, tmp_path / "part", "dapo", ["sample_every=2"], steps=1)[0] == 0
    code, _, err = cli(capsys, "train", "--resume", tmp_path / "part", "--steps", "2", "--trust-run-code")
    assert code == 0, err
    assert len(rows_of(tmp_path / "part")) == 2
    for a, b in zip(rows_of(tmp_path / "full"), rows_of(tmp_path / "part")):
        assert a["reward/mean"] == pytest.approx(b["reward/mean"], abs=1e-6)
        assert a["loss/policy"] == pytest.approx(b["loss/policy"], abs=1e-6)
    sa = weights(tmp_path / "full" / "checkpoints" / "step_000002" / "model")
    sb = weights(tmp_path / "part" / "checkpoints" / "step_000002" / "model")
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.slow
def test_credit_map_sample_and_eval(capsys, tiny, tmp_path, monkeypatch):
    import t2i_gcpo.eval.geneval as geneval
    from t2i_gcpo.worlds.shapeworld import parse_prompt

    model = f"showo:{tiny['model']}"
    code, stdout, err = cli(
        capsys,
        "credit-map",
        "--model",
        model,
        "--prompt",
        "a photo of a cat",
        "--group",
        "3",
        "--schemes",
        "gcpo,stepwise,uniform",
        "--reward",
        "train_fixtures:redness",
        "--out",
        tmp_path / "maps",
    )
    assert code == 0, err
    assert "stepwise: 147 predictions over the reveal steps scored" in stdout  # 3 samples × (50 − 1) steps
    assert (tmp_path / "maps" / "00000.png").is_file()
    assert "gcpo" in (tmp_path / "maps" / "credit_maps.html").read_text()

    code, _, err = cli(
        capsys,
        "sample",
        "--model",
        model,
        "--prompts",
        tiny["prompts"],
        "--n",
        "2",
        "--steps",
        "4",
        "--out",
        tmp_path / "samples",
    )
    assert code == 0, err
    from PIL import Image

    assert Image.open(tmp_path / "samples" / "00003" / "samples" / "0001.png").size == (8, 8)
    settings = json.loads((tmp_path / "samples" / "00000" / "generation.json").read_text())
    assert settings["steps"] == 4 and settings["cfg_scale"] == 5.0

    # GenEval's prompts replaced by two ShapeWorld ones, scored by the ShapeWorld detector
    monkeypatch.setattr(
        geneval,
        "load_geneval_prompts",
        lambda: [parse_prompt("a photo of a red circle"), parse_prompt("a photo of two squares")],
    )
    code, _, err = cli(
        capsys,
        "eval",
        "geneval",
        "--model",
        model,
        "--detector",
        "shapeworld",
        "--n",
        "2",
        "--steps",
        "4",
        "--out",
        tmp_path / "ev",
    )
    assert code == 0, err
    rows = [json.loads(x) for x in (tmp_path / "ev" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and (tmp_path / "ev" / "summary.json").is_file()


def test_a_missing_vq_or_an_unknown_config_is_one_line_before_any_run_folder(capsys, tiny, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny["model"], bad)
    shutil.rmtree(bad / "magvitv2")
    out = tmp_path / "run"
    code, _, err = train(capsys, tiny, out, "gcpo", model=bad)
    assert code == 2 and "no magvitv2/ folder" in error_line(err) and not out.exists()
    shutil.copytree(tiny["model"] / "magvitv2", bad / "magvitv2")
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "num_layers": 4}))
    code, _, err = train(capsys, tiny, out, "dapo", model=bad)
    assert code == 2 and "unknown config key 'num_layers'" in error_line(err) and not out.exists()
    code, _, err = cli(
        capsys, "sample", "--model", f"showo:{bad}", "--prompts", tiny["prompts"], "--out", tmp_path / "s"
    )
    assert code == 2 and "unknown config key" in error_line(err) and not (tmp_path / "s").exists()
