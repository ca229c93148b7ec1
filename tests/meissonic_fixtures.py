"""Tiny random Meissonic folders in the released layout (MeissonFlow/Meissonic), built offline for the tests.

`build_tiny_meissonic(path)` writes what the release holds, file for file and key for key:

    model_index.json                    {"_class_name": "Pipeline", …,
                                         "transformer": ["transformer", "Transformer2DModel"]}
    transformer/config.json             the release's keys (+ sample_size: the tiny grid; released: 1024 px)
    transformer/diffusion_pytorch_model.safetensors and .fp16.safetensors
    transformer/transformer.py          the release ships its code here: never run (it leaves a mark)
    vqvae/                              a diffusers VQModel (config.json + safetensors, fp16 copy too)
    text_encoder/                       a transformers CLIPTextModelWithProjection (77 positions)
    tokenizer/                          a CLIP BPE tokenizer (tests/tiny_models.py `write_clip_tokenizer`)
    scheduler/scheduler_config.json     {"_class_name": "Scheduler", "mask_token_id": …,
                                         "masking_schedule": "cosine"}
    scheduler/scheduler.py              the release's scheduler code: never run either

The transformer's weights are written from `released_shapes`, the parameter names and shapes of the
reference's ``Transformer2DModel`` (viiika/Meissonic src/transformer.py) spelled out here from its module
tree, not from the adapter's module: a name the adapter gets wrong does not load.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import torch

from tiny_models import write_clip_tokenizer

SIDE, K, MASK_ID, VOCAB = (
    8,
    16,
    19,
    20,
)  # 8×8 tokens (4×4 after the 2×2 compression), 16 codes, mask id 19 < 20
T = SIDE * SIDE
HEADS, HEAD_DIM = 2, 16  # D = 32
TEXT_WIDTH, PROJECTION = 24, 32  # joint_attention_dim ≠ D, pooled_projection_dim = D (as the reference needs)
MARK = "EXECUTED"  # the file a checkpoint's own Python would write beside itself

TRANSFORMER_CONFIG = {
    "_class_name": "Transformer2DModel",
    "_diffusers_version": "0.30.2",
    "attention_head_dim": HEAD_DIM,
    "axes_dims_rope": [4, 6, 6],
    "codebook_size": K,
    "downsample": True,
    "guidance_embeds": False,
    "in_channels": 64,
    "joint_attention_dim": TEXT_WIDTH,
    "num_attention_heads": HEADS,
    "num_layers": 2,
    "num_single_layers": 2,
    "patch_size": 1,
    "pooled_projection_dim": PROJECTION,
    "upsample": True,
    "vocab_size": VOCAB,
    "sample_size": SIDE,
}
MODEL_INDEX = {
    "_class_name": "Pipeline",
    "_diffusers_version": "0.30.2",
    "scheduler": ["scheduler", "Scheduler"],
    "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "transformer": ["transformer", "Transformer2DModel"],
    "vqvae": ["diffusers", "VQModel"],
}
PROMPTS = ["a red cat", "two dogs left of a bench"]


def released_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Parameter name → shape of the reference's Transformer2DModel for `cfg` (its module tree: Flux's
    embeddings and blocks, then the UViT embedding, compression, micro-conditioning and codebook head)."""
    d, j, p = (
        cfg["num_attention_heads"] * cfg["attention_head_dim"],
        cfg["joint_attention_dim"],
        cfg["pooled_projection_dim"],
    )
    hd, mlp = cfg["attention_head_dim"], 4 * d
    out: dict[str, tuple[int, ...]] = {}

    def linear(name: str, n_in: int, n_out: int, bias: bool = True) -> None:
        out[f"{name}.weight"] = (n_out, n_in)
        if bias:
            out[f"{name}.bias"] = (n_out,)

    linear("time_text_embed.timestep_embedder.linear_1", 256, d)
    linear("time_text_embed.timestep_embedder.linear_2", d, d)
    linear("time_text_embed.text_embedder.linear_1", p, d)
    linear("time_text_embed.text_embedder.linear_2", d, d)
    linear("context_embedder", j, d)
    for i in range(cfg["num_layers"]):
        b = f"transformer_blocks.{i}"
        linear(f"{b}.norm1.linear", d, 6 * d)
        linear(f"{b}.norm1_context.linear", d, 6 * d)
        for q in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            out[f"{b}.attn.{q}.weight"] = (hd,)
        for name in (
            "to_q",
            "to_k",
            "to_v",
            "add_q_proj",
            "add_k_proj",
            "add_v_proj",
            "to_out.0",
            "to_add_out",
        ):
            linear(f"{b}.attn.{name}", d, d)
        for ff in ("ff", "ff_context"):
            linear(f"{b}.{ff}.net.0.proj", d, mlp)
            linear(f"{b}.{ff}.net.2", mlp, d)
    for i in range(cfg["num_single_layers"]):
        b = f"single_transformer_blocks.{i}"
        linear(f"{b}.norm.linear", d, 3 * d)
        linear(f"{b}.proj_mlp", d, mlp)
        linear(f"{b}.proj_out", d + mlp, d)
        for q in ("norm_q", "norm_k"):
            out[f"{b}.attn.{q}.weight"] = (hd,)
        for name in ("to_q", "to_k", "to_v"):
            linear(f"{b}.attn.{name}", d, d)
    out["embed.embeddings.weight"] = (cfg["vocab_size"], d)
    out["embed.layer_norm.weight"] = (d,)
    out["embed.conv.weight"] = (d, d, 1, 1)
    out["mlm_layer.conv1.weight"] = (d, d, 1, 1)
    out["mlm_layer.layer_norm.weight"] = (d,)
    out["mlm_layer.conv2.weight"] = (cfg["codebook_size"], d, 1, 1)
    linear("cond_embed.linear_1", 5 * 256 + p, d, bias=False)
    linear("cond_embed.linear_2", d, d, bias=False)
    for norm in ("encoder_proj_layer_norm", "project_to_hidden_norm", "project_from_hidden_norm"):
        out[f"{norm}.weight"] = (d,)
    linear("project_to_hidden", d, d, bias=False)
    linear("project_from_hidden", d, d, bias=False)
    if cfg["downsample"]:
        out["down_block.downsample.norm.weight"] = (d,)
        out["down_block.downsample.conv.weight"] = (d, d, 2, 2)
    if cfg["upsample"]:
        out["up_block.upsample.norm.weight"] = (d,)
        out["up_block.upsample.conv.weight"] = (d, d, 2, 2)  # ConvTranspose2d: [in, out, kh, kw]
    return out


