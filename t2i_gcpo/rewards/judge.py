"""A VLM judge behind an OpenAI-compatible chat API (what UnifiedReward or Qwen-VL served by vLLM or
SGLang expose): each image is sent with its prompt, the answer's score is read with a pattern.

    r_i = s_i / max_score,   s_i = the number the pattern's first group reads in the judge's answer

A request per image, ``POST URL/chat/completions`` with one user message: the image as a base64 PNG data
URL (``image_url``), then the question (`template`, ``{prompt}`` the sample's prompt), temperature 0. At
most `concurrency` requests are in flight; each has `timeout` seconds, and a failed one (no connection,
a timeout, an HTTP error, an answer that is not a chat completion or holds no score) is tried again up to
`retries` times, `backoff` seconds apart, doubling. A sample still without a score is a `RewardError`
naming the reward, the sample and the last failure: never a silent 0. The reward asks for a probe, so a
server that is down, stalls or answers garbage stops a run at its dry sample, before its folder exists.

The defaults are the UnifiedReward judge of yifan123/flow_grpo, flow_grpo/rewards.py
``unifiedreward_score_sglang`` (commit 54809b5fcf4d3930d2a17fa553928704bd0b719e): its question (below,
`UNIFIEDREWARD`), the pattern ``Final Score:\\s*([1-5](?:\\.\\d+)?)``, the score divided by 5, images resized
to 512 × 512 first, temperature 0. Differences: flow_grpo scores an answer without a score 0 (here an
error, after the retries), labels its data URL ``data:image;base64`` (here ``data:image/png;base64``),
and names the model "UnifiedReward-7b-v1.5" (here ``model=`` as the server serves it, none by default:
vLLM and SGLang then use the one they serve).

The URL is a server's OpenAI base (``http://127.0.0.1:8000/v1``) or its chat endpoint. An API key is
read from the environment variable `api_key_env` (never from the spec, which a run records).
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Annotated, Any

from t2i_gcpo.errors import RewardError, UserError, shorten
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.registry import Arg, Option, register_reward

if TYPE_CHECKING:
    import torch

SOURCE = "yifan123/flow_grpo flow_grpo/rewards.py unifiedreward_score_sglang (54809b5)"
UNIFIEDREWARD = (
    "<image>\nYou are given a text caption and a generated image based on that caption. Your task is to "
    "evaluate this image based on two key criteria:\n1. Alignment with the Caption: Assess how well this image "
    "aligns with the provided caption. Consider the accuracy of depicted objects, their relationships, and "
    "attributes as described in the caption.\n2. Overall Image Quality: Examine the visual quality of this "
    "image, including clarity, detail preservation, color accuracy, and overall aesthetic appeal.\nBased on "
    "the above criteria, assign a score from 1 to 5 after 'Final Score:'.\nYour task is provided as follows:\n"
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
    url: Annotated[str, Arg("the server's OpenAI base URL (…/v1) or chat endpoint", kind="url", metavar="URL")],
    *,
    model: Annotated[str | None, Option("the model name the server serves (null: its only one)")] = None,
    template: Annotated[str, Option("the question, {prompt} the sample's prompt (quote it in a spec)")] = UNIFIEDREWARD,
    pattern: Annotated[str, Option("a regular expression whose first group is the score")] = PATTERN,
    max_score: Annotated[float, Option("r = score / max_score", low=0, low_open=True)] = 5.0,
    image_size: Annotated[int | None, Option("resize images to this square first (null: as sampled)", low=1)] = 512,
    concurrency: Annotated[int, Option("requests in flight at most", low=1, high=1024)] = 8,
    timeout: Annotated[float, Option("seconds one request may take", low=0, low_open=True)] = 60.0,
    retries: Annotated[int, Option("tries after the first for a failed request", low=0, high=100)] = 2,
    backoff: Annotated[float, Option("seconds before the first retry (doubling)", low=0)] = 1.0,
    max_tokens: Annotated[int | None, Option("the answer's token limit (null: the server's)", low=1)] = None,
    api_key_env: Annotated[str, Option("environment variable holding an API key, if any")] = "OPENAI_API_KEY",
) -> JudgeReward:  # fmt: skip
    return JudgeReward(url, model=model, template=template, pattern=pattern, max_score=max_score,
                       image_size=image_size, concurrency=concurrency, timeout=timeout, retries=retries,
                       backoff=backoff, max_tokens=max_tokens, api_key=os.environ.get(api_key_env))  # fmt: skip


def chat_url(url: str) -> str:
    """The chat-completions endpoint of an OpenAI base URL (or the endpoint itself)."""
    url = url.strip().rstrip("/")
    if not re.match(r"^https?://[^/\s]+", url):
        raise UserError(f"reward 'judge': {url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def post_chat(url: str, body: dict, *, timeout: float, api_key: str | None = None) -> dict:
    """One chat-completions request (`url`: the endpoint, `chat_url`): the answer's JSON object; an exception
    (urllib's, or ValueError for an answer that is not a JSON object) for anything else. The one HTTP call of
    this module, also used by the evaluations that ask a judge (t2i_gcpo/eval/suites/judge_client.py)."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        raw = response.read()
    try:
        completion = json.loads(raw)
    except ValueError:
        completion = None
    if not isinstance(completion, dict):
        raise ValueError(f"not a chat completion: {shorten(raw.decode('utf-8', 'replace'), 60)!r}")
    return completion


def png_data_url(image: Any) -> str:
    """A PIL image as a ``data:image/png;base64,…`` URL."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


class JudgeReward:
    """r_i = s_i / max_score (module docstring); details: ``answer`` (cut to 200 characters), ``judge_score``."""

    name = "judge"
    probe = True  # score a dry sample before a run starts (rewards.combine.probes)

    def __init__(self, url: str, model: str | None = None, template: str = UNIFIEDREWARD, pattern: str = PATTERN,
                 max_score: float = 5.0, image_size: int | None = 512, concurrency: int = 8, timeout: float = 60.0,
                 retries: int = 2, backoff: float = 1.0, max_tokens: int | None = None,
                 api_key: str | None = None):  # fmt: skip
        self.url = chat_url(url)
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
        content = [{"type": "image_url", "image_url": {"url": png_data_url(image)}},
                   {"type": "text", "text": self.template.replace("{prompt}", prompt)}]  # fmt: skip
        body: dict[str, Any] = {"messages": [{"role": "user", "content": content}], "temperature": 0}
        if self.model is not None:
            body["model"] = self.model
        if self.max_tokens is not None:
            body["max_tokens"] = int(self.max_tokens)
        return body

    def ask(self, body: dict) -> str:
        """One request: the answer's text; an exception for anything else."""
        completion = post_chat(self.url, body, timeout=self.timeout, api_key=self.api_key)
        try:
            answer = completion["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ValueError(f"not a chat completion: {shorten(json.dumps(completion), 60)!r}") from None
        if not isinstance(answer, str):
            raise ValueError(f"the answer is not text: {shorten(repr(answer), 60)}")
        return answer

    def score(self, answer: str) -> float:
        m = self.pattern.search(answer)
        if m is None:
            raise ValueError(f"no score in the answer {shorten(answer, 60)!r}")
        try:
            return float(m.group(1))
        except ValueError:
            raise ValueError(f"the score {m.group(1)!r} is not a number") from None

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
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code} {e.reason}"
            except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
                reason = getattr(e, "reason", None) if isinstance(e, urllib.error.URLError) else None
                last = f"{type(e).__name__}: {reason or e}"
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
