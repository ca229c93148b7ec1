"""A VLM judge behind an OpenAI-compatible chat API (what UnifiedReward or Qwen-VL served by vLLM or
SGLang expose): each image is sent with its prompt, the answer's score is read with a pattern.

    r_i = s_i / max_score,   s_i = the number the pattern's first group reads in the judge's answer

A request per image, ``POST URL/chat/completions`` with one user message: the image as a base64 PNG data
URL (``image_url``), then the question (`template`, ``{prompt}`` the sample's prompt), temperature 0. At
most `concurrency` requests are in flight; each has `timeout` seconds, the whole request (connecting,
sending, the judge's answer: not each read), and a failed one (no connection, the deadline, an HTTP error,
an answer that is not a chat completion, holds no score or a score outside [0, `max_score`]) is tried again
up to `retries` times, `backoff` seconds apart, doubling. A sample still without a score is a `RewardError`
naming the reward, the sample and the last failure: never a silent 0. The reward asks for a probe, so a
server that is down, stalls or answers garbage stops a run at its dry sample, before its folder exists.

The defaults are the UnifiedReward judge of yifan123/flow_grpo, flow_grpo/rewards.py
``unifiedreward_score_sglang`` (commit 54809b5fcf4d3930d2a17fa553928704bd0b719e): its question (below,
`UNIFIEDREWARD`), the pattern ``Final Score:\\s*([1-5](?:\\.\\d+)?)``, the score divided by 5, images resized
to 512 × 512 first, temperature 0. Differences: flow_grpo scores an answer without a score 0 (here an
error, after the retries), labels its data URL ``data:image;base64`` (here ``data:image/png;base64``),
and names the model "UnifiedReward-7b-v1.5" (here ``model=`` as the server serves it, none by default:
vLLM and SGLang then use the one they serve).

The URL is a server's OpenAI base (``http://127.0.0.1:8000/v1``) or its chat endpoint; a query string stays
after the endpoint's path (``https://host/deployments/x?api-version=…`` →
``https://host/deployments/x/chat/completions?api-version=…``). An API key is read from the environment
variable `api_key_env` (never from the spec, which a run records) and sent to that URL's server alone: the
client (t2i_gcpo/rewards/http_client.py) follows no redirect, reads no proxy from the environment (`proxy`
names one), and reads answers of at most `max_answer_mb` into `ChatCompletion`.

`post_chat(endpoint, body, …)` is the request on its own — POST this chat-completions JSON to this judge, get
its checked answer — for other uses of a judge (evaluation by questions).
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from t2i_gcpo.errors import RewardError, UserError, shorten
from t2i_gcpo.rewards import http_client
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.registry import Arg, Option, register_reward

if TYPE_CHECKING:
    import torch

SOURCE = "yifan123/flow_grpo flow_grpo/rewards.py unifiedreward_score_sglang (54809b5)"
UNIFIEDREWARD = (
    "<image>\nYou are given a text caption and a generated image based on that caption. Your task is to "
    "evaluate this image based on two key criteria:\n1. Alignment with the Caption: Assess how well "
    "this image aligns with the provided caption. Consider the accuracy of depicted objects, their "
    "relationships, and attributes as described in the caption.\n"
    "2. Overall Image Quality: Examine the visual quality of this image, including clarity, detail "
    "preservation, color accuracy, and overall aesthetic appeal.\n"
    "Based on the above criteria, assign a score from 1 to 5 after 'Final Score:'.\n"
    "Your task is provided as follows:\n"
    "Text Caption: [{prompt}]"
)
PATTERN = r"Final Score:\s*([1-5](?:\.\d+)?)"


@register_reward(
    "judge",
    scores="image",
    doc="a VLM judge behind an OpenAI-compatible chat API (UnifiedReward, Qwen-VL on vLLM/SGLang): "
    "the score its answer states",
    weights="none here: the judge runs in its own server (e.g. vllm serve /models/UnifiedReward-qwen-7b)",
    source=SOURCE,
    licence="the judge model's",
    example="judge:http://127.0.0.1:8000/v1,model=UnifiedReward-qwen-7b,concurrency=16",
)
def load(
    url: Annotated[
        str, Arg("the server's OpenAI base URL (…/v1) or chat endpoint", kind="url", metavar="URL")
    ],
    *,
    model: Annotated[str | None, Option("the model name the server serves (null: its only one)")] = None,
    template: Annotated[
        str, Option("the question, {prompt} the sample's prompt (quote it in a spec)")
    ] = UNIFIEDREWARD,
    pattern: Annotated[str, Option("a regular expression whose first group is the score")] = PATTERN,
    max_score: Annotated[float, Option("r = score / max_score", low=0, low_open=True)] = 5.0,
    image_size: Annotated[
        int | None, Option("resize images to this square first (null: as sampled)", low=1)
    ] = 512,
    concurrency: Annotated[int, Option("requests in flight at most", low=1, high=1024)] = 8,
    timeout: Annotated[
        float,
        Option("seconds one request may take, whole (connecting, sending, the answer)", low=0, low_open=True),
    ] = 60.0,
    retries: Annotated[int, Option("tries after the first for a failed request", low=0, high=100)] = 2,
    backoff: Annotated[float, Option("seconds before the first retry (doubling)", low=0)] = 1.0,
    max_tokens: Annotated[int | None, Option("the answer's token limit (null: the server's)", low=1)] = None,
    api_key_env: Annotated[str, Option("environment variable holding an API key, if any")] = "OPENAI_API_KEY",
    proxy: Annotated[
        str | None,
        Option(
            "an HTTP proxy to send the requests through, http://HOST:PORT (null: none; the environment's "
            "HTTPS_PROXY is not read)"
        ),
    ] = None,
    max_answer_mb: Annotated[
        float, Option("megabytes an answer may hold", low=0, low_open=True, high=1024)
    ] = 4.0,
) -> JudgeReward:
    return JudgeReward(
        url,
        model=model,
        template=template,
        pattern=pattern,
        max_score=max_score,
        image_size=image_size,
        concurrency=concurrency,
        timeout=timeout,
        retries=retries,
        backoff=backoff,
        max_tokens=max_tokens,
        api_key=os.environ.get(api_key_env),
        proxy=proxy,
        max_answer_mb=max_answer_mb,
    )


def chat_url(url: str) -> str:
    """The chat-completions endpoint of an OpenAI base URL (or the endpoint itself), its query string kept
    after the path; a one-line UserError for a URL that is not http(s), holds credentials or a fragment."""
    parts = http_client.split_url(url, "reward 'judge'", "http://127.0.0.1:8000/v1")
    path = parts.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path += "/chat/completions"
    return parts._replace(path=path).geturl()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    content: str


class ChatChoice(BaseModel):
    model_config = ConfigDict(extra="allow")
    message: ChatMessage


class ChatCompletion(BaseModel):
    """A chat-completions answer, as far as it is read: the first choice's message text (`text`); the other
    fields (``usage``, ``logprobs``, …) are kept as sent, unchecked."""

    model_config = ConfigDict(extra="allow")
    choices: Annotated[list[ChatChoice], Field(min_length=1)]

    @property
    def text(self) -> str:
        return self.choices[0].message.content


class JudgeFailure(ValueError):
    """One chat request without a usable answer: no answer, an HTTP error or redirect, too
    large, malformed."""


ANSWER_BYTES = 4 << 20


def post_chat(
    endpoint: str,
    body: dict,
    *,
    api_key: str | None = None,
    timeout: float = 60.0,
    max_bytes: int = ANSWER_BYTES,
    proxy: str | None = None,
) -> ChatCompletion:
    """POST the chat-completions request `body` to `endpoint` (a `chat_url`) once, with one deadline of
    `timeout` seconds and answers of at most `max_bytes` (http_client): the answer, checked; JudgeFailure
    naming what was wrong otherwise. `api_key` goes to `endpoint`'s server alone (no redirect is followed)."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        answer = http_client.request(
            endpoint,
            method="POST",
            body=json.dumps(body).encode(),
            headers=headers,
            timeout=timeout,
            max_bytes=max_bytes,
            proxy=proxy,
        )
    except (http_client.NoAnswer, http_client.AnswerTooLarge) as e:
        raise JudgeFailure(str(e)) from None
    if 300 <= answer.status < 400:
        raise JudgeFailure(http_client.redirect_line(endpoint, answer))
    if answer.status != 200:
        text = answer.body[:200].decode("utf-8", "replace").strip()
        raise JudgeFailure(
            f"HTTP {answer.status} {answer.reason}" + (f": {shorten(text, 100)}" if text else "")
        )
    try:
        return http_client.parse_answer(answer.body, ChatCompletion)
    except ValueError as e:
        raise JudgeFailure(f"not a chat completion: {e}") from None


