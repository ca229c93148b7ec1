"""The test suite's tiny random models, one builder per model family, all built offline (nothing is
downloaded). Each writes a checkpoint folder that ``load_policy`` reads:

- `tiny_policy_dir(root)`       the ShapeWorld AR prior: 2 layers, d = 32, a 16 px VQ (4×4 tokens)
- `build_tiny_masked(root)`     the ShapeWorld masked prior at the same size, 4 decoding steps
- `build_tiny_amused(path)`     an aMUSEd pipeline folder (UVit2DModel + VQModel + a CLIP text encoder)
- `build_tiny_janus(path)`      a Janus checkpoint in Janus-Pro's on-disk format (Llama + vision + VQ)
- Meissonic: tests/meissonic_fixtures.py `build_tiny_meissonic(path)`, the released folder layout
- `build_tiny_text_lm(path)`    a causal LM (Llama / Qwen2 / GPT-2) with a word-level tokenizer
- Show-o: tests/showo_fixtures.py (`build_tiny_showo`: the released layout, a tiny Phi and MAGVIT-v2)
- LlamaGen's release (GPT, VQ, FLAN-T5 folder): tests/llamagen_fixtures.py `build_tiny_llamagen`

and the reward models (docs/guides/rewards.md), each at its real architecture with tiny widths:

- `build_tiny_pickscore(path)`  a transformers CLIPModel folder with its processor (PickScore_v1's layout)
- `tiny_open_clip(name, …)`     an open_clip config registered under `name` (ViT-H-14's structure, tiny)
- `build_tiny_hps(path)`        an HPS checkpoint file ({"state_dict": …}) of a tiny open_clip model
- `build_tiny_aesthetic(root)`  a tiny OpenAI-style open_clip weights file and an aesthetic MLP head file
- `build_tiny_blip_vqa(path)`   a transformers BlipForQuestionAnswering folder with a word-level BERT vocab

`TINY_MODELS` maps each built-in family to a builder returning its ``--model`` spec and prompts its
vocabulary takes (tests/policies/test_policy_contract.py builds one per registered family).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from t2i_gcpo.resources import PROMPTS_DIR
from t2i_gcpo.worlds.shapeworld import generate_metadata

# the ShapeWorld priors' vocabulary covers every shipped ShapeWorld prompt, so they take the real prompt files
PROMPTS = [m["prompt"] for m in generate_metadata(24, seed=3)] + [
    line
    for f in ("shapeworld_train.txt", "shapeworld_test.txt")
    for line in (PROMPTS_DIR / f).read_text().splitlines()
]

# ----------------------------------------------------------------------------- ShapeWorld AR / masked


def tiny_ar_policy(prompts: list[str], storage: str = "float32", seed: int = 0):
    """A random 2-layer, d=32 AR prior over a random 16×16-px VQ (4×4 tokens, K=16), in memory, with
    logits 5× the default init's so that its distributions are far from uniform."""
    from t2i_gcpo.policies.ar import ARConfig, ARPolicy
    from t2i_gcpo.policies.prompt_tokenizer import PromptTokenizer
    from t2i_gcpo.tokenizers.vq import VQConfig, VQTokenizer

    torch.manual_seed(seed)
    vq = VQTokenizer(
        VQConfig(image_size=16, channels=(8, 8), codebook_size=16, code_dim=4, storage_dtype=storage)
    )
    cfg = ARConfig(
        prompt_len=8, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, storage_dtype=storage
    )
    policy = ARPolicy(cfg, PromptTokenizer.build(prompts, max_len=8), vq).eval()
    with torch.no_grad():
        policy.head.weight.mul_(5)
    return policy


