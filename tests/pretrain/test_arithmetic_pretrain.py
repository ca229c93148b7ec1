"""Arithmetic pretraining (t2i_gcpo.pretrain.arithmetic), the shipped `arithmetic` model and
the text entries of the policy registry (`arithmetic`, `text:PATH`, detection of a causal-LM folder).

What is checked: a few pretraining steps on a tiny shape write a folder that both `TextPolicy` and
plain `AutoModelForCausalLM` load, with EOS / pad in its generation config, only completion tokens
in the loss, and a pretrain.json record; the shipped model answers held-out problems in the world's
format (step lines, then "#### N"); `text:PATH` and detection load a tiny random Llama while image
checkpoints keep their families; the CLI's arithmetic errors are one line and come before any work.
"""

from __future__ import annotations

import json
import os
import random
import time

import pytest
import torch
from click.testing import CliRunner

from t2i_gcpo.cli import cli
from t2i_gcpo.config import ModelOptions
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import PromptRecord, SamplingParams
from t2i_gcpo.policies.registry import ASSETS, detect_family, load_policy, split_spec
from t2i_gcpo.policies.text import TextPolicy
from t2i_gcpo.pretrain.arithmetic import (
    IGNORE,
    ArithmeticPretrainConfig,
    ModelShape,
    data_accuracy,
    encode_batch,
    pretrain,
)
from t2i_gcpo.worlds.arithmetic import format_prompt, format_reward, make_splits
from t2i_gcpo.worlds.arithmetic.tokenizer import build_tokenizer

from tiny_models import build_tiny_text_lm


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices: one thread is fastest on a loaded 2-core machine; restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


TINY = ArithmeticPretrainConfig(
    n_train=64,
    n_test=3,
    steps=3,
    batch=8,
    warmup=2,
    eval_samples=2,
    eval_max_new_tokens=12,
    model=ModelShape(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=96),
)


def _gens(n: int, seed: int = 0) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed * 1000 + i) for i in range(n)]


def test_batch_has_loss_on_the_completion_and_eos_only():
    tok = build_tokenizer()
    problems = make_splits(4, 0)[0]
    cfg = ArithmeticPretrainConfig(p_wrong=0.0, empty_dropout=0.0)
    ids, mask, target = encode_batch(tok, problems, cfg, random.Random(0))
    for i, p in enumerate(problems):
        n_prompt = len(format_prompt(p.question))  # one token per character
        row = ids[i][mask[i] > 0].tolist()
        labelled = target[i][target[i] != IGNORE].tolist()
        assert tok.decode(row[:n_prompt]) == format_prompt(p.question)
        assert labelled == row[n_prompt:] and labelled[-1] == tok.eos_token_id
        assert tok.decode(labelled[:-1]) == "".join(s.text + "\n" for s in p.steps) + f"#### {p.answer}"
        assert (target[i][:n_prompt] == IGNORE).all() and (target[i][mask[i] == 0] == IGNORE).all()
    dropped = encode_batch(tok, problems, ArithmeticPretrainConfig(empty_dropout=1.0), random.Random(0))[0]
    assert tok.decode(dropped[0][: len(format_prompt(""))].tolist()) == format_prompt("")  # c⁻ = empty


def test_data_accuracy_is_the_chance_of_no_slip():
    problems = make_splits(0, 5)[1]
    expected = sum(0.9 ** len(p.steps) for p in problems) / 5
    assert data_accuracy(problems, 0.1) == pytest.approx(expected) and data_accuracy(problems, 0.0) == 1.0


