"""Tasks: what the prompts are and how samples are judged. A task is its prompt parser, its default
reward, its held-out evaluation and its step metrics (ShapeWorld / GenEval today); train/ knows no
task. `loop.py` holds the one rollout → decode → score loop and its seeding scheme."""
