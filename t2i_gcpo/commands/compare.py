"""`t2i-gcpo compare`: several algorithms × seeds, one table and one plot."""

from __future__ import annotations

from pathlib import Path

import click

from t2i_gcpo.policies.registry import models_help

EXAMPLES = """
\b
Examples:
  t2i-gcpo compare --algos grpo,dapo,gcpo,dgpo --seeds 3 --steps 200 --out runs/compare
  t2i-gcpo compare --algos dapo,gcpo --seeds 2 --steps 100 --set rollout.group_size=16 --out runs/cmp16
  t2i-gcpo compare --algos grpo,dapo,gcpo,dgpo --seeds 5 --steps 150 --jobs 2 --out runs/cmp5
  t2i-gcpo compare --algos dapo,gcpo --seeds 0,1,2,7 --baseline dapo --steps 150 --out runs/cmp_paired
  t2i-gcpo compare --algos dapo,gcpo,dgpo,stage@3,critical@3 --seeds 5 --steps 150 --jobs 2 --out runs/study
  t2i-gcpo compare --model arithmetic --algos grpo,dapo,gcpo,dgpo --seeds 3 --steps 100 --out runs/cmp_text
  t2i-gcpo compare --algos dapo,vine,eg-grpo@3 --match-budget samples --seeds 5 --steps 150 --out runs/tree
      # + dapo-at-vine-budget: dapo with vine's samples per step (a bigger group), read at equal samples
Re-running the same command resumes: finished runs are kept, stopped runs continue (more --algos or
--seeds add runs); a folder made with other --steps, --prompts, --model, --reward, --eval-every or --set
values is refused.
"""


def parse_seeds(text: str) -> list[int]:
    """--seeds: a count N (seeds 0 … N−1) or a comma-separated list of seeds ("0,1,2,7"; "7," is seed 7
    alone)."""
    from t2i_gcpo.errors import UserError

    items = [x.strip() for x in text.split(",")]
    if "," not in text:
        if not items[0].isdecimal() or int(items[0]) < 1:
            hint = f" (seed {items[0]} alone: '{items[0]},')" if items[0].isdecimal() else ""
            raise UserError(
                f"--seeds expects a count ≥ 1 or a comma-separated list of seeds, got '{text}'{hint}"
            )
        return list(range(int(items[0])))
    seeds = [x for x in items if x]
    if not seeds or not all(x.isdecimal() for x in seeds):
        raise UserError(f"--seeds: a list of seeds holds integers ≥ 0 separated by commas, got '{text}'")
    if len(set(map(int, seeds))) < len(seeds):
        raise UserError(f"--seeds lists a seed twice: '{text}'")
    return [int(x) for x in seeds]


