"""One typed config schema holding every default of a training run.

Layering: dataclass defaults → algorithm preset (``t2i_gcpo/configs/<algo>.yaml``) → ``--config FILE`` →
command-line flags → ``--set key=value`` (dotted keys, YAML-typed values). Unknown keys and values
of the wrong type are errors that name the key. Every field is documented once, here, with its
paper symbol; ``t2i-gcpo train --help-config`` prints this documentation.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from t2i_gcpo.core.schemes import (
    CREDIT_SCHEMES,
    CreditScheme,
    CreditSchemeError,
    Option,
    SchemeOption,
    check_options,
)
from t2i_gcpo.errors import UserError
from t2i_gcpo.extensions import Registry
from t2i_gcpo.resources import CONFIG_DIR, PROMPTS_DIR, config_file_path

REPO_PROMPTS = PROMPTS_DIR  # the name branches older than t2i_gcpo/resources.py import


@dataclass(frozen=True)
class DecodeMode:
    """One decode loop of the autoregressive samplers (policies/decode_loop.py, docs/fast-sampling.md)."""

    name: str
    doc: str


# the decode loops `rollout.decode` takes, declared here once (policies/decode_loop.py reads them)
DECODE_MODES: Registry[DecodeMode] = Registry("decode mode")
for _mode in (
    DecodeMode("auto", "graph on CUDA where the model's step is one the static loop reproduces, else eager"),
    DecodeMode("eager", "the adapter's own loop, one Python step per token: the reference and the fallback"),
    DecodeMode(
        "static",
        "the whole token step — both CFG halves, guidance, top-k/top-p, the draw, the three log-probs — in "
        "static shapes over preallocated buffers, uncaptured (what graph replays; any device; a check)",
    ),
    DecodeMode(
        "graph",
        "that step captured once a run as CUDA graphs and replayed (CUDA only; its cache and weight copies "
        "stay allocated between rollouts)",
    ),
    DecodeMode("compile", "that step through torch.compile once a run (then captured on CUDA)"),
):
    DECODE_MODES.add(_mode)
DecodeModeName = Literal[tuple(DECODE_MODES)]  # type: ignore[valid-type]


@dataclass(frozen=True)
class Bounds:
    """The values a numeric field accepts, declared next to it: `low` ≤ v ≤ `high` (`low_open`,
    `high_open`: strict). null passes (it means "the default"); NaN never does. `why` follows the
    range in the error message and in ``--help-config``."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def __str__(self) -> str:
        lo, hi = (f"{v:g}" if isinstance(v, float) else v for v in (self.low, self.high))
        if lo is not None and hi is not None:
            return f"in {'(' if self.low_open else '['}{lo}, {hi}{')' if self.high_open else ']'}"
        if lo is not None:
            return f"{'>' if self.low_open else '≥'} {lo}"
        return f"{'<' if self.high_open else '≤'} {hi}"

    def problem(self, value: Any) -> str | None:
        """None if `value` is accepted, else what it must be."""
        if value is None:
            return None
        ok = not (isinstance(value, float) and math.isnan(value))
        if ok and self.low is not None:
            ok = value > self.low if self.low_open else value >= self.low
        if ok and self.high is not None:
            ok = value < self.high if self.high_open else value <= self.high
        return None if ok else f"must be {self}" + (f" ({self.why})" if self.why else "")


def doc(
    text: str,
    default: Any = dataclasses.MISSING,
    factory: Any = dataclasses.MISSING,
    bounds: Bounds | None = None,
) -> Any:
    """A dataclass field carrying its documentation and, for a number, the `Bounds` it accepts."""
    metadata = {"doc": text, "bounds": bounds}
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


DEVICE = re.compile(r"^(cpu|cuda(:\d+)?|mps)$")  # a device a config key may name

# a ceiling on every count of samples (prompts per step, group size, held-out images per prompt): a typo's
# 100000 is one line at once, not an allocation error or a week of sampling
MAX_SAMPLES = 4096


