"""What one step draws, and the memory it holds, in one place (docs/performance.md#step-memory).

The plan bounds a step with it before the run (train/plan.py: `step_draws` against
``rollout.max_step_samples``, `step_memory` against ``rollout.max_step_memory``), and the collector charges
every draw against the same counts while it draws (train/collect.py, a `Ledger`): a count the plan did not
allow is a bug that stops the step, so the plan and what the collector does cannot drift apart.

**Counts** (one process, one step, at most): `groups` groups drawn (P, or dynamic sampling's ⌊draw_budget·P⌋),
each of `roots` samples drawn from its prompt (G; pods draw_factor·G; knapsack G + (draw_factor − 1)·G on
average, and a group a round more at most: the fraction it owes is carried to the next round), `continuations`
continued from their prefixes (tree groups G₀·k·n, vine and tree credit G·points·n) and `predictions`
intermediate predictions decoded and scored (stepwise G·(S − 1)); every one of them decoded and scored.
Tokens: each sample's positions (budget/tokens). Reward calls: one a round for its groups (and one per
distinct count of knapsack's extra draws), one for a round's continuations, one per reveal step before the
last for its predictions. The update trains P groups: a round's surplus is carried to the next step.

**Memory** (`MemoryProfile`, `step_memory`): the peak a step reaches, from a profile measured on the run's own
policy before the run (`measure_profile`: a rollout, its decoding, a continuation and an update's forward and
backward, each at two sizes — the CUDA allocator's peak; on the CPU the resident peak, and for the update and
the continuations the bytes of every tensor alive, exact where the resident size of a few rows is noise —
fitted as fixed bytes plus bytes per row), combined as the step runs them:

    held      = trained rows × (a decoded output + its record)          kept from collection to the update
    sampling  = fixed + per row × the rows a rollout pass samples      (max_rollout_batch, reward chunks)
    decoding  = per output × the outputs decoded at once               (a round's, or all its continuations)
    continuing = fixed + per row × a continuation pass's rows          (every root's n from one point)
                 + a round's continuations × (an output + its record)
    update    = fixed + per trained row × trained rows / optim.minibatches  (P groups: the surplus is carried)
    peak      = (held + max(sampling, decoding, continuing, update)) × OVERHEAD

`OVERHEAD` covers what a real step's resident memory was measured above the profile's parts (the allocator's
caching and fragmentation, the update's bookkeeping), 0.9–1.4× on the paths of docs/performance.md's table:
the estimate errs above. A reward's own memory (a model reward's activations) is not in it:
``reward_options.batch_size`` bounds it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from t2i_gcpo.errors import UserError

if TYPE_CHECKING:
    from t2i_gcpo.config import TrainConfig
    from t2i_gcpo.policies.base import Policy, PromptRecord

OVERHEAD = 1.3  # a real step's resident peak over the profile's parts (docs/performance.md#step-memory)
PROBE_ROWS = (2, 4)  # the profile's two sizes: a group of each from the run's first prompt, after one of 1


# ---------------------------------------------------------------------------------------------- counts
@dataclass(frozen=True)
class StepDraws:
    """What one process draws in one step, at most (module docstring, "Counts")."""

    groups: int  # groups drawn: P, or ⌊draw_budget·P⌋
    trained_groups: int  # groups the update trains on: P (the surplus of a round is carried to the next step)
    roots: int  # per group: samples drawn from its prompt
    continuations: int  # per group: samples continued from its samples' prefixes
    predictions: int  # per group: intermediate predictions decoded and scored (stepwise)
    trained: int  # per group: rows the update trains (G; tree groups: every leaf)
    formula: str  # e.g. "P·G₀·(1 + k·n) = 8·4·(1 + 2·2)"
    tokens: int | None  # decision steps of a sample (text: its longest); None: unknown before the model
    positions: int | None  # tokens a sample holds (AR images and text: its decision steps; masked: its grid)
    rounds: int  # rounds a step draws at most
    reward_calls: int  # reward calls at most
    spare: int = 0  # samples beyond the groups' counts: knapsack's carried fraction, a group a round at most
    per_point: int = 0  # continuations of a sample from one branch point (n): a continuation pass continues
    # every sample of the groups from the same point, n each

    @property
    def per_group(self) -> int:
        return self.roots + self.continuations + self.predictions

    @property
    def samples(self) -> int:
        """Everything the step decodes and scores: roots, continuations and predictions."""
        return self.groups * self.per_group + self.spare

    @property
    def sample_tokens(self) -> int | None:
        """Tokens sampled at most (budget/tokens counts them: positions, a continuation's
        from its point on)."""
        return None if self.positions is None else self.samples * self.positions


def processes() -> int:
    return max(1, int(os.environ.get("WORLD_SIZE", 1)))


def step_draws(cfg: TrainConfig, policy: Policy | None, num_processes: int | None = None) -> StepDraws | None:
    """The counts of a step of one process of `num_processes` (default: the launch's WORLD_SIZE; module
    docstring); None without a `policy` where they depend on its samples' decision steps (branching and
    stepwise schemes)."""
    from t2i_gcpo.core.schemes import get_scheme

    r, adv, br = cfg.rollout, cfg.advantage, cfg.branching
    P = r.prompts_per_step // (num_processes or processes())
    dyn = adv.dynamic_sampling
    groups = int(adv.draw_budget * P) if dyn else P
    rounds = 1 + (adv.max_resample if dyn else 0)
    steps = decision_steps_of(policy, decisions(cfg)) if policy is not None else None  # torch: with a model
    needs = get_scheme(cfg.credit.scheme).needs
    if steps is None and needs & {"branches", "step_rewards"}:
        return None
    G, n = r.group_size, br.continuations
    g_name = "⌊draw_budget·P⌋" if dyn else "P"
    shown = f"{groups}" if groups == P or not dyn else f"⌊{adv.draw_budget:g}·{P}⌋"
    common = {
        "groups": groups,
        "trained_groups": P,
        "tokens": steps,
        "rounds": rounds,
        "positions": positions_of(policy, steps),
    }
    if "leaves" in needs:
        cont = G * br.k * n
        return StepDraws(
            roots=G,
            continuations=cont,
            predictions=0,
            trained=G + cont,
            formula=f"{g_name}·G₀·(1 + k·n) = {shown}·{G}·(1 + {br.k}·{n})",
            reward_calls=2 * rounds,
            per_point=n,
            **common,
        )
    if "branches" in needs:
        points = branch_points(policy, br, steps)
        return StepDraws(
            roots=G,
            continuations=G * points * n,
            predictions=0,
            trained=G,
            formula=f"{g_name}·G·(1 + points·n) = {shown}·{G}·(1 + {points}·{n})",
            reward_calls=2 * rounds,
            per_point=n,
            **common,
        )
    if r.allocation == "pods":
        drawn = round(r.draw_factor * G)
        return StepDraws(
            roots=drawn,
            continuations=0,
            predictions=0,
            trained=G,
            formula=f"{g_name}·draw_factor·G = {shown}·{drawn}",
            reward_calls=rounds,
            **common,
        )
    if r.allocation == "knapsack":
        drawn = G + math.ceil((r.draw_factor - 1) * G - 1e-9)  # G, and (draw_factor − 1)·G more on average
        # a round's extra draws are whole groups, the fraction owed carried to the next round (below one
        # group): a round draws at most one group more than its average; a reward call per
        # distinct extra count
        formula = f"{g_name}·draw_factor·G + G a round = {shown}·{drawn} + {rounds}·{G}"
        return StepDraws(
            roots=drawn,
            continuations=0,
            predictions=0,
            trained=G,
            formula=formula,
            reward_calls=rounds * (1 + groups),
            spare=rounds * G,
            **common,
        )
    if "step_rewards" in needs:  # every reveal step's prediction decoded and scored
        return StepDraws(
            roots=G,
            continuations=0,
            predictions=G * (steps - 1),
            trained=G,
            formula=f"{g_name}·G·S = {shown}·{G}·{steps}",
            reward_calls=rounds * steps,
            **common,
        )
    return StepDraws(
        roots=G,
        continuations=0,
        predictions=0,
        trained=G,
        formula=f"{g_name}·G = {shown}·{G}",
        reward_calls=rounds,
        **common,
    )


def positions_of(policy: Policy | None, steps: int | None) -> int | None:
    """The tokens a sample of `policy` holds: an image's grid, or (text) its decision steps."""
    grid = getattr(getattr(policy, "layout", None), "grid", None)
    if policy is not None and policy.output != "text" and grid:
        return int(grid[0] * grid[1])
    return steps


