"""`t2i-gcpo eval geneval|geneval2|dpg|judge|shapeworld`: benchmarks with PyPI-only dependencies (judge:
a VLM behind an OpenAI-compatible server)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from t2i_gcpo.commands.options import (
    cfg_option,
    images_option,
    lock_out,
    masked_sampling_options,
    seed_option,
)
from t2i_gcpo.policies.registry import models_help

CTX = {"help_option_names": ["-h", "--help"]}


@click.group("eval", context_settings=CTX)
def eval_cmd() -> None:
    """Evaluate a model on GenEval, GenEval 2, DPG-Bench, a judge-scored suite (WISE, TIIF-Bench,
    UniGenBench++), T2I-CompBench or the ShapeWorld held-out prompts, and compare two
    evaluations item by item.

    \b
    Examples:
      t2i-gcpo eval shapeworld --model shapeworld --out eval/base
      t2i-gcpo eval geneval --model janus:/ckpt/Janus-Pro-1B --detector /ckpt/mask2former-swin-s \\
          --clip /ckpt/clip-vit-l-14.bin --out eval/janus1b
      t2i-gcpo eval geneval --score-only my_images/ --detector /ckpt/mask2former-swin-s --clip … --out eval/x
      t2i-gcpo eval dpg --model janus:/ckpt/Janus-Pro-1B --csv dpg_bench.csv --vqa /ckpt/blip-vqa-base \\
          --out eval/dpg
      t2i-gcpo eval geneval2 --data geneval2_data.jsonl --model janus:/ckpt/Janus-Pro-1B \\
          --vqa /ckpt/Qwen3-VL-8B-Instruct --device cuda --out eval/g2
      t2i-gcpo eval judge --suite wise --data merge.json --model janus:/ckpt/Janus-Pro-1B \\
          --judge http://127.0.0.1:8000/v1 --out eval/wise
      t2i-gcpo eval compare eval/janus1b eval/janus1b-gcpo
    """


@eval_cmd.command("compare", context_settings=CTX)
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option(
    "--json", "json_out", default=None, metavar="FILE", help="Also write the comparison as JSON here."
)
def compare_cmd(a, b, json_out):
    """B against A on the same prompts and seeds: each category's and the overall paired difference with its
    95 % interval (and the unpaired interval beside it). A and B are output folders of `t2i-gcpo eval …`
    (results.jsonl and protocol.json) or run directories (their last held-out evaluation). Refused in one
    line when their protocols differ (suite, data, seeds, images per prompt, scorer: protocol_mismatch) or
    they scored other items.

    \b
    Examples:
      t2i-gcpo eval compare eval/base eval/gcpo
      t2i-gcpo eval compare runs/dapo-seed0 runs/gcpo-seed0 --json cmp.json
    """
    import json

    from t2i_gcpo.errors import UserError
    from t2i_gcpo.eval.records.paired import compare_evaluations, format_comparison, strict_json

    result = compare_evaluations(a, b)
    click.echo(format_comparison(result))
    if json_out:
        from t2i_gcpo.outdir import write_file

        path = Path(json_out)
        if path.is_dir():
            raise UserError(f"--json {path} is a directory, expected a file name")
        write_file(path, json.dumps(strict_json(result), indent=1, allow_nan=False) + "\n")
        click.echo(f"comparison: {path}")


def _policy(model: str):
    from t2i_gcpo.policies.registry import load_policy

    return load_policy(model).eval()


def _check_out(out: str) -> Path:
    """--out must be a folder we can write into (or create), and no other command's: checked (and
    locked until the command ends) before any model is loaded."""
    from t2i_gcpo.errors import check_writable_dir

    return lock_out(check_writable_dir(out, "--out"))


def _overwrite_option(what: str):
    return click.option(
        "--overwrite",
        is_flag=True,
        help=f"Regenerate: delete the {what} already in OUT/images/ first. Without it, a run resumes only "
        "into images made for the same prompts, model, seed, CFG, count (and masked steps / reveal order), "
        "and refuses anything else.",
    )


def _generation_options(batch: int):
    """--batch, --cfg-scale, --steps, --reveal-order and --seed: how an evaluation generates its images."""

    def add(command):
        for option in reversed(
            (
                click.option(
                    "--batch", default=batch, show_default=True, help="Prompts per generation call."
                ),
                cfg_option(help="CFG scale [default: the model's]."),
                masked_sampling_options,
                seed_option,
            )
        ):
            command = option(command)
        return command

    return add


def _asked_out_options(command):
    """--out and --overwrite of a question-based suite (geneval2, judge): its folder's files."""
    command = _overwrite_option("prompt folders")(command)
    return click.option(
        "--out",
        required=True,
        help="Output dir: images/, answers.jsonl, results.jsonl, summary.json/txt, protocol.json.",
    )(command)


