"""The OCR reward (t2i_gcpo/rewards/forms/ocr.py): flow_grpo's formula by hand, the prompt check, and — with
the ocr extra installed (rapidocr-onnxruntime ships its PP-OCRv4 models in the wheel) — the real engine on
rendered text: an image of the prompt's phrase scores ≥ 0.9, one of another phrase ≤ 0.5."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards.forms.ocr import OcrReward, levenshtein, target_phrase, text_reward
from t2i_gcpo.rewards.registry import build_reward, check_reward_spec

HAS_OCR = importlib.util.find_spec("rapidocr_onnxruntime") is not None
needs_ocr = pytest.mark.skipif(
    not HAS_OCR, reason="the ocr extra is not installed (pip install 't2i-gcpo[ocr]')"
)


def test_the_formula_by_hand():
    assert [
        levenshtein(a, b) for a, b in [("", "abc"), ("kitten", "sitting"), ("open", "bakery"), ("ab", "ab")]
    ] == [3, 3, 5, 0]
    assert target_phrase('a sign that says "OPEN" and "SHUT"') == "OPEN" and target_phrase("no quotes") == ""
    assert text_reward("Hello World", "hello world") == (1.0, 0)  # spaces and case ignored
    assert text_reward("WELCOME TO THE OPEN DAY", "open") == (1.0, 0)  # contained: distance 0
    assert text_reward("OPFN", "open") == (0.75, 1)  # 1 − 1/4
    assert text_reward("a very long unrelated text", "open") == (0.0, 4)  # capped at |t|
    assert text_reward("", "open") == (0.0, 4)


class FakeEngine:
    """RapidOCR's call signature: (lines [[box, text, confidence], …] or None, timings)."""

    def __init__(self, lines):
        self.lines, self.seen = lines, []

    def __call__(self, image, use_cls=None, text_score=None):
        self.seen.append((image.shape, image[0, 0].tolist(), use_cls, text_score))
        return self.lines, [0.0]


def test_lines_are_joined_and_images_go_in_as_bgr():
    engine = FakeEngine([[None, "OP", 0.9], [None, "EN", 0.8]])
    reward = OcrReward(engine=engine)
    red = torch.zeros(1, 3, 8, 12)
    red[:, 0] = 1.0
    out = reward(red, ['a sign that says "OPEN"'], [{}])
    assert out.scores.tolist() == [1.0] and out.details == [{"text": "OPEN", "target": "OPEN", "distance": 0}]
    assert engine.seen == [((8, 12, 3), [0, 0, 255], False, 0.5)]  # BGR: red is the last channel
    assert OcrReward(engine=FakeEngine(None))(red, ['"OPEN"'], [{}]).scores.tolist() == [0.0]


def test_prompts_without_a_quoted_phrase_are_refused():
    reward = OcrReward(engine=FakeEngine(None))
    with pytest.raises(UserError, match="quotes none"):
        reward.check_prompts(['a sign that says "OPEN"', "a sign that says open"], [{}, {}])
    with pytest.raises(UserError, match="quotes none"):
        reward.check_prompts(['a sign that says "  "'], [{}])


def test_a_missing_extra_is_one_line(monkeypatch):
    import t2i_gcpo.rewards.registry as registry

    real = importlib.util.find_spec
    monkeypatch.setattr(
        registry.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "rapidocr_onnxruntime" else real(name, *a),
    )
    with pytest.raises(
        UserError,
        match=(
            r"reward 'ocr' needs the package rapidocr_onnxruntime, not installed: pip install "
            r"'t2i-gcpo\[ocr\]'"
        ),
    ):
        check_reward_spec("0.5*shapeworld+0.5*ocr")


def render(text: str, size: int = 256) -> torch.Tensor:
    """Black text on white, PIL's default (FreeType) font, as [3, H, W] in [0, 1]."""
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=size // 8)
    draw.text((size // 16, size // 2 - size // 16), text, fill="black", font=font)
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 255


@needs_ocr
def test_rendered_phrases_on_the_real_engine():
    reward = build_reward("ocr")
    phrases = ["OPEN", "BAKERY", "HELLO WORLD", "EXIT 12"]
    images = torch.stack([render(p) for p in phrases])
    own = reward(images, [f'a sign that says "{p}"' for p in phrases], [{}] * 4)
    other = reward(images, [f'a sign that says "{p}"' for p in phrases[1:] + phrases[:1]], [{}] * 4)
    assert (own.scores >= 0.9).all(), own.details
    assert (other.scores <= 0.5).all(), other.details
