"""The OCR reward for text rendering (flow_grpo's): read the image's text with an OCR engine and score it
against the phrase the prompt quotes.

    t = the prompt's first quoted phrase (prompt.split('"')[1]), spaces removed, lower case
    o = the recognised lines joined, spaces removed, lower case
    d = 0 if t is in o, else Levenshtein(o, t), capped at |t|
    r_i = 1 − d / |t|                                        (in [0, 1])

Scored as the reference scores: yifan123/flow_grpo, flow_grpo/ocr.py ``OcrScorer.__call__``, called by
flow_grpo/rewards.py ``ocr_score`` (commit 54809b5fcf4d3930d2a17fa553928704bd0b719e; the formula was read
from derived copies that state they keep it unchanged): the lines kept are those with a confidence above 0,
and a recognised text much longer than the phrase costs at most |t|.

The engine is not the reference's: flow_grpo runs PaddleOCR (``use_angle_cls=False, lang="en"``), here
RapidOCR (``rapidocr-onnxruntime``, PaddleOCR's PP-OCRv4 detection and recognition models converted to
ONNX and shipped inside the wheel: nothing is downloaded) with its angle classifier off, as flow_grpo's
``cls=False``; a line is kept when its confidence reaches ``text_score`` (0.5, PaddleOCR's and
RapidOCR's default ``drop_score``). Images go in as BGR arrays, as both engines expect (flow_grpo hands
PaddleOCR RGB). Where the reference scores an OCR failure 0 and goes on, this raises: an engine that
fails is not a bad image. A prompt without a quoted phrase is refused before the run starts (the
reference fails on it).

Install: ``pip install 't2i-gcpo[ocr]'`` (rapidocr-onnxruntime).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from t2i_gcpo.errors import UserError, shorten
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.registry import Option, register_reward

if TYPE_CHECKING:
    import torch

SOURCE = "yifan123/flow_grpo flow_grpo/ocr.py OcrScorer (54809b5)"
INSTALL = "pip install 't2i-gcpo[ocr]' (or pip install rapidocr-onnxruntime)"


@register_reward(
    "ocr",
    scores="image",
    doc=(
        "text rendering: 1 − (capped) edit distance between the image's OCR text and the "
        "prompt's quoted phrase"
    ),
    weights="none to fetch: RapidOCR's PP-OCRv4 ONNX models ship in the rapidocr-onnxruntime wheel",
    source=SOURCE,
    licence="Apache-2.0 (RapidOCR and the PP-OCR models)",
    example="ocr",
    requires=("rapidocr_onnxruntime",),
    install=INSTALL,
)
def load(
    *,
    text_score: Annotated[
        float,
        Option("the confidence a recognised line needs to count (PaddleOCR's drop_score)", low=0, high=1),
    ] = 0.5,
    threads: Annotated[int | None, Option("onnxruntime threads (null: its default)", low=1)] = None,
) -> OcrReward:
    return OcrReward(text_score=text_score, threads=threads)


def target_phrase(prompt: str) -> str:
    """The phrase a prompt asks to render: the text after its first double quote, up to the next one."""
    parts = prompt.split('"')
    return parts[1] if len(parts) > 1 else ""


def normalise(text: str) -> str:
    return text.replace(" ", "").lower()


def levenshtein(a: str, b: str) -> int:
    """The edit distance (insertions, deletions, substitutions, each 1) between `a` and `b`."""
    if len(a) < len(b):
        a, b = b, a
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def text_reward(recognised: str, phrase: str) -> tuple[float, int]:
    """(r, d) of the module docstring for the recognised text and the prompt's phrase."""
    o, t = normalise(recognised), normalise(phrase)
    d = 0 if t in o else min(levenshtein(o, t), len(t))
    return 1.0 - d / len(t), d


class OcrReward:
    """r_i = 1 − d_i / |t_i| (module docstring); details: ``text`` (what was read),
    ``target``, ``distance``."""

    name = "ocr"
    bounds = (0.0, 1.0)

    def __init__(self, text_score: float = 0.5, threads: int | None = None, engine=None):
        if engine is None:
            try:
                from rapidocr_onnxruntime import RapidOCR
            except ImportError:
                raise UserError(f"reward 'ocr' needs rapidocr-onnxruntime: {INSTALL}") from None
            extra = (
                {} if threads is None else {"intra_op_num_threads": int(threads), "inter_op_num_threads": 1}
            )
            engine = RapidOCR(text_score=float(text_score), use_cls=False, **extra)
        self.engine = engine
        self.text_score = float(text_score)

    def check_prompts(self, prompts: list[str], metadata: list[dict]) -> None:
        """Every prompt quotes the phrase to render ("…"), with something besides spaces in it."""
        for prompt in prompts:
            if not normalise(target_phrase(prompt)):
                raise UserError(
                    f"the OCR reward scores the phrase a prompt quotes, and {shorten(prompt)!r} quotes none: "
                    'write the text to render in double quotes, e.g. a sign that says "OPEN"'
                )

    def read(self, image_rgb) -> str:
        """The text the engine reads in one uint8 [H, W, 3] RGB image: its kept lines, joined."""
        import numpy as np

        result, _ = self.engine(
            np.ascontiguousarray(image_rgb[..., ::-1]), use_cls=False, text_score=self.text_score
        )
        return "".join(str(text) for _, text, conf in (result or []) if float(conf) > 0)

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        import torch

        from t2i_gcpo.rewards.forms.shapeworld import to_uint8_images

        self.check_prompts(prompts, metadata)
        scores, details = [], []
        for image, prompt in zip(to_uint8_images(images), prompts):
            text = self.read(image)
            r, d = text_reward(text, target_phrase(prompt))
            scores.append(r)
            details.append({"text": text, "target": target_phrase(prompt), "distance": d})
        return RewardOutput(scores=torch.tensor(scores, dtype=torch.float32), details=details)