def random_weights(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights of `released_shapes`: norms 1, biases N(0, 0.02), matrices N(0, 1/fan_in); the codebook
    head ×8 so that the tiny model's distributions are far from uniform (contexts and steps differ)."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in released_shapes(cfg).items():
        if len(shape) == 1 and name.endswith(".weight"):  # every 1-D weight here is a norm's
            state[name] = torch.ones(shape)
        elif name.endswith("bias"):
            state[name] = 0.02 * torch.randn(shape, generator=gen)
        else:
            fan_in = (
                shape[1] * (shape[2] * shape[3] if len(shape) == 4 else 1) if len(shape) > 1 else shape[0]
            )
            state[name] = torch.randn(shape, generator=gen) / fan_in**0.5
    state["mlm_layer.conv2.weight"] *= 8
    return state


def _save_safetensors(state: dict[str, torch.Tensor], file: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(file))


def _booby_trap(folder: Path, name: str, pickled: bool = False) -> None:
    """A Python file (and a pickle beside the safetensors weights) that leave `MARK` in `folder` if anything
    runs them."""
    (folder / name).write_text(
        f"import os\nopen(os.path.join(os.path.dirname(os.path.abspath(__file__)), {MARK!r}), "
        f"'w').write('ran')\n"
        "raise SystemExit('executed')\n"
    )
    mark = str(folder / MARK)
    if not pickled:
        return

    class Trap:
        def __reduce__(self):
            return (open, (mark, "w"))

    (folder / "diffusion_pytorch_model.bin").write_bytes(pickle.dumps(Trap()))


def build_tiny_meissonic(
    path,
    seed: int = 0,
    transformer: dict | None = None,
    text_width: int = TEXT_WIDTH,
    projection: int = PROJECTION,
    fp16_copy: bool = True,
) -> Path:
    """Write a tiny random Meissonic folder (module docstring) to `path`; `transformer` overrides config keys
    (None values remove them), `text_width` / `projection` the text encoder's widths."""
    from diffusers import VQModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    path = Path(path)
    cfg = dict(TRANSFORMER_CONFIG)
    for key, value in (transformer or {}).items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (path / "transformer").mkdir(parents=True, exist_ok=True)
    (path / "transformer" / "config.json").write_text(json.dumps(cfg, indent=2))
    known = {k: v for k, v in TRANSFORMER_CONFIG.items() if k in cfg}
    weights = random_weights({**known, **cfg}, seed)
    _save_safetensors(weights, path / "transformer" / "diffusion_pytorch_model.safetensors")
    if fp16_copy:
        half = {k: v.half() for k, v in weights.items()}
        _save_safetensors(half, path / "transformer" / "diffusion_pytorch_model.fp16.safetensors")
    _booby_trap(path / "transformer", "transformer.py", pickled=True)

    torch.manual_seed(seed)
    vq = VQModel(
        act_fn="silu",
        block_out_channels=[8, 8],
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=8,
        num_vq_embeddings=K,
        vq_embed_dim=4,
        sample_size=2 * SIDE,
        mid_block_add_attention=False,
        lookup_from_codebook=True,
        force_upcast=False,
    )
    vq.save_pretrained(path / "vqvae")
    if fp16_copy:
        vq.half().save_pretrained(path / "vqvae", variant="fp16")
    text = CLIPTextModelWithProjection(
        CLIPTextConfig(
            vocab_size=56,
            hidden_size=text_width,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=77,
            projection_dim=projection,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
        )
    )
    text.save_pretrained(path / "text_encoder")
    write_clip_tokenizer(path / "tokenizer")
    (path / "scheduler").mkdir(exist_ok=True)
    sched = {
        "_class_name": "Scheduler",
        "_diffusers_version": "0.30.2",
        "mask_token_id": MASK_ID,
        "masking_schedule": "cosine",
    }
    (path / "scheduler" / "scheduler_config.json").write_text(json.dumps(sched, indent=2))
    _booby_trap(path / "scheduler", "scheduler.py")
    (path / "model_index.json").write_text(json.dumps(MODEL_INDEX, indent=2))
    return path


def marks(path) -> list[str]:
    """The `MARK` files anything running the folder's own code left (none, if nothing ran)."""
    return sorted(str(p) for p in Path(path).rglob(MARK))


def tiny_meissonic_spec(root: Path) -> str:
    """tests/tiny_models.py TINY_MODELS: the --model spec of a tiny folder under `root`."""
    return f"meissonic:{build_tiny_meissonic(Path(root) / 'meissonic')}"


if __name__ == "__main__":  # python tests/meissonic_fixtures.py DIR: a folder to try the CLI on
    import sys

    print(build_tiny_meissonic(os.path.abspath(sys.argv[1])))