@dataclass
class RolloutConfig:
    prompts_per_step: int = doc(
        "P: prompts sampled per step (each gets a group of G outputs).", 8, bounds=Bounds(1, MAX_SAMPLES)
    )
    group_size: int = doc(
        "G: outputs sampled per prompt (GCPO paper: 16).",
        8,
        bounds=Bounds(2, MAX_SAMPLES, why="advantages are group-relative"),
    )
    cfg_scale: float | None = doc(
        "s_cfg: classifier-free guidance scale ℓ_u + s(ℓ_c − ℓ_u); null = the model's default "
        "(ShapeWorld: stored in its checkpoint; GCPO paper on Janus-Pro: 5).",
        None,
        bounds=Bounds(0, 1000, why="1 = the conditional model alone, 0 = the unconditional one"),
    )
    temperature: float = doc(
        "T: sampling temperature (GCPO paper: 1).",
        1.0,
        bounds=Bounds(1e-6, why="> 0; smaller overflows the scaled logits: top_k=1 samples greedily"),
    )
    top_k: int = doc("Top-k filter while sampling; 0 disables it.", 0, bounds=Bounds(0, why="0 disables it"))
    top_p: float = doc(
        "Top-p (nucleus) filter while sampling; 1 disables it.", 1.0, bounds=Bounds(0, 1, low_open=True)
    )
    steps: int | None = doc(
        "Decoding steps of a masked model (each reveals a share of the tokens on the cosine schedule); "
        "null = the model's default (ShapeWorld masked: 8, aMUSEd: 12, Show-o: 50, Meissonic: 64). "
        "Autoregressive models ignore it.",
        None,
        bounds=Bounds(1, why="or null"),
    )
    max_new_tokens: int | None = doc(
        "Text models: the longest completion in tokens; null = the model's default. Image models ignore it.",
        None,
        bounds=Bounds(1, why="or null"),
    )
    guidance_schedule: Literal["constant", "linear"] = doc(
        "Masked models: the guidance scale over the decoding steps, constant or rising linearly from 1 "
        "at the first step to cfg_scale at the last (open-muse's linear schedule).",
        "constant",
    )
    reveal_order: Literal["confidence", "random"] | None = doc(
        "Masked models: which masked positions a decoding step reveals — the most confident (MaskGIT, "
        "aMUSEd) or a uniformly random subset, whose order does not depend on the weights, so the "
        "trajectory log-prob is the sample's exact likelihood (policies/maskgen.py); null = the model's "
        "default (aMUSEd, Meissonic: confidence; ShapeWorld masked: stored in its checkpoint).",
        None,
    )
    train_logp: Literal["cond", "cfg"] = doc(
        "Which distribution is trained (docs/concepts/generation.md): 'cond', the positive context alone "
        "(GCPO, STAGE, T2I-R1), or 'cfg', the guided mix that was sampled (ReasonGen-R1).",
        "cond",
    )
    autocast: Literal["auto", "none", "bf16"] = doc(
        "Sample (training rollouts and held-out evaluation) under torch.autocast in bfloat16: the "
        "sampler's matmuls and KV cache in bf16, the sample step and the recorded log-probs in float32. "
        "'auto': bf16 where the hardware has native bf16 (see optim.autocast) and the model's sampler is "
        "checked for it (the ShapeWorld priors, Janus — LoRA included — and plain-Llama text models "
        "through the fused decoder; not aMUSEd, Meissonic or transformers' cache), else none; the run's "
        "config.yaml records what it resolved to. The fused decoder's bf16 weight copies are refreshed after "
        "each optimizer step (the fp32 weights stay the master copy). The update "
        "then sees log-probs recorded in bf16 (a mean |Δ log p| of 0.002 against its float32 "
        "recomputation on the ShapeWorld prior; logged every step as mismatch/*, docs/mismatch.md); 5 seeds "
        "each of DAPO, GCPO and DGPO on ShapeWorld-32 ended as the float32 runs did (docs/performance.md).",
        "auto",
    )
    decode: DecodeModeName = doc(
        "The decode loop of autoregressive samplers (the ShapeWorld AR priors, Janus, plain-Llama text "
        "models; masked models ignore it; docs/fast-sampling.md#decode-loop): "
        + "; ".join(f"'{name}', {text}" for name, text in DECODE_MODES.rows())
        + ". The same seeds draw the same samples in every mode (up to float rounding); models the static "
        "step does not reproduce (non-Llama language models, DoRA) sample eagerly.",
        "auto",
    )
    old_logprobs: Literal["recorded", "recompute"] = doc(
        "π_old of the ratio ρ = π_θ/π_old: 'recorded', the log-probs the sampler wrote while sampling (free; "
        "under bf16 the KV-cache decode rounds differently from the update's full forward, so ρ ≠ 1 before "
        "any step: logged as mismatch/*), or 'recompute', the update's own teacher-forced log-probs of the "
        "trained context under the weights that sampled, in the update's precision: with one update epoch "
        "the first pass's forward, detached (free: a separate no-grad pass would give the same numbers); "
        "with more epochs a no-grad forward before the update (one forward per batch, docs/mismatch.md). "
        "Alone it drops the correction that 'recorded' makes (ρ = π_θ/π_rollout is the importance "
        "weight): use it with loss.tis_cap. The recorded ones still feed loss.tis_cap, the mismatch metrics "
        "and GCPO's contrast (credit.contrast).",
        "recorded",
    )
    allocation: Literal["none", "pods", "knapsack"] = doc(
        "Prompt-level budget allocation (docs/concepts/algorithms.md#budget-allocation): 'none', G "
        "samples per prompt; 'pods', draw draw_factor·G per prompt and train on the G whose rewards vary "
        "most (PODS, arXiv 2504.13818); 'knapsack', draw G per prompt, then (draw_factor − 1)·G per prompt "
        "more on average, a group of G at a time, to the prompts whose estimated success rate (their history "
        "and this round) makes a larger group most likely to hold both outcomes (Knapsack RL, arXiv "
        "2509.25849), each prompt's draws down-sampled to the G that vary most. Works with every credit "
        "scheme but tree groups; the budget metrics count what was drawn (budget/samples) and what was kept "
        "(budget/samples_kept).",
        "none",
    )
    draw_factor: float = doc(
        "Budget allocation: the samples a step draws, as a multiple of the P·G it trains on (pods: "
        "draw_factor·G per prompt, a whole number above G; knapsack: (draw_factor − 1)·G per prompt more on "
        "average, the fraction of a group a round cannot draw carried to the next round).",
        2.0,
        bounds=Bounds(1, 64, why="a multiple of the trained samples"),
    )
    max_step_samples: int = doc(
        "The most samples one process may decode and score in one step — every group drawn (dynamic "
        "sampling's draw budget included), the allocation's extra draws, every continuation (tree groups: "
        "P·G₀·(1 + k·n); vine: P·G·(1 + points·n)) and every scored reveal-step prediction (stepwise: "
        "P·G·S). A run above it is refused before it starts, naming the product (docs/errors.md#the-plan); "
        "raise it where the machine holds more.",
        16384,
        bounds=Bounds(1, why="samples a step decodes and scores"),
    )
    max_step_memory: float | None = doc(
        "The most memory (GB) one process's step may hold at its peak, by the memory model measured on "
        "the run's model before it starts (train/draws.py; docs/performance.md#step-memory): its rollouts, "
        "decoded outputs, continuations and the update's forward and backward. null: what this process has "
        "free when the run starts (the device's free memory on CUDA; on the CPU the least of the machine's "
        "available memory, its memory cgroup's room and its address-space limit's, shared by the processes a "
        "launch runs on the machine). A run above it is refused before it starts, naming the product, the "
        "estimate and this setting.",
        None,
        bounds=Bounds(0, low_open=True, why="GB, or null for the free memory"),
    )


@dataclass
class AdvantageConfig:
    scale: Literal["group", "batch", "none"] = doc(
        "Divide (r − mean_g r) by the group std, batch std, or nothing.", "group"
    )
    eps: float = doc(
        "ε added to the std (GRPO: 1e-4).",
        1e-4,
        bounds=Bounds(1e-12, why="> 0: a group whose rewards are all equal has std 0"),
    )
    dynamic_sampling: bool = doc(
        "DAPO dynamic sampling: drop groups whose rewards are all equal, resample.", False
    )
    max_resample: int = doc(
        "Dynamic sampling: at most this many extra rollout rounds per step.", 3, bounds=Bounds(0, 1000)
    )
    draw_budget: float = doc(
        "Dynamic sampling: the most groups one step draws, as a multiple of P. A round draws the missing "
        "groups divided by (1 − r̂), r̂ the running share of groups without signal, so one batched round "
        "usually fills the step; when most groups score alike the budget caps the step's cost and the step "
        "trains on fewer than P groups. 1.5 keeps a late step (most groups alike) at the cost of an early "
        "one; 2.0 made late steps 1.27× dearer for no measured gain (docs/performance.md, 'progress').",
        1.5,
        bounds=Bounds(1, 1000, why="a multiple of P"),
    )
    carry_over: bool = doc(
        "Dynamic sampling: groups with signal beyond P are trained at the next step (at most P/2 of them, "
        "sampled one update earlier: the clipped ratio to their recorded log-probs corrects for it) "
        "instead of being dropped.",
        True,
    )
    reward_norm: Literal["sum", "per_reward"] = doc(
        "A weighted sum of rewards r = Σ_k w_k r_k: 'sum' normalises r within its group (GRPO); 'per_reward' "
        "normalises each term r_k within its group, takes the weighted sum of those advantages and "
        "normalises it over the batch (GDPO, arXiv 2601.05242; docs/concepts/algorithms.md#gdpo), so that "
        "one term's scale does not drown the others'; needs advantage.scale=group. A scheme that reads "
        "rewards (vine, tree, tempo, stepwise) reads GDPO's normalised rewards r̂ of the group's samples, "
        "continuations and step predictions (docs/concepts/algorithms.md#gdpo-and-credit-schemes); a scheme "
        "of yours that reads them is refused. Dynamic sampling still drops the groups whose total r is flat.",
        "sum",
    )


