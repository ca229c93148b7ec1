"""Tiny random causal language models with offline tokenizers, saved as transformers folders.

`build_tiny_text_lm(dir, chat_template=True | False, arch="llama" | "qwen2" | "gpt2")` writes a 2-layer
d=32 model (``AutoModelForCausalLM`` loads it) and a word-level `PreTrainedTokenizerFast` (digits
split one by one) that prepends BOS, with pad / eos / unk and the chat-turn tokens. Nothing is
downloaded. Used by tests/test_text_policy.py.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ["<unk>", "<pad>", "<bos>", "<eos>", "<|user|>", "<|assistant|>"]
WORDS = (
    "0 1 2 3 4 5 6 7 8 9 + - * = ? # : . , "
    "What is Solve the answer Note Intentionally generate an incorrect Question Wrong step so"
).split()

# one user turn: "<bos><|user|> {content} <|assistant|>" (the template writes BOS itself)
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(chat_template: bool = True):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIAL_TOKENS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
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
        chat_template=CHAT_TEMPLATE if chat_template else None,
    )


def tiny_config(tokenizer, arch: str = "llama"):
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
    tokenizer = build_tokenizer(chat_template)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(tokenizer, arch)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
