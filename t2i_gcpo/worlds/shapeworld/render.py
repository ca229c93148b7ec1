"""ShapeWorld renderer and scene sampler (docs/worlds/shapeworld.md).

Coordinates are fractions of the canvas so one scene renders at any size: `cx`, `cy` ∈ [0, 1] are
the centre (y grows downward), `size` is the side of the object's square bounding box as a
fraction of the canvas side. Sampled scenes put every object on the token grid of the VQ (4 px
cells), one free cell between objects, at one of two scales:
- 32 px (8×8 tokens, the shipped world): an 8 px box, exactly 2×2 tokens with one raster pattern
  per shape (151 distinct 4×4 patches in all, within the 256-entry codebook), so the prior's
  randomness is in what GenEval scores — layout, class, colour, count — and not in sub-token pixel
  offsets and sizes that no prompt asks about (those made most sampled objects malformed blobs and
  drowned RL's gradient in irrelevant choices; docs/results/shapeworld.md#gradient-signal).
- 64 px (16×16 tokens): a 16 px box, 4×4 tokens, drawn with inner detail — a 2 px rim in the
  object's colour around a pale core of the same colour (`core_rgb`: 65 % colour over the gray
  background) — so the tokens inside an object are not flat copies of its first one.
Shapes are rasterised with 5×5 supersampling and a hard > 50 % coverage threshold: every pixel is
exactly the object colour, its core colour (64 px) or the background, which keeps colours crisp for
the VQ tokenizer and the detector. The core lies on the blend line from the background to the
object's colour, so the detector (detect.py) reads it as that colour.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from t2i_gcpo.errors import UserError, shorten
from t2i_gcpo.scoring.geneval_rules import relative_position
from t2i_gcpo.worlds.shapeworld.constants import BACKGROUND_RGB, COLOR_RGB, COLORS, SHAPES

_SUPERSAMPLE = 5  # odd, so a pixel is never exactly half covered
# At 32×32 (both scale with the canvas): the token cell of the 8×8 VQ grid, and the object side —
# two cells, the smallest at which the five shapes stay apart (detector: 100 % on clean renders).
_CELL_PX = 4
_SIDE_PX = 8
_GAP_CELLS = 1  # free cells between bounding boxes: objects never share a token
# The 64 px scale, used for canvases of 64 px and more (scaled with the canvas like the 32 px one):
# 4 px cells of the 16×16 VQ grid, 16 px objects (4×4 tokens) with a rim of 2 px around a core.
DETAIL_MIN_PX = 64
_SIDE_PX_64 = 16
_RIM_PX_64 = 2  # the cross's 6 px arms keep a 2 px core
CORE_ALPHA = 0.65  # core colour = background + CORE_ALPHA · (colour − background)


@dataclass
class ShapeObject:
    shape: str  # one of SHAPES
    color: str  # one of COLORS
    cx: float  # centre x, fraction of canvas width
    cy: float  # centre y, fraction of canvas height (y grows downward)
    size: float  # side of the square bounding box, fraction of canvas side

    def box(self, size: int) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) square layout box in pixels of a `size`×`size` canvas (every shape spans
        it fully, except the bar, which fills only its middle half vertically)."""
        h = self.size * size / 2
        return (self.cx * size - h, self.cy * size - h, self.cx * size + h, self.cy * size + h)


