"""LlamaGen's captions: FLAN-T5 encoder features of the cleaned prompt, left-padded (FoundationVision/LlamaGen
``language/t5.py`` and ``autoregressive/sample/sample_t2i.py``; the facts, written here).

- Cleaning (`clean_caption`, T5Embedder's ``text_preprocessing``, applied twice as there): unquote
  ``+``/``%xx``, lower-case, strip; drop URLs, HTML tags, @names, CJK blocks, file names, long digit runs and
  shop phrases; unify dashes and quotes; spaces for bad punctuation; collapse whitespace. ``ftfy.fix_text``
  (mojibake repair) is the one step not reproduced: it changes nothing in well-formed text, and ftfy
  is not a dependency.
- Tokens: the T5 tokenizer, padded and truncated to L = 120 (``t5_feature_max_len``), EOS added.
- Features: ``T5EncoderModel(...).last_hidden_state`` under the attention mask, [N, L, C] (C = 2048 for
  flan-t5-xl), then left-padded: the n valid rows moved to the end, the padding rows zeroed, and the mask
  flipped with them (True on the last n slots) — what the GPT was trained on.

Features are a function of the text alone (computed without autocast, in the encoder's dtype), kept for the
last `CACHE` prompts: a rollout and the teacher-forced passes over it share them.
"""

from __future__ import annotations

import html
import re
import urllib.parse
from collections import OrderedDict
from html.parser import HTMLParser
from typing import Any

import torch
from torch import Tensor

CACHE = 256  # prompts whose features are kept
BATCH = 32  # prompts per encoder forward

_BAD_PUNCT = re.compile(r"[#®•©™&@·º½¾¿¡§~\)\(\]\[\}\{\|\\/\*]{1,}")
_DASHES = (
    "[\u002d\u058a\u05be\u1400\u1806\u2010-\u2015\u2e17\u2e1a\u2e3a\u2e3b\u2e40\u301c\u3030\u30a0"
    "\ufe31\ufe32\ufe58\ufe63\uff0d]+"
)
# CJK strokes, katakana extensions, enclosed letters, compatibility, unified ideographs (ext. A), hexagrams
_CJK = [
    ("\u31c0", "\u31ef"),
    ("\u31f0", "\u31ff"),
    ("\u3200", "\u32ff"),
    ("\u3300", "\u33ff"),
    ("\u3400", "\u4dbf"),
    ("\u4dc0", "\u4dff"),
    ("\u4e00", "\u9fff"),
]
_URL_TAIL = r"[a-zA-Z0-9.\-]+[.](?:com|co|ru|net|org|edu|gov|it)[\w/-]*\b\/?(?!@)"
_FILES = r"(?:png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4)"

# (pattern, replacement) in the order T5Embedder.clean_caption applies them, before and after its basic clean
_BEFORE = [
    (r"<person>", "person"),
    (r"\b((?:https?:(?:\/{1,3}|[a-zA-Z0-9%])|" + _URL_TAIL + r"))", ""),
    (r"\b((?:www:(?:\/{1,3}|[a-zA-Z0-9%])|" + _URL_TAIL + r"))", ""),
    ("HTML", None),
    (r"@[\w\d]+\b", ""),
    *[(f"[{a}-{b}]+", "") for a, b in _CJK],
    (_DASHES, "-"),
    (r"[`´«»“”¨]", '"'),
    (r"[‘’]", "'"),
    (r"&quot;?", ""),
    (r"&amp", ""),
    (r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}", " "),
    (r"\d:\d\d\s+$", ""),
    (r"\\n", " "),
    (r"#\d{1,3}\b", ""),
    (r"#\d{5,}\b", ""),
    (r"\b\d{6,}\b", ""),
    (r"[\S]+\." + _FILES, ""),
    (r"[\"\']{2,}", '"'),
    (r"[\.]{2,}", " "),
    (_BAD_PUNCT.pattern, " "),
    (r"\s+\.\s+", " "),
]
_AFTER = [
    (r"\b[a-zA-Z]{1,3}\d{3,15}\b", ""),
    (r"\b[a-zA-Z]+\d+[a-zA-Z]+\b", ""),
    (r"\b\d+[a-zA-Z]+\d+\b", ""),
    (r"(worldwide\s+)?(free\s+)?shipping", ""),
    (r"(free\s)?download(\sfree)?", ""),
    (r"\bclick\b\s(?:for|on)\s\w+", ""),
    (r"\b" + _FILES + r"(\simage[s]?)?", ""),
    (r"\bpage\s+\d+\b", ""),
    (r"\b\d*[a-zA-Z]+\d+[a-zA-Z]+\d+[a-zA-Z\d]*\b", " "),
    (r"\b\d+\.?\d*[xх×]\d+\.?\d*\b", ""),
    (r"\b\s+\:\s+", ": "),
    (r"(\D[,\./])\b", r"\1 "),
    (r"\s+", " "),
    (r"^[\"\']([\w\W]+)[\"\']$", r"\1"),
    (r"^[\'\_,\-\:;]", ""),
    (r"[\'\_,\-\:\-\+]$", ""),
    (r"^\.\S+$", ""),
]


