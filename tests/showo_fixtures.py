"""Tiny random Show-o checkpoints in the released layout, built offline:

    DIR/config.json                 showlab/show-o's keys (_class_name "Showo", vocab_size, llm_vocab_size, …)
    DIR/pytorch_model.safetensors   the Phi backbone under the released key names (showo.model.layers.0.…)
    DIR/magvitv2/                   config.json (_class_name "MAGVITv2", tiny), pytorch_model.safetensors
    DIR/phi-1_5/                    a Phi config.json (model_type "phi") + a byte-level BPE CodeGen tokenizer

The key names are spelled out here from the reference's modules (Show-o's models/phi.py and
models/modeling_magvitv2.py: `released_phi_keys`, `released_magvit_keys`), and the builder checks the
tensors it writes carry exactly those names. Sizes: Phi d = 32, 2 layers, 4 heads; MAGVIT-v2 with 16 codes
(z = 4), one down/up level (2 px per token); 4×4 image tokens, so an 8 px image.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SHOWO_SIDE = 4  # image-token grid side: T = 16
SHOWO_Z = 4  # LFQ code width: K = 2^4 = 16 codes
SHOWO_PROMPTS = ["a photo of a red cat", "two dogs left of a bench"]
PHI_LAYERS = 2
MAGVIT_TINY = {  # config.json width fields (the released file has none: the reference's defaults)
    "ch": 32,
    "encoder_ch_mult": [1, 2],
    "encoder_num_res_blocks": [1, 1],
    "decoder_ch_mult": [1, 2],
    "decoder_num_res_blocks": [1, 1],
    "z_channels": SHOWO_Z,
}
MERGES = ["Ġ a", "Ġ c", "a t", "Ġc at", "Ġ d", "o g", "Ġd og", "r e", "Ġ re", "Ġre d"]


def write_phi_tokenizer(folder: Path) -> int:
    """A byte-level BPE tokenizer in phi-1_5's format (tokenizer_class CodeGenTokenizer, <|endoftext|> as
    BOS, EOS and UNK): the 256 byte symbols, a few merges, then <|endoftext|>. Returns its length."""
    from tokenizers import pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for m in MERGES:
        vocab["".join(m.split())] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(MERGES) + "\n")
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "CodeGenTokenizer",
                "add_prefix_space": False,
                "model_max_length": 2048,
                "bos_token": "<|endoftext|>",
                "eos_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
            }
        )
    )
    return len(vocab)


def tiny_phi_config(vocab_size: int) -> dict:
    """microsoft/phi-1_5's config.json keys at tiny widths (model_type phi, partial rotary 0.5)."""
    return {
        "architectures": ["PhiForCausalLM"],
        "model_type": "phi",
        "hidden_act": "gelu_new",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": PHI_LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "partial_rotary_factor": 0.5,
        "max_position_embeddings": 256,
        "layer_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "qk_layernorm": False,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "bos_token_id": None,
        "eos_token_id": None,
        "torch_dtype": "float32",
        "transformers_version": "4.37.0",
    }


def released_phi_keys(layers: int) -> list[str]:
    """The keys of the released pytorch_model.safetensors: ``Showo.showo`` is Show-o's PhiForCausalLM
    (models/phi.py: model.embed_tokens, model.layers[i].{self_attn.{q,k,v}_proj, self_attn.dense,
    mlp.fc1, mlp.fc2, input_layernorm}, model.final_layernorm, lm_head; qk_layernorm off, rotary
    buffers not persistent)."""
    keys = ["showo.model.embed_tokens.weight"]
    for i in range(layers):
        for mod in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.dense",
            "mlp.fc1",
            "mlp.fc2",
            "input_layernorm",
        ):
            keys += [f"showo.model.layers.{i}.{mod}.weight", f"showo.model.layers.{i}.{mod}.bias"]
    keys += ["showo.model.final_layernorm.weight", "showo.model.final_layernorm.bias"]
    return sorted(keys + ["showo.lm_head.weight", "showo.lm_head.bias"])


