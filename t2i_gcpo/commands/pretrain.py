"""`t2i-gcpo pretrain`: rebuild an embedded ShapeWorld checkpoint (AR: VQ tokenizer + prior; masked:
a MaskGIT prior over the shipped AR checkpoint's VQ tokens, in the shipped masked prior's vocabulary),
or, with ``--world arithmetic``, the arithmetic world's tiny causal LM
(t2i_gcpo.pretrain.arithmetic)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from t2i_gcpo.commands.options import config_value, seed_option
from t2i_gcpo.hardware import check_threads, usable_cpus


@click.command("pretrain")
@click.option(
    "--world",
    type=click.Choice(["shapeworld", "arithmetic"]),
    default="shapeworld",
    show_default=True,
    help="shapeworld: the image world (--arch picks the prior); arithmetic: the text world's causal LM "
    "on noisy worked solutions (--model arithmetic).",
)
@click.option(
    "--arch",
    type=click.Choice(["ar", "masked"]),
    default="ar",
    show_default=True,
    help="ar: autoregressive prior and its VQ (--model shapeworld); masked: MaskGIT prior over the "
    "shipped VQ tokens (--model shapeworld-masked).",
)
@click.option(
    "--out",
    default=None,
    type=click.Path(),  # checked by check_writable_dir: a file there is a one-line error
    help="Checkpoint folder to write [default: shapeworld_model; arithmetic_model with --world arithmetic].",
)
@click.option(
    "--size",
    "image_size",
    default=None,
    type=click.Choice(["32", "64"]),
    help="ShapeWorld scale [default: 32]: 32 px scenes on an 8×8 token grid (the shipped model), or "
    "64 px scenes on a 16×16 grid, objects of 4×4 tokens with a rim and a pale core (ar only).",
)
@click.option(
    "--vq-steps",
    default=None,
    type=click.IntRange(min=1),
    help="VQ-VAE steps of a fresh VQ tokenizer (implies --new-vq) [default: 1000, 1500 at --size 64; "
    "ar only].",
)
@click.option(
    "--steps",
    "prior_steps",
    default=None,
    type=click.IntRange(min=1),
    help="Prior steps [default: ar 2000 (1500 at --size 64), masked 5000; arithmetic 2000].",
)
@click.option(
    "--scenes",
    "n_scenes",
    default=None,
    type=click.IntRange(min=100),
    help="Prompts drawn for training [default: 40000]; those asking for a held-out test prompt's content are "
    "dropped.",
)
@click.option(
    "--minutes",
    "max_minutes",
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    help="Wall-clock cap for training (VQ gets a quarter).",
)
@click.option(
    "--cfg",
    "cfg_scale",
    default=None,
    type=float,
    callback=config_value("rollout.cfg_scale"),
    help="Default CFG scale stored in the checkpoint [default: ar 2 (3 at --size 64), masked 3].",
)
@click.option(
    "--vq",
    "vq_path",
    default=None,
    type=click.Path(file_okay=False, exists=True),
    help="Reuse a trained VQ tokenizer folder (e.g. MODEL/vq); skips VQ training [default at --size 32 "
    "and with --arch masked: the shipped one].",
)
@click.option(
    "--new-vq",
    is_flag=True,
    help="Train a fresh VQ tokenizer instead of reusing the shipped one (--size 32; --size 64 always does).",
)
@seed_option
@click.option(
    "--threads",
    default=lambda: min(2, usable_cpus()),
    show_default="2, or 1 on a machine of one CPU",
    type=click.IntRange(min=1),
    help="torch threads (at most the CPUs this process may use).",
)
@click.option("--no-eval", is_flag=True, help="Skip scoring the result on the held-out test prompts.")
def pretrain_cmd(
    world: str,
    arch: str,
    out: str | None,
    image_size: str | None,
    vq_steps: int | None,
    prior_steps: int | None,
    n_scenes: int | None,
    max_minutes: float | None,
    cfg_scale: float | None,
    vq_path: str | None,
    new_vq: bool,
    seed: int,
    threads: int,
    no_eval: bool,
) -> None:
    """Rebuild the ShapeWorld model: render scenes for prompts of GenEval's six templates and of the
    compositional grammar (up to 6 objects, every relation; none asking for a held-out prompt's
    content), encode them with the shipped VQ tokenizer (--new-vq trains one), train the
    text-conditioned prior (10 % null-prompt dropout for CFG) on prompts as long as the longest the
    grammar accepts, save it and print its per-tag strict/partial scores on the held-out template
    and compositional prompts (4 images each). The defaults rebuild the shipped --model shapeworld
    (docs/results/shapeworld.md#the-shipped-prior-retrained). Load the result with --model OUT.

    With the defaults at --threads 1: 44 min measured on 2 CPU cores shared with five other jobs (the
    prior's 2 000 steps ≈ 18 min alone, estimated from its last steps); the prior of 865e766 (10-word
    prompts, 1 500 steps, its own VQ) took 8.3 min alone on 2 threads.

    With --size 64: 64 px scenes, a VQ with a 16×16 grid and 1 024 codes (1 500 steps at batch 32),
    a prior over 256 image tokens (1 500 steps at batch 32): 85 min measured on 2 CPU cores (VQ 24
    min, prior 57 min); the shipped one is --model shapeworld-64.

    With --arch masked: a bidirectional MaskGIT prior (cosine mask schedule, masked-token
    cross-entropy, the same 10 % null-prompt dropout) trained on the same scenes, encoded by the
    shipped VQ tokenizer (or --vq), 5 000 steps at batch 32: 30 min measured at --threads 1 beside
    another one-thread job (the shipped one is --model shapeworld-masked). Load the result with
    --model masked:OUT.

    \b
    Examples:
      t2i-gcpo pretrain --out my_shapeworld --seed 1
      t2i-gcpo sample --model my_shapeworld --prompts prompts/shapeworld_test.txt --out samples/
      t2i-gcpo pretrain --arch masked --out my_masked
      t2i-gcpo train --model masked:my_masked --prompts prompts/shapeworld_train.txt

    With --world arithmetic: a 4-layer Llama (0.87 M parameters) over the arithmetic world's
    characters, trained on prompts and noisy worked solutions (a step slips with probability 0.1),
    loss on the completion; prints its held-out accuracy sampled at temperature 1 and greedy. 7.5 min
    measured on a shared 2-core machine at --threads 1 (the shipped model: 0.38 sampled, 0.64
    greedy). Load the result with --model text:OUT (the shipped one is --model arithmetic).

    \b
      t2i-gcpo pretrain --world arithmetic --out my_arithmetic --threads 1
    """
    from t2i_gcpo.config import check_finite
    from t2i_gcpo.errors import UserError, check_writable_dir

    out = out or f"{world}_model"
    check_threads(threads)
    check_writable_dir(out, "--out")  # bad input fails now, not after minutes of training
    if max_minutes is not None:
        check_finite("--minutes", max_minutes)
    settings = {
        "--world": world,
        "--arch": arch,
        "--size": image_size,
        "--vq-steps": vq_steps,
        "--steps": prior_steps,
        "--scenes": n_scenes,
        "--minutes": max_minutes,
        "--cfg": cfg_scale,
        "--vq": vq_path and os.path.realpath(vq_path),
        "--new-vq": new_vq,
        "--seed": seed,
    }
    if world == "arithmetic":
        given = [
            ("--arch masked", arch == "masked"),
            ("--vq-steps", vq_steps is not None),
            ("--scenes", n_scenes is not None),
            ("--cfg", cfg_scale is not None),
            ("--vq", vq_path is not None),
            ("--size", image_size is not None),
            ("--new-vq", new_vq),
        ]
        bad = [name for name, used in given if used]
        if bad:
            raise UserError(
                f"{', '.join(bad)} applies to --world shapeworld only (the arithmetic model is a causal LM)"
            )
        claim_out(out, settings)
        _pretrain_arithmetic(out, prior_steps, max_minutes, seed, threads, no_eval)
        return
    if arch == "masked" and image_size == "64":
        raise UserError(
            "--size 64 applies to --arch ar only (the masked prior reuses the shipped 32 px VQ tokens)"
        )

    import torch

    torch.set_num_threads(threads)

    def evaluate(policy, test, images_per_prompt, seed):
        from t2i_gcpo.tasks.geneval import evaluate_shapeworld, format_table

        result = evaluate_shapeworld(policy, test, images_per_prompt, seed=seed, progress=True)
        click.echo(format_table(result))
        return result

    if arch == "masked":
        from t2i_gcpo.policies.masked import MaskedConfig
        from t2i_gcpo.pretrain.shapeworld_masked import MaskedPretrainConfig, pretrain_masked

        if vq_steps is not None or new_vq:
            flag = "--vq-steps" if vq_steps is not None else "--new-vq"
            raise click.UsageError(f"{flag} applies to --arch ar (the masked prior reuses a trained VQ)")
        mcfg = MaskedPretrainConfig(seed=seed, max_minutes=max_minutes, vq_path=vq_path)
        if prior_steps is not None:
            mcfg.steps = prior_steps
        if n_scenes is not None:
            mcfg.n_scenes = n_scenes
        if cfg_scale is not None:
            mcfg.model = MaskedConfig(default_cfg_scale=cfg_scale)
        claim_out(out, settings)
        stats = pretrain_masked(out, mcfg, evaluate=None if no_eval else evaluate)
        _say_wrote(out, stats)
        return

    from t2i_gcpo.pretrain.shapeworld_ar import PretrainConfig, pretrain

    if new_vq and vq_path is not None:
        raise click.UsageError("--new-vq trains a VQ tokenizer, --vq reuses one: give one of them")
    cfg = PretrainConfig.for_size(int(image_size or 32), seed=seed, max_minutes=max_minutes)
    if vq_steps is not None and vq_path is not None:
        raise click.UsageError("--vq-steps trains a VQ tokenizer, --vq reuses one: give one of them")
    if vq_path is not None or new_vq or vq_steps is not None:
        cfg.vq_path = vq_path
    if vq_steps is not None:
        cfg.vq_steps = vq_steps
    if prior_steps is not None:
        cfg.prior_steps = prior_steps
    if n_scenes is not None:
        cfg.n_scenes = n_scenes
    if cfg_scale is not None:
        cfg.cfg_scale = cfg_scale

    claim_out(out, settings)
    stats = pretrain(out, cfg, evaluate=None if no_eval else evaluate)
    _say_wrote(out, stats)


def claim_out(out: str, settings: dict) -> None:
    """After the options are checked, before any training: lock `out` until the command ends and make
    sure it is new, empty, or a model this command built with the same `settings` (rebuilt in place);
    record them there. Anything else (a training run, a model built otherwise, someone's files) is a
    one-line UserError."""
    from t2i_gcpo.commands.options import lock_out
    from t2i_gcpo.errors import UserError, check_writable_dir, shorten
    from t2i_gcpo.outdir import SETTINGS_RECORD, check_settings_record, foreign_entries, write_settings_record

    folder = Path(lock_out(check_writable_dir(out, "--out")))
    if not check_settings_record(folder, "pretrain", settings):
        entries = [e for e in foreign_entries(folder) if e != SETTINGS_RECORD]
        if entries:
            raise UserError(
                f"--out {out} is not empty (it holds {shorten(entries[0], 60)}) and not a model "
                "pretrain built there; pick a new or empty folder"
            )
    write_settings_record(folder, "pretrain", settings)


def _pretrain_arithmetic(
    out: str, steps: int | None, max_minutes: float | None, seed: int, threads: int, no_eval: bool
) -> None:
    import torch

    from t2i_gcpo.pretrain.arithmetic import ArithmeticPretrainConfig, pretrain

    torch.set_num_threads(threads)
    cfg = ArithmeticPretrainConfig(seed=seed, max_minutes=max_minutes)
    if steps is not None:
        cfg.steps = steps
    stats = pretrain(out, cfg, run_eval=not no_eval)
    if "eval" in stats:
        ev = stats["eval"]
        click.echo(
            f"held-out accuracy on {ev['problems']} problems: sampled (T=1, "
            f"{ev['sampled']['samples_per_problem']} each) {ev['sampled']['accuracy']:.3f}, greedy "
            f"{ev['greedy']['accuracy']:.3f}; format {ev['sampled']['format']:.3f} / "
            f"{ev['greedy']['format']:.3f}"
        )
    _say_wrote(out, stats)


def _say_wrote(out: str, stats: dict) -> None:
    out = Path(out)  # "model/" prints as model/, not model//
    click.echo(f"wrote {out}/ in {stats['total_seconds'] / 60:.1f} min (statistics: {out / 'pretrain.json'})")
