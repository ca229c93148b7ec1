"""A VLM judge behind an OpenAI-compatible chat API (vLLM, SGLang, a hosted model), as the evaluations ask it:
for the probability of an answer's first token (GenEval 2's Soft-TIFA, VQAScore, TIFA), or for a text the
judge suites parse (WISE, TIIF-Bench, UniGenBench++). Requests go through
`t2i_gcpo.rewards.forms.judge.post_chat`, the HTTP call the ``judge:`` reward makes; retries and concurrency
are `eval.suites.asking`'s.

Probabilities: one request per question, ``max_tokens: 1``, temperature 0, ``logprobs: true`` and
``top_logprobs: k`` (20 by default, vLLM's limit), the image (a base64 data URL) then the question in one
user turn, as the local VLM is asked (t2i_gcpo/scoring/vlm.py). The answer's probability is

    P(answers) = Σ_{a ∈ answers} exp(logprob of the token whose text is a)

over the first position's top-k list (the generated token included): an answer whose token is not among
the k most likely counts 0, and an answer string that is not one token of the judge's vocabulary matches
nothing (the local path sums the first token of each answer's encoding instead — for Qwen's tokenizer the
two differ only for answers such as " 4", whose first token is a bare space). The prediction TIFA compares
is the generated token's text. A top-k list whose probabilities sum above 1, a log-probability above 0 or
not finite is a lie (`BadAnswer`, asked again); a server that returns no log-probabilities at all cannot
serve Soft-TIFA or VQAScore (one line; TIFA reads the generated text then).
"""

from __future__ import annotations

import base64
import math
import mimetypes
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from t2i_gcpo.errors import UserError, shorten
from t2i_gcpo.eval.suites.asking import BadAnswer

TOP_LOGPROBS = 20


def image_url(image: Any) -> str:
    """A data URL of an image: a file's own bytes (its type from its suffix), or a PIL image as PNG."""
    if isinstance(image, (str, os.PathLike)):
        from t2i_gcpo.outdir import read_bytes

        path = Path(image)
        kind = mimetypes.guess_type(path.name)[0] or "image/png"
        data = read_bytes(path, limit=256 << 20, follow=True)
        return f"data:{kind};base64," + base64.b64encode(data).decode("ascii")
    from t2i_gcpo.rewards.forms.judge import png_data_url

    return png_data_url(image)


class JudgeClient:
    """The judge at `url` (an OpenAI base URL …/v1 or its chat endpoint), serving `model` (None: the only one
    it serves); `api_key` from the environment, never recorded."""

    kind = "judge"

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        timeout: float = 60.0,
        api_key: str | None = None,
        top_logprobs: int = TOP_LOGPROBS,
    ):
        from t2i_gcpo.rewards.forms.judge import chat_url

        self.base = url
        self.url = chat_url(url)
        self.model, self.timeout, self.api_key, self.top_logprobs = (
            model,
            float(timeout),
            api_key,
            int(top_logprobs),
        )
        self.name = self.url if model is None else f"{self.url} ({model})"

    def record(self, **settings: Any) -> dict[str, Any]:
        """The judge as a protocol records it (the fields of eval.protocol.scorer_record; a server's weights
        have no revision it tells), with the request `settings`."""
        return {"kind": "judge", "name": self.url, "revision": None, "model": self.model, **settings}

    def post(self, body: dict) -> dict:
        from t2i_gcpo.rewards.forms.judge import post_chat

        if self.model is not None:
            body = {"model": self.model, **body}
        # the hardened client's checked answer (one deadline, a size bound, no redirect), as the JSON it was
        return post_chat(self.url, body, timeout=self.timeout, api_key=self.api_key).model_dump()

    @staticmethod
    def choice(completion: dict) -> dict:
        try:
            choice = completion["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise BadAnswer(f"not a chat completion: {shorten(str(completion), 80)!r}") from None
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise BadAnswer(f"not a chat completion: {shorten(str(completion), 80)!r}")
        return choice

    # ---------------------------------------------------------------- text
    def chat(
        self,
        messages: list[dict],
        *,
        temperature: float = 0.0,
        max_tokens: int | None = None,
        extra: dict | None = None,
    ) -> str:
        """The judge's text answer to `messages`."""
        body: dict[str, Any] = {"messages": messages, "temperature": temperature, **(extra or {})}
        if max_tokens is not None:
            body["max_tokens"] = int(max_tokens)
        content = self.choice(self.post(body))["message"].get("content")
        if not isinstance(content, str):
            raise BadAnswer(f"the answer is not text: {shorten(repr(content), 60)}")
        return content

    # ---------------------------------------------------------------- first-token probabilities
    def first_token(
        self, image: Any, question: str, need_probability: bool = True
    ) -> tuple[str, dict[str, float]]:
        """(the generated token's text, {token text: log-probability} of the first position's top-k)."""
        content = [
            {"type": "image_url", "image_url": {"url": image_url(image)}},
            {"type": "text", "text": question},
        ]
        body = {
            "messages": [{"role": "user", "content": content}],
            "temperature": 0,
            "max_tokens": 1,
            "logprobs": True,
            "top_logprobs": self.top_logprobs,
        }
        choice = self.choice(self.post(body))
        entries = (
            (choice.get("logprobs") or {}).get("content")
            if isinstance(choice.get("logprobs"), dict)
            else None
        )
        if not entries:
            if need_probability:
                raise UserError(
                    f"judge {self.name} returns no log-probabilities: Soft-TIFA and VQAScore read the "
                    "answer's probability (serve the model with vLLM or SGLang, which return them for "
                    "logprobs=true), or use --method tifa"
                )
            text = choice["message"].get("content")
            if not isinstance(text, str):
                raise BadAnswer(f"the answer is not text: {shorten(repr(text), 60)}")
            return text, {}
        first = entries[0]
        if not isinstance(first, dict) or not isinstance(first.get("token"), str):
            raise BadAnswer(f"log-probabilities without a token: {shorten(repr(first), 80)}")
        table: dict[str, float] = {}
        listed = first.get("top_logprobs") or []
        if not isinstance(listed, list):
            raise BadAnswer(f"top_logprobs is not a list: {shorten(repr(listed), 80)}")
        for entry in [first, *listed]:
            token, logprob = (
                (entry.get("token"), entry.get("logprob")) if isinstance(entry, dict) else (None, None)
            )
            if (
                not isinstance(token, str)
                or isinstance(logprob, bool)
                or not isinstance(logprob, (int, float))
            ):
                raise BadAnswer(
                    f"a log-probability entry that is not (token, number): {shorten(repr(entry), 80)}"
                )
            if not math.isfinite(logprob) or logprob > 1e-6:
                raise BadAnswer(
                    f"log-probability {logprob!r} of {token!r} is not a log-probability (finite, <= 0)"
                )
            table[token] = float(logprob)
        total = sum(math.exp(v) for v in table.values())
        if total > 1 + 1e-3:
            raise BadAnswer(f"the top log-probabilities sum to a probability of {total:.4f} > 1")
        return first["token"], table

    def probabilities(
        self,
        images: Sequence[Any],
        questions: Sequence[str],
        answers: Sequence[Sequence[str]],
        need_probability: bool = True,
    ) -> list[tuple[float | None, str]]:
        """(P(answers) as the module docstring defines it — None without log-probabilities —, the generated
        token) per question, one request each."""
        out = []
        for image, question, wanted in zip(images, questions, answers):
            token, table = self.first_token(image, question, need_probability)
            p = sum(math.exp(table[a]) for a in wanted if a in table) if table else None
            out.append((p, token))
        return out
