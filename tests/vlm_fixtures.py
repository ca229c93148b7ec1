"""A tiny random Qwen3-VL checkpoint in the released layout (config.json, model.safetensors, tokenizer files,
processor config with a chat template), built offline for the GenEval 2 and Soft-TIFA tests, and a small
GenEval 2 data file in the real format (written here: the benchmark's own file is CC BY-NC)."""

from __future__ import annotations

import json
from pathlib import Path

# words made single tokens of the tiny vocabulary (with and without a leading space): the answers asked for
WORDS = ("Yes", "yes", "No", "no", "one", "One", "two", "Two", "three", "Three", "four", "Four")
FAVOURED = ("Ġyes", "Yes", "ĠNo", "four")  # tokens given large logits: one of them wins the argmax
SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Qwen's chat template, cut to what a one-turn image question uses
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% for c in message['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% "
    "endif %}{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}"
)

# the real format (facebookresearch/GenEval2 README); prompts of our own, in ShapeWorld's words
GENEVAL2_ROWS = [
    {
        "prompt": "a photo of a square and a circle",
        "atom_count": 3,
        "vqa_list": [
            ["How many squares are in the image?", "one"],
            ["Are there any squares in the image?", "Yes"],
            ["How many circles are in the image?", "one"],
            ["Are there any circles in the image?", "Yes"],
        ],
        "skills": ["count", "object", "count", "object"],
    },
    {
        "prompt": "a photo of a circle above a triangle",
        "atom_count": 3,
        "vqa_list": [
            ["How many circles are in the image?", "one"],
            ["Are there any circles in the image?", "Yes"],
            ["Is the circle above the triangle?", "Yes"],
            ["How many triangles are in the image?", "one"],
            ["Are there any triangles in the image?", "Yes"],
        ],
        "skills": ["count", "object", "position", "count", "object"],
    },
    {
        "prompt": "a photo of four triangles",
        "atom_count": 2,
        "vqa_list": [
            ["How many triangles are in the image?", "four"],
            ["Are there any triangles in the image?", "Yes"],
        ],
        "skills": ["count", "object"],
    },
]


def write_geneval2_data(path: Path, rows: list[dict] | None = None) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in (rows or GENEVAL2_ROWS)), encoding="utf-8")
    return path


def _tokenizer():
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    merges: list[tuple[str, str]] = []
    # words with a leading space (Ġ) first: their merges outrank the bare words', so " yes" is one token
    for word in [f"Ġ{w}" for w in WORDS] + list(WORDS):
        piece = word[0]
        for ch in word[1:]:
            if (piece, ch) not in merges:
                merges.append((piece, ch))
            piece += ch
            vocab.setdefault(piece, len(vocab))
    for s in SPECIALS:
        vocab.setdefault(s, len(vocab))
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges)
    tok.add_special_tokens({"additional_special_tokens": list(SPECIALS[1:])})
    return tok


def build_tiny_qwen3_vl(folder: Path, seed: int = 0) -> Path:
    """Save a randomly initialised tiny Qwen3-VL (about 0.2 M parameters) with its processor into `folder`."""
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl import Qwen3VLVideoProcessor

    tok = _tokenizer()
    ids = {s: tok.convert_tokens_to_ids(s) for s in SPECIALS}
    image_processor = Qwen2VLImageProcessor(
        patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=56 * 56, max_pixels=56 * 56 * 4
    )
    video_processor = Qwen3VLVideoProcessor(patch_size=14, merge_size=2, temporal_patch_size=2)
    processor = Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )
    config = Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            eos_token_id=ids["<|im_end|>"],
            rope_scaling={"rope_type": "default", "mrope_section": [2, 1, 1]},
        ),
        vision_config=dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=32,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            deepstack_visual_indexes=[0],
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    # a few answers' tokens get large logits: TIFA then hits some atoms and misses others
    with torch.no_grad():
        model.lm_head.weight[[tok.convert_tokens_to_ids(t) for t in FAVOURED]] *= 60.0
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def reference_probability(model, processor, image, question: str, answers) -> tuple[float, str]:
    """The reference's send_message_with_image (facebookresearch/GenEval2 evaluation.py), written again: one
    token generated greedily with its scores, their softmax summed over each answer's first token id."""
    import torch

    messages = [
        {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": question}]}
    ]
    inputs = processor.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    with torch.no_grad():
        out = model.generate(
            **inputs, max_new_tokens=1, do_sample=False, output_scores=True, return_dict_in_generate=True
        )
    probs = torch.nn.functional.softmax(out.scores[0], dim=-1)
    p = sum(probs[0, processor.tokenizer.encode(a)[0]].item() for a in answers)
    return p, processor.batch_decode([torch.argmax(probs)])[0]
