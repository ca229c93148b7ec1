"""Everything `t2i-gcpo train` checks and loads before the first step, so bad input fails with one
line and nothing is written; then the run itself."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t2i_gcpo.config import TrainConfig, from_dict, load_config
from t2i_gcpo.errors import UserError


@dataclass
class Job:
    cfg: TrainConfig
    run_dir: Path | None
    prompts: list[Any]  # PromptRecord
    eval_prompts: list[Any] | None
    policy: Any
    reward: Any
    task: Any
    resume: bool


def local_device() -> str:
    """This process's device (accelerate sets LOCAL_RANK per process on multi-GPU launches)."""
    import os

    import torch

    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"


def prepare(algo: str | None = None, config_file: str | None = None, flags: dict | None = None,
            overrides: tuple[str, ...] = (), resume_dir: Path | None = None, steps: int | None = None) -> Job:  # fmt: skip
    import yaml

    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.rewards.registry import build_reward
    from t2i_gcpo.tasks.registry import get_task

    if resume_dir is not None:
        saved = resume_dir / "config.yaml"
        if not saved.is_file():
            raise UserError(f"cannot resume: {saved} not found (is {resume_dir} a run directory?)")
        cfg = from_dict(yaml.safe_load(saved.read_text()))
        if steps is not None:
            cfg.steps = steps
        run_dir = resume_dir
    else:
        cfg = load_config(algo, config_file, flags, overrides)
        run_dir = Path(cfg.out) if cfg.out else None
        if run_dir is not None and (run_dir / "metrics.jsonl").exists():
            raise UserError(
                f"{run_dir} already holds a run; continue it with --resume {run_dir} or pick another --out"
            )
    policy = load_policy(cfg.model, cfg.model_options)
    cfg.task = cfg.task or policy.default_task
    task = get_task(cfg.task)
    prompts = task.load_prompts(cfg.prompts)
    if cfg.reward is None:
        if task.default_reward is None:
            raise UserError(
                f"task '{task.name}' has no default reward: give --reward (e.g. geneval:DETECTOR,CLIP)"
            )
        cfg.reward = task.default_reward
    if cfg.eval_prompts is None and cfg.reward == task.default_reward:
        cfg.eval_prompts = task.default_eval_prompts()
    eval_prompts = task.load_prompts(cfg.eval_prompts) if cfg.eval_prompts else None
    policy.check_prompts([p.text for p in prompts + (eval_prompts or [])])
    if cfg.rollout.cfg_scale is None:  # the checkpoint's recommendation (ShapeWorld stores one)
        cfg.rollout.cfg_scale = policy.default_sampling().guidance_scale
    reward = build_reward(cfg.reward, grid=policy.layout.grid, device=local_device())
    return Job(cfg, run_dir, prompts, eval_prompts, policy, reward, task, resume=resume_dir is not None)


def run(job: Job) -> dict:
    from t2i_gcpo.train.trainer import Trainer

    trainer = Trainer(
        job.cfg, job.run_dir, job.prompts, job.policy, job.reward, job.task, job.eval_prompts, job.resume
    )
    return trainer.fit()
