"""Section `rewards`: images per second of each image reward of the registry (docs/guides/rewards.md), as a
training step calls it — B decoded images in [0, 1] and their prompts, one call.

Shapes: at the real shape where the weights are here — `ocr` (RapidOCR's PP-OCRv4 ONNX models ship in its
wheel) on 384 × 384 images of rendered text (Janus-Pro's image size), `shapeworld` (the embedded world's
exact detector) on its own 32 × 32 images — and otherwise at a tiny shape: the real architecture with tiny
widths and random weights (tests/tiny_models.py; PickScore, HPS, the aesthetic predictor, BLIP VQA, CLIP)
fed 384 × 384 images, so what is timed is the preprocessing (resize, crop, normalise, from 384 px) plus a
tiny forward — not the real model's cost (PickScore and HPS are CLIP-H, about 1 B parameters). `judge` runs
against a loopback fake server that answers at once: the client's cost (resize to 512, PNG encoding,
base64, HTTP, parsing), with the default concurrency (8). `geneval` is not timed: it needs a Mask2Former
checkpoint. The full run (not ``--quick``) adds the model rewards at their real architectures with random
weights (``real, random weights``: speed does not depend on the weights' values): PickScore's CLIP-H as a
transformers CLIPModel, HPS's open_clip ViT-H-14, the aesthetic predictor's OpenAI ViT-L-14 (QuickGELU) and
MLP, and BLIP VQA at blip-vqa-base's configuration, each built in memory (nothing read or downloaded; the
text side uses the tests' tiny tokenizers, a negligible part of the cost), one at a time: a warm-up call on
one image, then one timed call on 2. Each reward: one warm-up call, then the best of the repeats; float32, the
section's threads (torch's, and onnxruntime's for `ocr`).
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.suite.common import REPO, Context, load_average, shared_cpu_note

TITLE = "Rewards: images per second of each form (`rewards`)"
SIZE = 384  # Janus-Pro's images
WORDS = ["OPEN", "BAKERY", "EXIT 12", "HELLO", "SALE", "PIZZA", "TICKETS", "MOON"]


def tiny_models() -> Any:
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))
    import tiny_models

    return tiny_models


def rendered(n: int, size: int | None = None) -> tuple[torch.Tensor, list[str]]:
    """n images of a phrase in black on white (`size` px, default SIZE), and prompts quoting the phrase."""
    from PIL import Image, ImageDraw, ImageFont

    size = size or SIZE
    images, prompts = [], []
    for i in range(n):
        word = WORDS[i % len(WORDS)]
        im = Image.new("RGB", (size, size), "white")
        ImageDraw.Draw(im).text(
            (size // 16, size // 2 - size // 16),
            word,
            fill="black",
            font=ImageFont.load_default(size=size // 8),
        )
        images.append(torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float() / 255)
        prompts.append(f'a sign that says "{word}"')
    return torch.stack(images), prompts


class _Judge(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        payload = json.dumps({"choices": [{"message": {"content": "Final Score: 4"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


FORMS = ("shapeworld", "ocr", "judge", "pickscore", "hps", "aesthetic", "vqa")  # the forms timed, in order


def specs(root: Path, judge_url: str, threads: int) -> Iterator[tuple[str, str, str, str]]:
    """(form, shape, spec, what) of each timed reward of FORMS, its tiny weights written under `root` when
    its turn comes (ocr only where the extra is installed)."""
    import importlib.util

    tm = tiny_models()
    for form in FORMS:
        if form == "shapeworld":
            yield form, "real", "shapeworld", "the embedded detector, 32 × 32 images"
        elif form == "ocr" and importlib.util.find_spec("rapidocr_onnxruntime") is not None:
            yield form, "real", f"ocr:threads={threads}", "RapidOCR PP-OCRv4 (ONNX), rendered text"
        elif form == "judge":
            yield form, "client", f"judge:{judge_url}", "loopback server answering at once"
        elif form == "pickscore":
            yield (
                form,
                "tiny",
                f"pickscore:{tm.build_tiny_pickscore(root / 'PickScore_v1')}",
                "CLIPModel d 32, 32 px",
            )
        elif form == "hps":
            path = tm.build_tiny_hps(root / "HPS_v2.1_compressed.pt")
            yield form, "tiny", f"hps:{path},arch={tm.TINY_HPS}", "open_clip ViT-H-14 layout, d 32, 28 px"
        elif form == "aesthetic":
            clip, head = tm.build_tiny_aesthetic(root / "aesthetic")
            yield (
                form,
                "tiny",
                f"aesthetic:{clip},'{head}',clip_model={tm.TINY_AESTHETIC_CLIP}",
                "CLIP d 32 + MLP",
            )
        elif form == "vqa":
            yield form, "tiny", f"vqa:{tm.build_tiny_blip_vqa(root / 'blip-vqa')}", "BLIP VQA d 32, 32 px"


def real_shape(tm: Any, device: str) -> Iterator[tuple[str, str, Any]]:
    """(form, model, reward object) at the real architectures with random weights (module docstring), one
    at a time (a CLIP-H is 4 GB in float32: each is built after the one before is dropped)."""
    import open_clip
    from transformers import AutoTokenizer, BlipConfig, BlipForQuestionAnswering, CLIPConfig, CLIPModel
    from transformers.models.blip import BlipImageProcessorPil
    from transformers.models.clip import CLIPImageProcessorPil

    from t2i_gcpo.rewards.forms.aesthetic import AestheticReward
    from t2i_gcpo.rewards.forms.hps import HPSReward
    from t2i_gcpo.rewards.forms.pickscore import PickScoreReward
    from t2i_gcpo.rewards.forms.vqa import VQAReward

    with tempfile.TemporaryDirectory() as tmp:
        tm.write_clip_tokenizer(tmp)
        clip_tok = AutoTokenizer.from_pretrained(tmp)
        blip_tok_dir = tm.build_tiny_blip_vqa(Path(tmp) / "blip")  # its word-level BERT vocabulary
        blip_tok = AutoTokenizer.from_pretrained(blip_tok_dir)
    vit_h = dict(
        hidden_size=1280,
        intermediate_size=5120,
        num_hidden_layers=32,
        num_attention_heads=16,
        image_size=224,
        patch_size=14,
    )  # ViT-H/14, laion/CLIP-ViT-H-14-laion2B-s32B-b79K's config
    text_h = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16)
    pick = CLIPModel(CLIPConfig(text_config=text_h, vision_config=vit_h, projection_dim=1024)).to(device)
    yield (
        "pickscore",
        "CLIP-H/14 (transformers), 224 px",
        PickScoreReward(pick, CLIPImageProcessorPil(), clip_tok),
    )
    del pick
    hps = open_clip.create_model("ViT-H-14", pretrained=None, device=device)
    yield "hps", "open_clip ViT-H-14, 224 px", HPSReward(hps, open_clip.get_tokenizer("ViT-H-14"), 224)
    del hps
    clip_l = open_clip.create_model("ViT-L-14", pretrained=None, force_quick_gelu=True, device=device)
    head = torch.nn.Sequential(
        torch.nn.Linear(768, 1024),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(1024, 128),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(128, 64),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(64, 16),
        torch.nn.Linear(16, 1),
    )
    yield "aesthetic", "OpenAI ViT-L/14 + MLP, 224 px", AestheticReward(clip_l, head.to(device).eval())
    del clip_l
    blip = BlipForQuestionAnswering(BlipConfig()).to(device)  # blip-vqa-base's sizes: ViT-B/16 at 384 px
    processor = BlipImageProcessorPil(size={"height": 384, "width": 384})
    yield "vqa", "BLIP VQA base, 384 px", VQAReward(blip.eval(), processor, blip_tok)


def run(ctx: Context) -> dict:
    from t2i_gcpo.rewards.registry import build_reward

    batch, repeats = ctx.pick(4, 8), ctx.pick(2, 3)
    load = load_average()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for form, shape, spec, what in specs(
                Path(tmp), f"http://127.0.0.1:{server.server_address[1]}/v1", ctx.threads
            ):
                reward = build_reward(spec, device=ctx.device)
                if form == "shapeworld":
                    from t2i_gcpo.worlds.shapeworld import generate_metadata, render, sample_scene

                    meta, rng = generate_metadata(batch, seed=0), np.random.default_rng(0)
                    images = torch.stack(
                        [
                            torch.from_numpy(render(sample_scene(m, rng))).permute(2, 0, 1).float() / 255
                            for m in meta
                        ]
                    )
                    prompts = [m["prompt"] for m in meta]
                else:
                    images, prompts, meta = *rendered(batch), [{}] * batch
                reward(images, prompts, meta)  # warm-up
                best = float("inf")
                for _ in range(repeats):
                    ctx.sync()
                    tic = time.perf_counter()
                    reward(images, prompts, meta)
                    ctx.sync()
                    best = min(best, time.perf_counter() - tic)
                rows.append(
                    {
                        "reward": form,
                        "shape": shape,
                        "model": what,
                        "image": f"{images.shape[-1]} px",
                        "batch": batch,
                        "seconds": best,
                        "images_per_s": batch / best,
                    }
                )
        if not ctx.quick:  # the model rewards at their real architectures, random weights
            images, prompts = rendered(2)
            for form, what, reward in real_shape(tiny_models(), ctx.device):
                with torch.no_grad():
                    reward(images[:1], prompts[:1], [{}])  # warm-up
                    ctx.sync()
                    tic = time.perf_counter()
                    reward(images, prompts, [{}] * 2)
                    ctx.sync()
                seconds = time.perf_counter() - tic
                rows.append(
                    {
                        "reward": form,
                        "shape": "real, random weights",
                        "model": what,
                        "image": f"{SIZE} px",
                        "batch": 2,
                        "seconds": seconds,
                        "images_per_s": 2 / seconds,
                    }
                )
                del reward
                gc.collect()
    finally:
        server.shutdown()
        server.server_close()
    by = {r["reward"]: r for r in rows if r["shape"] == "real"}
    real = {r["reward"]: r["images_per_s"] for r in rows if r["shape"] == "real, random weights"}
    ocr = by.get("ocr")
    reading = (
        (
            f"The OCR reward, on its real models, scores {ocr['images_per_s']:.2g} images/s at {SIZE} px on "
            f"{ctx.threads} thread(s): for a step of 128 images that is "
            f"{128 / ocr['images_per_s']:.0f} s of scoring. "
            if ocr
            else "The OCR extra is not installed here: `ocr` was not timed. "
        )
        + "The tiny-shape rows time preprocessing and plumbing, not the real models (PickScore and HPS are "
        "CLIP-H, about 1 B parameters)"
        + (
            f"; at their real shapes (random weights) PickScore scores {real['pickscore']:.2g}, HPS "
            f"{real['hps']:.2g}, the aesthetic predictor {real['aesthetic']:.2g} and VQAScore "
            f"{real['vqa']:.2g} images/s here, so on a CPU the reward model, not the sampler, "
            f"can bound a step"
            if len(real) == 4
            else ""
        )
        + "; the judge row is the client's cost with a server that answers at once."
        + shared_cpu_note(load)
    )
    return {
        "title": TITLE,
        "timing": f"best of {repeats} calls of {batch} images after one warm-up call, float32",
        "columns": [
            ("reward", "reward"),
            ("shape", "shape"),
            ("model", "model"),
            ("image", "input"),
            ("batch", "images"),
            ("seconds", "seconds"),
            ("images_per_s", "images/s"),
        ],
        "rows": rows,
        "summary": {
            "images_per_s": {f"{r['reward']} ({r['shape']})": r["images_per_s"] for r in rows},
            "load_average": load,
        },
        "reading": reading,
    }