def decision_steps_of(policy: Policy, sampling: Any) -> int | None:
    """train/branches.decision_steps_of (imported with its torch only once there is a model)."""
    from t2i_gcpo.train.branches import decision_steps_of as steps_of

    return steps_of(policy, sampling)


def decisions(cfg: TrainConfig) -> Any:
    """The sampling settings that decide how many steps a sample takes (masked steps, text length)."""
    from t2i_gcpo.policies.base import SamplingParams

    return SamplingParams(steps=cfg.rollout.steps, max_new_tokens=cfg.rollout.max_new_tokens)


def branch_points(policy: Policy, branching: Any, steps: int) -> int:
    """The most branch points a sample of `steps` decision steps gets under `branching.rule`."""
    if branching.rule == "every_k":
        return max(0, (steps - 1) // branching.k)
    if branching.rule == "boundary" and policy.layout.kind == "grid":
        return policy.layout.grid[0] - 1  # each token row but the first
    return max(0, min(branching.k, steps - 1)) if branching.rule == "entropy" else max(0, steps - 1)


# ---------------------------------------------------------------------------------------------- the ledger
COUNTS = ("samples", "tokens", "continuations", "predictions", "reward_calls")


@dataclass
class Ledger:
    """What a step has drawn so far against what its plan allows (`StepDraws`): the collector charges each
    draw before it makes it; more than the plan allows raises (a bug: the plan and the collector disagree)."""

    draws: StepDraws
    spent: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0.0))

    def allowed(self) -> dict[str, float]:
        d = self.draws
        tokens = math.inf if d.sample_tokens is None else d.sample_tokens
        return {
            "samples": d.samples,
            "tokens": tokens,
            "continuations": d.groups * d.continuations,
            "predictions": d.groups * d.predictions,
            "reward_calls": d.reward_calls,
        }

    def charge(self, what: str, **counts: float) -> None:
        """Charge `counts` (of `COUNTS`) for `what` the collector is about to draw."""
        allowed = self.allowed()
        for key, value in counts.items():
            self.spent[key] += value
            if self.spent[key] > allowed[key] + 1e-9:
                raise RuntimeError(
                    f"the collector would draw {self.spent[key]:g} {key} this step ({what}), more than "
                    f"the plan's {allowed[key]:g} ({self.draws.formula}): train/draws.step_draws and "
                    f"train/collect.py disagree"
                )