@dataclass
class LossConfig:
    eps_low: float = doc(
        "ε_low: lower clip of the ratio ρ (PPO/GRPO: 0.2); .inf: no lower clip.", 0.2, bounds=Bounds(0)
    )
    eps_high: float = doc(
        "ε_high: upper clip of ρ (DAPO clip-higher: 0.28); .inf: no upper clip.", 0.2, bounds=Bounds(0)
    )
    dual_clip: float | None = doc(
        "c: dual-clip bound for Â < 0 (typical 3); null disables it.",
        None,
        bounds=Bounds(1, low_open=True, why="or null"),
    )
    aggregation: Literal[
        "seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm", "weighted-token-mean"
    ] = doc(
        "How per-token losses become one number: GRPO 'seq-mean-token-mean', DAPO 'token-mean', Dr. GRPO "
        "'seq-mean-token-sum-norm', official GCPO T2I / STAGE 'weighted-token-mean' = Σ(ρ A w)/Σ w.",
        "seq-mean-token-mean",
    )
    beta: float = doc(
        "β: weight of the k3 KL to the frozen initial policy (GRPO: 0.03; DAPO/DGPO: 0).",
        0.0,
        bounds=Bounds(0),
    )
    kl_reweight: bool = doc(
        "Official GCPO T2I: scale each token's KL by 0.5 + 0.5·clamp(2 − 2w, 0, 1).", False
    )
    reference_dtype: Literal["same", "bfloat16"] = doc(
        "Weights of the frozen reference policy that the KL term (loss.beta) and reference-comparing credit "
        "schemes (credit.reference) read: 'same' dtype as the policy, or 'bfloat16' — half its memory (an "
        "fp32 Janus-Pro-1B: 6 GB → 3 GB; 7B: 30 GB → 15 GB); under optim.autocast=bf16 its matmuls run in "
        "bf16 either way, so only its norms and embeddings round differently.",
        "same",
    )
    tis_cap: float | None = doc(
        "C: truncated importance sampling of the rollout/update mismatch (needs rollout.old_logprobs="
        "recompute): each token's surrogate is multiplied by min(π_old/π_rollout, C), π_old the recomputed "
        "log-prob and π_rollout the sampler's, detached (Yao et al. 2025, 'Your efficient RL framework "
        "secretly brings you off-policy RL training'; docs/mismatch.md measured C = 2). null disables it.",
        None,
        bounds=Bounds(0, low_open=True),
    )


@dataclass
class CreditBase:
    """The credit config's fixed keys; `CreditConfig` adds one section per registered scheme with options."""

    scheme: str = doc(
        "Token credit: a scheme of the registry (t2i_gcpo/core/schemes/, one file each: "
        + ", ".join(CREDIT_SCHEMES)
        + "; critical is Group Critical-token PO, zghhui/GCPO — not the same method as gcpo), or a "
        "function of your own, 'path/to/file.py:function' or 'module:function' "
        "(docs/guides/custom-credit.md).",
        "uniform",
    )
    granularity: Literal["token", "step"] = doc(
        "'step' pools the weights over the tokens decided at one step (masked models; AR: no change).",
        "token",
    )
    contrast: Literal["recorded", "recompute"] = doc(
        "Where a contrast scheme (gcpo) gets the positive/negative log-probs: the rollout's recorded ones "
        "(free; equal to recomputed with one update epoch) or recomputed by the current policy at update "
        "time (official code; costs two forward passes).",
        "recorded",
    )
    reference: Literal["initial", "rollout"] = doc(
        "π_ref of a scheme that compares distributions (dgpo): the frozen initial policy, or the policy "
        "that sampled the step's rollout (a weight snapshot, not cached logits).",
        "initial",
    )

    def options_for(self, name: str) -> dict[str, Any]:
        """The keyword options scheme `name` is called with: its section `credit.<name>` (if it has one)
        and, for the configured scheme, `credit.options` on top."""
        section = getattr(self, name, None) if name.isidentifier() else None
        options = dataclasses.asdict(section) if dataclasses.is_dataclass(section) else {}
        if name == self.scheme:
            options.update(getattr(self, "options", {}))
        return options


def _option_field(name: str, opt: SchemeOption) -> tuple[str, Any, Any]:
    """A config field for the scheme option `opt`: its type, default, documentation and range."""
    if opt.required:
        raise TypeError(f"credit scheme {name!r}: built-in option {opt.name!r} needs a default")
    return opt.name, opt.type, doc((opt.info or Option("")).doc, opt.default, bounds=option_bounds(opt))


def option_bounds(opt: SchemeOption) -> Bounds | None:
    """The `Bounds` a scheme option's `Option` declares (None: any value of its type)."""
    info = opt.info
    if info is None or (info.low is None and info.high is None):
        return None
    return Bounds(info.low, info.high, info.low_open, info.high_open, info.why)


def _scheme_section(name: str, scheme: CreditScheme) -> type:
    """The config section `credit.<name>`: a dataclass of the scheme's options, made from its signature."""
    title = "".join(part.capitalize() for part in name.replace("-", "_").split("_"))
    section = dataclasses.make_dataclass(
        f"{title}Options", [_option_field(name, o) for o in scheme.specs], namespace={"scheme": name}
    )
    section.__module__ = __name__
    globals()[section.__name__] = section  # importable by its name (copy, pickle)
    return section


def _credit_config() -> type:
    """`CreditBase` plus a section per registered scheme that takes options, in the registry's order,
    plus `options` (the configured scheme's options given by name, e.g. a user scheme's)."""
    fields: list[tuple[str, Any, Any]] = []
    for name, scheme in CREDIT_SCHEMES.items():
        if scheme.options and name.isidentifier():
            section = _scheme_section(name, scheme)
            fields.append((name, section, doc(f"Options of the credit scheme {name}.", factory=section)))
    fields.append(
        (
            "options",
            dict[str, Any],
            doc(
                "Options for the configured scheme by name (credit.options.NAME=value), checked against its "
                "function's signature: a user scheme's options, or a built-in one's on top of its section.",
                factory=dict,
            ),
        )
    )
    cls = dataclasses.make_dataclass("CreditConfig", fields, bases=(CreditBase,))
    cls.__module__ = __name__
    return cls


CreditConfig = _credit_config()


BRANCH_RULES = ("every_k", "entropy", "boundary")  # where a scheme that needs "branches" branches (vine)
LEAF_RULES = ("spread", "entropy")  # tree groups: k points in every sample


@dataclass
class BranchingConfig:
    """Branched rollouts (docs/concepts/tree_credit.md#running-tree-credit): read by the train step and the
    credit maps for every credit scheme that needs "branches" (vine, or a user's own), ignored otherwise."""

    rule: Literal["every_k", "entropy", "boundary", "spread"] = doc(
        "Where samples branch: every k decision steps, before the k highest-entropy steps, at task "
        "boundaries (text: line starts; AR images: token rows), or k points spread evenly over each "
        "sample's steps (tree groups: spread or entropy, so every group has the same number of leaves).",
        "every_k",
    )
    k: int = doc(
        "every_k: the spacing in decision steps (scale it with the sample's steps: 16 gives 3 points on a "
        "64-token grid, use 64 on a 256-token one); entropy and spread: how many points per sample.",
        16,
        bounds=Bounds(1),
    )
    continuations: int = doc(
        "Continuations sampled from each branch point (each is decoded and scored: a step scores about "
        "G·points·continuations extra samples per prompt).",
        2,
        bounds=Bounds(1, 64, why="each continuation is a whole extra sample; VinePPO samples 9"),
    )