def _print_files(out: Path, summary: str = "summary.txt") -> None:
    """Where an evaluation's files are: results.jsonl, the summary, protocol.json."""
    click.echo(
        f"results: {out / 'results.jsonl'}  summary: {out / summary}  protocol: {out / 'protocol.json'}"
    )


def _print_summary(out: Path, summary: dict, partial: bool = False) -> None:
    """GenEval's table, (`partial`) the partial credit, where the files are, and last the headline: the
    strict score with its 95 % interval over the images sampled (stats.proportions_se over the tags)."""
    from t2i_gcpo.scoring.geneval_rules import format_summary
    from t2i_gcpo.stats import proportions_se

    click.echo(format_summary(summary))
    if partial:
        _print_partial(out)
    _print_files(out)
    se = proportions_se((t["score"], t["total"]) for t in summary["tags"].values())
    interval = f" ± {1.96 * se:.3f} (95 % interval over the images sampled)" if se == se else ""
    click.echo(f"strict score (GenEval's overall): {summary['overall']:.3f}{interval}")


@eval_cmd.command("geneval", context_settings=CTX)
@click.option("--model", default=None, help="Model to generate with: " + models_help() + ".")
@click.option(
    "--score-only", "score_only", default=None, metavar="DIR", help="Score an existing GenEval-layout folder."
)
@click.option(
    "--detector", required=True, help="Local Mask2Former checkpoint dir (COCO instance), or 'shapeworld'."
)
@click.option(
    "--clip", "clip_ckpt", default=None, help="Local open_clip checkpoint for colour classification."
)
@click.option("--clip-model", default="ViT-L-14", show_default=True, help="open_clip architecture of --clip.")
@images_option("images_per_prompt")
@_generation_options(batch=4)
@click.option("--device", default="cpu", show_default=True, help="Device of the scoring models.")
@click.option(
    "--out", required=True, help="Output dir: images/ (unless --score-only), results.jsonl, summary.txt/json."
)
@_overwrite_option("prompt folders")
def geneval_cmd(
    model,
    score_only,
    detector,
    clip_ckpt,
    clip_model,
    images_per_prompt,
    batch,
    cfg_scale,
    steps,
    reveal_order,
    seed,
    device,
    out,
    overwrite,
):
    """GenEval's 553 prompts: generate 4 images each (resumable), then score them with Mask2Former and
    CLIP colour classification through GenEval's rules. Output as GenEval's summary."""
    from t2i_gcpo.api import evaluate_geneval

    summary = evaluate_geneval(
        out,
        detector,
        model,
        clip=clip_ckpt,
        clip_model=clip_model,
        score_only=score_only,
        n=images_per_prompt,
        batch=batch,
        cfg_scale=cfg_scale,
        steps=steps,
        reveal_order=reveal_order,
        seed=seed,
        device=device,
        overwrite=overwrite,
    )
    _print_summary(Path(out), summary)