def parse_algos(text: str, seeds: list[int]) -> tuple[list[str], dict[str, list[int]]]:
    """--algos: preset names, each optionally NAME@N (the first N of `seeds` only) → (names, each
    one's seeds)."""
    from t2i_gcpo.config import ALGORITHMS
    from t2i_gcpo.errors import UserError

    names, lists = [], {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, at, count = item.partition("@")
        if name not in ALGORITHMS:
            raise UserError(f"unknown algorithm '{name}': choose from {', '.join(ALGORITHMS)}")
        if name in lists:
            raise UserError(f"--algos names {name} twice")
        if at and not (count.isdecimal() and 1 <= int(count) <= len(seeds)):
            raise UserError(
                f"--algos {item}: N in NAME@N must be a count from 1 to {len(seeds)} (the --seeds given)"
            )
        names.append(name)
        lists[name] = seeds[: int(count)] if at else list(seeds)
    if not names:
        raise UserError(f"--algos names no algorithm: choose from {', '.join(ALGORITHMS)}")
    return names, lists


def default_train_prompts(model: str) -> str:
    """The shipped training prompts of the task a `--model` belongs to, read from the model's family
    without loading it: ShapeWorld models and their checkpoints (AR or masked) train on ShapeWorld
    prompts, the shipped arithmetic LM on arithmetic problems; other models need `--prompts`."""
    from t2i_gcpo.errors import UserError
    from t2i_gcpo.policies.registry import model_task
    from t2i_gcpo.tasks.registry import get_task

    task = model_task(model)
    path = get_task(task).default_train_prompts() if task else None
    if path is None:
        raise UserError(f"give --prompts: there are no default training prompts for --model {model}")
    return path


@click.command("compare", epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--algos",
    default="grpo,dapo,gcpo,dgpo",
    show_default=True,
    help="Comma-separated presets; NAME@N trains that one on the first N of --seeds only.",
)
@click.option(
    "--seeds",
    default="3",
    show_default=True,
    help="Seeds per algorithm: a count N (seeds 0 … N−1) or a list such as 0,1,2,7.",
)
@click.option("--steps", default=200, show_default=True, help="Steps per run.")
@click.option(
    "--prompts",
    default=None,
    help="Training prompts [default: prompts/shapeworld_train.jsonl for ShapeWorld models and their "
    "checkpoints, prompts/arithmetic_train.jsonl for --model arithmetic].",
)
@click.option("--model", default="shapeworld", show_default=True, help=models_help() + ".")
@click.option("--reward", default=None, help="Reward spec [default: the task's own].")
@click.option(
    "--baseline",
    default=None,
    help="Algorithm the others are measured against [default: dapo if compared, else the first of --algos].",
)
@click.option(
    "--eval-every", default=25, show_default=True, help="Held-out evaluation interval (the curves)."
)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Config override for every run.")
@click.option(
    "--report-to",
    "report_to",
    default=None,
    metavar="TRACKERS",
    help="Trackers of every run, as for train (report_to)  [default: tensorboard]",
)
@click.option(
    "--jobs",
    default=1,
    show_default=True,
    help=(
        "Runs trained side by side, each with cores/jobs threads (2 on a 2-core machine: ≈1.5× "
        "the throughput)."
    ),
)
@click.option(
    "--match-budget",
    default=None,
    metavar="UNITS",
    help="Also train the baseline at the budget of every algorithm that scores extra samples (vine, "
    "tree, pods, knapsack), measured from its first two steps: 'samples' (arm <baseline>-at-<algo>-budget), "
    "'tokens' (arm <baseline>-at-<algo>-tokens: a continuation from t counts its L − t tokens) or "
    "'samples,tokens'; the table then reads the algorithm against it at equal samples (tokens), and every "
    "arm at equal time.",
)
@click.option(
    "--match-by",
    type=click.Choice(["group", "prompts"]),
    default="group",
    show_default=True,
    help="What the matched baseline scales: its group size (same prompts per step) or its prompts per step.",
)
@click.option("--out", required=True, help="Directory: <algo>/seed<k>/ runs, comparison.md/json, curves.png.")
def compare_cmd(
    algos,
    seeds,
    steps,
    prompts,
    model,
    reward,
    baseline,
    eval_every,
    overrides,
    report_to,
    jobs,
    match_budget,
    match_by,
    out,
) -> None:
    """Train each algorithm with several seeds and compare held-out scores: mean and 95 % interval
    (image tasks: strict score per tag, credit lift and overall; text: accuracy, pass@k, format rate
    and step lift), steps to reach the baseline's final score, each algorithm's final score minus the
    baseline's, paired by seed and unpaired, every run's held-out score at each evaluation, the paired
    differences at each evaluation, what each run spent (samples, tokens, reward calls, training time)
    with the scores read at equal training time, and curves with bands."""
    from t2i_gcpo.commands.options import lock_out
    from t2i_gcpo.errors import UserError, check_writable_dir
    from t2i_gcpo.studies.compare import check_baseline, format_table, match_units, run_comparison
    from t2i_gcpo.train.distributed import leave_process_group

    seed_list = parse_seeds(seeds)
    names, seed_lists = parse_algos(algos, seed_list)
    baseline = check_baseline(names, baseline)
    if steps < 1 or eval_every < 1 or jobs < 1:
        raise UserError("--steps, --eval-every and --jobs must be ≥ 1")
    if match_budget is not None:  # before the folder: an unknown unit or nothing to match is one line
        match_units(match_budget, match_by, names, baseline)
    if prompts is None:
        prompts = default_train_prompts(model)
    if report_to is not None:
        overrides = (*overrides, f"report_to={report_to}")
    lock_out(check_writable_dir(out, "--out"))  # each run's own folder is locked by its training
    result = run_comparison(
        names,
        seed_lists,
        steps,
        Path(out),
        prompts,
        model,
        reward,
        eval_every,
        tuple(overrides),
        jobs,
        baseline,
        match_budget,
        match_by,
    )
    leave_process_group()
    click.echo(format_table(result))
    click.echo(f"curves: {Path(out) / 'curves.png'}")