class _Text(HTMLParser):
    """The text of an HTML fragment (its tags dropped, character references resolved)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def _html_text(text: str) -> str:
    parser = _Text()
    parser.feed(text)
    parser.close()
    return "".join(parser.parts)


def _apply(rules: list[tuple[str, str | None]], text: str) -> str:
    for pattern, repl in rules:
        text = _html_text(text) if pattern == "HTML" else re.sub(pattern, repl, text)
    return text


def _clean_once(caption: str) -> str:
    text = urllib.parse.unquote_plus(str(caption)).strip().lower()
    text = _apply(_BEFORE, text)
    if len(re.findall(r"(?:\-|\_)", text)) > 3:  # this-is-my-cute-cat / this_is_my_cute_cat
        text = re.sub(r"(?:\-|\_)", " ", text)
    text = html.unescape(html.unescape(text)).strip()  # basic_clean (without ftfy.fix_text)
    return _apply(_AFTER, text).strip()


def clean_caption(caption: str) -> str:
    """A prompt as LlamaGen's T5Embedder feeds it to T5 (cleaned twice, as ``text_preprocessing`` does)."""
    return _clean_once(_clean_once(caption))


class T5Captions:
    """Left-padded caption features of prompts, from a local FLAN-T5 encoder and its tokenizer (frozen)."""

    def __init__(self, encoder: Any, tokenizer: Any, length: int) -> None:
        self.encoder = encoder.eval().requires_grad_(False)  # transformers' T5EncoderModel
        self.tokenizer = tokenizer
        self.length = length  # L
        self._cache: OrderedDict[str, tuple[Tensor, int]] = OrderedDict()

    @property
    def dim(self) -> int:
        return int(self.encoder.config.d_model)

    @property
    def device(self) -> torch.device:
        return self.encoder.get_input_embeddings().weight.device

    def to(self, device: torch.device) -> None:
        if self.device != device:
            self.encoder.to(device)
            self._cache.clear()

    def tokens(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        """Cleaned, tokenised prompts: ids and attention mask [N, L] (right-padded, as T5 reads them)."""
        batch = self.tokenizer(
            [clean_caption(t) for t in texts],
            max_length=self.length,
            padding="max_length",
            truncation=True,
            return_attention_mask=True,
            add_special_tokens=True,
            return_tensors="pt",
        )
        return batch["input_ids"], batch["attention_mask"]

    @torch.no_grad()
    def _encode(self, texts: list[str]) -> dict[str, tuple[Tensor, int]]:
        ids, mask = self.tokens(texts)
        dev = self.device
        with torch.autocast(dev.type, enabled=False):
            hidden = self.encoder(input_ids=ids.to(dev), attention_mask=mask.to(dev)).last_hidden_state
        return {text: (h[:n].clone(), n) for text, h, n in zip(texts, hidden, mask.sum(1).tolist())}

    def features(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        """Prompts → (features [N, L, C] in the encoder's dtype, zero on the padding; mask [N, L] bool, True
        on the valid slots, which are the last ones), on the encoder's device."""
        found = {t: self._cache[t] for t in texts if t in self._cache}
        todo = [t for t in dict.fromkeys(texts) if t not in found]
        for s in range(0, len(todo), BATCH):
            found.update(self._encode(todo[s : s + BATCH]))
        for text in dict.fromkeys(texts):  # the cache keeps the last CACHE prompts used
            self._cache[text] = found[text]
            self._cache.move_to_end(text)
        while len(self._cache) > CACHE:
            self._cache.popitem(last=False)
        dev, dtype = self.device, self.encoder.get_input_embeddings().weight.dtype
        feats = torch.zeros(len(texts), self.length, self.dim, device=dev, dtype=dtype)
        mask = torch.zeros(len(texts), self.length, dtype=torch.bool, device=dev)
        for i, text in enumerate(texts):
            h, n = found[text]
            feats[i, self.length - n :] = h
            mask[i, self.length - n :] = True
        return feats, mask
