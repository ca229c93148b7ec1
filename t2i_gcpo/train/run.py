"""Everything `t2i-gcpo train` checks and loads before the first step, so bad input fails with one
line and nothing is written; then the run itself."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t2i_gcpo.config import CONFIG_DIR, TrainConfig, from_dict, load_config
from t2i_gcpo.errors import UserError

REPO_PROMPTS = CONFIG_DIR.parent / "prompts"


@dataclass
class Job:
    cfg: TrainConfig
    run_dir: Path | None
    metadata: list[dict]
    eval_metadata: list[dict] | None
    policy: Any
    reward: Any
    resume: bool


def default_eval_prompts(cfg: TrainConfig) -> str | None:
    """The ShapeWorld held-out prompts when training the ShapeWorld model with its reward."""
    test = REPO_PROMPTS / "shapeworld_test.jsonl"
    if cfg.reward == "shapeworld" and test.is_file():
        return str(test)
    return None


def local_device() -> str:
    """This process's device (accelerate sets LOCAL_RANK per process on multi-GPU launches)."""
    import os

    import torch

    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"


def default_cfg_scale(policy: Any) -> float:
    """The CFG scale a checkpoint recommends (ShapeWorld stores one), else the Janus-Pro default 5."""
    return float(getattr(getattr(policy, "config", None), "default_cfg_scale", 5.0))


def prompt_classes(cfg: TrainConfig) -> list[str] | None:
    """Object classes prompts are parsed against: ShapeWorld shapes, or GenEval's 80 COCO names."""
    if cfg.model.startswith("janus:"):
        from t2i_gcpo.worlds.shapeworld.parse import geneval_classes

        return geneval_classes()
    return None


def prepare(algo: str | None = None, config_file: str | None = None, flags: dict | None = None,
            overrides: tuple[str, ...] = (), resume_dir: Path | None = None, steps: int | None = None) -> Job:  # fmt: skip
    import yaml

    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.rewards.registry import build_reward
    from t2i_gcpo.train.data import load_prompts

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
    metadata = load_prompts(cfg.prompts, prompt_classes(cfg))
    cfg.eval_prompts = cfg.eval_prompts or default_eval_prompts(cfg)
    eval_metadata = load_prompts(cfg.eval_prompts, prompt_classes(cfg)) if cfg.eval_prompts else None
    policy = load_policy(cfg.model, cfg.model_options)
    policy.check_prompts([m["prompt"] for m in metadata + (eval_metadata or [])])
    if cfg.rollout.cfg_scale is None:
        cfg.rollout.cfg_scale = default_cfg_scale(policy)
    reward = build_reward(cfg.reward, grid=getattr(policy, "grid_shape", None), device=local_device())
    return Job(cfg, run_dir, metadata, eval_metadata, policy, reward, resume=resume_dir is not None)


def run(job: Job) -> dict:
    from t2i_gcpo.train.trainer import Trainer

    trainer = Trainer(
        job.cfg, job.run_dir, job.metadata, job.policy, job.reward, job.eval_metadata, job.resume
    )
    return trainer.fit()


def leave_process_group() -> None:
    """Destroy the distributed process group, if there is one, before the process exits: a process
    that exits with a live gloo group can abort in C++ teardown ("terminate called without an active
    exception"). Call it once per process, after the last run, when every rank got there."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