def tiny_masked_policy(
    prompts: list[str], codebook_size: int, steps: int, storage: str = "float32", seed: int = 0, **kw
):
    """A random 2-layer, d=32 masked prior over a random 16×16-px VQ (4×4 tokens), in memory, with logits
    of std ≈ 2: distributions far from uniform, yet not one-hot."""
    from t2i_gcpo.policies.masked import MaskedConfig, MaskedPolicy
    from t2i_gcpo.policies.prompt_tokenizer import PromptTokenizer
    from t2i_gcpo.tokenizers.vq import VQConfig, VQTokenizer

    torch.manual_seed(seed)
    vq = VQTokenizer(
        VQConfig(
            image_size=16, channels=(8, 8), codebook_size=codebook_size, code_dim=4, storage_dtype=storage
        )
    )
    cfg = MaskedConfig(
        prompt_len=8,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
        default_steps=steps,
        storage_dtype=storage,
    )
    policy = MaskedPolicy(cfg, PromptTokenizer.build(prompts, max_len=8), vq, **kw).eval()
    with torch.no_grad():
        policy.head.weight.normal_(0, 2 / 32**0.5)
    return policy


def tiny_policy_dir(root: Path, seed: int = 0) -> Path:
    """Save a random 2-layer, d=32 AR prior over a random 16×16-px VQ (4×4 tokens) to root/tiny."""
    from t2i_gcpo.policies.ar import ARConfig, ARPolicy
    from t2i_gcpo.policies.prompt_tokenizer import PromptTokenizer
    from t2i_gcpo.tokenizers.vq import VQConfig, VQTokenizer

    torch.manual_seed(seed)
    vq = VQTokenizer(VQConfig(image_size=16, channels=(16, 32), num_down=2, codebook_size=16, code_dim=8))
    tok = PromptTokenizer.build(PROMPTS + ["a photo of four hearts"], max_len=12)
    cfg = ARConfig(prompt_len=12, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    policy = ARPolicy(cfg, tok, vq)
    path = Path(root) / "tiny"
    policy.save_pretrained(str(path))
    return path


def build_tiny_masked(root, seed: int = 0) -> str:
    """Save a random masked prior (as `tiny_policy_dir`, 4 decoding steps) to root/tiny_masked."""
    from t2i_gcpo.policies.masked import MaskedConfig, MaskedPolicy
    from t2i_gcpo.policies.prompt_tokenizer import PromptTokenizer
    from t2i_gcpo.tokenizers.vq import VQConfig, VQTokenizer

    torch.manual_seed(seed)
    vq = VQTokenizer(VQConfig(image_size=16, channels=(16, 32), num_down=2, codebook_size=16, code_dim=8))
    tok = PromptTokenizer.build(PROMPTS, max_len=12)
    cfg = MaskedConfig(
        prompt_len=12,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
        default_steps=4,
        storage_dtype="float32",
    )
    policy = MaskedPolicy(cfg, tok, vq)
    with torch.no_grad():  # far-from-uniform distributions: the advantage moves log-probs measurably
        policy.head.weight.normal_(0, 2 / 32**0.5)
    path = os.path.join(root, "tiny_masked")
    policy.save_pretrained(path)
    return path


# ----------------------------------------------------------------------------- aMUSEd
AMUSED_SIDE, AMUSED_K, AMUSED_MASK_ID = (
    4,
    16,
    17,
)  # 4×4 tokens, 16 codes, mask id ≠ K (aMUSEd: 8255 for K = 8192)
AMUSED_T = AMUSED_SIDE * AMUSED_SIDE


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
                "tokenizer_class": "CLIPTokenizer",
                "model_max_length": 16,
                "bos_token": "<|startoftext|>",
                "eos_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
            },
            f,
        )


def build_tiny_amused(path) -> None:
    """Write a tiny random aMUSEd pipeline folder (4×4 tokens, 16 codes, 8 px images) to `path`."""
    from diffusers import AmusedScheduler, UVit2DModel, VQModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    torch.manual_seed(0)
    write_clip_tokenizer(os.path.join(path, "tokenizer"))
    text = CLIPTextModelWithProjection(
        CLIPTextConfig(
            vocab_size=56,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=16,
            projection_dim=16,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
        )
    )
    transformer = UVit2DModel(
        hidden_size=16,
        use_bias=False,
        cond_embed_dim=16,
        micro_cond_encode_dim=2,
        micro_cond_embed_dim=10,
        encoder_hidden_size=16,
        vocab_size=AMUSED_MASK_ID + 1,
        codebook_size=AMUSED_K,
        in_channels=8,
        block_out_channels=8,
        num_res_blocks=1,
        downsample=True,
        upsample=True,
        block_num_heads=1,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        sample_size=AMUSED_SIDE,
    )
    with torch.no_grad():  # far-from-uniform distributions, so contexts and steps differ measurably
        transformer.mlm_layer.conv2.weight.mul_(20)
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
        num_vq_embeddings=AMUSED_K,
        vq_embed_dim=4,
        sample_size=8,
        mid_block_add_attention=False,
        lookup_from_codebook=True,
        force_upcast=False,
    )
    transformer.save_pretrained(os.path.join(path, "transformer"))
    vq.save_pretrained(os.path.join(path, "vqvae"))
    text.save_pretrained(os.path.join(path, "text_encoder"))
    AmusedScheduler(mask_token_id=AMUSED_MASK_ID).save_pretrained(os.path.join(path, "scheduler"))


