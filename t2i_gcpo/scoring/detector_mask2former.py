"""GenEval's object detector on PyPI packages: transformers Mask2Former (COCO instance)
(docs/evaluation/geneval.md).

GenEval (Ghosh et al., 2023) runs Mask2Former Swin-S trained on COCO instance segmentation and
keeps, per class, detections above 0.3 (0.9 for counting prompts), at most 16, without NMS. This
adapter returns every instance above a low score floor with its mask and the box around the mask;
the thresholds are the rules engine's job (t2i_gcpo/scoring/geneval_rules.py).

The checkpoint is read from a LOCAL directory, e.g. a copy of the hub's
``facebook/mask2former-swin-small-coco-instance`` (config.json, model.safetensors,
preprocessor_config.json). Nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from t2i_gcpo.errors import UserError
from t2i_gcpo.scoring.detections import Detection
from t2i_gcpo.scoring.geneval_classes import geneval_classes

# COCO label spellings (detectron2 / HF checkpoints, older VOC-style and mmdet variants) that differ
# from GenEval's object_names.txt. Labels are matched case-insensitively with '_'/'-' read as ' '.
COCO_TO_GENEVAL = {
    "mouse": "computer mouse",
    "remote": "tv remote",
    "keyboard": "computer keyboard",
    "tvmonitor": "tv",
    "tv monitor": "tv",
    "tv-monitor": "tv",
    "motorbike": "motorcycle",
    "aeroplane": "airplane",
    "sofa": "couch",
    "pottedplant": "potted plant",
    "diningtable": "dining table",
    "hair dryer": "hair drier",
    "doughnut": "donut",
    "cellphone": "cell phone",
    "mobile phone": "cell phone",
    "hotdog": "hot dog",
    "teddybear": "teddy bear",
    "wineglass": "wine glass",
    "sportsball": "sports ball",
    "ball": "sports ball",
}


def to_geneval_name(label: str, names: set[str]) -> str | None:
    """GenEval's name for a checkpoint label, or None if the label is not one of the 80 classes."""
    key = label.strip().lower().replace("_", " ")
    for candidate in (
        key,
        key.replace("-", " "),
        COCO_TO_GENEVAL.get(key),
        COCO_TO_GENEVAL.get(key.replace(" ", "")),
    ):
        if candidate in names:
            return candidate
    return None


def box_from_mask(mask: np.ndarray) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) in pixels around the True pixels of `mask` [H, W]; end exclusive."""
    ys, xs = np.nonzero(mask)
    return (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))


class Mask2FormerDetector:
    """Instance detector: PIL image → list[Detection] with GenEval class names, masks and boxes."""

    def __init__(self, model, processor, *, score_floor: float = 0.1, name: str = "mask2former"):
        self.model = model.eval()
        self.processor = processor
        self.score_floor = score_floor
        self.name = name
        names = set(geneval_classes())  # GenEval's 80 COCO class names
        id2label = {int(k): v for k, v in model.config.id2label.items()}
        # label id → GenEval name; labels outside the 80 classes (e.g. panoptic "stuff") are dropped
        self.label_names = {i: n for i, lab in id2label.items() if (n := to_geneval_name(lab, names))}
        missing = sorted(names - set(self.label_names.values()))
        if missing:
            shown = ", ".join(missing[:8]) + (", …" if len(missing) > 8 else "")
            raise UserError(
                f"{name}: checkpoint labels do not cover {len(missing)} of GenEval's 80 COCO classes "
                f"({shown}); a COCO instance-segmentation checkpoint is required"
            )

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, *, device: str | torch.device = "cpu", score_floor: float = 0.1
    ) -> Mask2FormerDetector:
        """Load a Mask2Former checkpoint and its image processor from the local directory `path`."""
        from transformers import Mask2FormerForUniversalSegmentation, Mask2FormerImageProcessor

        path = Path(path)
        config_path = path / "config.json"
        if not config_path.is_file():
            raise UserError(f"{path}: not a Mask2Former checkpoint directory (no config.json)")
        from t2i_gcpo.outdir import read_json

        model_type = read_json(config_path, dict[str, object], follow=True).get("model_type")
        if model_type != "mask2former":
            raise UserError(f"{path}: model_type is {model_type!r}, expected 'mask2former'")
        if not (path / "preprocessor_config.json").is_file():
            raise UserError(f"{path}: preprocessor_config.json is missing (copy it from the checkpoint)")
        try:
            model = Mask2FormerForUniversalSegmentation.from_pretrained(path, local_files_only=True)
            processor = Mask2FormerImageProcessor.from_pretrained(path, local_files_only=True)
        except OSError as e:
            raise UserError(f"{path}: cannot load Mask2Former ({str(e).splitlines()[0]})") from None
        return cls(model.to(device), processor, score_floor=score_floor, name=path.name)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def __call__(self, image: Image.Image) -> list[Detection]:
        """All instances of GenEval classes with score ≥ `score_floor`, highest score first."""
        image = image.convert("RGB")
        w, h = image.size
        # one image per call: the processor resizes to multiples of 32 without padding, so the
        # post-processing resize of the mask logits back to (h, w) is exact
        inputs = self.processor(images=image, return_tensors="pt").to(self.device)
        outputs = self.model(**inputs)
        result = self.processor.post_process_instance_segmentation(
            outputs, threshold=self.score_floor, target_sizes=[(h, w)], return_binary_maps=True
        )[0]
        segments = result["segments_info"]
        if not segments:
            return []
        masks = result["segmentation"].bool().cpu().numpy()  # [N, H, W] one binary mask per instance
        detections = []
        for seg, mask in zip(segments, masks):
            cls_name = self.label_names.get(int(seg["label_id"]))
            if cls_name is None or not mask.any():
                continue
            detections.append(
                Detection(cls=cls_name, box=box_from_mask(mask), score=float(seg["score"]), mask=mask)
            )
        detections.sort(key=lambda d: d.score, reverse=True)
        return detections
