"""What the text-path training tests share (tests/train/test_text_train.py, tests/core/test_tree_groups.py,
tests/viz/test_value_maps.py): the fast settings, the reward, a problem file and `t2i-gcpo train` on a local
causal LM through the CLI. The tiny LM itself is the `tiny_lm` fixture of tests/conftest.py."""

from __future__ import annotations

import json

import t2i_gcpo.train.scoring as scoring_module  # round_scorer picks sample_and_score up from here
from t2i_gcpo.cli import main

# float32 whatever the machine ('auto' picks bf16 where native): recorded ≡ replayed log-probs is
# asserted to float32 tolerances (tests/test_sampler_precision.py covers bf16)
FAST = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=16",
    "sample_every=1",
    "save_every=1",
    "eval_every=-1",
    "rollout.autocast=none",
    "optim.autocast=none",
]
# lengths vary between random completions, so the overlong penalty gives every group signal
REWARD = "arithmetic:overlong=16/12"


def problems(tmp_path, rows) -> str:
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


ROWS = [
    {"question": "12+7*3=?", "answer": "7*3=21\n12+21=33\n#### 33"},
    {"question": "4*5-6=?", "answer": "#### 14"},
]


def cli_train(model, prompts, out, algo, lr, extra=(), capture=None, monkeypatch=None) -> list[dict]:
    if capture is not None:  # keep each step's scored rollout
        real = scoring_module.sample_and_score

        def keep(*args, **kwargs):
            scored = real(*args, **kwargs)
            capture.append(scored)
            return scored

        monkeypatch.setattr(scoring_module, "sample_and_score", keep)
    args = [
        "train",
        "--prompts",
        prompts,
        "--model",
        f"text:{model}",
        "--reward",
        REWARD,
        "--out",
        str(out),
        "--steps",
        "1",
        "--algo",
        algo,
        "--seed",
        "0",
        "--set",
        f"optim.lr={lr}",
    ]
    for kv in (*FAST, *extra):
        args += ["--set", kv]
    try:
        main(args)
    except SystemExit as e:
        assert e.code in (0, None), f"exit {e.code}"
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