# ----------------------------------------------------------------------------- Janus

JANUS_SPECIAL_TOKENS = [
    "<unk>",
    "<pad>",
    "<bos>",
    "<eos>",
    "<image_placeholder>",
    "<begin_of_image>",
    "<end_of_image>",
    "<|User|>",
    "<|Assistant|>",
]
# ShapeWorld/GenEval-like words so the ShapeWorld prompt sets tokenise without <unk>s.
JANUS_WORDS = (
    ": . , a an the of and to is on in photo left right above below two three four "
    "red orange yellow green blue purple pink brown black white gray "
    "circle circles square squares triangle triangles diamond diamonds cross crosses ring rings "
    "star stars heart hearts cat cats dog dogs"
).split()

# Janus-Pro's text-to-image prompt for one user message with the generation prompt added:
# "<|User|>: {text}\n\n<|Assistant|>:" (the processor then appends <begin_of_image>).
JANUS_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|User|>: {% else %}<|Assistant|>: {% endif %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] | trim }}{% endif "
    "%}{% endfor %}{{ '\\n\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|Assistant|>:{% endif %}"
)

JANUS_GRID = 4  # image-token grid side: T = GRID² = 16 tokens per image
JANUS_CODEBOOK = 64  # VQ codebook size K


def build_tiny_janus_tokenizer():
    """A word-level fast tokenizer that prepends BOS, with Janus's special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(JANUS_SPECIAL_TOKENS + JANUS_WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(JANUS_SPECIAL_TOKENS)
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        extra_special_tokens={
            "image_token": "<image_placeholder>",
            "boi_token": "<begin_of_image>",
            "eoi_token": "<end_of_image>",
        },
        chat_template=JANUS_CHAT_TEMPLATE,
    )


@dataclass(frozen=True)
class JanusShape:
    """The language model and codebook of a Janus config (the vision tower and VQ decoder stay tiny)."""

    hidden: int = 64  # d
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128  # MLP width
    vocab: int | None = None  # text vocabulary; None: the tokenizer's
    codebook: int = JANUS_CODEBOOK  # K


# Janus-Pro-1B and -7B (Janus-Pro paper Table 1; DeepSeek-LLM 1.5B / 7B: MLP 5632 / 11008, vocab 102,400)
JANUS_PRO_1B = JanusShape(2048, 24, 16, 16, 5632, 102400, 16384)
JANUS_PRO_7B = JanusShape(4096, 30, 32, 32, 11008, 102400, 16384)


def tiny_janus_config(
    vocab_size: int,
    tokenizer=None,
    grid: int = JANUS_GRID,
    upsample: int = 1,
    shape: JanusShape = JanusShape(),
):
    """JanusConfig: Llama d=64 L=2 (or `shape`'s); a grid×grid image-token grid (vision image 8·grid px /
    patch 8, which sets the VQ grid); VQ K=64 with 32/64 channels and `upsample` ×2 stages → images of
    grid·2^upsample px."""
    from transformers import JanusConfig, JanusVisionConfig, JanusVQVAEConfig, LlamaConfig

    d = shape.hidden
    ids = (
        {}
        if tokenizer is None
        else {
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        }
    )
    text = LlamaConfig(
        vocab_size=shape.vocab or vocab_size,
        hidden_size=d,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=max(128, 2 * grid * grid),
        **ids,
    )
    vision = JanusVisionConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=8 * grid,
        patch_size=8,
        projection_dim=d,
        num_image_tokens=grid * grid,
    )
    vq = JanusVQVAEConfig(
        embed_dim=8,
        num_embeddings=shape.codebook,
        latent_channels=32,
        base_channels=32,  # GroupNorm(32 groups) needs channel counts divisible by 32
        channel_multiplier=[1] * upsample + [2],  # `upsample` ×2 stages: grid → grid·2^upsample px
        num_res_blocks=1,
        projection_dim=d,
        image_token_embed_dim=d,
        num_hidden_layers=2,
    )
    image_token_id = None if tokenizer is None else tokenizer.convert_tokens_to_ids("<image_placeholder>")
    return JanusConfig(
        text_config=text,
        vision_config=vision,
        vq_config=vq,
        **({} if image_token_id is None else {"image_token_id": image_token_id}),
    )


def make_janus(
    tokenizer,
    seed: int = 0,
    grid: int = JANUS_GRID,
    upsample: int = 1,
    shape: JanusShape = JanusShape(),
    std: float = 0.1,
    device: str = "cpu",
):
    """A random `JanusForConditionalGeneration` in memory (eval mode, on `device`, in torch's default dtype):
    the language model and generation modules' matrices drawn N(0, std²) (0.1: sharper than the usual
    0.02, so cond/null logits differ visibly at tiny sizes), the generation config Janus-Pro's."""
    import torch
    from transformers import JanusForConditionalGeneration

    torch.manual_seed(seed)
    with torch.device(device):
        model = JanusForConditionalGeneration(
            tiny_janus_config(len(tokenizer), tokenizer, grid, upsample, shape)
        )
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and not name.startswith(("model.vqmodel", "model.vision_model")):
                p.normal_(0.0, std)
    gc = model.generation_config
    gc._from_model_config = False  # keep the Janus-specific fields below when reloading
    gc.bos_token_id = tokenizer.bos_token_id
    gc.eos_token_id = tokenizer.eos_token_id
    gc.pad_token_id = tokenizer.pad_token_id
    gc.guidance_scale = 5
    gc.generation_kwargs = {"boi_token_id": tokenizer.convert_tokens_to_ids("<begin_of_image>")}
    return model