def png_data_url(image: Any) -> str:
    """A PIL image as a ``data:image/png;base64,…`` URL."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


class JudgeReward:
    """r_i = s_i / max_score (module docstring); details: ``answer`` (cut to 200
    characters), ``judge_score``."""

    name = "judge"
    probe = True  # score a dry sample before a run starts (rewards.combine.probes)

    def __init__(
        self,
        url: str,
        model: str | None = None,
        template: str = UNIFIEDREWARD,
        pattern: str = PATTERN,
        max_score: float = 5.0,
        image_size: int | None = 512,
        concurrency: int = 8,
        timeout: float = 60.0,
        retries: int = 2,
        backoff: float = 1.0,
        max_tokens: int | None = None,
        api_key: str | None = None,
        proxy: str | None = None,
        max_answer_mb: float = 4.0,
    ):
        self.url = chat_url(url)
        http_client.check_proxy(proxy, "reward 'judge'")
        self.proxy, self.max_answer = proxy, int(max_answer_mb * (1 << 20))
        try:
            self.pattern = re.compile(pattern)
        except re.error as e:
            raise UserError(
                f"reward 'judge': pattern {pattern!r} is not a regular expression ({e})"
            ) from None
        if self.pattern.groups < 1:
            raise UserError(f"reward 'judge': pattern {pattern!r} needs a group, (…), around the score")
        if "{prompt}" not in template:
            raise UserError("reward 'judge': the template must hold {prompt}, where the sample's prompt goes")
        self.template, self.model, self.max_score = template, model, float(max_score)
        self.image_size, self.concurrency, self.timeout = image_size, int(concurrency), float(timeout)
        self.retries, self.backoff, self.max_tokens, self.api_key = (
            int(retries),
            float(backoff),
            max_tokens,
            api_key,
        )

    def body(self, image: Any, prompt: str) -> dict:
        """The chat-completions request for one image (module docstring)."""
        content = [
            {"type": "image_url", "image_url": {"url": png_data_url(image)}},
            {"type": "text", "text": self.template.replace("{prompt}", prompt)},
        ]
        body: dict[str, Any] = {"messages": [{"role": "user", "content": content}], "temperature": 0}
        if self.model is not None:
            body["model"] = self.model
        if self.max_tokens is not None:
            body["max_tokens"] = int(self.max_tokens)
        return body

    def ask(self, body: dict) -> str:
        """One request: the answer's text; JudgeFailure for anything else."""
        return post_chat(
            self.url,
            body,
            api_key=self.api_key,
            timeout=self.timeout,
            max_bytes=self.max_answer,
            proxy=self.proxy,
        ).text

    def score(self, answer: str) -> float:
        """The score the pattern reads in `answer`: a finite number in [0, max_score];
        ValueError otherwise."""
        m = self.pattern.search(answer)
        if m is None:
            raise ValueError(f"no score in the answer {shorten(answer, 60)!r}")
        try:
            score = float(m.group(1))
        except (TypeError, ValueError):
            raise ValueError(f"the score {shorten(str(m.group(1)), 40)!r} is not a number") from None
        if not math.isfinite(score) or not 0 <= score <= self.max_score:
            raise ValueError(f"the score {m.group(1)!r} is outside [0, max_score={self.max_score:g}]")
        return score

    def judge(self, index: int, image: Any, prompt: str) -> tuple[float, str]:
        """(score, answer) of one sample after at most 1 + retries tries; RewardError naming it otherwise."""
        body, wait, last = self.body(image, prompt), self.backoff, ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(wait)
                wait *= 2
            try:
                answer = self.ask(body)
                return self.score(answer), answer
            except ValueError as e:  # JudgeFailure included
                last = str(e)
        raise RewardError(
            f"reward 'judge' ({self.url}): sample {index} ({shorten(prompt, 60)!r}) has no score after "
            f"{self.retries + 1} tries: {shorten(last, 160)}"
        )

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        import torch

        from t2i_gcpo.rewards._common import images_to_pil

        pil = images_to_pil(images)
        if self.image_size:
            from PIL import Image

            pil = [im.resize((self.image_size, self.image_size), Image.Resampling.BICUBIC) for im in pil]
        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, max(len(pil), 1)))
        try:
            futures = [pool.submit(self.judge, i, im, p) for i, (im, p) in enumerate(zip(pil, prompts))]
            results = [f.result() for f in futures]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        scores = torch.tensor([s / self.max_score for s, _ in results], dtype=torch.float32)
        details = [{"judge_score": s, "answer": shorten(a, 200)} for s, a in results]
        return RewardOutput(scores=scores, details=details)
