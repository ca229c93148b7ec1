"""A tiny random BLIP VQA checkpoint in the released layout (config, weights, BERT vocab with BLIP's [DEC]
and [ENC] after it, BlipImageProcessor settings) and a T2I-CompBench data folder, for
tests/eval/test_compbench.py and tests/e2e/test_eval_compare_cli.py."""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "yes",
    "no",
    "a",
    "red",
    "blue",
    "green",
    "circle",
    "square",
    "triangle",
    "and",
    "?",
    "metallic",
    "fluffy",
    "[DEC]",
    "[ENC]",
]
SIZE = 32

PROMPTS = {
    "color": ["a red circle and a blue square", "a green triangle and a red square", "a blue circle"],
    "shape": ["a red circle and a green square"],
    "texture": ["a metallic circle and a fluffy square"],
    "non_spatial": ["a red circle and a blue square"],
    "spatial": ["a cat next to a dog", "a cat on the left of a dog"],
    "numeracy": ["two cats and a dog", "three dogs"],
}


def build_tiny_blip(path, seed: int = 0) -> Path:
    """BlipForQuestionAnswering, one layer each at width 32 on 32 px images, weights drawn wide (std 0.5)
    so the answer moves with the image and the question; [DEC] the decoder's BOS, [ENC] the id after it."""
    from transformers import BertTokenizer, BlipConfig, BlipForQuestionAnswering
    from transformers.models.blip import BlipImageProcessorPil

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    BertTokenizer(str(path / "vocab.txt")).save_pretrained(path)
    text = dict(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        encoder_hidden_size=32,
        bos_token_id=WORDS.index("[DEC]"),
        sep_token_id=3,
        pad_token_id=0,
        max_position_embeddings=64,
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=SIZE,
        patch_size=8,
    )
    torch.manual_seed(seed)
    model = BlipForQuestionAnswering(BlipConfig(text_config=text, vision_config=vision))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.5)
    model.save_pretrained(path)
    BlipImageProcessorPil(size={"height": SIZE, "width": SIZE}).save_pretrained(path)
    return path


def write_compbench_data(folder, prompts: dict[str, list[str]] = PROMPTS) -> Path:
    """<folder>/<category>_val.txt for each category, and new_objects.txt, in the reference's format."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for c, lines in prompts.items():
        (folder / f"{c}_val.txt").write_text("\n".join(lines) + "\n")
    (folder / "new_objects.txt").write_text("cat - cats\ndog - dogs\ndining table - dining tables\n")
    return folder
