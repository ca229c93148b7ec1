"""A tiny random aMUSEd pipeline folder built offline (UVit2DModel + VQModel + a CLIP text encoder and
a CLIP tokenizer written from a tiny vocab.json / merges.txt), for tests/test_amused*.py."""

from __future__ import annotations

import json
import os

import torch

SIDE, K, MASK_ID = 4, 16, 17  # 4×4 tokens, 16 codes, mask id ≠ K (as in aMUSEd: 8255 for K = 8192)
T = SIDE * SIDE


def write_clip_tokenizer(folder) -> None:
    """A tiny byte-level CLIP BPE tokenizer: specials, letters (with and without </w>), two merges."""
    os.makedirs(folder, exist_ok=True)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = (
        ["<|startoftext|>", "<|endoftext|>"] + letters + [c + "</w>" for c in letters] + ["re", "red</w>"]
    )
    with open(os.path.join(folder, "vocab.json"), "w") as f:
        json.dump({t: i for i, t in enumerate(tokens)}, f)
    with open(os.path.join(folder, "merges.txt"), "w") as f:
        f.write("#version: 0.2\nr e\nre d</w>\n")
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "CLIPTokenizer", "model_max_length": 16,
                "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
            },
            f,
        )  # fmt: skip


def build_tiny_amused(path) -> None:
    from diffusers import AmusedScheduler, UVit2DModel, VQModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    torch.manual_seed(0)
    write_clip_tokenizer(os.path.join(path, "tokenizer"))
    text = CLIPTextModelWithProjection(
        CLIPTextConfig(
            vocab_size=56, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=16, projection_dim=16, bos_token_id=0, eos_token_id=1, pad_token_id=1,
        )
    )  # fmt: skip
    transformer = UVit2DModel(
        hidden_size=16, use_bias=False, cond_embed_dim=16, micro_cond_encode_dim=2, micro_cond_embed_dim=10,
        encoder_hidden_size=16, vocab_size=MASK_ID + 1, codebook_size=K, in_channels=8, block_out_channels=8,
        num_res_blocks=1, downsample=True, upsample=True, block_num_heads=1, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=16, sample_size=SIDE,
    )  # fmt: skip
    with torch.no_grad():  # far-from-uniform distributions, so contexts and steps differ measurably
        transformer.mlm_layer.conv2.weight.mul_(20)
    vq = VQModel(
        act_fn="silu", block_out_channels=[8, 8], down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2, in_channels=3, out_channels=3, latent_channels=4,
        layers_per_block=1, norm_num_groups=8, num_vq_embeddings=K, vq_embed_dim=4, sample_size=8,
        mid_block_add_attention=False, lookup_from_codebook=True, force_upcast=False,
    )  # fmt: skip
    transformer.save_pretrained(os.path.join(path, "transformer"))
    vq.save_pretrained(os.path.join(path, "vqvae"))
    text.save_pretrained(os.path.join(path, "text_encoder"))
    AmusedScheduler(mask_token_id=MASK_ID).save_pretrained(os.path.join(path, "scheduler"))