def _inside(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Membership of normalised points (u, v ∈ [-1, 1] across the bounding box) in a shape."""
    au, av = np.abs(u), np.abs(v)
    box = (au <= 1) & (av <= 1)
    if shape == "circle":
        return u**2 + v**2 <= 1
    if shape == "square":
        return box
    if shape == "triangle":  # apex up, base down
        return box & (au <= (v + 1) / 2)
    if shape == "diamond":
        return au + av <= 1
    if shape == "cross":  # arms one third of the side wide
        return box & (np.minimum(au, av) <= 1 / 3)
    if shape == "bar":  # horizontal, half as tall as wide
        return (au <= 1) & (av <= 0.5)
    raise UserError(f"unknown ShapeWorld shape {shape!r}: expected one of {', '.join(SHAPES)}")


def _mask(obj: ShapeObject, size: int) -> np.ndarray:
    """[size, size] bool — pixels with more than half of their 5×5 subsamples inside the shape."""
    s = _SUPERSAMPLE
    coords = (np.arange(size * s) + 0.5) / (size * s)  # sub-pixel centres as canvas fractions
    half = obj.size / 2
    u = (coords[None, :] - obj.cx) / half  # [1, size*s]
    v = (coords[:, None] - obj.cy) / half  # [size*s, 1]
    inside = _inside(obj.shape, u, v).astype(np.float32)  # [size*s, size*s]
    coverage = inside.reshape(size, s, size, s).mean(axis=(1, 3))
    return coverage >= 0.5


def object_masks(objects: list[ShapeObject], size: int = 32) -> list[np.ndarray]:
    """One [size, size] bool mask per object (later objects are drawn on top but masks are full)."""
    return [_mask(o, size) for o in objects]


def has_detail(size: int) -> bool:
    """Whether a `size` px canvas is drawn at the 64 px scale (objects with a rim and a pale core)."""
    return size >= DETAIL_MIN_PX


def core_rgb(color: str) -> tuple[int, int, int]:
    """The pale core colour of a `color` object at the 64 px scale: on the background–colour line."""
    bg, c = np.array(BACKGROUND_RGB, float), np.array(COLOR_RGB[color], float)
    return tuple(int(v) for v in np.round(bg + CORE_ALPHA * (c - bg)))


def erode(mask: np.ndarray, r: int) -> np.ndarray:
    """[H, W] bool — pixels whose whole (2r+1)×(2r+1) neighbourhood lies in `mask` (outside the
    canvas counts as outside the mask)."""
    from scipy.ndimage import binary_erosion

    mask = np.asarray(mask, dtype=bool)
    if r < 1:  # scipy reads iterations=0 as "until nothing changes"
        return mask
    return binary_erosion(mask, structure=np.ones((3, 3), dtype=bool), iterations=r, border_value=0)


def rim_px(size: int) -> int:
    """Width of an object's rim on a `size` px canvas at the 64 px scale (2 px at 64 px)."""
    return int(round(_RIM_PX_64 * size / DETAIL_MIN_PX))


def core_masks(masks: list[np.ndarray], size: int) -> list[np.ndarray]:
    """Each object's pale core at the 64 px scale (its mask eroded by the rim); empty below."""
    if not has_detail(size):
        return [np.zeros_like(m) for m in masks]
    return [erode(m, rim_px(size)) for m in masks]


def render(objects: list[ShapeObject], size: int = 32) -> np.ndarray:
    """Draw objects on the #999999 background (with rim and pale core from 64 px). Returns uint8
    [size, size, 3]."""
    img = np.empty((size, size, 3), dtype=np.uint8)
    img[:] = BACKGROUND_RGB
    masks = object_masks(objects, size)
    for obj, m, core in zip(objects, masks, core_masks(masks, size)):
        if obj.color not in COLOR_RGB:
            raise UserError(f"unknown colour {obj.color!r}: expected one of {', '.join(COLORS)}")
        img[m] = COLOR_RGB[obj.color]
        img[core] = core_rgb(obj.color)
    return img


def token_grid_mask(masks: list[np.ndarray], grid: tuple[int, int]) -> np.ndarray:
    """[rows, cols] bool — tokens "on an object" for credit-lift scoring
    (docs/worlds/shapeworld.md#credit-lift).

    The union of `masks` is split into a rows×cols grid of pixel blocks (block edges at
    round(i·H/rows)); a token is on an object when ≥ 25 % of its block's pixels are object pixels.
    With no masks every token is off.
    """
    rows, cols = grid
    if not masks:
        return np.zeros((rows, cols), dtype=bool)
    union = np.logical_or.reduce([np.asarray(m, dtype=bool) for m in masks])  # [H, W]
    H, W = union.shape
    ys = np.round(np.linspace(0, H, rows + 1)).astype(int)
    xs = np.round(np.linspace(0, W, cols + 1)).astype(int)
    out = np.zeros((rows, cols), dtype=bool)
    for r in range(rows):
        for c in range(cols):
            block = union[ys[r] : ys[r + 1], xs[c] : xs[c + 1]]
            out[r, c] = block.size > 0 and block.mean() >= 0.25
    return out


# ---- scene sampling -------------------------------------------------------------------------


def _boxes_clear(a: tuple, b: tuple, gap: float) -> bool:
    """True if two pixel boxes are at least `gap` pixels apart along x or y."""
    return a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1]