# ---------------------------------------------------------------------------------------------- memory
@dataclass(frozen=True)
class Fit:
    """Bytes = fixed + per_row × rows, from two measured sizes."""

    fixed: float
    per_row: float

    def __call__(self, rows: float) -> float:
        return max(self.fixed, 0.0) + max(self.per_row, 0.0) * rows

    @staticmethod
    def of(sizes: tuple[int, int], measured: tuple[float, float]) -> Fit:
        (a, b), (ma, mb) = sizes, measured
        per_row = max((mb - ma) / (b - a), 0.0)
        return Fit(max(ma - per_row * a, 0.0), per_row)


@dataclass(frozen=True)
class MemoryProfile:
    """Bytes of a step's parts on a policy, measured (`measure_profile`)."""

    sampling: Fit  # a rollout pass, per sampled row
    decoding: Fit  # decoding, per output (transient)
    output: float  # a decoded output and its record, per row (held)
    continuing: Fit | None  # continuations, per continued row (None: the policy does not branch)
    update: Fit  # the update's forward and backward, per trained row
    device: str
    meter: str  # how the bytes were measured


@dataclass(frozen=True)
class MemoryEstimate:
    bytes: float  # the step's peak, OVERHEAD included
    parts: dict[str, float]  # held, sampling, decoding, continuing, update (tensor bytes)
    largest: str  # the part the peak is made of (besides what is held)

    @property
    def gb(self) -> float:
        return self.bytes / 1e9


def step_memory(cfg: TrainConfig, draws: StepDraws, profile: MemoryProfile) -> MemoryEstimate:
    """A step's peak memory (module docstring, "Memory")."""
    groups = draws.groups
    rows = groups * draws.roots
    chunk = cfg.reward_options.chunk or cfg.model_options.max_rollout_batch
    if cfg.reward_options.overlap and not chunk:
        chunk = max(1, math.ceil(groups / 4)) * draws.roots
    per_pass = min(rows, chunk) if chunk else rows
    trained = draws.trained_groups * draws.trained
    parts = {
        "held": trained * profile.output,
        "sampling": profile.sampling(per_pass),
        "decoding": profile.decoding(
            max(per_pass, groups * draws.continuations, groups * draws.roots if draws.predictions else 0)
        ),
        "update": profile.update(math.ceil(trained / max(1, cfg.optim.minibatches))),
    }
    if draws.continuations and profile.continuing is not None:  # a pass: every root's n from one point
        cont = groups * draws.continuations
        parts["continuing"] = profile.continuing(rows * draws.per_point) + cont * profile.output
    largest = max((k for k in parts if k != "held"), key=parts.get)
    return MemoryEstimate((parts["held"] + parts[largest]) * OVERHEAD, parts, largest)


