"""Pretrain the arithmetic world's tiny causal LM on noisy worked solutions (docs/worlds/arithmetic.md).

Every step draws fresh noisy solutions (a slip rate per step), so the model learns the slip rate and its
sampled accuracy stays well below 1 — room for RL; with some probability the question is left out, so
GCPO's ``empty`` negative context is one the model has seen. `pretrain(out, cfg)` returns the statistics
it also writes to ``out/pretrain.json``. Details and the shipped model: docs/worlds/arithmetic.md#pretraining.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from t2i_gcpo.errors import check_writable_dir
from t2i_gcpo.pretrain.optim import pretrain_optimizer, set_lr
from t2i_gcpo.pretrain.shapeworld_ar import use_bf16
from t2i_gcpo.worlds.arithmetic.checking import correctness_reward, format_reward
from t2i_gcpo.worlds.arithmetic.problems import Problem, make_splits
from t2i_gcpo.worlds.arithmetic.prompts import format_prompt
from t2i_gcpo.worlds.arithmetic.solutions import noisy_solution
from t2i_gcpo.worlds.arithmetic.tokenizer import build_tokenizer

IGNORE = -100  # label of a position without loss (prompt, padding)


@dataclass
class ModelShape:
    """The Llama decoder's shape (SwiGLU MLP, rotary positions, RMSNorm)."""

    hidden_size: int = 128  # d
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384  # SwiGLU width (3d)
    max_positions: int = 128  # prompt + completion; the longest generated problem needs ≈ 62


@dataclass
class ArithmeticPretrainConfig:
    seed: int = 0
    n_train: int = 50_000  # training problems (distinct, none of the test problems)
    n_test: int = 200  # held-out problems scored after training (make_splits' default test set)
    p_wrong: float = 0.1  # probability that a step of a training solution slips
    empty_dropout: float = 0.1  # probability of training a row without its question (c⁻ = empty)
    steps: int = 2_000  # AdamW steps at batch `batch`
    batch: int = 32
    lr: float = 3e-3  # peak, linear warm-up then cosine decay to 10 %
    warmup: int = 50
    weight_decay: float = 0.05
    bf16: bool | None = None  # bf16 autocast for the forward; None: where the CPU has native bf16
    max_minutes: float | None = None  # wall-clock cap on training (None: run all steps)
    eval_samples: int = 4  # samples per held-out problem at temperature 1
    eval_max_new_tokens: int = 64  # the longest solution is ≈ 45 characters
    model: ModelShape = field(default_factory=ModelShape)


def build_model(tokenizer: Any, shape: ModelShape) -> Any:
    """A randomly initialised `LlamaForCausalLM` over `tokenizer`'s vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def encode_batch(
    tokenizer: Any, problems: list[Problem], cfg: ArithmeticPretrainConfig, rng: random.Random
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (ids, attention mask, labels), each [B, S] long: prompt + a fresh noisy solution
    + EOS, labels `IGNORE` on the prompt and the padding."""
    rows, labels = [], []
    for p in problems:
        question = "" if rng.random() < cfg.empty_dropout else p.question
        prompt = tokenizer(format_prompt(question), add_special_tokens=False)["input_ids"]
        answer = tokenizer(noisy_solution(p, cfg.p_wrong, rng).text, add_special_tokens=False)["input_ids"]
        answer = answer + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        labels.append([IGNORE] * len(prompt) + answer)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    target = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, (r, y) in enumerate(zip(rows, labels)):
        ids[i, : len(r)] = torch.as_tensor(r)
        mask[i, : len(r)] = 1
        target[i, : len(y)] = torch.as_tensor(y)
    return ids, mask, target


