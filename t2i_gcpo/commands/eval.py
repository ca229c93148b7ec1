"""`t2i-gcpo eval geneval|dpg|shapeworld`: benchmarks with PyPI-only dependencies."""

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
    """Evaluate a model on GenEval, DPG-Bench, T2I-CompBench or the ShapeWorld held-out prompts, and compare
    two evaluations item by item.

    \b
    Examples:
      t2i-gcpo eval shapeworld --model shapeworld --out eval/base
      t2i-gcpo eval geneval --model janus:/ckpt/Janus-Pro-1B --detector /ckpt/mask2former-swin-s \\
          --clip /ckpt/clip-vit-l-14.bin --out eval/janus1b
      t2i-gcpo eval geneval --score-only my_images/ --detector /ckpt/mask2former-swin-s --clip … --out eval/x
      t2i-gcpo eval dpg --model janus:/ckpt/Janus-Pro-1B --csv dpg_bench.csv --vqa /ckpt/blip-vqa-base --out eval/dpg
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
    from t2i_gcpo.eval.paired import compare_evaluations, format_comparison, strict_json

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


def _print_summary(out: Path, summary: dict, partial: bool = False) -> None:
    """GenEval's table, (`partial`) the partial credit, where the files are, and last the headline: the
    strict score with its 95 % interval over the images sampled (stats.proportions_se over the tags)."""
    from t2i_gcpo.scoring.geneval_rules import format_summary
    from t2i_gcpo.stats import proportions_se

    click.echo(format_summary(summary))
    if partial:
        _print_partial(out)
    click.echo(
        f"results: {out / 'results.jsonl'}  summary: {out / 'summary.txt'}  protocol: {out / 'protocol.json'}"
    )
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
@click.option("--batch", default=4, show_default=True, help="Prompts per generation call.")
@cfg_option(help="CFG scale [default: the model's].")
@masked_sampling_options
@seed_option
@click.option("--device", default="cpu", show_default=True, help="Device of the scoring models.")
@click.option(
    "--out", required=True, help="Output dir: images/ (unless --score-only), results.jsonl, summary.txt/json."
)
@_overwrite_option("prompt folders")
def geneval_cmd(
    model, score_only, detector, clip_ckpt, clip_model, images_per_prompt, batch, cfg_scale, steps, reveal_order,
    seed, device, out, overwrite,
):  # fmt: skip
    """GenEval's 553 prompts: generate 4 images each (resumable), then score them with Mask2Former and
    CLIP colour classification through GenEval's rules. Output as GenEval's summary."""
    from t2i_gcpo.api import evaluate_geneval

    summary = evaluate_geneval(out, detector, model, clip=clip_ckpt, clip_model=clip_model, score_only=score_only,
                               n=images_per_prompt, batch=batch, cfg_scale=cfg_scale, steps=steps,
                               reveal_order=reveal_order, seed=seed, device=device, overwrite=overwrite)  # fmt: skip
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
@click.option("--batch", default=16, show_default=True, help="Prompts per generation call.")
@cfg_option(help="CFG scale [default: the model's].")
@masked_sampling_options
@seed_option
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
    summary = evaluate_shapeworld(out, model, Path(prompts) if prompts else None, images_per_prompt, batch=batch,
                                  cfg_scale=cfg_scale, steps=steps, reveal_order=reveal_order, seed=seed,
                                  overwrite=overwrite)  # fmt: skip
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
@click.option("--batch", default=4, show_default=True, help="Prompts per generation call.")
@cfg_option(help="CFG scale [default: the model's].")
@masked_sampling_options
@seed_option
@click.option("--device", default="cpu", show_default=True, help="Device of the scoring models.")
@click.option(
    "--out",
    required=True,
    help="Output dir: images/<category>/ (unless --score-only), results.jsonl, "
    "summary.txt/json, protocol.json.",
)
@_overwrite_option("prompt folders")
def compbench_cmd(
    data, model, score_only, categories, split, vqa, clip_ckpt, clip_model, detector, noun_phrases,
    images_per_prompt, batch, cfg_scale, steps, reveal_order, seed, device, out, overwrite,
):  # fmt: skip
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
        data, out, model=model, score_only=score_only, categories=categories, split=split, vqa=vqa,
        clip=clip_ckpt, clip_model=clip_model, detector=detector, noun_phrases=noun_phrases, n=images_per_prompt,
        batch=batch, cfg_scale=cfg_scale, steps=steps, reveal_order=reveal_order, seed=seed, device=device,
        overwrite=overwrite, check_out=_check_out, load_policy=_policy,
    )  # fmt: skip
    from t2i_gcpo.eval.compbench import format_summary

    click.echo(format_summary(summary))
    out = Path(out)
    click.echo(
        f"results: {out / 'results.jsonl'}  summary: {out / 'summary.txt'}  protocol: {out / 'protocol.json'}"
    )


def _print_partial(out: Path) -> None:
    """Mean partial-credit score per tag (the reward's score, not GenEval's), under the strict table."""
    from t2i_gcpo.outdir import read_jsonl

    by_tag: dict[str, list[float]] = {}
    for r in read_jsonl(out / "results.jsonl", dict[str, str | float | bool | None]):
        by_tag.setdefault(r["tag"], []).append(float(r["partial"]))
    cells = ", ".join(f"{t} {sum(v) / len(v):.3f}" for t, v in by_tag.items())
    mean = sum(sum(v) / len(v) for v in by_tag.values()) / max(len(by_tag), 1)
    click.echo(
        f"partial credit, the reward's score, not GenEval's (docs/evaluation/geneval.md#geneval-as-a-reward): "
        f"{cells}; mean of the tags {mean:.3f}"
    )


@eval_cmd.command("dpg", context_settings=CTX)
@click.option("--model", default=None, help="Model to generate with.")
@click.option(
    "--score-only", "score_only", default=None, metavar="DIR", help="Score existing <item_id>.png 2×2 grids."
)
@click.option("--csv", "csv_path", required=True, help="DPG-Bench question file dpg_bench.csv.")
@click.option("--vqa", required=True, help="Local transformers VQA checkpoint (BLIP VQA).")
@click.option("--batch", default=4, show_default=True, help="Prompts per generation call.")
@cfg_option(help="CFG scale [default: the model's].")
@masked_sampling_options
@seed_option
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
    from t2i_gcpo.eval.layout import model_identity
    from t2i_gcpo.outdir import check_settings_record, write_settings_record

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
        known = {"model": model_identity(model), "seed": seed, "temperature": 1.0, "top_k": 0,
                 **({"cfg_scale": cfg_scale} if cfg_scale is not None else {}),
                 **masked_asked(steps, reveal_order)}  # fmt: skip
        check_dpg_resumable(out / "images", prompts, known)
    read_dpg_csv(csv_path)  # fail on a bad CSV before generating anything
    vqa_model = VQAModel.from_pretrained(vqa, device=device)
    root = Path(score_only) if score_only else out / "images"
    write_settings_record(out, "eval dpg", source)
    if model:
        policy = _policy(model)
        sampling = image_sampling(policy, cfg_scale=cfg_scale, steps=steps, reveal_order=reveal_order)
        generate_dpg(policy, prompts, root, sampling, batch=batch, seed=seed, model=model_identity(model),
                     overwrite=overwrite)  # fmt: skip
    items = [str(p["item_id"]) for p in prompts] if model else None
    result = score_dpg_folder(root, csv_path, vqa_model, out, items=items)
    from t2i_gcpo.eval.dpg import dpg_protocol_fields
    from t2i_gcpo.eval.protocol import protocol_record, scorer_record, write_protocol

    write_protocol(out, protocol_record("dpg", data=[csv_path], scorer=scorer_record("vqa", os.path.realpath(vqa),
                   label=result["label"]), aggregate="items", images=str(root.resolve()),
                   **dpg_protocol_fields(root)))  # fmt: skip
    click.echo(format_dpg_summary(result))
    click.echo(
        f"results: {out / 'results.jsonl'}  summary: {out / 'summary.txt'}  protocol: {out / 'protocol.json'}"
    )
