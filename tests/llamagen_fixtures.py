"""Tiny random LlamaGen-T2I releases, written in the released layout (nothing downloaded):

- ``t2i_tiny_stage1_8.pt``: a torch file ``{"model": state dict, "optimizer": …, "steps": …, "args":
  Namespace}`` as LlamaGen's train_t2i.py saves it, the state dict under the released key names (spelled out
  here from the reference's module tree, not from t2i_gcpo's model);
- ``vq_ds16_t2i.pt``: ``{"model": state dict}`` of a VQ with the reference's encoder and decoder names;
- ``flan-t5-xl/``: a transformers T5ForConditionalGeneration folder (encoder and decoder weights, as
  google/flan-t5-xl) with a T5 tokenizer built offline from a word list.

The tiny GPT: dim 32, 2 layers, 4 heads of 8, SwiGLU 64, caption length L = 12 from T5 features of width 16, a
4 × 4 grid (8 px images through a VQ that upsamples once) over a 64-entry codebook. Its size is
not in the reference's
table: `register_tiny_size` adds it (as "GPT-tiny") to t2i_gcpo's table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

DIM, LAYERS, HEADS, FFN = 32, 2, 4, 64
CAPTION_LEN, CAPTION_DIM = 12, 16
GRID, CODES, CODE_DIM = 4, 64, 8
VQ_CH, VQ_Z = 32, 32  # GroupNorm(32) needs widths that are multiples of 32
GPT_NAME = "t2i_tiny_stage1_8.pt"  # 8 px: GRID × 2 pixels a side
TINY_SIZE = "GPT-tiny"
WORDS = (
    "a an the of and photo two three four left right above below red blue green yellow white black "
    "cat cats dog dogs bench car circle square clock"
).split()
PROMPTS = ["a photo of a red cat", "two blue dogs left of a green bench"]


def register_tiny_size() -> None:
    """The tiny GPT's size in t2i_gcpo's size table (the reference's has no GPT this small)."""
    from t2i_gcpo.policies.llamagen_gpt import GPT_SIZES, GPTSize

    GPT_SIZES.setdefault(TINY_SIZE, GPTSize(DIM, LAYERS, HEADS))


def gpt_state(
    seed: int = 0,
    dim: int = DIM,
    layers: int = LAYERS,
    heads: int = HEADS,
    ffn: int = FFN,
    vocab: int = CODES,
    std: float = 0.25,
) -> dict[str, torch.Tensor]:
    """A random text-to-image GPT's state dict under gpt.py's names (Transformer with CaptionEmbedder)."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape: int, scale: float = std) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    state = {
        "cls_embedding.cap_proj.fc1.weight": w(dim, CAPTION_DIM, scale=0.5),
        "cls_embedding.cap_proj.fc2.weight": w(dim, dim),
        "cls_embedding.uncond_embedding": w(CAPTION_LEN, CAPTION_DIM, scale=CAPTION_DIM**-0.5),
        "tok_embeddings.weight": w(vocab, dim, scale=1.0),
        "norm.weight": 1 + w(dim, scale=0.1),
        "output.weight": w(vocab, dim, scale=0.5),
    }
    for i in range(layers):
        p = f"layers.{i}."
        state |= {
            p + "attention.wqkv.weight": w(3 * dim, dim, scale=0.4),
            p + "attention.wo.weight": w(dim, dim),
            p + "feed_forward.w1.weight": w(ffn, dim),
            p + "feed_forward.w3.weight": w(ffn, dim),
            p + "feed_forward.w2.weight": w(dim, ffn),
            p + "attention_norm.weight": 1 + w(dim, scale=0.1),
            p + "ffn_norm.weight": 1 + w(dim, scale=0.1),
        }
    return state


def _res(prefix: str, cin: int, cout: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    out = {}
    for name, shape in (
        ("norm1", (cin,)),
        ("conv1", (cout, cin, 3, 3)),
        ("norm2", (cout,)),
        ("conv2", (cout, cout, 3, 3)),
    ) + ((("nin_shortcut", (cout, cin, 1, 1)),) if cin != cout else ()):
        if name.startswith("norm"):
            out[f"{prefix}.{name}.weight"], out[f"{prefix}.{name}.bias"] = (
                torch.ones(shape),
                torch.zeros(shape),
            )
        else:
            out[f"{prefix}.{name}.weight"] = (
                torch.randn(*shape, generator=g) * (shape[1] * shape[2] * shape[3]) ** -0.5
            )
            out[f"{prefix}.{name}.bias"] = torch.zeros(shape[0])
    return out


def _attn(prefix: str, c: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    out = {f"{prefix}.norm.weight": torch.ones(c), f"{prefix}.norm.bias": torch.zeros(c)}
    for name in ("q", "k", "v", "proj_out"):
        out[f"{prefix}.{name}.weight"] = torch.randn(c, c, 1, 1, generator=g) * c**-0.5
        out[f"{prefix}.{name}.bias"] = torch.zeros(c)
    return out


def _conv(prefix: str, cout: int, cin: int, k: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        f"{prefix}.weight": torch.randn(cout, cin, k, k, generator=g) * (cin * k * k) ** -0.5,
        f"{prefix}.bias": torch.zeros(cout),
    }


def vq_state(
    seed: int = 0,
    ch: int = VQ_CH,
    ch_mult: tuple[int, ...] = (1, 1),
    blocks: int = 1,
    z: int = VQ_Z,
    codes: int = CODES,
    code_dim: int = CODE_DIM,
) -> dict[str, torch.Tensor]:
    """A random VQModel's state dict under vq_model.py's names: encoder, decoder, quant / post-quant convs and
    the (l2-normalised, as initialised there) codebook with its usage buffer."""
    g = torch.Generator().manual_seed(seed)
    n = len(ch_mult)
    state = {**_conv("encoder.conv_in", ch, 3, 3, g)}
    cin = ch
    for i in range(n):  # the encoder, bottom up
        cout = ch * ch_mult[i]
        for j in range(blocks):
            state |= _res(f"encoder.conv_blocks.{i}.res.{j}", cin, cout, g)
            cin = cout
            if i == n - 1:
                state |= _attn(f"encoder.conv_blocks.{i}.attn.{j}", cin, g)
        if i != n - 1:
            state |= _conv(f"encoder.conv_blocks.{i}.downsample.conv", cin, cin, 3, g)
    state |= (
        _res("encoder.mid.0", cin, cin, g)
        | _attn("encoder.mid.1", cin, g)
        | _res("encoder.mid.2", cin, cin, g)
    )
    state |= {"encoder.norm_out.weight": torch.ones(cin), "encoder.norm_out.bias": torch.zeros(cin)}
    state |= _conv("encoder.conv_out", z, cin, 3, g) | _conv("quant_conv", code_dim, z, 1, g)
    state |= _conv("post_quant_conv", z, code_dim, 1, g)
    cin = ch * ch_mult[-1]
    state |= _conv("decoder.conv_in", cin, z, 3, g)
    state |= (
        _res("decoder.mid.0", cin, cin, g)
        | _attn("decoder.mid.1", cin, g)
        | _res("decoder.mid.2", cin, cin, g)
    )
    for j, i in enumerate(reversed(range(n))):  # the decoder, top down
        cout = ch * ch_mult[i]
        for b in range(blocks + 1):
            state |= _res(f"decoder.conv_blocks.{j}.res.{b}", cin, cout, g)
            cin = cout
            if i == n - 1:
                state |= _attn(f"decoder.conv_blocks.{j}.attn.{b}", cin, g)
        if i != 0:
            state |= _conv(f"decoder.conv_blocks.{j}.upsample.conv", cin, cin, 3, g)
    state |= {"decoder.norm_out.weight": torch.ones(cin), "decoder.norm_out.bias": torch.zeros(cin)}
    state |= _conv("decoder.conv_out", 3, cin, 3, g)
    table = torch.nn.functional.normalize(torch.randn(codes, code_dim, generator=g), dim=-1)
    state |= {"quantize.embedding.weight": table, "quantize.codebook_used": torch.zeros(65536)}
    return state


def t5_tokenizer():
    """A T5 (Unigram) tokenizer from a word list, letters as the fallback pieces: pad 0, EOS
    1, unk 2, as T5's."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [
        ("▁" + w, -2.0 - i / 100) for i, w in enumerate(WORDS)
    ]
    pieces += [("▁", -6.0)] + [(c, -8.0) for c in "abcdefghijklmnopqrstuvwxyz,.'"]
    return T5Tokenizer(vocab=pieces, extra_ids=0)


