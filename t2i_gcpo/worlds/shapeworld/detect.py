"""The ShapeWorld detector: reads objects (class, colour, box, mask, confidence) back from pixels.

Steps, each robust to the blur and colour drift of a VQ reconstruction:
1. colour: every pixel is explained as a blend p = bg + α·(c − bg) of the #999999 background and
   the palette colour c whose blend line passes closest (so a blurred black edge stays black rather
   than turning brown); pixels with α ≥ 0.5 are foreground.
2. segment: 4-connected components of the foreground; a component's colour is the α-weighted vote
   of its pixels, and a component with two strong colours (touching objects) is split between them.
3. shape: analysis by synthesis on the component's coverage map α. Blur keeps mass and centroid, so
   each shape's box follows from them; the shape is drawn exactly as the renderer draws it around
   that box, sharp and blurred (σ 0.6–1.2 px), and compared by soft IoU; the best shape wins.
4. confidence: sigmoid(16·(IoU − 0.6)) times a small-area penalty: ≈ 1 for clean renders, ≈ 0.99
   for blurred ones (IoU ≈ 0.9), below 0.3 for blobs that fit no shape (IoU < 0.55).
   GenEval keeps scores > 0.3, > 0.9 for counting prompts.
At the 64 px scale (render.has_detail) objects have a pale core on their colour's blend line
(α ≈ 0.65): it is read as the object's colour by step 1, holes of faint colour inside a component
(a core the VQ washed out) are filled, and step 3 sees the core as fully covered (its coverage map
is the larger of α and the mask eroded by the rim width, 2 px), so the core does not thin the shape
fit. Eroding by the rim rather than 1 px keeps a blurred cross's filled-in corners soft: after a
273-step VQ round trip 99.5 % of scenes read right against 95 % (1 px) and 99 % (no correction, but
24 % of true objects then score < 0.9). Smaller canvases are read exactly as before.
"""

from __future__ import annotations

import functools

import numpy as np

from t2i_gcpo.scoring.detections import Detection
from t2i_gcpo.worlds.shapeworld.constants import BACKGROUND_RGB, COLOR_RGB, COLORS, SHAPES
from t2i_gcpo.worlds.shapeworld.render import _SUPERSAMPLE, _inside, erode, has_detail, rim_px

_MIN_AREA_32 = 10  # components smaller than this (pixels at 32×32, scaled by area) are noise
_FULL_AREA_32 = 24  # components at least this large get no small-area penalty
_IOU_MID, _IOU_SLOPE = 0.6, 16.0  # confidence = sigmoid(slope · (IoU − mid))
_SPLIT_SHARE = 0.25  # a second colour with this share of a component's colour votes splits it
_HOLE_ALPHA = 0.25  # 64 px scale: enclosed non-foreground regions of at least this mean α are filled

_BG_RGB = np.array(BACKGROUND_RGB, dtype=np.float32)  # [3]
_DIRS = np.array([COLOR_RGB[c] for c in COLORS], dtype=np.float32) - _BG_RGB  # [10, 3] colour − background
_DIRS_SQ = (_DIRS**2).sum(axis=1)  # [10]


def _components(group: np.ndarray) -> np.ndarray:
    """4-connected components of equal positive values of `group` [H, W] int (0 = none).

    Returns [H, W] int labels (0 = none); a component's label is 1 + the flat index of its first
    pixel in raster order, so labels sort in the order the components start.
    """
    from scipy.ndimage import label

    labels = np.zeros(group.shape, dtype=np.int64)
    count = 0
    for value in np.unique(group[group > 0]):
        found, n = label(group == value)  # scipy's default structure in 2-D: 4-connectivity
        labels[found > 0] = found[found > 0] + count
        count += n
    values, first = np.unique(labels, return_index=True)
    relabel = np.zeros(count + 1, dtype=np.int64)
    relabel[values] = first + 1
    relabel[0] = 0
    return relabel[labels]


