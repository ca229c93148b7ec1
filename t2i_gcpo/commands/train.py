"""`t2i-gcpo train`: the RL loop from the command line."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from t2i_gcpo.config import TrainConfig, preset_names
from t2i_gcpo.core.schemes import CREDIT_SCHEMES
from t2i_gcpo.policies.registry import models_help
from t2i_gcpo.rewards.registry import forms_text as reward_forms

EXAMPLES = """
\b
Examples:
  t2i-gcpo train --prompts prompts/shapeworld_train.txt
  t2i-gcpo train --prompts prompts/shapeworld_train.jsonl --algo dapo --steps 200 --seed 1
  t2i-gcpo train --prompts prompts/shapeworld_train.txt --set rollout.group_size=16 \\
      --set credit.gcpo.normalization=softmax
  t2i-gcpo train --prompts prompts/shapeworld_train.txt --model shapeworld-masked \\
      --set rollout.reveal_order=random --set optim.lr=3e-5   # the masked prior's RL recipe
  t2i-gcpo train --prompts p.txt --model amused:/models/amused-256 --reward clip:/models/clip \\
      --set model_options.estimator=remask --set rollout.steps=12
  t2i-gcpo train --prompts prompts/shapeworld_train.txt --report-to wandb --set optim.lr_scheduler=cosine
  t2i-gcpo train --prompts prompts/shapeworld_train.txt --algo dapo --out runs/mine \\
      --credit examples/custom_credit.py:prompt_sensitivity --set credit.options.power=2   # your own scheme
  t2i-gcpo train --resume runs/gcpo-20261121-120000          # continue a stopped run
  t2i-gcpo train --resume runs/gcpo-20261121-120000 --steps 400   # train it longer
  t2i-gcpo train --resume runs/mine --credit examples/custom_credit.py:prompt_sensitivity  # name it again
  accelerate launch --multi_gpu --num_processes 2 -m t2i_gcpo.cli train \\
      --prompts prompts/shapeworld_train.txt
  t2i-gcpo train --help-config                               # every config key, default and meaning