def write_t5(folder: Path, seed: int = 0, d_model: int = CAPTION_DIM) -> Path:
    """A tiny FLAN-T5 folder: T5ForConditionalGeneration (gated-GELU, as flan-t5) saved with safetensors, and
    its tokenizer."""
    from transformers import T5Config, T5ForConditionalGeneration

    tok = t5_tokenizer()
    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=len(tok),
        d_model=d_model,
        d_kv=4,
        d_ff=32,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=4,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    T5ForConditionalGeneration(config).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def build_tiny_llamagen(folder: str | Path, seed: int = 0, with_args: bool = True) -> Path:
    """Write a tiny LlamaGen release to `folder` (module docstring) → `folder`."""
    register_tiny_size()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint: dict = {"model": gpt_state(seed)}
    if with_args:  # what train_t2i.py saves beside the weights
        checkpoint |= {
            "optimizer": {"state": {}, "param_groups": [{"lr": 1e-4, "params": [0]}]},
            "steps": 10,
            "args": argparse.Namespace(gpt_model=TINY_SIZE, cls_token_num=CAPTION_LEN, image_size=8),
        }
    torch.save(checkpoint, folder / GPT_NAME)
    torch.save({"model": vq_state(seed)}, folder / "vq_ds16_t2i.pt")
    write_t5(folder / "flan-t5-xl", seed)
    return folder