def _faint_holes(fg: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """[H, W] bool — 4-connected regions of ~`fg` that do not reach the image border and whose mean
    `alpha` is at least _HOLE_ALPHA (a faded core, not background enclosed by objects)."""
    from scipy.ndimage import binary_fill_holes

    comps = _components((binary_fill_holes(fg) & ~fg).astype(np.int64))  # enclosed, 4-connected
    holes = np.zeros_like(fg)
    for lab in np.unique(comps[comps > 0]):
        region = comps == lab
        if alpha[region].mean() >= _HOLE_ALPHA:
            holes |= region
    return holes


# Shape geometry for the moment fit: area / box area, and (centroid − box centre) / side along y.
_FILL = {"circle": np.pi / 4, "square": 1.0, "triangle": 0.5, "cross": 5 / 9, "bar": 0.5}
_CENTROID_DY = {"triangle": 1 / 6}  # apex-up triangle: centroid one sixth of the side below centre
_HEIGHT = {"bar": 0.5}  # object height / side of its square layout box (1 for the others)
_SCALES = np.array([0.92, 1.0, 1.08])  # candidate sides around the moment estimate
_OFFSETS = np.array([(0.0, 0.0), (0.5, 0.0), (-0.5, 0.0), (0.0, 0.5), (0.0, -0.5)])  # (x, y) pixels
_BLURS = (0.6, 0.9, 1.2)  # Gaussian σ (pixels) of blurred templates, besides the sharp one
_PAD = 3  # crop margin around a component: room for blurred edges


def _raster(shape: str, boxes: np.ndarray, origin: tuple[int, int], hw: tuple[int, int]) -> np.ndarray:
    """[C, h, w] float 0/1 — the shape drawn as the renderer draws it (5×5 supersampling, > half
    covered) in each box (cx, cy, side) of `boxes` [C, 3], pixels, on a crop at `origin` (y, x)."""
    (h, w), S = hw, _SUPERSAMPLE
    sub_x = origin[1] + (np.arange(w * S) + 0.5) / S  # [w*S] sub-pixel centres, image pixels
    sub_y = origin[0] + (np.arange(h * S) + 0.5) / S  # [h*S]
    cx, cy, half = (boxes[:, i, None, None] for i in range(3))  # [C, 1, 1]
    half = half / 2
    inside = _inside(shape, (sub_x[None, None, :] - cx) / half, (sub_y[None, :, None] - cy) / half)
    cover = (
        _pool_matrix(h, S) @ inside.astype(np.float32) @ _pool_matrix(w, S).T
    )  # [C, h, w] sub-pixel counts
    return (cover > S * S // 2).astype(np.float32)


@functools.cache
def _pool_matrix(n: int, S: int) -> np.ndarray:
    """[n, n·S] 0/1 matrix summing each run of S sub-pixels into its pixel (a matmul: far faster
    than numpy's strided sum)."""
    return np.kron(np.eye(n, dtype=np.float32), np.ones((1, S), dtype=np.float32))


@functools.cache
def _blur_matrix(n: int, sigma: float) -> np.ndarray:
    """[n, n] banded matrix M with (M @ x) = x convolved with a Gaussian (σ, truncated at 2.5σ) and
    zero padding outside the n samples."""
    r = int(np.ceil(2.5 * sigma))
    k = np.exp(-(np.arange(-r, r + 1) ** 2) / (2 * sigma**2))
    k /= k.sum()
    offset = np.arange(n)[None, :] - np.arange(n)[:, None]  # [n, n] column − row
    return np.where(np.abs(offset) <= r, k[np.clip(offset + r, 0, 2 * r)], 0.0).astype(np.float32)


def _blur(stack: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of [C, h, w] with zero padding (outside the crop is background)."""
    _, h, w = stack.shape
    return _blur_matrix(h, sigma) @ stack @ _blur_matrix(w, sigma).T  # [C, h, w]


def _fit_shapes(alpha: np.ndarray, origin: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Match an object's coverage map to every shape by analysis by synthesis.

    `alpha` [h, w] ∈ [0, 1] is the share of object colour in each pixel of a crop at `origin`.
    Blur keeps mass and centroid, so for each shape the box side follows from the mass
    (side² · fill = Σα) and the centre from the centroid; around that estimate the shape is drawn
    (3 sides × 5 centres), optionally blurred (σ ∈ {0.6, 0.9, 1.2}), and compared with soft IoU
    Σ min / Σ max. Returns the best soft IoU per shape [S] and the best box (cx, cy, side) per
    shape [S, 3], in image pixels.
    """
    h, w = alpha.shape
    mass = float(alpha.sum())
    if mass <= 0:
        raise ValueError("_fit_shapes: the coverage map is empty (no share of the object's colour)")
    ys, xs = np.mgrid[0:h, 0:w]
    mx = origin[1] + 0.5 + float((alpha * xs).sum()) / mass  # centroid, image pixels
    my = origin[0] + 0.5 + float((alpha * ys).sum()) / mass
    sims, boxes = np.zeros(len(SHAPES)), np.zeros((len(SHAPES), 3))
    for k, shape in enumerate(SHAPES):
        side = np.sqrt(mass / _FILL[shape])
        cand = np.array(
            [
                (mx + ox, my - _CENTROID_DY.get(shape, 0.0) * side * sc + oy, side * sc)
                for sc in _SCALES
                for ox, oy in _OFFSETS
            ]
        )  # [C, 3]
        sharp = _raster(shape, cand, origin, (h, w))  # [C, h, w]
        templates = np.concatenate([sharp] + [_blur(sharp, s) for s in _BLURS])  # [C·4, h, w]
        soft_iou = np.minimum(templates, alpha).sum(axis=(1, 2)) / np.maximum(templates, alpha).sum(
            axis=(1, 2)
        )
        best = int(soft_iou.argmax())
        sims[k], boxes[k] = soft_iou[best], cand[best % len(cand)]
    return sims, boxes


def detect(image: np.ndarray) -> list[Detection]:
    """Detect ShapeWorld objects in an RGB uint8 image [H, W, 3]; sorted by score, best first."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected an RGB image [H, W, 3], got shape {image.shape}")
    H, W = image.shape[:2]
    scale = H * W / (32 * 32)
    min_area, full_area = _MIN_AREA_32 * scale, _FULL_AREA_32 * scale
    # 1. every pixel as a blend of the background and one palette colour: p = bg + α·(c − bg)
    diff = image.astype(np.float32) - _BG_RGB  # [H, W, 3]
    alphas = np.clip(diff @ _DIRS.T / _DIRS_SQ, 0.0, 1.0)  # [H, W, 10] share of each colour
    resid = np.linalg.norm(diff[:, :, None, :] - alphas[..., None] * _DIRS, axis=-1)  # [H, W, 10]
    label = resid.argmin(axis=-1)  # [H, W] the colour whose blend line passes closest
    alpha = np.take_along_axis(alphas, label[..., None], axis=-1)[..., 0]  # [H, W]
    fg = alpha >= 0.5  # more object than background
    detail = has_detail(min(H, W))
    if detail:
        fg |= _faint_holes(fg, alpha)

    # 2. foreground components, each with its colour; two strong colours split a component
    objects: list[tuple[np.ndarray, int]] = []  # (mask [H, W], colour index)
    comps = _components(fg.astype(np.int64))

    def colour_votes(region: np.ndarray) -> np.ndarray:  # [10] each colour's α over the region's pixels
        return np.bincount(label[region], weights=alpha[region], minlength=len(COLORS))

    for lab in np.unique(comps[comps > 0]):
        comp = comps == lab
        if comp.sum() < min_area:
            continue
        votes = colour_votes(comp)
        strong = [c for c in np.argsort(-votes) if votes[c] >= max(_SPLIT_SHARE * votes.sum(), min_area / 2)]
        if len(strong) <= 1:
            objects.append((comp, int(votes.argmax())))
            continue
        owner = np.array(strong)[resid[:, :, strong].argmin(axis=-1)]  # [H, W] closest strong colour
        sub = _components(np.where(comp, owner + 1, 0))
        for sl in np.unique(sub[sub > 0]):
            m = sub == sl
            if m.sum() >= min_area:
                colour = int(owner[m][0])
                if alphas[..., colour][m].sum() == 0:  # a weak colour's own patch, cut off from its
                    # neighbour: none of the closest strong colour in it, so it keeps the colour it has
                    colour = int(colour_votes(m).argmax())
                objects.append((m, colour))

    # 3–4. shape by analysis by synthesis on the object's coverage map, confidence from the fit
    detections = []
    for i, (mask, colour) in enumerate(objects):
        ys, xs = np.nonzero(mask)
        y0, y1 = max(int(ys.min()) - _PAD, 0), min(int(ys.max()) + 1 + _PAD, H)
        x0, x1 = max(int(xs.min()) - _PAD, 0), min(int(xs.max()) + 1 + _PAD, W)
        cover = alphas[y0:y1, x0:x1, colour].copy()  # [h, w] share of the object's colour
        others = np.zeros((H, W), dtype=bool)
        for j, (m, _) in enumerate(objects):
            if j != i:
                others |= m
        cover[others[y0:y1, x0:x1]] = 0.0  # neighbours' pixels are not this object's
        if detail:  # the pale core counts as covered
            cover = np.maximum(cover, erode(mask, rim_px(H))[y0:y1, x0:x1])
        sims, boxes = _fit_shapes(cover, (y0, x0))
        k = int(sims.argmax())
        cx, cy, side = boxes[k]
        area_factor = min(1.0, max(0.0, (mask.sum() - min_area) / (full_area - min_area)))
        score = area_factor / (1.0 + np.exp(-_IOU_SLOPE * (sims[k] - _IOU_MID)))
        half_w, half_h = side / 2, side / 2 * _HEIGHT.get(SHAPES[k], 1.0)  # the object's own extent
        box = (float(cx - half_w), float(cy - half_h), float(cx + half_w), float(cy + half_h))
        detections.append(
            Detection(cls=SHAPES[k], box=box, score=float(score), mask=mask, color=COLORS[colour])
        )
    detections.sort(key=lambda d: -d.score)
    return detections