"""


def print_config_help(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from t2i_gcpo.config import describe

    rows = describe()
    width = max(len(k) for k, _, _ in rows)
    for key, default, text in rows:
        click.echo(f"{key:<{width}}  {default:<12} {text}")
    ctx.exit(0)


@click.command("train", epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--prompts",
    "prompts",
    type=str,
    help="Prompt file: .txt (GenEval-template prompts) or .jsonl (GenEval metadata).",
)
@click.option(
    "--algo", type=str, default=None, help=" | ".join(preset_names()) + f"  [default: {TrainConfig.algo}]"
)
@click.option(
    "--credit",
    type=str,
    default=None,
    metavar="SCHEME",
    help=" | ".join(CREDIT_SCHEMES) + ", or your own: 'path/to/file.py:function' or 'module:function' "
    "(options: --set credit.options.NAME=VALUE)  [default: the preset's]",
)
@click.option(
    "--config", "config_file", type=str, default=None, help="YAML config applied on top of the preset."
)
@click.option(
    "--model",
    type=str,
    default=None,
    help=models_help() + " [default: shapeworld].",
)
@click.option(
    "--reward",
    type=str,
    default=None,
    metavar="SPEC",
    help=f"{reward_forms()} [default: the task's own] (docs/guides/rewards.md).",
)
@click.option("--out", type=str, default=None, help="Run directory  [default: runs/<algo>-<time>]")
@click.option(
    "--report-to",
    "report_to",
    type=str,
    default=None,
    metavar="TRACKERS",
    help=(
        "tensorboard | wandb | mlflow | trackio | all | none, or a comma-separated list  "
        "[default: tensorboard]"
    ),
)
@click.option("--steps", type=int, default=None, help="Optimizer steps  [default: 200]")
@click.option("--seed", type=int, default=None, help="Seed  [default: 0]")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override any config key (dotted), repeatable.",
)
@click.option(
    "--resume",
    type=str,
    default=None,
    metavar="DIR",
    help="Continue the run in DIR from its last checkpoint (with --steps N: to N steps in all). Code its "
    "config names (a credit or reward file.py:function) runs only if you name it again with --credit / "
    "--reward, or with --trust-run-code.",
)
@click.option(
    "--trust-run-code",
    is_flag=True,
    help="With --resume: run the credit and reward code the run's config names without naming it again, "
    "if it is the code the run started with (unchanged). Only for runs you trust: a run folder from "
    "someone else can name any code.",
)
@click.option(
    "--allow-changed-inputs",
    is_flag=True,
    help="With --resume: continue although a prompt, credit or reward file changed since the run started "
    "(the new content is recorded); without it that is an error naming the file.",
)
@click.option(
    "--help-config",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=print_config_help,
    help="List every config key with its default and meaning.",
)
def train_cmd(
    prompts,
    algo,
    credit,
    config_file,
    model,
    reward,
    out,
    report_to,
    steps,
    seed,
    overrides,
    resume,
    trust_run_code,
    allow_changed_inputs,
) -> None:
    """Train a text-to-image policy: an algorithm preset (--algo) and its token credit, or any other
    credit scheme, a function of your own included (--credit).

    With only --prompts it trains the shipped ShapeWorld model with GCPO and the ShapeWorld reward.
    """
    from t2i_gcpo.api import train
    from t2i_gcpo.errors import UserError

    if resume:
        if any(v is not None for v in (prompts, algo, config_file, model, out, report_to, seed)) or overrides:
            raise UserError(
                "--resume takes the run's saved config; only --steps may be given with it (and the run's own "
                "--credit / --reward, to let their code run)"
            )
    elif trust_run_code or allow_changed_inputs:
        flag = "--trust-run-code" if trust_run_code else "--allow-changed-inputs"
        raise UserError(f"{flag} goes with --resume DIR (a new run runs the code you name)")
    elif not prompts:
        raise UserError("missing --prompts FILE (e.g. --prompts prompts/shapeworld_train.txt)")
    try:
        # prints each held-out evaluation and the run directory; a Path is a file, never a prompt
        train(
            model,
            Path(prompts) if prompts else None,
            reward,
            config_file,
            algo=algo,
            overrides=overrides,
            out=out,
            report_to=report_to,
            steps=steps,
            seed=seed,
            resume=resume,
            credit=credit,
            trust_run_code=trust_run_code,
            allow_changed_inputs=allow_changed_inputs,
        )
    except KeyboardInterrupt as interrupt:  # Ctrl-C or SIGTERM: the checkpoint is saved, resume prints
        from t2i_gcpo.train.distributed import leave_process_group

        for sig in (signal.SIGINT, signal.SIGTERM):  # stopping: a late Ctrl-C prints no traceback
            signal.signal(sig, signal.SIG_IGN)
        _say_how_to_continue(getattr(interrupt, "run_dir", None), interrupt)  # api.train names it
        leave_process_group()
        sys.exit(128 + getattr(interrupt, "signum", signal.SIGINT))  # 130 (SIGINT) or 143 (SIGTERM)
    from t2i_gcpo.train.distributed import leave_process_group  # torch: imported once a run has trained

    leave_process_group()


def _say_how_to_continue(run_dir: Path | None, interrupt: KeyboardInterrupt) -> None:
    """A Ctrl-C before the training loop took over the signals (the loop prints its own line): the run
    directory, once it is one, continues with --resume like any other."""
    import os

    from t2i_gcpo.outdir import is_run_dir
    from t2i_gcpo.train.trainer import Interrupted

    if isinstance(interrupt, Interrupted) or run_dir is None or int(os.environ.get("RANK", 0)) != 0:
        return
    if is_run_dir(run_dir):
        command = getattr(interrupt, "resume", None) or f"t2i-gcpo train --resume {run_dir}"
        print(f"interrupted before training began; continue with: {command}", flush=True)