@eval_cmd.command("shapeworld", context_settings=CTX)
@click.option(
    "--model",
    default="shapeworld",
    show_default=True,
    help=models_help() + ".",
)
@click.option(
    "--prompts",
    default=None,
    help="Prompt file [default: prompts/shapeworld_test.jsonl, GenEval's six templates; the held-out "
    "compositional prompts: prompts/shapeworld_compositional_test.jsonl, a shipped file].",
)
@images_option("images_per_prompt")
@_generation_options(batch=16)
@click.option(
    "--out", required=True, help="Output dir: images/ in GenEval layout, results.jsonl, summary.txt/json."
)
@_overwrite_option("prompt folders")
def shapeworld_cmd(
    model, prompts, images_per_prompt, batch, cfg_scale, steps, reveal_order, seed, out, overwrite
):
    """The held-out ShapeWorld prompts, 4 images each, scored by the ShapeWorld detector through the
    GenEval rules: per-tag strict and partial scores, in GenEval's output format."""
    from t2i_gcpo.api import evaluate_shapeworld

    # a Path is a file, never a prompt
    summary = evaluate_shapeworld(
        out,
        model,
        Path(prompts) if prompts else None,
        images_per_prompt,
        batch=batch,
        cfg_scale=cfg_scale,
        steps=steps,
        reveal_order=reveal_order,
        seed=seed,
        overwrite=overwrite,
    )
    _print_summary(Path(out), summary, partial=True)


@eval_cmd.command("compbench", context_settings=CTX)
@click.option(
    "--data",
    required=True,
    metavar="DIR",
    help="T2I-CompBench's examples/dataset folder (color_val.txt, …, new_objects.txt), your copy.",
)
@click.option("--model", default=None, help="Model to generate with: " + models_help() + ".")
@click.option(
    "--score-only",
    "score_only",
    default=None,
    metavar="DIR",
    help="Score existing images: DIR/<category>/ in GenEval layout, or the reference's "
    "DIR/<category>/samples/<prompt>_<NNNNNN>.png.",
)
@click.option(
    "--categories",
    default=None,
    metavar="LIST",
    help="Comma-separated, of color, shape, texture, non_spatial, spatial, numeracy [default: "
    "those whose scorer is given].",
)
@click.option(
    "--split",
    default="val",
    show_default=True,
    type=click.Choice(["val", "train", "all"]),
    help="Prompt file per category: <category>_val.txt, _train.txt, or <category>.txt.",
)
@click.option(
    "--vqa",
    default=None,
    metavar="DIR",
    help="Local BLIP VQA checkpoint (colour, shape, texture), e.g. Salesforce/blip-vqa-capfilt-large.",
)
@click.option(
    "--clip",
    "clip_ckpt",
    default=None,
    metavar="CKPT",
    help="Local open_clip checkpoint (non_spatial), OpenAI ViT-B/32 as the reference.",
)
@click.option("--clip-model", default="ViT-B-32", show_default=True, help="open_clip architecture of --clip.")
@click.option(
    "--detector",
    default=None,
    metavar="DIR",
    help="Local Mask2Former COCO checkpoint (spatial, numeracy): in place of UniDet, so labelled "
    "'detector substitute, not the official number'.",
)
@click.option(
    "--noun-phrases",
    "noun_phrases",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "spacy", "simple"]),
    help="How prompts are parsed: spaCy's en_core_web_sm as the reference (auto: where installed), or "
    "the built-in rule for the template prompts.",
)
@images_option("images_per_prompt", default=10)
@_generation_options(batch=4)
@click.option("--device", default="cpu", show_default=True, help="Device of the scoring models.")
@click.option(
    "--out",
    required=True,
    help="Output dir: images/<category>/ (unless --score-only), results.jsonl, "
    "summary.txt/json, protocol.json.",
)
@_overwrite_option("prompt folders")
def compbench_cmd(
    data,
    model,
    score_only,
    categories,
    split,
    vqa,
    clip_ckpt,
    clip_model,
    detector,
    noun_phrases,
    images_per_prompt,
    batch,
    cfg_scale,
    steps,
    reveal_order,
    seed,
    device,
    out,
    overwrite,
):
    """T2I-CompBench(++): colour / shape / texture by BLIP-VQA, non-spatial by CLIPScore, spatial and numeracy
    by the detector here in place of UniDet (labelled 'detector substitute, not the official number').
    Generates 10 images per prompt of each category's val split (resumable), or scores a folder.

    \b
    Examples:
      t2i-gcpo eval compbench --data T2I-CompBench/examples/dataset --model janus:/ckpt/Janus-Pro-1B \\
          --vqa /ckpt/blip-vqa-capfilt-large --clip /ckpt/ViT-B-32.bin --detector /ckpt/mask2former-swin-s \\
          --out eval/compbench
      t2i-gcpo eval compbench --data …/dataset --score-only my_images/ --vqa /ckpt/blip-vqa-capfilt-large \\
          --categories color,shape,texture --out eval/cb
    """
    from t2i_gcpo.eval.compbench import run_compbench

    summary = run_compbench(
        data,
        out,
        model=model,
        score_only=score_only,
        categories=categories,
        split=split,
        vqa=vqa,
        clip=clip_ckpt,
        clip_model=clip_model,
        detector=detector,
        noun_phrases=noun_phrases,
        n=images_per_prompt,
        batch=batch,
        cfg_scale=cfg_scale,
        steps=steps,
        reveal_order=reveal_order,
        seed=seed,
        device=device,
        overwrite=overwrite,
        check_out=_check_out,
        load_policy=_policy,
    )
    from t2i_gcpo.eval.compbench import format_summary

    click.echo(format_summary(summary))
    out = Path(out)
    _print_files(out)