class LiveBytes:
    """Counts the bytes of every tensor storage made while it is active and still alive, and their peak (the
    CPU's meter: torch keeps no allocator statistics there). A TorchDispatchMode: every operation is seen; a
    view's or an in-place operation's output makes no storage."""

    def __init__(self) -> None:
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef
        from torch.utils._python_dispatch import TorchDispatchMode

        live: dict[int, tuple[Any, int]] = {}
        state = {"current": 0, "peak": 0, "ops": 0}
        is_tensor = torch.is_tensor

        def add(t: Any) -> None:
            storage = t.untyped_storage()
            key = storage._cdata
            if key not in live:
                size = storage.nbytes()
                live[key] = (StorageWeakRef(storage), size)
                state["current"] += size

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if not func.is_view:
                    outs = out if isinstance(out, (tuple, list)) else (out,)
                    for t in outs:
                        if is_tensor(t) and not any(t is a for a in args):
                            add(t)
                state["ops"] += 1
                if state["current"] > state["peak"]:
                    if state["ops"] % 8 == 0 or state["current"] > 1.25 * state["peak"]:
                        for key in [k for k, (ref, _) in live.items() if ref.expired()]:
                            state["current"] -= live.pop(key)[1]
                    state["peak"] = max(state["peak"], state["current"])
                return out

        self.mode, self.state = Mode(), state

    @property
    def peak(self) -> int:
        return self.state["peak"]

    @property
    def ops(self) -> int:
        return self.state["ops"]

    def __enter__(self) -> LiveBytes:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)


def _status(key: str) -> int | None:
    from t2i_gcpo.hardware import _status_bytes

    return _status_bytes(key)