@dataclass
class OptimConfig:
    lr: float = doc(
        "AdamW learning rate. Default suits the 3.4 M-parameter ShapeWorld prior; the GCPO Janus-Pro "
        "recipe uses 5e-6.",
        1e-4,
        bounds=Bounds(0, 1, low_open=True, why="AdamW moves each weight by up to about lr per step"),
    )
    weight_decay: float = doc("AdamW weight decay.", 0.0, bounds=Bounds(0))
    lr_scheduler: Literal["constant", "linear", "cosine", "cosine_with_min_lr"] = doc(
        "Learning-rate schedule over the run's steps (transformers.get_scheduler), after warmup_steps of "
        "linear warmup: constant, linear decay to 0, cosine decay to 0, or cosine decay to min_lr_rate × lr "
        "(the official GCPO launch script: cosine_with_min_lr, min_lr_rate 0.05). The lr at step k is "
        "lr × λ(k − 1), λ transformers' schedule; the logged metric 'lr' shows it.",
        "constant",
    )
    warmup_steps: int = doc(
        "Steps of linear warmup before the schedule (0: none); transformers' warmup starts at lr 0 (step 1 "
        "makes no change) and reaches optim.lr at step warmup_steps + 1.",
        0,
        bounds=Bounds(0),
    )
    min_lr_rate: float = doc(
        "cosine_with_min_lr: the floor as a fraction of optim.lr (the cosine ends there one step after the "
        "last).",
        0.0,
        bounds=Bounds(0, 1),
    )
    grad_clip: float = doc(
        "Clip the global gradient norm to this value; 0 (or .inf) disables it.",
        1.0,
        bounds=Bounds(0, why="a negative bound reverses the update; 0 disables clipping"),
    )
    update_epochs: int = doc(
        "Passes over each rollout batch (1 = strictly on-policy, as the official recipe).",
        1,
        bounds=Bounds(1),
    )
    minibatches: int = doc(
        "Split each rollout batch into this many gradient-accumulation minibatches.", 1, bounds=Bounds(1)
    )
    minibatch_split: Literal["sequential", "query", "balanced"] = doc(
        "How the batch is split into minibatches: rows in order; 'query': whole groups (all samples of a "
        "prompt together); 'balanced': whole groups assigned so that each minibatch's positive and negative "
        "advantage mass nearly cancel (arXiv 2605.08666; docs/concepts/tree_credit.md#balanced-minibatches). "
        "Changes the gradient only with optim.step_per_minibatch.",
        "sequential",
    )
    step_per_minibatch: bool = doc(
        "Take an optimizer step after every minibatch (PPO-style minibatch updates, each normalised by its "
        "own tokens) instead of accumulating the whole batch's gradient into one step.",
        False,
    )
    autocast: Literal["auto", "none", "bf16"] = doc(
        "Run the update's forward passes under torch.autocast in bfloat16 (log-probs and the loss stay "
        "float32; rollouts follow rollout.autocast, in the weights' dtype otherwise: model_options.dtype "
        "for real checkpoints). 'auto': bf16 where the hardware has native bf16 (CUDA since Ampere, CPUs "
        "with AMX or avx512_bf16: `python -m benchmarks --only peak` says), else none — on a CPU without "
        "it bf16 matmuls are emulated, 0.007× the fp32 rate (the 2-core test machine, 2026-11-23).",
        "auto",
    )


@dataclass
class ModelOptions:
    dtype: Literal["float32", "bfloat16"] = doc("Weights dtype for real checkpoints.", "float32")
    gradient_checkpointing: bool = doc("Trade compute for memory (real checkpoints).", False)
    lora_rank: int = doc(
        "LoRA rank through peft; 0 = full fine-tuning (the paper's setting).", 0, bounds=Bounds(0)
    )
    max_rollout_batch: int | None = doc(
        "Janus, LlamaGen and text models: samples per sampling pass (the KV cache holds 2 rows per sample "
        "with CFG); null = a step's whole batch at once. Lower it when the rollout's KV cache does not "
        "fit; the samples do not change (each is drawn from its own prompt's generator).",
        None,
        bounds=Bounds(1, why="or null"),
    )
    estimator: Literal["trajectory", "remask"] = doc(
        "Masked models: how a sample's log-prob (and the ratio) is estimated. 'trajectory' replays the "
        "recorded reveal order and scores each token at the step that revealed it (TraceRL, Mask-GRPO; "
        "one forward per step); 'remask' scores the final tokens under remask_count random re-masks, "
        "loss on the re-masked positions only (MaskGRPO, UniGRPO; one forward per re-mask).",
        "trajectory",
    )
    remask_count: int = doc(
        "Masked models, estimator 'remask': re-masks per sample (K).", 2, bounds=Bounds(1)
    )
    negative_prompt: str | None = doc(
        "aMUSEd and Meissonic: the negative prompt when a prompt names none — CFG's unconditional "
        "branch u in u + s(c − u) and GCPO's negative context c⁻ (docs/concepts/credit.md#gcpo). null: the "
        "one the checkpoint was trained with (its t2i_gcpo_sampling.json), else the pipelines' default, the "
        "empty prompt. The Meissonic authors' inference.py and MaskFocus use 'worst quality, low quality, "
        "low res, blurry, distortion, watermark, logo, signature, text, jpeg artifacts, signature, sketch, "
        "duplicate, ugly, identifying mark' (configs/recipes/meissonic_geneval.yaml). Saved with the "
        "model's checkpoints.",
        None,
    )
    negative: str = doc(
        "Text models: GCPO's negative context c⁻ (docs/concepts/credit.md#gcpo) — 'empty' (the question "
        "removed, the prompt template kept), 'wrong_answer' (the prompt plus an instruction to answer "
        "incorrectly), or a template containing {question}.",
        "empty",
    )
    gpt_size: str | None = doc(
        "LlamaGen: the GPT's size in the reference's table (GPT-B, GPT-L, GPT-XL, GPT-XXL, GPT-XXXL, GPT-1B, "
        "GPT-3B, GPT-7B: its dim, layers and heads); null = the size whose dim and layers the checkpoint's "
        "shapes have (the released text-to-image GPTs are GPT-XL).",
        None,
    )
    image_size: int | None = doc(
        "LlamaGen: the image side in pixels the GPT was trained for (256: 16 × 16 tokens, stage 1; 512: "
        "32 × 32, stage 2); null = from the GPT file's name (t2i_XL_stage1_256.pt) or a saved "
        "checkpoint's llamagen.json.",
        None,
        bounds=Bounds(1, 4096, why="or null"),
    )
    cfg_interval: int = doc(
        "LlamaGen: k of the reference's cfg_interval — tokens after the first k + 2 are drawn from the "
        "conditional logits alone (guidance scale 1; the guided log-prob records that); -1 = every token "
        "guided (generate.py's default).",
        -1,
        bounds=Bounds(-1, why="-1 switches it off"),
    )


@dataclass
class RewardOptions:
    """Where and how the reward runs (docs/guides/rewards.md#at-scale); a term of a sum may say its own
    device= and batch_size= in the spec."""

    device: str = doc(
        "Where the reward's models run and its images go: 'auto' (the policy's device), cpu, cuda or cuda:N "
        "(a reward model on a GPU of its own, or on the CPU to leave the GPU to the policy). A term may say "
        "its own: '0.7*pickscore:DIR,device=cuda:1+0.3*shapeworld'. A remote: reward runs where its server "
        "put it; a reward given to the Python API as a function is called as given.",
        "auto",
    )
    batch_size: int | None = doc(
        "Images per call of each term (a form with its own batch_size option, images per forward pass, gets "
        "this one); the results come back in order. null: a rollout's whole batch at once (model rewards: "
        "their own default).",
        None,
        bounds=Bounds(1, MAX_SAMPLES, why="or null"),
    )
    overlap: bool = doc(
        "Score a rollout's finished chunks while the next chunk samples (train/scoring.py): a thread for a "
        "reward in this process (best on a device of its own), requests in flight for a remote: reward. The "
        "same seeds give the same samples, rewards and update (each group is drawn from its own generator; "
        "the rollout's batch is split into chunks of reward_options.chunk — on a GPU a kernel chosen "
        "by batch size may round the recorded log-probs differently in the last bit; at a given "
        "reward_options.chunk, overlap on or off runs the same computation). Off by default: the reward then "
        "runs beside the sampler (memory, a user function called from another thread). Tree groups and "
        "branch continuations are scored as before.",
        False,
    )
    chunk: int | None = doc(
        "Samples per rollout call, in whole groups (rounded down to a multiple of the group's size, at least "
        "one group): a round is sampled chunk after chunk, each chunk scored when it is sampled — or, with "
        "overlap, while the next one samples. Like model_options.max_rollout_batch it bounds a rollout's "
        "memory, for any model; on a CPU each call of the sampler has a fixed cost (docs/performance.md, "
        "reward_overlap). null: with overlap, model_options.max_rollout_batch where it is set, else a "
        "quarter of the round's groups; without, the round at once.",
        None,
        bounds=Bounds(1, why="or null"),
    )