def _relation_clear(box_a: tuple, box_b: tuple, relation: str) -> bool:
    """`relation` holds with a safety margin: boxes grown by 1 px (VQ blur) and every other box
    perturbation of ±1 px on the centre still gives the relation under GenEval's rule."""
    grown_a = (box_a[0] - 1, box_a[1] - 1, box_a[2] + 1, box_a[3] + 1)
    grown_b = (box_b[0] - 1, box_b[1] - 1, box_b[2] + 1, box_b[3] + 1)
    for ddx in (-1.0, 0.0, 1.0):
        for ddy in (-1.0, 0.0, 1.0):
            shifted = (grown_a[0] + ddx, grown_a[1] + ddy, grown_a[2] + ddx, grown_a[3] + ddy)
            if relation not in relative_position(shifted, grown_b):
                return False
    return True


def _check_classes(metadata: dict) -> None:
    for clause in list(metadata.get("include", [])) + list(metadata.get("exclude", [])):
        if clause.get("class") not in SHAPES:
            raise UserError(
                f"ShapeWorld cannot draw class {clause.get('class')!r}: expected one of {', '.join(SHAPES)}"
            )
        if "color" in clause and clause["color"] not in COLOR_RGB:
            raise UserError(f"unknown colour {clause['color']!r}: expected one of {', '.join(COLORS)}")


def _geometry(size: int) -> tuple[float, float]:
    """(token cell, object side) in pixels of a `size` px canvas: the 32 px scale below
    DETAIL_MIN_PX, the 64 px scale from there, each scaled with the canvas."""
    if has_detail(size):
        return size / DETAIL_MIN_PX * _CELL_PX, size / DETAIL_MIN_PX * _SIDE_PX_64
    return size / 32 * _CELL_PX, size / 32 * _SIDE_PX


def sample_scene(metadata: dict, rng: np.random.Generator, size: int = 32) -> list[ShapeObject]:
    """A random scene that satisfies GenEval `metadata` (docs/worlds/shapeworld.md, rules of
    docs/evaluation/geneval.md).

    Every include clause gets exactly `count` objects of its class (count 1 if absent), in its
    colour if one is required, else in a random colour; no other objects are added, so excludes
    (count + 1 for counting prompts) always hold. Objects sit on the token grid (2×2 cells of
    4 px at 32 px, 4×4 cells of 4 px at 64 px; `_geometry`), one free cell apart, and position
    clauses hold with a margin that survives ±1 px box noise.
    """
    _check_classes(metadata)
    includes = list(metadata.get("include", []))
    if not includes:
        raise UserError("metadata has no 'include' clause: nothing to draw")
    specs: list[tuple[int, str, str | None]] = []  # (clause index, shape, colour or None)
    for i, clause in enumerate(includes):
        for _ in range(int(clause.get("count", 1))):
            specs.append((i, clause["class"], clause.get("color")))
    if len(specs) > 6:
        raise UserError(f"ShapeWorld scenes hold at most 6 objects, metadata asks for {len(specs)}")
    relations = [
        (i, clause["position"][0], int(clause["position"][1]))
        for i, clause in enumerate(includes)
        if "position" in clause
    ]

    cell, side = _geometry(size)
    slots = int(round((size - side) / cell)) + 1  # cell positions a box corner can take per axis
    gap = _GAP_CELLS * cell
    for _attempt in range(200):
        boxes: list[tuple[float, float, float, float]] = []
        ok = True
        for _obj in specs:
            for _ in range(60):
                x0 = float(rng.integers(slots)) * cell
                y0 = float(rng.integers(slots)) * cell
                box = (x0, y0, x0 + side, y0 + side)
                if all(_boxes_clear(box, b, gap) for b in boxes):
                    boxes.append(box)
                    break
            else:
                ok = False
                break
        if not ok:
            continue
        ok = all(
            _relation_clear(boxes[a], boxes[b], rel)
            for ci, rel, ti in relations
            for a in range(len(specs))
            if specs[a][0] == ci
            for b in range(len(specs))
            if specs[b][0] == ti
        )
        if ok:
            return [
                ShapeObject(
                    shape=shape,
                    color=color if color is not None else COLORS[int(rng.integers(len(COLORS)))],
                    cx=float((bx[0] + bx[2]) / 2 / size),
                    cy=float((bx[1] + bx[3]) / 2 / size),
                    size=float((bx[2] - bx[0]) / size),
                )
                for (_, shape, color), bx in zip(specs, boxes)
            ]
    raise UserError(
        f"could not place a scene for {shorten(str(metadata.get('prompt', metadata)))!r} on a {size}px canvas"
    )