def _print_partial(out: Path) -> None:
    """Mean partial-credit score per tag (the reward's score, not GenEval's), under the strict table."""
    from t2i_gcpo.outdir import read_jsonl

    by_tag: dict[str, list[float]] = {}
    for r in read_jsonl(out / "results.jsonl", dict[str, str | float | bool | None]):
        by_tag.setdefault(r["tag"], []).append(float(r["partial"]))
    cells = ", ".join(f"{t} {sum(v) / len(v):.3f}" for t, v in by_tag.items())
    mean = sum(sum(v) / len(v) for v in by_tag.values()) / max(len(by_tag), 1)
    click.echo(
        f"partial credit, the reward's score, not GenEval's "
        f"(docs/evaluation/geneval.md#geneval-as-a-reward): {cells}; mean of the tags {mean:.3f}"
    )


@eval_cmd.command("dpg", context_settings=CTX)
@click.option("--model", default=None, help="Model to generate with.")
@click.option(
    "--score-only", "score_only", default=None, metavar="DIR", help="Score existing <item_id>.png 2×2 grids."
)
@click.option("--csv", "csv_path", required=True, help="DPG-Bench question file dpg_bench.csv.")
@click.option("--vqa", required=True, help="Local transformers VQA checkpoint (BLIP VQA).")
@_generation_options(batch=4)
@click.option("--device", default="cpu", show_default=True)
@click.option(
    "--out", required=True, help="Output dir: images/ (unless --score-only), results.jsonl, summary.txt/json."
)
@_overwrite_option("grids")
def dpg_cmd(
    model, score_only, csv_path, vqa, batch, cfg_scale, steps, reveal_order, seed, device, out, overwrite
):
    """DPG-Bench: 4 images per prompt tiled 2×2, a local VQA model answers every question per tile,
    parent zeroing, per-category scores. Labelled 'DPG-Bench (proxy VQA: <model>)'."""
    from t2i_gcpo.errors import UserError
    from t2i_gcpo.eval.dpg import (
        VQAModel,
        check_dpg_resumable,
        format_dpg_summary,
        generate_dpg,
        load_dpg_prompts,
        read_dpg_csv,
        score_dpg_folder,
    )
    from t2i_gcpo.eval.geneval import image_sampling, masked_asked
    from t2i_gcpo.outdir import check_settings_record, write_settings_record
    from t2i_gcpo.policies.registry import model_identity

    if bool(model) == bool(score_only):
        raise UserError("give either --model (generate, then score) or --score-only DIR")
    if overwrite and not model:
        raise UserError("--overwrite regenerates grids: it needs --model, not --score-only")
    if batch < 1:
        raise UserError(f"--batch must be >= 1 (got {batch})")
    out = _check_out(out)
    source = {"--score-only": score_only and os.path.realpath(score_only)}
    check_settings_record(out, "eval dpg", source, redo="--overwrite", redoing=overwrite)
    prompts = load_dpg_prompts() if model else None
    if model and not overwrite:  # refuse grids of other prompts or settings before loading any model
        known = {
            "model": model_identity(model),
            "seed": seed,
            "temperature": 1.0,
            "top_k": 0,
            **({"cfg_scale": cfg_scale} if cfg_scale is not None else {}),
            **masked_asked(steps, reveal_order),
        }
        check_dpg_resumable(out / "images", prompts, known)
    read_dpg_csv(csv_path)  # fail on a bad CSV before generating anything
    vqa_model = VQAModel.from_pretrained(vqa, device=device)
    root = Path(score_only) if score_only else out / "images"
    write_settings_record(out, "eval dpg", source)
    if model:
        policy = _policy(model)
        sampling = image_sampling(policy, cfg_scale=cfg_scale, steps=steps, reveal_order=reveal_order)
        generate_dpg(
            policy,
            prompts,
            root,
            sampling,
            batch=batch,
            seed=seed,
            model=model_identity(model),
            overwrite=overwrite,
        )
    items = [str(p["item_id"]) for p in prompts] if model else None
    result = score_dpg_folder(root, csv_path, vqa_model, out, items=items)
    from t2i_gcpo.eval.dpg import dpg_protocol_fields
    from t2i_gcpo.eval.records.protocol import protocol_record, scorer_record, write_protocol

    write_protocol(
        out,
        protocol_record(
            "dpg",
            data=[csv_path],
            scorer=scorer_record("vqa", os.path.realpath(vqa), label=result["label"]),
            aggregate="items",
            images=str(root.resolve()),
            **dpg_protocol_fields(root),
        ),
    )
    click.echo(format_dpg_summary(result))
    _print_files(out)