def save_janus(model, tokenizer, directory: str | Path, with_processor: bool = True) -> Path:
    """Write `model` (from `make_janus`) and its processor (or only the tokenizer) to `directory`."""
    from transformers import JanusImageProcessor, JanusProcessor

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    if with_processor:
        side = model.config.vq_config.num_patches
        processor = JanusProcessor(
            image_processor=JanusImageProcessor(size={"height": 8 * side, "width": 8 * side}),
            tokenizer=tokenizer,
            chat_template=JANUS_CHAT_TEMPLATE,
            num_image_tokens=side * side,
        )
        processor.save_pretrained(directory)
    else:
        tokenizer.save_pretrained(directory)
    return directory


def build_tiny_janus(
    directory: str | Path,
    seed: int = 0,
    with_processor: bool = True,
    grid: int = JANUS_GRID,
    upsample: int = 1,
) -> Path:
    """Write a tiny random Janus checkpoint (model, generation config, processor) to `directory`.

    Defaults: 4×4 image tokens decoded to 8×8 px. ``grid=4, upsample=3`` gives 32 px images (the
    ShapeWorld canvas). ``with_processor=False`` saves only the tokenizer (no processor files).
    """
    tokenizer = build_tiny_janus_tokenizer()
    model = make_janus(tokenizer, seed, grid, upsample)
    return save_janus(model, tokenizer, directory, with_processor)


# ----------------------------------------------------------------------------- causal LMs (text)

TEXT_SPECIAL_TOKENS = ["<unk>", "<pad>", "<bos>", "<eos>", "<|user|>", "<|assistant|>"]
TEXT_WORDS = (
    "0 1 2 3 4 5 6 7 8 9 + - * = ? # : . , "
    "What is Solve the answer Note Intentionally generate an incorrect Question Wrong step so"
).split()

# one user turn: "<bos><|user|> {content} <|assistant|>" (the template writes BOS itself)
TEXT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_text_tokenizer(chat_template: bool = True):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(TEXT_SPECIAL_TOKENS + TEXT_WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.add_special_tokens(TEXT_SPECIAL_TOKENS)
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        chat_template=TEXT_CHAT_TEMPLATE if chat_template else None,
    )


