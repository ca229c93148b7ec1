"""GenEval's colour classifier: CLIP zero-shot over 10 colours on the masked object
(docs/evaluation/geneval.md).

GenEval (Ghosh et al., 2023) classifies the colour of each counted object with open_clip ViT-L-14
(`openai` weights): the object is pasted through its mask onto a #999999 background, cropped to its
box, and compared with the text prompts "a photo of a {c} {obj}", "a photo of a {c}-colored {obj}"
and "a photo of a {c} object" for the 10 colours; the text embeddings of the three templates are
averaged per colour (standard CLIP zero-shot ensembling) and the best colour wins.

The weights come from a LOCAL checkpoint file passed as open_clip's ``pretrained`` argument.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from t2i_gcpo.errors import UserError
from t2i_gcpo.scoring.detections import Detection

GENEVAL_COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
COLOR_TEMPLATES = ("a photo of a {c} {obj}", "a photo of a {c}-colored {obj}", "a photo of a {c} object")
BACKGROUND_RGB = (153, 153, 153)  # #999999


def crop_on_background(
    image: Image.Image, detection: Detection, background: tuple[int, int, int] = BACKGROUND_RGB
) -> Image.Image:
    """The object pasted through its mask onto `background`, cropped to its box.

    Pixels outside the mask become `background`; without a mask the box crop is returned as is.
    The box is widened to whole pixels (floor of the start, ceil of the end) and clipped to the image.
    """
    rgb = np.asarray(image.convert("RGB"))  # [H, W, 3] uint8
    h, w = rgb.shape[:2]
    if detection.mask is not None:
        mask = np.asarray(detection.mask, dtype=bool)
        if mask.shape != (h, w):
            raise ValueError(f"mask shape {mask.shape} does not match the image size {(h, w)}")
        rgb = np.where(mask[..., None], rgb, np.asarray(background, dtype=np.uint8))
    x0, y0, x1, y1 = detection.box
    x0, y0 = max(int(math.floor(x0)), 0), max(int(math.floor(y0)), 0)
    x1, y1 = min(int(math.ceil(x1)), w), min(int(math.ceil(y1)), h)
    if x1 <= x0 or y1 <= y0:
        raise ValueError(f"empty box {detection.box} for an image of size {(w, h)}")
    return Image.fromarray(np.ascontiguousarray(rgb[y0:y1, x0:x1]))


class ClipColorClassifier:
    """Zero-shot colour of a detected object, for `evaluate_detections(..., color_of=...)`."""

    def __init__(self, model, preprocess, tokenizer, *, name: str = "clip", colors=GENEVAL_COLORS):
        self.model = model.eval()
        self.preprocess = preprocess
        self.tokenizer = tokenizer
        self.name = name
        self.colors = tuple(colors)
        self._text_cache: dict[str, torch.Tensor] = {}  # object class → [n_colors, D] unit vectors

    @classmethod
    def from_pretrained(
        cls,
        path_or_ckpt: str | os.PathLike,
        model_name: str = "ViT-L-14",
        *,
        quick_gelu: bool = True,
        device: str | torch.device = "cpu",
    ) -> ClipColorClassifier:
        """open_clip `model_name` with weights from the local file `path_or_ckpt`.

        A directory is searched for open_clip_model.safetensors / open_clip_pytorch_model.bin (the
        hub layout of open_clip weights, e.g. ``timm/vit_large_patch14_clip_224.openai``); a file is
        passed to open_clip as is. `quick_gelu`: the OpenAI CLIP weights GenEval uses were trained
        with QuickGELU (open_clip sets it only for the ``openai`` tag, not for a file): keep True
        for them, set False for weights trained with plain GELU (LAION, DataComp).
        """
        import open_clip

        path = Path(path_or_ckpt)
        if path.is_dir():
            found = [
                path / n
                for n in ("open_clip_model.safetensors", "open_clip_pytorch_model.bin", "model.safetensors")
                if (path / n).is_file()
            ]
            if not found:
                raise UserError(f"{path}: no open_clip weights file in this directory")
            path = found[0]
        if not path.is_file():
            raise UserError(f"{path}: CLIP checkpoint file not found")
        if model_name not in open_clip.list_models():
            raise UserError(f"unknown open_clip model {model_name!r}")
        try:
            model, _, preprocess = open_clip.create_model_and_transforms(
                model_name, pretrained=str(path), device=device, force_quick_gelu=quick_gelu
            )
        except Exception as e:  # any load failure of a user-given file is a user error
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UserError(f"{path}: cannot load as open_clip {model_name} ({first})") from None
        tokenizer = open_clip.get_tokenizer(model_name)
        return cls(model, preprocess, tokenizer, name=f"{model_name}:{path.name}")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def text_features(self, obj: str) -> torch.Tensor:
        """[n_colors, D] unit text embeddings for class `obj`, averaged over the 3 templates."""
        if obj not in self._text_cache:
            texts = [t.format(c=c, obj=obj) for c in self.colors for t in COLOR_TEMPLATES]
            emb = self.model.encode_text(self.tokenizer(texts).to(self.device)).float()  # [C*K, D]
            emb = emb / emb.norm(dim=-1, keepdim=True)
            emb = emb.view(len(self.colors), len(COLOR_TEMPLATES), -1).mean(dim=1)  # [C, D]
            self._text_cache[obj] = emb / emb.norm(dim=-1, keepdim=True)
        return self._text_cache[obj]

    @torch.no_grad()
    def classify(self, image: Image.Image, detections: list[Detection]) -> list[str]:
        """The colour name of each detection in `image` (one CLIP image batch)."""
        if not detections:
            return []
        crops = [self.preprocess(crop_on_background(image, d)) for d in detections]
        img = self.model.encode_image(torch.stack(crops).to(self.device)).float()  # [N, D]
        img = img / img.norm(dim=-1, keepdim=True)
        out = []
        for i, d in enumerate(detections):
            logits = self.text_features(d.cls) @ img[i]  # [C]
            out.append(self.colors[int(logits.argmax())])
        return out

    def color_of(self, image: Image.Image) -> Callable[[Detection], str]:
        """A per-image callable Detection → colour name, cached per detection object."""
        cache: dict[int, tuple[Detection, str]] = {}  # id → (detection kept alive, colour)

        def color(detection: Detection) -> str:
            hit = cache.get(id(detection))
            if hit is None or hit[0] is not detection:
                hit = (detection, self.classify(image, [detection])[0])
                cache[id(detection)] = hit
            return hit[1]

        return color
