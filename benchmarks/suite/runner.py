"""``python -m benchmarks``: run the suite's sections and write one JSON and one markdown page.

    python -m benchmarks                         # every section (≲ 20 min at 2 threads on a quiet CPU)
    python -m benchmarks --quick                 # smaller batches and repeats (≲ 4 min)
    python -m benchmarks --only rl_step,scaling  # re-measure these, keep the others' earlier results
    python -m benchmarks --threads 4 --device cuda
    python -m benchmarks --only compare_cost --compare-dir runs/cmp5 --compare-reference runs/cmp5-fp32

Results: benchmarks/results/suite.json and docs/performance.md (rewritten after every section, so an
interrupted run keeps what it measured). Sections: peak, samplers, decode_loops, text_vs_generate,
janus_vs_generate, janus_scale, llamagen, meissonic_scale, rl_step, scaling, branch_cost, tree_step, rewards,
reward_overlap, reward_server, step_memory, and two that read finished runs instead of timing anything:
progress (one training run, --progress-run) and compare_cost (a `t2i-gcpo compare` output, --compare-dir,
optionally paired against --compare-reference) (benchmarks/suite/<name>.py; each module's docstring says what
it measures and how).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import sys
import time
from pathlib import Path

from benchmarks.suite import SECTIONS

REPO = Path(__file__).resolve().parents[2]
JSON_PATH = REPO / "benchmarks" / "results" / "suite.json"
MD_PATH = REPO / "docs" / "performance.md"


def parse_only(value: str | None) -> list[str]:
    """``--only a,b`` → the named sections in suite order; every section when not given."""
    if not value:
        return list(SECTIONS)
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise SystemExit(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    return [n for n in SECTIONS if n in names]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="a few-minute subset: smaller batches and repeats")
    ap.add_argument("--only", metavar="SECTION[,SECTION]", help=f"run these sections ({', '.join(SECTIONS)})")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available")
    ap.add_argument(
        "--progress-run",
        dest="run",
        metavar="DIR",
        default=None,
        help="section progress: the training run it reads (default: the newest long runs/gcpo-*); it selects "
        "no section (--only does)",
    )
    ap.add_argument(
        "--compare-dir",
        metavar="DIR",
        default=None,
        help="section compare_cost: a finished `t2i-gcpo compare` output (without it the section keeps its "
        "earlier result)",
    )
    ap.add_argument(
        "--compare-reference",
        metavar="DIR",
        default=None,
        help="section compare_cost: the same comparison run another way (e.g. float32); final scores are "
        "paired by seed against it",
    )
    ap.add_argument(
        "--json", type=Path, default=JSON_PATH, help=f"results JSON (default {JSON_PATH.relative_to(REPO)})"
    )
    ap.add_argument(
        "--md", type=Path, default=MD_PATH, help=f"markdown page (default {MD_PATH.relative_to(REPO)})"
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    names = parse_only(args.only)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.device == "cpu":  # the trainer picks CUDA whenever it sees one
        os.environ["CUDA_VISIBLE_DEVICES"] = ""

    import torch

    from benchmarks.suite import report
    from benchmarks.suite.common import Context, machine

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    torch.set_num_threads(args.threads)
    command = shlex.join(["python", "-m", "benchmarks", *argv])
    existing = report.load(args.json)
    ctx = Context(
        quick=args.quick,
        threads=args.threads,
        device=device,
        run=args.run,
        previous=existing["sections"],
        compare_dir=args.compare_dir,
        compare_reference=args.compare_reference,
    )
    meta = {"command": command, "quick": args.quick, "machine": machine(device, args.threads)}
    print(
        f"{command}: {len(names)} section(s) on {meta['machine']['cpu']} ({device}, {args.threads} threads)"
    )
    total = time.perf_counter()
    for i, name in enumerate(names, 1):
        module = importlib.import_module(f"benchmarks.suite.{name}")
        print(f"[{i}/{len(names)}] {name}: {module.TITLE} …", flush=True)
        torch.manual_seed(0)
        tic = time.perf_counter()
        section = module.run(ctx)
        seconds = time.perf_counter() - tic
        if section is None:  # the section had nothing to read: its earlier result stays
            print(f"[{i}/{len(names)}] {name}: nothing to measure, earlier result kept", flush=True)
            continue
        section["run"] = {
            "command": command,
            "date": meta["machine"]["date"],
            "quick": args.quick,
            "threads": args.threads,
            "device": device,
            "seconds": seconds,
        }
        ctx.results[name] = section
        data = report.merge(existing, ctx.results, meta, SECTIONS)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1) + "\n")
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(report.render(data))
        print(f"[{i}/{len(names)}] {name} done in {seconds:.0f} s", flush=True)
    print(f"{len(names)} section(s) in {time.perf_counter() - total:.0f} s; wrote {args.json} and {args.md}")