def tiny_text_config(tokenizer, arch: str = "llama"):
    """Llama / Qwen2 (rotary positions) or GPT-2 (learned absolute positions: left padding and position
    ids must be right for a padded row to score as it does alone)."""
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    ids = dict(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if arch == "gpt2":
        return GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=2, n_head=4, **ids)
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    return cls(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        **ids,
    )


def build_tiny_text_lm(
    directory: str | Path, chat_template: bool = True, arch: str = "llama", seed: int = 0
) -> Path:
    """Save a tiny random causal LM + tokenizer to `directory` (weights N(0, 0.1²): peaked enough that
    contexts give visibly different distributions)."""
    import torch
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_text_tokenizer(chat_template)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_text_config(tokenizer, arch)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# ----------------------------------------------------------------------------- one per family


def _tiny_ar(root: Path) -> str:
    return str(tiny_policy_dir(root))


def _tiny_masked(root: Path) -> str:
    return "masked:" + build_tiny_masked(root)


def _tiny_amused(root: Path) -> str:
    build_tiny_amused(root / "amused")
    return f"amused:{root / 'amused'}"


def _tiny_meissonic(root: Path) -> str:
    from meissonic_fixtures import tiny_meissonic_spec

    return tiny_meissonic_spec(root)


def _tiny_janus(root: Path) -> str:
    return f"janus:{build_tiny_janus(root / 'janus')}"


def _tiny_text(root: Path) -> str:
    return f"text:{build_tiny_text_lm(root / 'text')}"


def _tiny_showo(root: Path) -> str:
    from showo_fixtures import tiny_showo_spec  # Show-o's builders live in tests/showo_fixtures.py

    return tiny_showo_spec(root)


def _tiny_llamagen(root: Path) -> str:
    from llamagen_fixtures import build_tiny_llamagen

    return f"llamagen:{build_tiny_llamagen(root / 'llamagen')}"


# family → (a builder that writes a tiny checkpoint under a folder and returns its --model spec,
#           two prompts of different lengths its vocabulary takes)
TINY_MODELS: dict[str, tuple[Callable[[Path], str], list[str]]] = {
    "ar": (_tiny_ar, ["a photo of a red circle", "a photo of a cross above a circle"]),
    "masked": (_tiny_masked, ["a photo of a red circle", "a photo of a cross above a circle"]),
    "amused": (_tiny_amused, ["a red cat", "two dogs left of a bench"]),
    "janus": (_tiny_janus, ["a red circle", "two blue squares left of a green cat"]),
    "meissonic": (_tiny_meissonic, ["a red cat", "two dogs left of a bench"]),
    "text": (_tiny_text, ["What is 12+7*3 ?", "Solve 4*5"]),
    "showo": (_tiny_showo, ["a red cat", "two dogs left of a bench"]),
    "llamagen": (_tiny_llamagen, ["a photo of a red cat", "two blue dogs left of a green bench"]),
}


# ----------------------------------------------------------------------------- reward models
PICK_SIZE = 32  # the tiny CLIP's input side (PickScore: 224)


def build_tiny_pickscore(path, seed: int = 0) -> Path:
    """A random CLIPModel (1 layer, d 32, 32 px, patch 8) with CLIPImageProcessor settings and the tiny BPE
    tokenizer, saved as yuvalkirstain/PickScore_v1 is laid out (config, weights, processor, tokenizer)."""
    from transformers import CLIPConfig, CLIPModel
    from transformers.models.clip import CLIPImageProcessorPil

    path = Path(path)
    write_clip_tokenizer(path)
    text = dict(
        vocab_size=56,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=77,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=PICK_SIZE,
        patch_size=8,
    )
    torch.manual_seed(seed)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
    model.save_pretrained(path)
    CLIPImageProcessorPil(
        size={"shortest_edge": PICK_SIZE}, crop_size={"height": PICK_SIZE, "width": PICK_SIZE}
    ).save_pretrained(path)
    return path