# the evaluation suites (`eval_suite`, `t2i-gcpo eval judge --suite`), one module each in
# t2i_gcpo/eval/suites/ (`register_suite` there): declared here, where the schema checks a run's eval_suite
# against it, and filled from that package when first read (t2i_gcpo/extensions.py)
EVAL_SUITES: Registry[Any] = Registry(
    "evaluation suite",
    builtins="t2i_gcpo.eval.suites",
    skip=("asking", "driver", "judge_client"),
    plugins="t2i_gcpo.suites",  # installed packages' suites (docs/guides/eval-suites.md)
)
GENEVAL2_METHODS = ("soft_tifa_gm", "soft_tifa_am", "tifa", "vqascore")


@dataclass
class EvalSuiteOptions:
    """What the held-out evaluation's benchmark suite reads and how it asks
    (docs/evaluation/judge-suites.md#during-training)."""

    data: str | None = doc(
        "The suite's data file (folder for tiif): GenEval 2's geneval2_data.jsonl, WISE's merge.json, "
        "TIIF-Bench's data/testmini_eval_prompts, a UniGenBench CSV. Its prompts are the held-out prompts.",
        None,
    )
    vqa: str | None = doc(
        "geneval2: a local VLM folder that answers the atoms' questions (Qwen3-VL-8B-Instruct is "
        "the reference's).",
        None,
    )
    judge: str | None = doc(
        "An OpenAI-compatible server's URL (…/v1): the judge of wise, tiif and unigenbench; for "
        "geneval2, a VLM served with log-probabilities, in place of vqa. An API key is read from "
        "$OPENAI_API_KEY.",
        None,
    )
    judge_model: str | None = doc("The model name the judge serves (null: its only one).", None)
    method: Literal["soft_tifa_gm", "soft_tifa_am", "tifa", "vqascore"] = doc(
        "geneval2: the score of each image (Soft-TIFA GM, the prompt-level score GenEval 2 reports; "
        "AM; TIFA; VQAScore).",
        "soft_tifa_gm",
    )
    device: str = doc(
        "geneval2: where the VQA model runs: 'auto' (the policy's device), cpu, cuda, cuda:N.", "auto"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = doc(
        "geneval2: the VQA model's dtype (auto: its checkpoint's).", "auto"
    )
    batch_size: int = doc("geneval2: questions per VQA forward pass.", 8, bounds=Bounds(1, MAX_SAMPLES))
    concurrency: int = doc("Judge requests in flight at most.", 8, bounds=Bounds(1, 1024))
    timeout: float = doc("Seconds one judge request may take.", 120.0, bounds=Bounds(0, low_open=True))
    retries: int = doc(
        "Tries after the first for a failed judge request or an answer the suite's rule cannot read; "
        "then the run stops (its last checkpoint kept: --resume continues once the judge is back).",
        2,
        bounds=Bounds(0, 100),
    )
    backoff: float = doc("Seconds before the first retry (doubling).", 1.0, bounds=Bounds(0, 600))


@dataclass
class TrainConfig:
    algo: str = doc(
        "Algorithm preset the run started from: one of the files t2i_gcpo/configs/*.yaml "
        "(`--algo` lists them).",
        "gcpo",
    )
    model: str = doc(
        "The model to train: a shipped model's name, a local checkpoint folder, or FAMILY:PATH for "
        "one of the registered model families (`t2i-gcpo train --help` lists them under --model; "
        "docs/guides/new_family.md).",
        "shapeworld",
    )
    task: str | None = doc(
        "What the prompts are and how samples are scored and evaluated: 'shapeworld' (GenEval rules on "
        "ShapeWorld's shapes), 'geneval' (GenEval's 80 COCO classes), 'arithmetic', or 'prompts' (free text "
        "scored by the reward alone: PickScore, OCR, a judge, …); null = the model's own task.",
        None,
    )
    reward: str | None = doc(
        "The reward spec: a registered form (shapeworld, clip:CKPT, geneval:DETECTOR,CLIP, pickscore:DIR, "
        "hps:FILE, aesthetic:CLIP,HEAD, ocr, vqa:DIR, judge:URL, …: `t2i-gcpo train --help` lists them, with "
        "options as NAME:ARGS,key=value), a user function 'module:function', or a weighted sum '0.7*a+0.3*b' "
        "(docs/guides/rewards.md); null = the task's default reward.",
        None,
    )
    prompts: str | None = doc(
        "Prompt file: .txt (GenEval-template prompts) or .jsonl (GenEval metadata).", None
    )
    eval_prompts: str | None = doc(
        "Held-out prompts scored every eval_every steps (default: the world's test set).", None
    )
    out: str | None = doc("Run directory (default runs/<algo>-<timestamp>).", None)
    steps: int = doc("Optimizer steps (one rollout batch each).", 200, bounds=Bounds(0))
    seed: int = doc("Seed of prompts order, sampling and initialisation.", 0, bounds=Bounds(0, 2**63 - 1))
    sample_every: int = doc(
        "Save a sample grid and credit maps every N steps; 0 disables them.",
        25,
        bounds=Bounds(0, why="0: no sample grids"),
    )
    save_every: int = doc(
        "Write a checkpoint every N steps (and at the end, and when stopped).",
        50,
        bounds=Bounds(1, why="a checkpoint is also written at the end"),
    )
    keep_checkpoints: int = doc(
        "Checkpoints kept in the run directory: the last N (each save removes older ones).",
        2,
        bounds=Bounds(1, why="--resume continues from the last one"),
    )
    eval_every: int = doc(
        "Score eval_prompts every N steps, at step 0 (the base model) and at the end; 0 only at the end; "
        "-1 never.",
        100,
        bounds=Bounds(-1, why="0: only at the end, -1: never"),
    )
    eval_images_per_prompt: int = doc(
        "Images per held-out prompt when evaluating.", 8, bounds=Bounds(1, MAX_SAMPLES)
    )
    eval_suite: str | None = doc(
        "A benchmark suite the held-out evaluation runs instead of the task's own score: geneval2 "
        "(Soft-TIFA, a VQA model asked every atom's question), wise, tiif or unigenbench (a VLM judge per "
        "image) — the same suite and scores as `t2i-gcpo eval geneval2|judge`, on eval_suite_options.data's "
        "prompts, each drawn eval_images_per_prompt times from its own generator at every evaluation "
        "(docs/evaluation/judge-suites.md#during-training). Logged as eval/<suite>/overall and "
        "eval/<suite>/<category>; eval_prompts is then not read. null: the task's held-out evaluation.",
        None,
    )
    eval_suite_options: EvalSuiteOptions = doc(
        "The eval_suite's data, its VQA model or judge, and how the judge is asked.", factory=EvalSuiteOptions
    )
    report_to: str = doc(
        "Experiment trackers the metrics also go to: tensorboard, wandb, mlflow, trackio, a comma-separated "
        "list of them, all (every installed one) or none; metrics.jsonl is always written "
        "(docs/tracking-and-schedules.md).",
        "tensorboard",
    )
    rollout: RolloutConfig = doc("Sampling.", factory=RolloutConfig)
    advantage: AdvantageConfig = doc("Sequence advantages.", factory=AdvantageConfig)
    loss: LossConfig = doc("Policy loss.", factory=LossConfig)
    credit: CreditConfig = doc("Token credit.", factory=CreditConfig)
    branching: BranchingConfig = doc(
        "Branched rollouts for credit schemes that need them (vine).", factory=BranchingConfig
    )
    optim: OptimConfig = doc("Optimizer.", factory=OptimConfig)
    model_options: ModelOptions = doc(
        "Loading options: real checkpoints' dtype, LoRA, checkpointing; masked models' estimator.",
        factory=ModelOptions,
    )
    reward_options: RewardOptions = doc(
        "Where the reward runs (device, batch size) and whether scoring overlaps sampling.",
        factory=RewardOptions,
    )

    def validate(self) -> None:
        """Every field against its declared `Bounds`, then the checks that span fields; raise a
        one-line UserError naming the offending key."""
        check_fields(self)
        check_report_to(self.report_to)
        check_credit(self.credit)

        P, G = self.rollout.prompts_per_step, self.rollout.group_size
        presets = preset_names()
        scheme = resolve_scheme(self.credit.scheme)
        pods_draws = self.rollout.draw_factor * G
        checks = [  # (key, accepted, what the key must be)
            ("algo", self.algo in presets, f"must be one of {', '.join(presets)}"),
            (
                "optim.minibatches",
                P * G % self.optim.minibatches == 0,
                f"must divide rollout.prompts_per_step × rollout.group_size ({P} × {G})",
            ),
            (
                "optim.weight_decay",
                self.optim.lr * self.optim.weight_decay <= 1,
                f"optim.lr × optim.weight_decay must be ≤ 1 (AdamW multiplies each weight by 1 − lr·wd per "
                f"step), got {self.optim.lr:g} × {self.optim.weight_decay:g}",
            ),
            (
                "loss.tis_cap",
                self.loss.tis_cap is None or self.rollout.old_logprobs == "recompute",
                "needs rollout.old_logprobs=recompute (the weight is π_old/π_rollout)",
            ),
            (
                "optim.warmup_steps",
                self.optim.warmup_steps == 0 or self.optim.warmup_steps < self.steps,
                f"must be less than steps ({self.steps}): the warmup starts at lr 0, a run that ends in it "
                "trains at a fraction of optim.lr",
            ),
            (
                "optim.min_lr_rate",
                self.optim.min_lr_rate == 0 or self.optim.lr_scheduler == "cosine_with_min_lr",
                "applies to optim.lr_scheduler=cosine_with_min_lr only",
            ),
            (
                "rollout.allocation",
                self.rollout.allocation == "none" or "leaves" not in scheme.needs,
                (
                    "down-samples groups, which tree groups (a scheme that needs leaves) cannot "
                    "be: set it to none"
                ),
            ),
            (
                "rollout.draw_factor",
                self.rollout.allocation != "pods"
                or (math.isclose(pods_draws, round(pods_draws)) and pods_draws > G),
                (
                    f"pods draws draw_factor × G samples per prompt, a whole number above G: "
                    f"{self.rollout.draw_factor:g} × {G} = {pods_draws:g} (e.g. --set "
                    f"rollout.draw_factor={max(G + 1, round(pods_draws)) / G!r})"
                ),
            ),
            (
                "loss.aggregation",
                scheme.returns != "advantages" or self.loss.aggregation != "weighted-token-mean",
                (
                    f"credit scheme '{self.credit.scheme}' gives token advantages, which "
                    f"'weighted-token-mean' cannot weight: use token-mean, seq-mean-token-mean or "
                    f"seq-mean-token-sum-norm"
                ),
            ),
            (
                "branching.rule",
                "branches" not in scheme.needs or self.branching.rule in BRANCH_RULES,
                (
                    f"credit scheme '{self.credit.scheme}' branches each sample at points of "
                    f"{', '.join(BRANCH_RULES)} (spread is for tree groups), got {self.branching.rule}"
                ),
            ),
            (
                "branching.rule",
                "leaves" not in scheme.needs or self.branching.rule in LEAF_RULES,
                (
                    f"credit scheme '{self.credit.scheme}' grows tree groups, which branch with "
                    f"branching.rule=spread or entropy (k points in every sample), got {self.branching.rule}"
                ),
            ),
            (
                "model_options.estimator",
                "leaves" not in scheme.needs or self.model_options.estimator == "trajectory",
                (
                    f"credit scheme '{self.credit.scheme}' trains on continuations, which are trajectory "
                    f"samples: set model_options.estimator=trajectory"
                ),
            ),
            (
                "advantage.reward_norm",
                self.advantage.reward_norm == "sum" or self.advantage.scale == "group",
                "per_reward standardises each reward within its group (GDPO): it needs advantage.scale=group",
            ),
            (
                "reward_options.device",
                self.reward_options.device == "auto" or DEVICE.match(self.reward_options.device) is not None,
                f"must be auto, cpu, cuda, cuda:N or mps, got {self.reward_options.device!r}",
            ),
            (
                "eval_suite",
                self.eval_suite is None or self.eval_suite in EVAL_SUITES,
                f"must be one of {', '.join(EVAL_SUITES.names())} or null, got {self.eval_suite!r}",
            ),
            (
                "eval_suite_options.data",
                self.eval_suite is None or bool(self.eval_suite_options.data),
                (
                    f"eval_suite {self.eval_suite} reads its prompts from a data file: set "
                    f"eval_suite_options.data"
                ),
            ),
            (
                "eval_suite_options.vqa",
                self.eval_suite != "geneval2"
                or (self.eval_suite_options.vqa is None) != (self.eval_suite_options.judge is None),
                "eval_suite geneval2 needs a VQA model folder (eval_suite_options.vqa) or a judge with "
                "log-probabilities (eval_suite_options.judge), one of them",
            ),
            (
                "eval_suite_options.judge",
                self.eval_suite in (None, "geneval2") or self.eval_suite_options.judge is not None,
                (
                    f"eval_suite {self.eval_suite} is scored by a VLM judge: set "
                    f"eval_suite_options.judge (its URL)"
                ),
            ),
            (
                "eval_suite_options.device",
                self.eval_suite_options.device == "auto"
                or DEVICE.match(self.eval_suite_options.device) is not None,
                f"must be auto, cpu, cuda, cuda:N or mps, got {self.eval_suite_options.device!r}",
            ),
            (
                "eval_prompts",
                self.eval_suite is None or self.eval_prompts is None,
                (
                    f"eval_suite {self.eval_suite} holds the held-out prompts (eval_suite_options.data): "
                    f"leave eval_prompts unset"
                ),
            ),
            (
                "model_options.negative",
                self.model_options.negative in ("empty", "wrong_answer")
                or "{question}" in self.model_options.negative,
                "must be 'empty', 'wrong_answer' or a template containing {question}",
            ),
        ]
        for key, ok, message in checks:
            if not ok:
                raise UserError(f"config key '{key}': {message}")
        check_prompt_files(self)  # last: a value the config refuses is named before a missing file


def check_prompt_files(cfg: TrainConfig) -> None:
    """The prompt files a config names exist (the user's, else the shipped one of that name): a missing one
    is one line when the config is built, not after the model has loaded."""
    from t2i_gcpo.errors import not_a_file
    from t2i_gcpo.resources import prompt_file

    for key in ("prompts", "eval_prompts"):
        path = getattr(cfg, key)
        shown = path if str(path).isprintable() else repr(path)  # a newline in the value: still one line
        problem = not_a_file(prompt_file(path)) if path else None
        if problem:
            raise UserError(f"config key '{key}': prompt file {shown} {problem}")


def check_credit(credit: Any) -> None:
    """The configured credit scheme exists (a user's ``file.py:function`` is imported now, again on every
    load: a resumed run re-imports it, as usercode.run_code_guard allows), takes the options given, and each
    section passes its scheme's own check; else a one-line UserError naming the key, the
    scheme and its options."""
    scheme = resolve_scheme(credit.scheme)
    specs = {o.name: o for o in scheme.specs}
    for (
        key,
        value,
    ) in credit.options.items():  # typed and bounded as the function declares them, where it does
        if key in specs and _checkable(specs[key].type):
            credit.options[key] = _coerce(f"credit.options.{key}", value, specs[key].type)
        value, bounds = credit.options[key], option_bounds(specs[key]) if key in specs else None
        if bounds is not None:  # the bounds of the scheme's section credit.<scheme>.<key>, NaN included
            check_value(f"credit.options.{key}", value, bounds=bounds)
        elif isinstance(value, float):
            check_finite(f"config key 'credit.options.{key}'", value)
    try:
        check_options(scheme, credit.options_for(credit.scheme))
    except CreditSchemeError as e:
        raise UserError(f"config key 'credit.options': {e}") from None
    for name, registered in CREDIT_SCHEMES.items():  # every section, as every other field is checked
        if registered.check is None or not dataclasses.is_dataclass(getattr(credit, name, None)):
            continue
        problem = registered.check(credit.options_for(name))
        if problem:
            option, message = problem
            raise UserError(f"config key 'credit.{name}{'.' + option if option else ''}': {message}")


def resolve_scheme(spec: str) -> CreditScheme:
    """The scheme named `spec`: a registered one, or a user function ``file.py:function`` /
    ``module:function`` (imported now and added to the registry under `spec`); else a one-line UserError
    that names the choices."""
    from t2i_gcpo.core.schemes import USER_SCHEMES, add_user_scheme, get_scheme
    from t2i_gcpo.usercode import PYTHON_OBJECT, import_function, is_function_spec

    if spec in CREDIT_SCHEMES:
        return get_scheme(spec)
    if spec.split(":", 1)[0] == PYTHON_OBJECT:
        if spec in USER_SCHEMES:  # added by the Python API in this process
            return USER_SCHEMES[spec]
        raise UserError(
            f"config key 'credit.scheme': '{spec}' names a Python function that is not importable: pass it "
            "from Python again (t2i_gcpo.api.train(…, credit=function))"
        )
    if not is_function_spec(spec):
        raise UserError(
            f"config key 'credit.scheme': must be one of {', '.join(CREDIT_SCHEMES)}, or a function of your "
            f"own as 'path/to/file.py:function' or 'module:function', got {spec!r}"
        )
    fn = import_function(spec, "credit scheme")
    try:
        return add_user_scheme(spec, fn)
    except CreditSchemeError as e:
        raise UserError(str(e)) from None


def canonical_spec(spec: str) -> str:
    """`spec` as a run records it: a user file by its absolute path (so `--resume` finds it from any
    directory); anything else unchanged."""
    from t2i_gcpo.usercode import canonical_spec as canonical

    return spec if spec in CREDIT_SCHEMES else canonical(spec)


def _checkable(tp: Any) -> bool:
    """Whether `_coerce` can check a value against the annotation `tp` (plain values, Literal, unions)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        return all(_checkable(a) for a in typing.get_args(tp))
    return typing.get_origin(tp) is Literal or tp in (int, float, bool, str, type(None))


PROJECT = "t2i-gcpo"  # the trackers' project name, and the TensorBoard events' folder under <run>/tb/
TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")  # report_to's trackers (train/tracking.py)


def check_report_to(spec: str) -> None:
    """A one-line UserError for a report_to that names no tracker (config validation)."""
    choices = (*TRACKERS, "all", "none")
    names = [n.strip() for n in spec.split(",") if n.strip()]
    bad = [n for n in names if n not in choices]
    if bad or not names:
        raise UserError(
            f"config key 'report_to': must be one of {', '.join(choices)} or a comma-separated "
            f"list, got {spec!r}"
        )


def check_fields(obj: Any, prefix: str = "") -> None:
    """Check every field of the config tree `obj` against the `Bounds` declared with it."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            check_fields(value, prefix=f"{prefix}{f.name}.")
        else:
            check_value(f"{prefix}{f.name}", value, bounds=f.metadata.get("bounds"))


def field_bounds(key: str) -> Bounds | None:
    """The `Bounds` declared for the dotted config `key` (None: any value of its type)."""
    obj: Any = TrainConfig()
    *parents, leaf = key.split(".")
    for name in parents:
        obj = getattr(obj, name)
    return {f.name: f for f in dataclasses.fields(obj)}[leaf].metadata.get("bounds")


def check_value(key: str, value: Any, what: str | None = None, bounds: Bounds | None = None) -> Any:
    """`value` if the config field `key` accepts it, else a one-line UserError naming `what` (the
    key itself, or the command-line option that sets it, e.g. "--cfg"). Command-line options that set
    a config value check it here, so they accept exactly what the config does."""
    bounds = bounds if bounds is not None else field_bounds(key)
    if isinstance(value, float):
        check_finite(f"{what or f'config key {key!r}'}", value, allow_inf=key in UNBOUNDED_OK)
    problem = bounds.problem(value) if bounds is not None else None
    if problem:
        label = what or f"config key '{key}':"
        raise UserError(f"{label} {problem}, got {value!r}")
    return value


# --------------------------------------------------------------------------- loading and overrides


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp)).replace("NoneType", "null")


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the annotation `tp`; return it (ints accepted for floats)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(key, value, arg)
            except UserError as e:
                errors.append(str(e))
        raise UserError(
            f"config key '{key}': expected {' or '.join(_type_name(a) for a in args)}, got {value!r}"
        )
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise UserError(f"config key '{key}': expected one of {_type_name(tp)}, got {value!r}")
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML reads "5e-6" (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if isinstance(tp, type) and isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
        return value
    raise UserError(f"config key '{key}': expected {_type_name(tp)}, got {value!r}")


# keys that moved: older runs' config.yaml, presets and --set lines that use the old name still work
MOVED_KEYS = {
    "credit.vine.rule": "branching.rule",
    "credit.vine.k": "branching.k",
    "credit.vine.continuations": "branching.continuations",
}


def _moved(updates: dict[str, Any]) -> dict[str, Any]:
    """`updates` (nested) with every key of MOVED_KEYS under its new name; both names at once is an error."""
    out = copy.deepcopy(updates)
    for old, new in MOVED_KEYS.items():
        *parents, leaf = old.split(".")
        node = out
        for name in parents:
            node = node.get(name) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            continue
        value = node.pop(leaf)
        *new_parents, new_leaf = new.split(".")
        target = out
        for name in new_parents:
            target = target.setdefault(name, {})
            if not isinstance(target, dict):
                raise UserError(f"config key '{new}': its section is not a mapping")
        if new_leaf in target and target[new_leaf] != value:
            raise UserError(f"config keys '{old}' and '{new}' are the same setting ({new}); give it once")
        target[new_leaf] = value
    return out


def _apply(obj: Any, updates: dict[str, Any], prefix: str = "") -> None:
    if not prefix:
        updates = _moved(updates)
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for name, value in updates.items():
        key = f"{prefix}{name}"
        if name not in names:
            scheme = getattr(obj, "scheme", None) if prefix.startswith("credit.") else None
            if isinstance(scheme, str) and scheme in CREDIT_SCHEMES:  # a scheme's section: its options
                raise UserError(
                    f"unknown config key '{key}': credit scheme '{scheme}' has no option '{name}' "
                    f"(its options: {CREDIT_SCHEMES[scheme].describe_options()})"
                )
            close = ", ".join(sorted(names))
            raise UserError(f"unknown config key '{key}' (known at this level: {close})")
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise UserError(f"config key '{key}' is a section; set its fields, e.g. {key}.<field>=…")
            _apply(current, value, prefix=f"{key}.")
        elif isinstance(current, dict):  # a free mapping (credit.options): merged key by key
            if not isinstance(value, dict):
                raise UserError(f"config key '{key}' is a mapping; set its entries, e.g. {key}.<name>=…")
            setattr(obj, name, {**current, **value})
        else:
            value = _coerce(key, value, hints[name])
            if isinstance(value, float):
                check_finite(f"config key '{key}'", value, allow_inf=key in UNBOUNDED_OK)
            setattr(obj, name, value)


# float keys where ±inf means "no bound" (NaN is refused everywhere)
UNBOUNDED_OK = frozenset({"loss.eps_low", "loss.eps_high", "optim.grad_clip"})


def check_finite(name: str, value: float, allow_inf: bool = False) -> float:
    """`value` if it is a finite number (or ±inf with `allow_inf`); else a `UserError` naming `name`.
    Shared by the config keys and by command-line float options (e.g. a CFG scale)."""
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise UserError(f"{name} must be a finite number, got {value}")
    return value


def load_yaml(text: str) -> Any:
    """`text` parsed as YAML the safe way, aliases refused and nesting bounded (outdir.yaml_value): a
    ``--set`` value. yaml.YAMLError for text that is not YAML (an alias included), UserError for a value
    nested too deeply."""
    from t2i_gcpo.outdir import MAX_DEPTH, _no_alias_loader, _too_deep

    try:
        value = yaml.load(text, Loader=_no_alias_loader())  # noqa: S506 — a SafeLoader subclass
        deep = _too_deep(value)
    except RecursionError:
        deep = True
    if deep:
        raise UserError(
            f"--set value {text[:40]!r}… is nested too deeply (over {MAX_DEPTH} levels) to be a config value"
        )
    return value


def _read_yaml(path: Path, follow: bool = True) -> dict[str, Any]:
    """A YAML config file (outdir.read_yaml): a mapping of keys, else a one-line UserError naming it.
    `follow`: a link at `path` is read through (a file the user names); a run folder's is not."""
    from t2i_gcpo.outdir import read_yaml

    try:
        data = read_yaml(path, follow=follow) or {}
    except UserError as e:
        if "is not UTF-8 text" in str(e):
            raise UserError(
                f"config file {path} is not a YAML file (not UTF-8 text: a binary file?)"
            ) from None
        raise
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping of keys, got {type(data).__name__}")
    return data


def preset_names() -> tuple[str, ...]:
    """The algorithm presets shipped as configs/<name>.yaml (recipes/ holds full runs, not presets)."""
    return tuple(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))