def released_magvit_keys(cfg: dict) -> list[str]:
    """The keys of showlab/magvitv2's weights for a config (the reference's VQGANEncoder / VQGANDecoder /
    LFQuantizer constructors: levels ``down.i`` / ``up.i`` of ResNet blocks with a ``nin_shortcut`` where the
    width changes, ``downsample.conv`` below the last level, ``upsample.conv`` above the first, a middle of
    block_1, attn_1 (norm, q, k, v, proj_out), block_2; the two LFQ buffers)."""
    ch = cfg["ch"]

    def block(prefix: str, c_in: int, c_out: int) -> list[str]:
        mods = ["norm1", "conv1", "norm2", "conv2"] + (["nin_shortcut"] if c_in != c_out else [])
        return [f"{prefix}.{m}.{p}" for m in mods for p in ("weight", "bias")]

    def middle(prefix: str, c: int) -> list[str]:
        attn = [
            f"{prefix}.attn_1.{m}.{p}"
            for m in ("norm", "q", "k", "v", "proj_out")
            for p in ("weight", "bias")
        ]
        return block(f"{prefix}.block_1", c, c) + attn + block(f"{prefix}.block_2", c, c)

    def wb(name: str) -> list[str]:
        return [f"{name}.weight", f"{name}.bias"]

    keys = wb("encoder.conv_in")
    c = ch
    mult, blocks = cfg["encoder_ch_mult"], cfg["encoder_num_res_blocks"]
    for i, (m, n) in enumerate(zip(mult, blocks)):
        for j in range(n):
            keys += block(f"encoder.down.{i}.block.{j}", c if j == 0 else ch * m, ch * m)
        c = ch * m
        if i != len(mult) - 1:
            keys += wb(f"encoder.down.{i}.downsample.conv")
    keys += (
        middle("encoder.mid", c) + wb("encoder.norm_out") + wb("encoder.conv_out") + wb("encoder.quant_conv")
    )
    mult, blocks = cfg["decoder_ch_mult"], cfg["decoder_num_res_blocks"]
    c = ch * mult[-1]
    keys += wb("decoder.post_quant_conv") + wb("decoder.conv_in") + middle("decoder.mid", c)
    for i in reversed(range(len(mult))):
        for j in range(blocks[i]):
            keys += block(f"decoder.up.{i}.block.{j}", c if j == 0 else ch * mult[i], ch * mult[i])
        c = ch * mult[i]
        if i != 0:
            keys += wb(f"decoder.up.{i}.upsample.conv")
    keys += wb("decoder.norm_out") + wb("decoder.conv_out") + ["quantize.embedding", "quantize.power_vals"]
    return sorted(keys)


def build_tiny_magvit(folder: Path, seed: int = 0) -> Path:
    """showlab/magvitv2's layout at tiny widths: config.json + pytorch_model.safetensors."""
    from safetensors.torch import save_file

    from t2i_gcpo.tokenizers.magvitv2 import MagvitConfig, MagvitV2

    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in MAGVIT_TINY.items()}
    state = MagvitV2(MagvitConfig(**cfg)).state_dict()
    assert sorted(state) == released_magvit_keys(MAGVIT_TINY), "the released key names"
    (folder / "config.json").write_text(
        json.dumps({"_class_name": "MAGVITv2", "_diffusers_version": "0.30.1", **MAGVIT_TINY})
    )
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "pytorch_model.safetensors"))
    return folder


def build_tiny_showo(folder, seed: int = 0, head_scale: float = 0.5) -> Path:
    """Write a tiny random Show-o checkpoint folder (module docstring) to `folder`; returns it. Its Phi is
    N(0, 0.1²) with the lm_head's code rows N(0, head_scale²): peaked distributions, so contexts and steps
    differ measurably."""
    from safetensors.torch import save_file
    from transformers import PhiConfig, PhiForCausalLM

    folder = Path(folder)
    llm_vocab = write_phi_tokenizer(folder / "phi-1_5")
    k = 2**SHOWO_Z
    vocab = llm_vocab + 10 + k + 1
    phi_cfg = tiny_phi_config(300)  # phi-1_5's own (text) vocabulary; Show-o resizes it
    (folder / "phi-1_5" / "config.json").write_text(json.dumps(phi_cfg, indent=2))
    cfg = PhiConfig.from_dict(phi_cfg)
    cfg.vocab_size = vocab
    torch.manual_seed(seed)
    phi = PhiForCausalLM(cfg)
    with torch.no_grad():
        for name, p in phi.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, head_scale if name == "lm_head.weight" else 0.1)
    state = {"showo." + name: t.contiguous() for name, t in phi.state_dict().items()}
    assert sorted(state) == released_phi_keys(PHI_LAYERS), "the released key names"
    save_file(state, str(folder / "pytorch_model.safetensors"), metadata={"format": "pt"})
    config = {
        "_class_name": "Showo",
        "_diffusers_version": "0.30.1",
        "codebook_size": k,
        "llm_model_path": "microsoft/phi-1_5",
        "llm_vocab_size": llm_vocab,
        "mask_token_id": vocab - 1,
        "num_vq_tokens": SHOWO_SIDE * SHOWO_SIDE,
        "vocab_size": vocab,
        "w_clip_vit": False,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    build_tiny_magvit(folder / "magvitv2", seed)
    return folder


def tiny_showo_spec(root: Path) -> str:
    """TINY_MODELS' builder: the --model spec of a tiny Show-o under `root`."""
    return f"showo:{build_tiny_showo(Path(root) / 'showo')}"