def _n_option(default: int | None, help: str):
    """--n: images per prompt, checked as eval_images_per_prompt."""
    from t2i_gcpo.commands.options import config_value

    return click.option(
        "--n",
        "n",
        type=int,
        default=default,
        show_default=default is not None,
        help=help,
        callback=config_value("eval_images_per_prompt"),
    )


def _judge_options(command):
    """--judge-model, --concurrency, --timeout, --retries, --backoff: how the judge is asked."""
    for option in reversed(
        (
            click.option(
                "--judge-model",
                default=None,
                metavar="NAME",
                help="The model name the judge serves "
                "[default: its only one]. An API key is read from $OPENAI_API_KEY.",
            ),
            click.option(
                "--concurrency", default=8, show_default=True, help="Judge requests in flight at most."
            ),
            click.option(
                "--timeout",
                type=float,
                default=None,
                help="Seconds a judge request may take [default: 60; eval judge: 120].",
            ),
            click.option(
                "--retries",
                default=2,
                show_default=True,
                help="Tries after the first for a failed request "
                "or an answer that cannot be read; then the evaluation stops, its answers kept.",
            ),
            click.option(
                "--backoff",
                type=float,
                default=1.0,
                show_default=True,
                help="Seconds before the first retry (doubling).",
            ),
        )
    ):
        command = option(command)
    return command


