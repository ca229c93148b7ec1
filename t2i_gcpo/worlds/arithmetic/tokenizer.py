"""The tiny model's character tokenizer: one token per character of ALPHABET (docs/worlds/arithmetic.md).

Problems and solutions need only digits, "+-*=?#", space and newline; the alphabet adds the
letters and ":.," so that the prompt frame ("Q: … A:") and the `wrong_answer` negative context
("Note: Intentionally generate an incorrect answer.") are expressible without an unknown token.
Anything else maps to <unk>; callers refuse such text first (`check_characters`).

One character is one token: ids never merge or split characters, no special token is added on
encoding (a caller prepends `bos_token_id` and appends `eos_token_id` itself), token i of a text
covers characters [i, i+1), and `decode(encode(s)) == s` for any text over ALPHABET.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

from t2i_gcpo.errors import UserError, shorten
from t2i_gcpo.worlds.arithmetic.prompts import CHAT_TEMPLATE

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")  # ids 0..3, in this order
ALPHABET = string.digits + "+-*=?#" + " \n" + ":.," + string.ascii_letters
MODEL_MAX_LENGTH = 1024  # characters; far beyond any prompt plus solution of this world


def unknown_characters(text: str) -> set[str]:
    """The characters of `text` that the tiny vocabulary cannot express."""
    return set(text) - set(ALPHABET)


def check_characters(text: str, what: str = "prompt") -> str:
    """`text` unchanged, or a one-line `UserError` naming the characters outside ALPHABET."""
    bad = unknown_characters(text)
    if bad:
        shown = " ".join(repr(c) for c in sorted(bad))
        raise UserError(
            f"{what} {shorten(text)!r} has characters the tiny arithmetic model cannot read: {shown} "
            "(it knows digits, letters, space, newline and + - * = ? # : . ,)"
        )
    return text


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A `transformers.PreTrainedTokenizerFast` over ALPHABET (ids: SPECIAL_TOKENS, then ALPHABET
    in order) whose chat template is the prompt frame (`prompts.CHAT_TEMPLATE`); it saves and loads
    with save_pretrained / from_pretrained (AutoTokenizer too)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast  # noqa: F811 (imported late: it is slow)

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + tuple(ALPHABET))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character
    tok.decoder = decoders.Fuse()  # concatenate, no spaces between tokens
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
        model_max_length=MODEL_MAX_LENGTH,
        chat_template=CHAT_TEMPLATE,
    )
