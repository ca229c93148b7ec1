"""ShapeWorld vocabulary (docs/worlds/shapeworld.md): shape classes, GenEval's 10 colours,
the gray background.

Colour RGB values are chosen to be far apart from each other and from the background (minimum
pairwise RGB distance ≥ 70), so a nearest-palette classifier survives VQ reconstruction noise.
"""

from __future__ import annotations

# GenEval's colour list, in GenEval's order (evaluation/evaluate_images.py).
COLORS: list[str] = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white"]

COLOR_RGB: dict[str, tuple[int, int, int]] = {
    "red": (220, 20, 20),
    "orange": (255, 140, 0),
    "yellow": (250, 235, 20),
    "green": (20, 160, 40),
    "blue": (30, 60, 235),
    "purple": (130, 30, 180),
    "pink": (255, 120, 210),
    "brown": (110, 60, 15),
    "black": (0, 0, 0),
    "white": (255, 255, 255),
}

BACKGROUND_RGB: tuple[int, int, int] = (153, 153, 153)  # #999999, GenEval's compositing gray
BACKGROUND_HEX = "#999999"

# Shape classes that stay apart at 32×32 after a VQ round trip: each fills its (square) bounding box
# differently — fill 0.79 / 1.0 / 0.5 / 0.56 / 0.5, the bar flat, the triangle apex-up — and
# blur keeps those differences (a diamond was tried and dropped: blurred, it passes for a circle
# or a cross).
SHAPES: list[str] = ["circle", "square", "triangle", "cross", "bar"]

# GenEval's six tags, in the order of GenEval's summary.
TAGS: list[str] = ["single_object", "two_object", "counting", "colors", "position", "color_attr"]

RELATIONS: list[str] = ["left of", "right of", "above", "below"]

NUMBER_WORDS: dict[int, str] = {2: "two", 3: "three", 4: "four"}
