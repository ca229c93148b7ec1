"""The learning-rate schedule of a run: transformers' schedulers (LambdaLR), stepped once per training
step, so the lr of step k is optim.lr × λ(k − 1) whatever the number of update epochs or minibatches.
Its state is saved with each checkpoint and restored on resume: the lr is then the one the run would
have had without stopping."""

from __future__ import annotations

import warnings
from typing import Any

from t2i_gcpo.config import OptimConfig

# optim.lr_scheduler → transformers' name (a constant lr with warmup is its own scheduler there)
SCHEDULERS = {"linear": "linear", "cosine": "cosine", "cosine_with_min_lr": "cosine_with_min_lr"}


def build_scheduler(optim: OptimConfig, optimizer: Any, total_steps: int) -> Any:
    """A fresh scheduler over `total_steps` training steps; it sets the optimizer's lr for step 1."""
    from transformers import get_scheduler

    name = SCHEDULERS.get(optim.lr_scheduler)
    if name is None:  # constant
        name = "constant_with_warmup" if optim.warmup_steps else "constant"
    extra = {"min_lr_rate": optim.min_lr_rate} if name == "cosine_with_min_lr" else None
    return get_scheduler(
        name,
        optimizer,
        num_warmup_steps=optim.warmup_steps,
        num_training_steps=max(total_steps, 1),
        scheduler_specific_kwargs=extra,
    )


def restore_scheduler(scheduler: Any, state: dict | None, steps_done: int) -> None:
    """Put a fresh scheduler where a run left it after `steps_done` steps: its saved `state`, or (a
    checkpoint written before runs had schedules) `steps_done` replayed steps. The optimizer's lr is
    set from it: the loaded optimizer state may hold the lr of a schedule over fewer steps (a run
    resumed with a larger --steps follows the new schedule from here on)."""
    if state is not None:
        scheduler.load_state_dict(state)  # base lrs and step count; λ stays this run's (its total steps)
        lrs = [
            base * lam(scheduler.last_epoch) for base, lam in zip(scheduler.base_lrs, scheduler.lr_lambdas)
        ]
    else:
        for _ in range(steps_done):  # no update is replayed
            step_schedule(scheduler)
        lrs = scheduler.get_last_lr()
    for group, lr in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = lr


def step_schedule(scheduler: Any) -> None:
    """Advance the schedule by one training step, with or without an update. torch warns "lr_scheduler.step()
    before optimizer.step()" when the run's first step made no update (DAPO's dynamic sampling, a group
    of equal rewards): it fears the schedule's first value was skipped, but here the lr belongs to the
    step, not to the update (the lr of step k is optim.lr × λ(k − 1)), so that one warning is dropped."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"
        )
        scheduler.step()


def current_lr(scheduler: Any) -> float:
    """The lr the next optimizer step uses (the first parameter group's)."""
    return float(scheduler.optimizer.param_groups[0]["lr"])