def _trim() -> None:
    """Hand glibc's freed heap back to the system: the resident size then counts what is alive (the young
    garbage collected first; a full collection takes most of a second in a process that imported torch and
    transformers). A no-op where there is no glibc."""
    import ctypes
    import gc

    gc.collect(1)
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _peak(device: str, fn: Any, tensors: bool = False) -> tuple[float, Any]:
    """(the peak bytes `fn` adds while it runs, its result): the CUDA allocator's peak; on the CPU the
    process's peak resident size (VmHWM, reset through /proc/self/clear_refs) above its size before, the heap
    trimmed first — what the step is measured by —, or (`tensors`, and where /proc cannot do that) the bytes
    of the tensors alive (`LiveBytes`: exact, and steady where the resident size of a few rows
    is not, but slow per
    operation: the update's forward and backward, a few thousand operations)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated() - before), out
    base = None
    if not tensors:
        _trim()
        base = _status("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # the peak resident size starts again from the current one
        except OSError:
            base = None
    if base is None:
        with LiveBytes() as meter:
            out = fn()
        return float(meter.peak), out
    out = fn()
    return float(max((_status("VmHWM") or base) - base, 0)), out


def _nbytes(value: Any) -> int:
    import torch

    if torch.is_tensor(value):
        return value.untyped_storage().nbytes()
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def measure_profile(cfg: TrainConfig, policy: Policy, prompt: PromptRecord) -> MemoryProfile:
    """The policy's `MemoryProfile` under the run's sampling: a rollout of one group of the `PROBE_ROWS` sizes
    from `prompt` (the eager loop: the run's kept decode loop is not touched; a scheme that branches keeps the
    rollout's cache, as the collector asks), its decoding, one continuation of each row from half-way (a
    scheme that branches), and an update's forward and backward of its rows (the gradients it leaves are
    dropped). Nothing the run keeps changes (the caches kept are put back as they were); a few
    seconds on the CPU."""
    import copy
    import dataclasses
    import functools

    import torch

    from t2i_gcpo.core.schemes import get_scheme
    from t2i_gcpo.hardware import local_device
    from t2i_gcpo.policies.branching import decision_steps
    from t2i_gcpo.tasks.loop import group_generators, sampler_precision
    from t2i_gcpo.train.credit import TRAIN_CONTEXT
    from t2i_gcpo.train.run_settings import resolve_autocast, sampling_params

    device = local_device()
    resolved = copy.deepcopy(cfg)
    resolve_autocast(resolved, torch.device(device).type, policy)  # as the trainer will
    needs = get_scheme(cfg.credit.scheme).needs
    branches = bool(needs & {"branches", "leaves"}) and policy.capabilities.branching
    # as the collector samples: a scheme that branches keeps the rollout's cache for its continuations
    sampling = dataclasses.replace(sampling_params(resolved), decode="eager", keep_cache=branches)
    precision = torch.autocast(
        torch.device(device).type, dtype=torch.bfloat16, enabled=resolved.optim.autocast == "bf16"
    )
    context = TRAIN_CONTEXT[cfg.rollout.train_logp]
    kept = getattr(policy, "kept_caches", None)  # the AR prior's kept caches: put back as they were
    saved = None if kept is None else (dict(kept.caches), kept.latest)

    def probe(rows: int) -> tuple[dict[str, float], float]:
        """The peaks of one group of `rows` (rollout, decoding, continuations, update), and
        what a row holds."""
        peaks = {}
        gens = group_generators(cfg.seed, "memory-probe", [0])
        with torch.no_grad(), sampler_precision(policy, sampling):
            peaks["sampling"], ro = _peak(
                device, functools.partial(policy.rollout, [prompt], rows, sampling, gens)
            )
        with torch.no_grad():
            peaks["decoding"], out = _peak(device, functools.partial(policy.decode, ro))
        # a rollout's record and decoded output: what a step holds of each sample until its update
        held = (_nbytes(out) + _nbytes(ro.tokens) + _nbytes(ro.logp) + _nbytes(ro.mask)) / rows
        if branches:
            points = (decision_steps(ro).cpu() // 2).clamp_min(1)[:, None]
            keys = [(0, b, 0, int(t), 0) for b, t in enumerate(points[:, 0].tolist())]
            gens = group_generators(cfg.seed, "memory-probe", keys)
            with torch.no_grad(), sampler_precision(policy, sampling):
                peaks["continuing"], _ = _peak(
                    device, functools.partial(policy.branch, ro, points, 1, gens), tensors=True
                )

        def update() -> None:
            with precision:
                logp, _ = policy(ro, context=context, dists=True)
            (-(logp * ro.mask).sum() / ro.mask.sum()).backward()

        try:
            peaks["update"], _ = _peak(device, update, tensors=True)
        finally:
            for p in policy.parameters():
                p.grad = None
        return peaks, held

    try:
        probe(1)  # not counted: what a first call allocates once
        (small, held_small), (large, held_large) = (probe(rows) for rows in PROBE_ROWS)
    finally:
        if saved is not None:
            kept.caches, kept.latest = saved
    fits = {k: Fit.of(PROBE_ROWS, (small[k], large[k])) for k in small}
    output = max(held_small, held_large)
    return MemoryProfile(
        fits["sampling"],
        fits["decoding"],
        output,
        fits.get("continuing"),
        fits["update"],
        device,
        "the CUDA allocator's peak" if device.startswith("cuda") else "the resident size's peak",
    )


def size_text(nbytes: float) -> str:
    """8.1 GB, or 430 MB below a GB."""
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"


def check_memory(
    cfg: TrainConfig, draws: StepDraws, estimate: MemoryEstimate, free: tuple[float | None, str]
) -> None:
    """A step whose memory estimate is above ``rollout.max_step_memory`` (GB; null: what `free` says this
    process has, read at the start) is refused, naming the product, the estimate and the setting."""
    setting = cfg.rollout.max_step_memory
    if setting is None:
        cap, source = free
        if cap is None:
            return
        cap_text = (
            f"the {size_text(cap)} this process has free ({source}; config key "
            "'rollout.max_step_memory' = null)"
        )
    else:
        cap = float(setting) * 1e9
        cap_text = f"config key 'rollout.max_step_memory' = {float(setting):g} GB"
    if estimate.bytes <= cap:
        return
    what = "a step of each process" if processes() > 1 else "a step"
    part = {
        "update": f"the update's {draws.trained_groups * draws.trained:,} trained rows",
        "continuing": f"{draws.groups * draws.continuations:,} continuations",
        "sampling": "a rollout pass",
        "decoding": "decoding",
    }[estimate.largest]
    advice = "raise optim.minibatches, " if estimate.largest == "update" else ""
    raise UserError(
        f"{what} would decode and score {draws.formula} = {draws.samples:,} samples, ≈ "
        f"{size_text(estimate.bytes)} by the memory model (mostly {part}; docs/performance.md#step-memory), "
        f"more than {cap_text}: lower those counts, {advice}or set rollout.max_step_memory (GB) if this "
        f"machine holds it"
    )
