"""A tiny random Janus checkpoint built offline, in the same on-disk format as Janus-Pro.

`build_tiny_janus(dir)` writes a `JanusForConditionalGeneration` (Llama text model + Janus vision
encoder + Janus VQ-VAE, all tiny and randomly initialised), its generation config (BOS, pad and
begin-of-image ids, as the converted Janus-Pro checkpoints carry them) and a `JanusProcessor` whose
tokenizer is a word-level `tokenizers` model with the special tokens Janus needs. Nothing is
downloaded. Used by tests/test_janus.py and reusable by the CLI tests (``--model janus:DIR``).
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = [
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
WORDS = (
    ": . , a an the of and to is on in photo left right above below two three four "
    "red orange yellow green blue purple pink brown black white gray "
    "circle circles square squares triangle triangles diamond diamonds cross crosses ring rings "
    "star stars heart hearts cat cats dog dogs"
).split()

# Janus-Pro's text-to-image prompt for one user message with the generation prompt added:
# "<|User|>: {text}\n\n<|Assistant|>:" (the processor then appends <begin_of_image>).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|User|>: {% else %}<|Assistant|>: {% endif %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}{% endfor %}"
    "{{ '\\n\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|Assistant|>:{% endif %}"
)

GRID = 4  # image-token grid side: T = GRID² = 16 tokens per image
CODEBOOK = 64  # VQ codebook size K


def build_tiny_tokenizer():
    """A word-level fast tokenizer that prepends BOS, with Janus's special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIAL_TOKENS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIAL_TOKENS)
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
        chat_template=CHAT_TEMPLATE,
    )


def tiny_janus_config(vocab_size: int, tokenizer=None, grid: int = GRID, upsample: int = 1):
    """JanusConfig: Llama d=64 L=2; a grid×grid image-token grid (vision image 8·grid px / patch 8, which
    sets the VQ grid); VQ K=64 with 32/64 channels and `upsample` ×2 stages → images of grid·2^upsample px."""
    from transformers import JanusConfig, JanusVisionConfig, JanusVQVAEConfig, LlamaConfig

    d = 64
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
        vocab_size=vocab_size,
        hidden_size=d,
        intermediate_size=2 * d,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
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
        num_embeddings=CODEBOOK,
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


def build_tiny_janus(
    directory: str | Path, seed: int = 0, with_processor: bool = True, grid: int = GRID, upsample: int = 1
) -> Path:
    """Write a tiny random Janus checkpoint (model, generation config, processor) to `directory`.

    Defaults: 4×4 image tokens decoded to 8×8 px. ``grid=4, upsample=3`` gives 32 px images (the
    ShapeWorld canvas). ``with_processor=False`` saves only the tokenizer (no processor files).
    """
    import torch
    from transformers import JanusForConditionalGeneration, JanusImageProcessor, JanusProcessor

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(tiny_janus_config(len(tokenizer), tokenizer, grid, upsample)).eval()
    with torch.no_grad():  # sharper than the 0.02-std init, so cond/null logits differ visibly
        for name, p in model.named_parameters():
            if p.dim() == 2 and not name.startswith(("model.vqmodel", "model.vision_model")):
                p.normal_(0.0, 0.1)
    gc = model.generation_config
    gc._from_model_config = False  # keep the Janus-specific fields below when reloading
    gc.bos_token_id = tokenizer.bos_token_id
    gc.eos_token_id = tokenizer.eos_token_id
    gc.pad_token_id = tokenizer.pad_token_id
    gc.guidance_scale = 5
    gc.generation_kwargs = {"boi_token_id": tokenizer.convert_tokens_to_ids("<begin_of_image>")}
    model.save_pretrained(directory)
    if with_processor:
        processor = JanusProcessor(
            image_processor=JanusImageProcessor(size={"height": 8 * grid, "width": 8 * grid}),
            tokenizer=tokenizer,
            chat_template=CHAT_TEMPLATE,
            num_image_tokens=grid * grid,
        )
        processor.save_pretrained(directory)
    else:
        tokenizer.save_pretrained(directory)
    return directory