def train_lm(
    model: Any,
    tokenizer: Any,
    train: list[Problem],
    cfg: ArithmeticPretrainConfig,
    max_seconds: float | None = None,
) -> dict[str, float]:
    """Completion-only next-token cross-entropy on noisy solutions of `train` problems."""
    from tqdm.auto import tqdm

    rng = random.Random(cfg.seed + 1)  # problems, dropout and slips
    params = list(model.parameters())
    opt = pretrain_optimizer(params, cfg.lr, cfg.weight_decay)
    model.train()
    t0, ema, step = time.time(), 0.0, 0
    bar = tqdm(range(cfg.steps), desc="arithmetic LM")
    for step in bar:
        set_lr(opt, cfg.lr, step, cfg.steps, cfg.warmup)
        ids, mask, target = encode_batch(tokenizer, rng.choices(train, k=cfg.batch), cfg, rng)  # [B, S]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16(cfg.bf16)):
            logits = model(input_ids=ids, attention_mask=mask).logits  # [B, S, V]
        loss = F.cross_entropy(
            logits[:, :-1].float().flatten(0, 1), target[:, 1:].flatten(), ignore_index=IGNORE
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema = 0.95 * ema + 0.05 * loss.item() if step else loss.item()
        if step % 10 == 0:
            bar.set_postfix(loss=f"{ema:.3f}")
        if max_seconds is not None and time.time() - t0 > max_seconds:
            break
    model.eval()
    return {"loss": ema, "steps": step + 1, "seconds": time.time() - t0}


@torch.no_grad()
def evaluate(
    policy: Any, test: list[Problem], samples: int, max_new_tokens: int, seed: int
) -> dict[str, Any]:
    """Held-out accuracy and format rate of a `TextPolicy`: sampled at T = 1 (`samples` per
    problem, prompt i's noise from its own generator) and greedy; a few greedy completions."""
    from t2i_gcpo.policies.base import PromptRecord, SamplingParams

    prompts = [PromptRecord(p.question, meta={"answer": p.answer}) for p in test]
    out: dict[str, Any] = {"problems": len(test)}
    for name, sampling, group in (
        ("sampled", SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens), samples),
        ("greedy", SamplingParams(top_k=1, max_new_tokens=max_new_tokens), 1),
    ):
        gens = [torch.Generator().manual_seed(seed * 100_003 + i) for i in range(len(test))]
        texts = policy.decode(policy.rollout(prompts, group, sampling, gens))
        rows = [p for p in test for _ in range(group)]
        out[name] = {
            "accuracy": sum(correctness_reward(p, t) for p, t in zip(rows, texts)) / len(texts),
            "format": sum(format_reward(t) for t in texts) / len(texts),
            "samples_per_problem": group,
        }
        if name == "greedy":
            out["examples"] = [format_prompt(p.question) + t for p, t in zip(test[:4], texts[:4])]
    return out


def data_accuracy(problems: list[Problem], p_wrong: float) -> float:
    """E[(1 − p_wrong)^steps]: the sampled accuracy of a perfect imitator of the training data."""
    return sum((1 - p_wrong) ** len(p.steps or ()) for p in problems) / max(len(problems), 1)


def pretrain(out: str, cfg: ArithmeticPretrainConfig | None = None, run_eval: bool = True) -> dict[str, Any]:
    """Build, save to `out` and (with `run_eval`) score the arithmetic model; the statistics are
    returned and written to ``out/pretrain.json``."""
    from transformers import GenerationConfig

    from t2i_gcpo.policies.text import TextPolicy

    cfg = cfg or ArithmeticPretrainConfig()
    check_writable_dir(out, "output folder")  # before minutes of training, not at the save
    torch.manual_seed(cfg.seed)
    t_start = time.time()
    stats: dict[str, Any] = {"config": asdict(cfg), "torch_threads": torch.get_num_threads()}
    stats["load_average"] = {"start": os.getloadavg()[0]}  # other jobs on the machine slow training

    # ---- data and model ---------------------------------------------------------------------------
    train, test = make_splits(cfg.n_train, cfg.n_test)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, cfg.model)
    stats["params"] = sum(p.numel() for p in model.parameters())
    stats["bf16"] = use_bf16(cfg.bf16)
    stats["data_accuracy"] = data_accuracy(test, cfg.p_wrong)

    # ---- training ---------------------------------------------------------------------------------
    budget = None if cfg.max_minutes is None else cfg.max_minutes * 60
    stats["train"] = train_lm(model, tokenizer, train, cfg, budget)
    stats["load_average"]["after_train"] = os.getloadavg()[0]

    # ---- save, reload, evaluate the reloaded model ------------------------------------------------
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=cfg.eval_max_new_tokens,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if run_eval:
        t = time.time()
        policy = TextPolicy.from_pretrained(out, max_new_tokens=cfg.eval_max_new_tokens)
        stats["eval"] = evaluate(policy, test, cfg.eval_samples, cfg.eval_max_new_tokens, cfg.seed)
        stats["eval"]["seconds"] = time.time() - t
        stats["load_average"]["after_eval"] = os.getloadavg()[0]
    stats["total_seconds"] = time.time() - t_start
    with open(os.path.join(out, "pretrain.json"), "w") as f:
        json.dump(stats, f, indent=2)
    return stats