# eval/suites/geneval2.py METHODS, repeated so that --help imports nothing (a test checks they agree)
GENEVAL2_METHODS = ("soft_tifa_gm", "soft_tifa_am", "tifa", "vqascore")


@eval_cmd.command("geneval2", context_settings=CTX)
@click.option(
    "--data",
    required=True,
    metavar="FILE",
    help="GenEval 2's geneval2_data.jsonl, your copy "
    "(github.com/facebookresearch/GenEval2; CC BY-NC 4.0, so not shipped).",
)
@click.option("--model", default=None, help="Model to generate with: " + models_help() + ".")
@click.option(
    "--score-only",
    "score_only",
    default=None,
    metavar="DIR",
    help="Score a GenEval-layout folder of these prompts instead (e.g. OUT/images of an earlier run).",
)
@click.option(
    "--images",
    "images",
    default=None,
    metavar="MAP.json",
    help="Score the reference's image map instead: a JSON object {prompt: image path}.",
)
@click.option(
    "--vqa",
    default=None,
    metavar="DIR",
    help="A local VLM folder that answers the questions "
    "(transformers image-text-to-text: Qwen3-VL-8B-Instruct is the reference's; Qwen2.5-VL …).",
)
@click.option(
    "--judge",
    default=None,
    metavar="URL",
    help="Or an OpenAI-compatible server (vLLM, SGLang: "
    "http://127.0.0.1:8000/v1) serving a VLM with log-probabilities.",
)
@click.option(
    "--method",
    type=click.Choice(GENEVAL2_METHODS),
    default="soft_tifa_gm",
    show_default=True,
    help=(
        "The headline score (Soft-TIFA AM, GM and TIFA come from the same questions; VQAScore asks its own)."
    ),
)
@_n_option(1, "Images per prompt (the reference scores one).")
@_generation_options(batch=4)
@click.option("--device", default="cpu", show_default=True, help="Device of the VQA model.")
@click.option(
    "--vqa-dtype",
    type=click.Choice(("auto", "float32", "bfloat16", "float16")),
    default="auto",
    show_default=True,
    help="The VQA model's dtype (auto: its checkpoint's, as the reference loads it).",
)
@click.option("--vqa-batch", default=8, show_default=True, help="Questions per VQA forward pass.")
@_judge_options
@_asked_out_options
def geneval2_cmd(
    data,
    model,
    score_only,
    images,
    vqa,
    judge,
    method,
    n,
    batch,
    cfg_scale,
    steps,
    reveal_order,
    seed,
    device,
    vqa_dtype,
    vqa_batch,
    judge_model,
    concurrency,
    timeout,
    retries,
    backoff,
    out,
    overwrite,
):
    """GenEval 2's 800 compositional prompts: generate (resumable), ask a VQA model each atom's question
    and score Soft-TIFA (AM per atom, GM per prompt) as the reference does, with TIFA, per-skill and
    per-atom-count tables. The answers' probabilities are read from the model's logits (or the judge's
    log-probabilities); a resumed evaluation asks nothing it has. docs/evaluation/geneval2.md.

    \b
    Examples:
      t2i-gcpo eval geneval2 --data geneval2_data.jsonl --model janus:/ckpt/Janus-Pro-1B \\
          --vqa /ckpt/Qwen3-VL-8B-Instruct --device cuda --out eval/g2-janus1b
      t2i-gcpo eval geneval2 --data geneval2_data.jsonl --score-only eval/g2-janus1b/images \\
          --judge http://127.0.0.1:8000/v1 --judge-model Qwen3-VL-8B-Instruct --out eval/g2-judge
    """
    from t2i_gcpo.api import evaluate_geneval2

    summary = evaluate_geneval2(
        out,
        data,
        model,
        vqa=vqa,
        judge=judge,
        judge_model=judge_model,
        method=method,
        score_only=score_only,
        images=images,
        n=n,
        batch=batch,
        cfg_scale=cfg_scale,
        steps=steps,
        reveal_order=reveal_order,
        seed=seed,
        device=device,
        vqa_dtype=vqa_dtype,
        vqa_batch=vqa_batch,
        concurrency=concurrency,
        timeout=60.0 if timeout is None else timeout,
        retries=retries,
        backoff=backoff,
        overwrite=overwrite,
    )
    from t2i_gcpo.eval.suites.geneval2 import format_summary

    click.echo(format_summary(summary))
    _print_files(Path(out), "summary.json")


