"""GenEval as an RL reward on real images (docs/evaluation/geneval.md#geneval-as-a-reward,
the flow_grpo variant).

Per image: detect objects (Mask2Former, a local checkpoint), classify colours with CLIP, and score
the prompt's GenEval metadata with the rules engine's partial-credit reward: per include clause
1 − |count − found| / count, a colour term 1 − |count − n_colour| / count and a position term (1 or 0),
averaged; a wrong count gives 0 for its colour/position terms (``variant="spec"``, the default, in
[0, 1]), or flow_grpo's code term for term (``variant="flow_grpo"``: an over-count goes negative, a
failed position scores 0 then 1 — `reward_detections`; reward spec ``geneval:DET,CLIP[,MODEL],flow_grpo``).
The strict 0/1 GenEval correctness is kept in the details (``strict``) so both can be reported side
by side.

The detector is any callable PIL image → list[Detection]; the colour classifier anything with
``color_of(image) -> (Detection -> colour name)``. ``from_paths`` builds the real pair:
`Mask2FormerDetector` (t2i_gcpo/scoring/detector_mask2former.py) and `ClipColorClassifier`
(t2i_gcpo/scoring/color_clip.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards._common import images_to_pil
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.registry import Arg, Option, register_reward

if TYPE_CHECKING:
    import torch

    from t2i_gcpo.scoring.detections import Detection


@register_reward(
    "geneval",
    scores="image",
    doc=(
        "GenEval's partial credit against each prompt's GenEval metadata: Mask2Former "
        "detections, CLIP colours"
    ),
    weights="a transformers Mask2Former folder (facebook/mask2former-swin-small-coco-instance) and an "
    "open_clip checkpoint (OpenAI ViT-L-14)",
    source="GenEval's rules and flow_grpo's partial credit: docs/evaluation/geneval.md#geneval-as-a-reward",
    licence="CC BY-NC 4.0 (Mask2Former COCO weights); MIT (OpenAI CLIP)",
    example="geneval:/models/mask2former-swin-small-coco-instance,/models/ViT-L-14.bin,flow_grpo",
)
def load(
    detector_dir: Annotated[str, Arg("a transformers Mask2Former folder", kind="path")],
    clip_ckpt: Annotated[str, Arg("open_clip weights for the colour classifier", kind="path")],
    model_name: Annotated[str, Arg("the open_clip architecture")] = "ViT-L-14",
    *,
    variant: Annotated[
        Literal["spec", "flow_grpo"],
        Option(
            "partial credit: 'spec' (in [0, 1]) or 'flow_grpo' (its code term for term; write "
            "the flag flow_grpo)"
        ),
    ] = "spec",
    device: str = "cpu",
) -> GenEvalReward:
    return GenEvalReward.from_paths(detector_dir, clip_ckpt, model_name, device=device, variant=variant)


class GenEvalReward:
    """r_i = GenEval partial credit (default) or strict correctness of image i against its metadata."""

    name = "geneval"

    def __init__(
        self,
        detector: Callable[[Any], list[Detection]],
        color_classifier: Any,
        score: Literal["partial", "strict"] = "partial",
        variant: Literal["spec", "flow_grpo"] = "spec",
    ):
        from t2i_gcpo.scoring.geneval_rules import check_score_and_variant

        check_score_and_variant("GenEval", "score", score, variant)
        self.detector = detector
        self.color_classifier = color_classifier
        self.score = score
        self.variant = variant

    @property
    def bounds(self) -> tuple[float, float] | None:
        """The range every score lies in (rewards.combine.reward_bounds;
        geneval_rules.partial_credit_bounds)."""
        from t2i_gcpo.scoring.geneval_rules import partial_credit_bounds

        return partial_credit_bounds(self.score, self.variant)

    @classmethod
    def from_paths(
        cls,
        detector_dir: str,
        clip_checkpoint: str,
        clip_model: str = "ViT-L-14",
        device: str | torch.device = "cpu",
        score: Literal["partial", "strict"] = "partial",
        variant: Literal["spec", "flow_grpo"] = "spec",
    ) -> GenEvalReward:
        """Mask2Former (local transformers checkpoint dir) + open_clip colour classifier (local weights)."""
        from t2i_gcpo.scoring.color_clip import ClipColorClassifier
        from t2i_gcpo.scoring.detector_mask2former import Mask2FormerDetector

        detector = Mask2FormerDetector.from_pretrained(detector_dir, device=device)
        colors = ClipColorClassifier.from_pretrained(clip_checkpoint, clip_model, device=device)
        return cls(detector, colors, score=score, variant=variant)

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        import torch

        from t2i_gcpo.scoring.geneval_rules import reward_detections  # looked up per call (tests patch it)

        missing = [i for i, m in enumerate(metadata) if not m or "include" not in m]
        if missing or len(metadata) != len(prompts):
            raise UserError(
                "the GenEval reward needs GenEval metadata ({'tag', 'include', …}) for every prompt; "
                f"missing for sample(s) {missing[:8]} — use a prompt set with metadata (e.g. GenEval's)"
            )
        scores, details = [], []
        for image, meta in zip(images_to_pil(images), metadata):
            detections = self.detector(image)
            color_of = self.color_classifier.color_of(image)
            result = reward_detections(meta, detections, color_of, variant=self.variant)
            strict, partial = float(bool(result.correct)), float(result.partial)
            scores.append(partial if self.score == "partial" else strict)
            details.append(
                {"strict": strict, "partial": partial, "reason": result.reason, "tag": meta.get("tag")}
            )
        return RewardOutput(scores=torch.tensor(scores, dtype=torch.float32), details=details)