def test_pretrain_writes_a_folder_that_loads_and_samples(tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "lm"
    stats = pretrain(str(out), TINY)
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    record = json.loads((out / "pretrain.json").read_text())
    assert record["train"]["steps"] == 3 and record["params"] == stats["params"] > 0
    assert {"sampled", "greedy", "problems"} <= set(record["eval"]) and record["eval"]["problems"] == 3
    assert 0.0 <= record["eval"]["sampled"]["accuracy"] <= 1.0
    assert (
        {"loss", "seconds"} <= set(record["train"]) and "load_average" in record and "torch_threads" in record
    )

    plain = AutoModelForCausalLM.from_pretrained(out)
    assert plain.generation_config.eos_token_id == 2 and plain.generation_config.pad_token_id == 0
    policy = TextPolicy.from_pretrained(out)
    assert policy.eos_ids == [2] and policy.pad_id == 0
    assert policy.context_ids("1+2*3=?") == policy.tokenizer(format_prompt("1+2*3=?"))["input_ids"]
    ro = policy.rollout([PromptRecord("1+2*3=?")], 2, SamplingParams(max_new_tokens=8), _gens(1))
    assert ro.tokens.shape[0] == 2 and len(policy.decode(ro)) == 2


def test_shipped_model_answers_in_the_world_format():
    policy = load_policy("arithmetic")
    assert isinstance(policy, TextPolicy) and split_spec("arithmetic") == ("text", "arithmetic")
    record = json.loads(open(os.path.join(ASSETS, "arithmetic", "pretrain.json")).read())
    assert 0.2 < record["eval"]["sampled"]["accuracy"] < 0.7  # room for RL, above chance
    test = make_splits(0, 4)[1]
    ro = policy.rollout(
        [PromptRecord(p.question) for p in test], 2, SamplingParams(max_new_tokens=64), _gens(len(test))
    )
    texts = policy.decode(ro)
    assert all(format_reward(t) == 1.0 for t in texts), texts  # step lines, then "#### N"
    ends = ro.tokens.gather(1, (ro.mask.sum(1).long() - 1)[:, None])[:, 0]
    assert (ends == policy.tokenizer.eos_token_id).all()  # every row stopped by itself


def test_text_prefix_and_detection_load_a_causal_lm_folder(tmp_path):
    path = build_tiny_text_lm(tmp_path / "lm")
    assert split_spec(str(path)) == ("text", str(path)) and detect_family(str(path)) == "text"
    for spec in (f"text:{path}", str(path)):
        assert isinstance(load_policy(spec), TextPolicy)
    bf16 = load_policy(f"text:{path}", ModelOptions(dtype="bfloat16"))
    assert bf16.model.dtype == torch.bfloat16
    with pytest.raises(UserError, match="lora_rank"):
        load_policy(f"text:{path}", ModelOptions(lora_rank=4))
    with pytest.raises(UserError, match="is not a directory"):
        load_policy(f"text:{tmp_path / 'missing'}")


def test_image_detection_is_unchanged(tmp_path):
    assert detect_family(os.path.join(ASSETS, "shapeworld")) == "ar"
    assert detect_family(os.path.join(ASSETS, "shapeworld_masked")) == "masked"
    (tmp_path / "janus").mkdir()
    (tmp_path / "janus" / "config.json").write_text('{"model_type": "janus"}')
    assert detect_family(str(tmp_path / "janus")) == "janus"
    (tmp_path / "vit").mkdir()
    (tmp_path / "vit" / "config.json").write_text('{"model_type": "vit"}')  # not a causal LM
    assert detect_family(str(tmp_path / "vit")) == "ar"


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--arch", "masked"], "--arch masked applies to --world shapeworld only"),
        (["--vq-steps", "5"], "--vq-steps applies to --world shapeworld only"),
        (["--out", "/proc/t2i-gcpo-test"], "not writable"),
    ],
)
def test_cli_arithmetic_errors_are_one_line_and_immediate(tmp_path, extra, needle):
    tic = time.perf_counter()
    args = ["pretrain", "--world", "arithmetic", "--out", str(tmp_path / "m"), *extra]
    err = CliRunner().invoke(cli, args).exception
    assert isinstance(err, UserError) and needle in str(err) and "\n" not in str(err), err
    assert time.perf_counter() - tic < 5 and not (tmp_path / "m").exists()


def test_cli_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    err = (
        CliRunner().invoke(cli, ["pretrain", "--world", "arithmetic", "--out", str(tmp_path / "f")]).exception
    )
    assert isinstance(err, UserError) and "is a file, not a directory" in str(err), err


def test_cli_runs_the_arithmetic_pretraining(tmp_path, monkeypatch):
    import dataclasses

    import t2i_gcpo.pretrain.arithmetic as module

    monkeypatch.setattr(module, "ArithmeticPretrainConfig", lambda **kw: dataclasses.replace(TINY, **kw))
    out = tmp_path / "m"
    args = [
        "pretrain",
        "--world",
        "arithmetic",
        "--out",
        str(out),
        "--steps",
        "2",
        "--seed",
        "3",
        "--threads",
        "1",
    ]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    record = json.loads((out / "pretrain.json").read_text())
    assert record["config"]["steps"] == 2 and record["config"]["seed"] == 3 and record["train"]["steps"] == 2
    assert "held-out accuracy on 3 problems" in res.output and isinstance(load_policy(str(out)), TextPolicy)
