"""The detection record every detector produces and the GenEval rules engine consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Detection:
    cls: str  # GenEval/COCO class name (or ShapeWorld shape name), e.g. "circle", "dog"
    box: tuple[float, float, float, float]  # (x0, y0, x1, y1) in pixels, y grows downward
    score: float  # detector confidence in [0, 1]
    mask: np.ndarray | None = None  # [H, W] bool — the object's pixels
    color: str | None = None  # one of GenEval's 10 colour names, if the detector knows it