def tiny_open_clip(name: str, folder, quick_gelu: bool = False, image_size: int = 28) -> str:
    """Register an open_clip config `name`: ViT-H-14's structure (patch 14, head width 16 as ViT-H's 80 is
    to its 1280, a text tower over the full CLIP vocabulary) at tiny widths, one layer each."""
    import open_clip

    cfg = {
        "embed_dim": 16,
        "quick_gelu": quick_gelu,
        "vision_cfg": {
            "image_size": image_size,
            "layers": 1,
            "width": 32,
            "head_width": 16,
            "patch_size": 14,
        },
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(folder)
    return name


TINY_HPS = "t2i-gcpo-tiny-hps"


def build_tiny_hps(path, seed: int = 0) -> Path:
    """An HPS-style checkpoint file (``{"state_dict": …}``, as HPS_v2.1_compressed.pt) of a random tiny
    open_clip model registered as TINY_HPS."""
    import open_clip

    path = Path(path)
    tiny_open_clip(TINY_HPS, path.parent / "open_clip_configs")
    torch.manual_seed(seed)
    model = open_clip.create_model(TINY_HPS, pretrained=None)
    torch.save({"state_dict": model.state_dict()}, path)
    return path


TINY_AESTHETIC_CLIP = "t2i-gcpo-tiny-aesthetic-clip"


def build_tiny_aesthetic(root, seed: int = 0) -> tuple[Path, Path]:
    """(CLIP weights file, head file): a random tiny open_clip model with QuickGELU registered as
    TINY_AESTHETIC_CLIP (embedding 16) and a random MLP head of the predictor's layout
    (layers.0/2/4/6/7: Linear 16→24→12→8→4→1 with dropouts between)."""
    import open_clip

    root = Path(root)
    tiny_open_clip(TINY_AESTHETIC_CLIP, root / "open_clip_configs", quick_gelu=True, image_size=28)
    torch.manual_seed(seed)
    model = open_clip.create_model(TINY_AESTHETIC_CLIP, pretrained=None)
    clip_path = root / "tiny_clip.bin"
    torch.save(model.state_dict(), clip_path)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.Sequential(
                torch.nn.Linear(16, 24),
                torch.nn.Dropout(0.2),
                torch.nn.Linear(24, 12),
                torch.nn.Dropout(0.2),
                torch.nn.Linear(12, 8),
                torch.nn.Dropout(0.1),
                torch.nn.Linear(8, 4),
                torch.nn.Linear(4, 1),
            )

    head_path = root / "sac+logos+ava1-tiny.pth"
    torch.save(Head().state_dict(), head_path)
    return clip_path, head_path


BLIP_WORDS = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "yes",
    "no",
    "does",
    "this",
    "figure",
    "show",
    '"',
    "?",
    "please",
    "answer",
    "or",
    ".",
    "a",
    "red",
    "blue",
    "circle",
    "photo",
    "of",
    "[DEC]",
]
BLIP_SIZE = 32


def build_tiny_blip_vqa(path, seed: int = 0) -> Path:
    """A random BlipForQuestionAnswering (1 layer each, d 32, 32 px, patch 8) with a word-level BERT vocab
    whose last token is the decoder's BOS ([DEC], as BLIP's 30522), weights drawn wide (std 0.5) so the
    answer's probability varies with the image and the question, and BlipImageProcessor settings."""
    from transformers import BertTokenizer, BlipConfig, BlipForQuestionAnswering
    from transformers.models.blip import BlipImageProcessorPil

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(BLIP_WORDS) + "\n")
    BertTokenizer(str(path / "vocab.txt")).save_pretrained(path)
    text = dict(
        vocab_size=len(BLIP_WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        encoder_hidden_size=32,
        bos_token_id=len(BLIP_WORDS) - 1,
        sep_token_id=3,
        pad_token_id=0,
        max_position_embeddings=64,
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=BLIP_SIZE,
        patch_size=8,
    )
    torch.manual_seed(seed)
    model = BlipForQuestionAnswering(BlipConfig(text_config=text, vision_config=vision))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.5)
    model.save_pretrained(path)
    BlipImageProcessorPil(size={"height": BLIP_SIZE, "width": BLIP_SIZE}).save_pretrained(path)
    return path
