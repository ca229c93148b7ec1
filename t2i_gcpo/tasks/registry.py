"""Task names → tasks. A model names its own task (`Policy.default_task`); `task:` in the config
overrides it."""

from __future__ import annotations

from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import Policy
from t2i_gcpo.resources import PROMPTS_DIR
from t2i_gcpo.tasks.arithmetic import TEST_FILE, TRAIN_FILE, ArithmeticTask
from t2i_gcpo.tasks.base import Task
from t2i_gcpo.tasks.geneval import GenEvalTask
from t2i_gcpo.tasks.prompts import PromptsTask

TASKS = {
    "shapeworld": lambda: GenEvalTask(
        "shapeworld",
        "shapeworld",
        default_reward="shapeworld",
        eval_file=str(PROMPTS_DIR / "shapeworld_test.jsonl"),
        train_file=str(PROMPTS_DIR / "shapeworld_train.jsonl"),
    ),
    "geneval": lambda: GenEvalTask("geneval", "coco", default_reward=None),
    "arithmetic": lambda: ArithmeticTask(
        eval_file=str(PROMPTS_DIR / TEST_FILE), train_file=str(PROMPTS_DIR / TRAIN_FILE)
    ),
    # free text scored by the reward alone; the shipped held-out prompts are the text-rendering ones
    "prompts": lambda: PromptsTask(
        eval_file=str(PROMPTS_DIR / "text_rendering_test.txt"),
        train_file=str(PROMPTS_DIR / "text_rendering_train.txt"),
    ),
}


def get_task(name: str, policy: Policy | None = None) -> Task:
    """A fresh task; with `policy`, bound to it (`Task.bind`: arithmetic maps reward spans, text
    positions, to the policy's tokens for its step lift)."""
    if name not in TASKS:
        raise UserError(f"unknown task '{name}': choose one of {', '.join(TASKS)}")
    task = TASKS[name]()
    if policy is not None:
        task.bind(policy)
    return task