ALGORITHMS = preset_names()  # the presets shipped (read again by preset_names where files may change)


def preset_path(algo: str) -> Path:
    """The shipped preset of `algo`: always the package's own file (in a clone, the checkout's
    t2i_gcpo/configs/, edits included); a file of the user's is given with --config, on top of it."""
    presets = preset_names()
    if algo not in presets:
        raise UserError(f"unknown algorithm '{algo}' (choose one of {', '.join(presets)})")
    return CONFIG_DIR / f"{algo}.yaml"


def parse_set(item: str) -> tuple[str, Any]:
    """'loss.beta=0.03' → ('loss.beta', 0.03); the value is read as YAML."""
    if "=" not in item:
        raise UserError(f"--set expects key=value, got '{item}'")
    key, raw = item.split("=", 1)
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:  # an alias included: the text as it is
        value = raw
    return key.strip(), value


def override_values(overrides: Sequence[str]) -> dict[str, Any]:
    """``--set`` strings as {dotted key: the value the config takes}, sorted by key, a repeated key's last
    value winning: how two command lines are compared (neither the order of the options nor the spelling
    of a value, 1e-3 or 0.001, matters). An unknown key or a value of the wrong type is a UserError."""
    pairs = dict(parse_set(item) for item in overrides)
    cfg = TrainConfig()
    _apply(cfg, nest(pairs))
    values = {}
    for key in pairs:
        node: Any = cfg
        for part in key.split("."):
            node = node[part] if isinstance(node, dict) else getattr(node, part)
        values[key] = dataclasses.asdict(node) if dataclasses.is_dataclass(node) else node
    return dict(sorted(values.items()))


