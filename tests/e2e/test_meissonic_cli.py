"""`t2i-gcpo` on a tiny random Meissonic folder in the released layout (tests/meissonic_fixtures.py), as a
user runs it: two training steps under GCPO, DAPO and `stepwise` (the transformer learns, the VQ and the text
encoder stay frozen, the checkpoint is a Meissonic folder that resumes exactly), LoRA with gradient
checkpointing, `credit-map`, `sample` and `eval` (slow: ≈ 10 s of CPU a run); a wrong folder is one line and
exit 2 before any run folder exists (default tier)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from t2i_gcpo.policies.registry import load_policy, split_spec

from cli_helpers import cli, error_line
from meissonic_fixtures import SIDE, build_tiny_meissonic, marks

# float32 whatever the machine; 4 reveal steps, 2 prompts × 4 samples a step
FAST = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=3",
    "rollout.steps=4",
    "sample_every=1",
    "save_every=1",
    "eval_every=-1",
    "rollout.autocast=none",
    "optim.autocast=none",
]
PROMPTS = "a photo of a cat\na photo of two dogs\na photo of a red car\na photo of a bench\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("meissonic_cli")
    (root / "prompts.txt").write_text(PROMPTS)
    return {"model": build_tiny_meissonic(root / "meissonic"), "prompts": root / "prompts.txt", "root": root}


def train(capsys, tiny, out, algo, extra=(), steps=2, model=None):
    args = [
        "train",
        "--prompts",
        tiny["prompts"],
        "--model",
        model or f"meissonic:{tiny['model']}",
        "--algo",
        algo,
        "--reward",
        "train_fixtures:redness",
        "--out",
        out,
        "--steps",
        steps,
        "--seed",
        "0",
        "--set",
        "optim.lr=1e-3",
    ]
    for kv in (*FAST, *extra):
        args += ["--set", kv]
    return cli(capsys, *args)


def rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def weights(policy, prefix):
    return {k: v.clone() for k, v in policy.state_dict().items() if k.startswith(prefix)}


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["gcpo", "dapo", "stepwise"])
def test_two_training_steps_train_the_transformer_only(capsys, tiny, tmp_path, algo):
    out = tmp_path / "run"
    code, stdout, err = train(capsys, tiny, out, algo)
    assert code == 0, err
    got = rows(out)
    assert [r["step"] for r in got] == [1, 2] and all(math.isfinite(r["loss/policy"]) for r in got)
    if algo == "stepwise":
        assert "scores the model's prediction after each of the 4 reveal steps" in stdout
        assert all(r["budget/step_predictions"] == 24 for r in got)  # x̂_0 … x̂_2 of each of the 8 samples
    # recorded ≡ replayed log-probs (float32): the ratio starts at 1
    assert all(r["mismatch/max_abs_pos"] < 1e-4 for r in got)
    ckpt = out / "checkpoints" / "step_000002" / "model"
    assert split_spec(str(ckpt))[0] == "meissonic"  # the checkpoint is a Meissonic folder, found by its files
    base, trained = load_policy(f"meissonic:{tiny['model']}"), load_policy(str(ckpt))
    for part in ("vqvae.", "text_encoder."):
        a, b = weights(base, part), weights(trained, part)
        assert all(torch.equal(a[k], b[k]) for k in a), part
    a, b = weights(base, "transformer."), weights(trained, "transformer.")
    assert any(not torch.equal(a[k], b[k]) for k in a)
    assert (out / "credit_maps" / "step_000002.png").is_file() and marks(tiny["model"]) == []


@pytest.mark.slow
def test_a_resumed_run_equals_the_uninterrupted_one(capsys, tiny, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert train(capsys, tiny, full, "dapo", ["model_options.estimator=remask"])[0] == 0
    assert train(capsys, tiny, part, "dapo", ["model_options.estimator=remask"], steps=1)[0] == 0
    code, _, err = cli(capsys, "train", "--resume", part, "--steps", "2", "--trust-run-code")
    assert code == 0, err
    for a, b in zip(rows(full), rows(part)):
        assert a["reward/mean"] == pytest.approx(b["reward/mean"], abs=1e-6)
        assert a["loss/policy"] == pytest.approx(b["loss/policy"], abs=1e-6)
    sa = load_policy(str(full / "checkpoints" / "step_000002" / "model")).state_dict()
    sb = load_policy(str(part / "checkpoints" / "step_000002" / "model")).state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.slow
def test_lora_with_gradient_checkpointing_trains_and_saves_a_merged_folder(capsys, tiny, tmp_path):
    out = tmp_path / "lora"
    code, _, err = train(
        capsys,
        tiny,
        out,
        "gcpo",
        ["model_options.lora_rank=2", "model_options.gradient_checkpointing=true"],
        steps=1,
    )
    assert code == 0, err
    trained = load_policy(str(out / "checkpoints" / "step_000001" / "model"))
    base = load_policy(f"meissonic:{tiny['model']}")
    a, b = weights(base, "transformer."), weights(trained, "transformer.")
    assert set(a) == set(b)  # merged: the released key set, no lora_ keys
    changed = {k for k in a if not torch.equal(a[k], b[k])}
    assert changed and all(".attn." in k for k in changed)  # only the adapted projections moved


@pytest.mark.slow
def test_credit_map_sample_and_eval(capsys, tiny, tmp_path, monkeypatch):
    import t2i_gcpo.eval.geneval as geneval
    from t2i_gcpo.worlds.shapeworld import parse_prompt

    spec = f"meissonic:{tiny['model']}"
    maps = tmp_path / "maps"
    code, stdout, err = cli(
        capsys,
        "credit-map",
        "--model",
        spec,
        "--prompt",
        "a photo of a red car",
        "--group",
        "3",
        "--schemes",
        "gcpo,stepwise,uniform",
        "--reward",
        "train_fixtures:redness",
        "--out",
        maps,
    )
    assert code == 0, err
    steps = load_policy(spec).default_sampling().steps
    assert f"stepwise: {3 * (steps - 1)} predictions over the reveal steps scored" in stdout
    assert (maps / "00000.png").is_file() and (maps / "00000_steps.png").is_file()
    assert "r(x̂_s) over the reveal steps" in (maps / "credit_maps.html").read_text()

    samples = tmp_path / "samples"
    code, _, err = cli(
        capsys,
        "sample",
        "--model",
        spec,
        "--prompts",
        tiny["prompts"],
        "--out",
        samples,
        "--n",
        "2",
        "--steps",
        "4",
    )
    assert code == 0, err
    from PIL import Image

    images = sorted(samples.glob("*/samples/*.png"))
    assert len(images) == 8 and Image.open(images[0]).size == (2 * SIDE, 2 * SIDE)
    assert json.loads((samples / "00000" / "generation.json").read_text())["steps"] == 4

    prompts = [parse_prompt(p) for p in ("a photo of a red circle", "a photo of two squares")]
    monkeypatch.setattr(geneval, "load_geneval_prompts", lambda: prompts)  # GenEval's 553 → 2 prompts
    ev = tmp_path / "eval"
    code, _, err = cli(
        capsys,
        "eval",
        "geneval",
        "--model",
        spec,
        "--detector",
        "shapeworld",
        "--n",
        "2",
        "--steps",
        "4",
        "--out",
        ev,
    )
    assert code == 0, err
    assert len((ev / "results.jsonl").read_text().splitlines()) == 4 and (ev / "summary.json").is_file()


@pytest.mark.parametrize(
    "change,message",
    [
        ("no vqvae", "missing vqvae/"),
        ("text encoder width", "a text encoder of width 40"),
        ("unknown config", "unknown config key 'num_experts'"),
    ],
)
def test_a_wrong_folder_is_one_line_and_no_run_folder(capsys, tiny, tmp_path, change, message):
    if change == "no vqvae":
        path = tmp_path / "m"
        shutil.copytree(tiny["model"], path)
        shutil.rmtree(path / "vqvae")
    else:
        kw = {"text_width": 40} if change == "text encoder width" else {"transformer": {"num_experts": 4}}
        path = build_tiny_meissonic(tmp_path / "m", fp16_copy=False, **kw)
    out = tmp_path / "run"
    code, _, err = train(capsys, tiny, out, "gcpo", model=f"meissonic:{path}")
    assert code == 2 and message in error_line(err) and not out.exists()
    code, _, err = cli(
        capsys,
        "sample",
        "--model",
        f"meissonic:{path}",
        "--prompts",
        tiny["prompts"],
        "--out",
        tmp_path / "s",
    )
    assert code == 2 and message in error_line(err) and not (tmp_path / "s").exists()


@pytest.mark.slow
def test_the_shipped_recipe_trains_the_tiny_folder(capsys, tiny, tmp_path):
    """configs/recipes/meissonic_geneval.yaml as shipped (remask × 6, gradient checkpointing, bf16 autocasts,
    4 minibatches, the negative prompt), only its model, reward, reveal steps and length replaced."""
    out = tmp_path / "recipe"
    code, _, err = cli(
        capsys,
        "train",
        "--config",
        "configs/recipes/meissonic_geneval.yaml",
        "--model",
        f"meissonic:{tiny['model']}",
        "--prompts",
        tiny["prompts"],
        "--reward",
        "train_fixtures:redness",
        "--steps",
        "1",
        "--out",
        out,
        "--set",
        "rollout.steps=4",
        "--set",
        "eval_every=-1",
    )
    assert code == 0, err
    (row,) = rows(out)
    assert row["budget/samples"] == 8 and math.isfinite(row["loss/kl"])
    trained = load_policy(str(out / "checkpoints" / "step_000001" / "model"))
    assert trained.default_negative.startswith("worst quality, low quality")  # saved with the checkpoint