def _suites_help() -> str:
    from t2i_gcpo.eval.suites import suites_help

    return suites_help("judge")


@eval_cmd.command("judge", context_settings=CTX)
@click.option(  # checked against the registry when the command runs: a suite registered later is taken too
    "--suite", required=True, metavar="NAME", help="The suite: " + _suites_help() + "."
)
@click.option("--data", required=True, metavar="PATH", help="The suite's data file or folder (see --suite).")
@click.option(
    "--judge",
    required=True,
    metavar="URL",
    help="The judge: an OpenAI-compatible server's URL "
    "(vLLM, SGLang: http://127.0.0.1:8000/v1), or a hosted API's.",
)
@click.option("--model", default=None, help="Model to generate with: " + models_help() + ".")
@click.option(
    "--score-only",
    "score_only",
    default=None,
    metavar="DIR",
    help="Judge existing images instead: a "
    "GenEval-layout folder of these prompts, or a folder in the suite's own layout (docs).",
)
@_n_option(None, "Images per prompt [default: the suite's: UniGenBench 4, WISE and TIIF 1].")
@_generation_options(batch=4)
@click.option(
    "--temperature", type=float, default=None, help="The judge's temperature [default: the suite's, 0]."
)
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="The judge's answer limit [default: the suite's].",
)
@_judge_options
@_asked_out_options
def judge_cmd(
    suite,
    data,
    judge,
    model,
    score_only,
    n,
    batch,
    cfg_scale,
    steps,
    reveal_order,
    seed,
    temperature,
    max_tokens,
    judge_model,
    concurrency,
    timeout,
    retries,
    backoff,
    out,
    overwrite,
):
    """A question-based suite scored by a VLM judge: generate (resumable), send every image with the suite's
    question, read the judge's answer with the suite's rule and aggregate as its paper does. Every answer is
    recorded with the score it gave (answers.jsonl); a resumed evaluation asks nothing it has; a judge that
    is down, stalls or answers what the rule cannot read stops it after the retries, in one line.
    docs/evaluation/judge-suites.md.

    \b
    Examples:
      t2i-gcpo eval judge --suite wise --data WISE/data_verified/merge.json \\
          --model janus:/ckpt/Janus-Pro-1B \\
          --judge http://127.0.0.1:8000/v1 --judge-model Qwen3.5-35B-A3B --out eval/wise-janus1b
      t2i-gcpo eval judge --suite unigenbench --data UniGenBench/data/test_prompts_en.csv \\
          --score-only my_images/ --judge http://127.0.0.1:8080/v1 --judge-model QwenVL --out eval/ugb
    """
    from t2i_gcpo.api import evaluate_judge
    from t2i_gcpo.eval.suites.driver import format_summary

    summary = evaluate_judge(
        out,
        suite,
        data,
        judge,
        model,
        judge_model=judge_model,
        score_only=score_only,
        n=n,
        batch=batch,
        cfg_scale=cfg_scale,
        steps=steps,
        reveal_order=reveal_order,
        seed=seed,
        temperature=temperature,
        max_tokens=max_tokens,
        concurrency=concurrency,
        timeout=120.0 if timeout is None else timeout,
        retries=retries,
        backoff=backoff,
        overwrite=overwrite,
    )
    click.echo(format_summary(summary))
    _print_files(Path(out), "summary.json")