def nest(dotted: dict[str, Any]) -> dict[str, Any]:
    """{'a.b': 1} → {'a': {'b': 1}}."""
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise UserError(f"config key '{key}' conflicts with another override")
        node[leaf] = value
    return out


def load_config(
    algo: str | None = None,
    config_file: str | Path | None = None,
    flags: dict[str, Any] | None = None,
    overrides: Sequence[str] | Mapping[str, Any] = (),
    base: TrainConfig | None = None,
) -> TrainConfig:
    """Build the resolved config. `flags` holds values from CLI options by (dotted) key (None = not given);
    `overrides` is ``--set`` strings ("key=value", the value read as YAML) or a dict of dotted keys to
    values. A `base` config (a copy of it) replaces the preset and the config file."""
    if base is not None:
        cfg, algo = copy.deepcopy(base), base.algo
    else:
        file_data = _read_yaml(config_file_path(config_file)) if config_file else {}
        algo = algo or file_data.get("algo") or TrainConfig.algo
        cfg = TrainConfig()
        _apply(cfg, _read_yaml(preset_path(algo)))
        _apply(cfg, file_data)
    _apply(cfg, nest({k: v for k, v in (flags or {}).items() if v is not None}))  # e.g. "credit.scheme"
    pairs = overrides.items() if isinstance(overrides, Mapping) else (parse_set(s) for s in overrides)
    sets = nest(dict(pairs))
    if "algo" in sets and sets["algo"] != algo:  # it would be overwritten below: never silently
        raise UserError(
            f"config key 'algo': give the algorithm with --algo {sets['algo']} (it picks the preset every "
            "other value starts from), not with --set"
        )
    _apply(cfg, sets)
    cfg.algo = algo
    cfg.credit.scheme = canonical_spec(cfg.credit.scheme)  # a file by its absolute path: resumable anywhere
    cfg.validate()
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


# keys that older runs' config.yaml may hold and that no longer exist (they did nothing): dropped on resume
RETIRED_KEYS = frozenset({"log_every"})


def from_dict(data: dict[str, Any]) -> TrainConfig:
    cfg = TrainConfig()
    _apply(cfg, {k: v for k, v in data.items() if k not in RETIRED_KEYS})
    cfg.validate()
    return cfg


def save_config(cfg: TrainConfig, path: str | Path) -> None:
    from t2i_gcpo.outdir import atomic_write_text  # never written through a link at `path`

    atomic_write_text(Path(path), yaml.safe_dump(to_dict(cfg), sort_keys=False))


def describe(obj: Any = None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, documentation) for every field — the source of `--help-config`."""
    obj = obj if obj is not None else TrainConfig()
    rows = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            rows.extend(describe(value, prefix=f"{prefix}{f.name}."))
        else:
            bounds = f.metadata.get("bounds")
            text = f.metadata.get("doc", "") + (f" Accepts: {bounds}." if bounds else "")
            rows.append((f"{prefix}{f.name}", repr(value), text))
    return rows
