"""PickScore (Kirstain et al. 2023, "Pick-a-Pic: An Open Dataset of User Preferences for Text-to-Image
Generation", arXiv 2305.01569): CLIP-H fine-tuned on human preferences between images of one prompt.

    r_i = exp(s) · cos(E_I(x_i), E_T(prompt_i))       s: the model's logit_scale; E: projected CLIP features

Scored as the reference scores: yuvalkirstain/PickScore, README.md "Inference with PickScore" (commit
013b54d70bf3bd9112251e7ab5ea8b2e915de3dc): the CLIP processor on the images and on the prompt (padding,
truncation at 77 tokens), ``get_image_features`` and ``get_text_features`` each divided by its norm, times
``logit_scale.exp()``. The reference goes on to a softmax over the images of one prompt, to pick one; a
reward keeps the score. Its processor was transformers 4.27's CLIPImageProcessor, which works on PIL
images: here `CLIPImageProcessorPil` from the folder's preprocessor_config.json (short side to 224 by PIL
bicubic, centre crop 224, ×1/255, CLIP's mean and std), not transformers 5's default tensor processor,
whose antialiased resize differs slightly.

Weights: a local copy of the Hugging Face repository yuvalkirstain/PickScore_v1 (config.json, the weights,
preprocessor_config.json and the tokenizer files); a folder without the processor files takes them from
``processor=FOLDER`` (laion/CLIP-ViT-H-14-laion2B-s32B-b79K, the reference's processor). Read in float32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards._common import chunks, images_to_pil, load_processor_model
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.registry import Arg, Option, register_reward

if TYPE_CHECKING:
    import torch

SOURCE = "yuvalkirstain/PickScore README.md, 'Inference with PickScore' (013b54d)"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
PROCESSOR_FILES = ("preprocessor_config.json",)
TOKENIZER_FILES = ("tokenizer.json", "vocab.json")


@register_reward(
    "pickscore",
    scores="image",
    doc="PickScore: a CLIP-H trained on Pick-a-Pic preferences, exp(s)·cos(image, prompt)",
    weights="a local copy of yuvalkirstain/PickScore_v1 (transformers CLIPModel + processor files)",
    source=SOURCE,
    licence="not stated in the PickScore repository; see the model card",
    example="pickscore:/models/PickScore_v1",
)
def load(
    folder: Annotated[
        str,
        Arg(
            "a PickScore_v1 folder (transformers CLIPModel)",
            kind="dir",
            metavar="DIR",
            needs=("config.json", WEIGHT_FILES),
        ),
    ],
    *,
    processor: Annotated[
        str | None,
        Option(
            "a folder holding the CLIP processor files, when DIR has none "
            "(laion/CLIP-ViT-H-14-laion2B-s32B-b79K)"
        ),
    ] = None,
    batch_size: Annotated[int, Option("images per forward pass", low=1, high=4096)] = 16,
    device: str = "cpu",
) -> PickScoreReward:
    return PickScoreReward.from_pretrained(folder, processor=processor, batch_size=batch_size, device=device)


class PickScoreReward:
    """r_i = exp(logit_scale) · cos(image_i, prompt_i) (module docstring); details: ``cosine``."""

    name = "pickscore"

    def __init__(self, model, image_processor, tokenizer, batch_size: int = 16):
        self.model = model.eval()
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.batch_size = int(batch_size)

    @classmethod
    def from_pretrained(
        cls,
        folder: str,
        processor: str | None = None,
        batch_size: int = 16,
        device: str | torch.device = "cpu",
    ) -> PickScoreReward:
        """The model in `folder`, its processor there or in `processor` (local files only)."""
        from pathlib import Path

        proc = Path(processor).expanduser() if processor else Path(folder).expanduser()
        missing = [f for f in PROCESSOR_FILES if not (proc / f).is_file()]
        if missing or not any((proc / f).is_file() for f in TOKENIZER_FILES):
            what = ", ".join(missing) or " or ".join(TOKENIZER_FILES)
            hint = (
                "" if processor else "; give processor=FOLDER (a laion/CLIP-ViT-H-14-laion2B-s32B-b79K copy)"
            )
            raise UserError(f"reward 'pickscore': {proc} has no {what} (the CLIP processor){hint}")
        model, image_processor, tokenizer = load_processor_model(
            "pickscore",
            "CLIP model",
            folder,
            "clip",
            "CLIPModel",
            "CLIPImageProcessorPil",
            processor=proc,
            device=device,
        )
        return cls(model, image_processor, tokenizer, batch_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def pixel_values(self, images: list) -> torch.Tensor:
        """The processor's [n, 3, S, S] for PIL images (module docstring)."""
        return self.image_processor(images=images, return_tensors="pt")["pixel_values"]

    def scores(self, images: torch.Tensor, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(exp(s)·cos, cos) per (image, prompt) pair, [B] each."""
        import torch
        import torch.nn.functional as F

        pil, out = images_to_pil(images), []
        with torch.no_grad():
            scale = self.model.logit_scale.exp().float()
            for part in chunks(len(pil), self.batch_size):
                pix = self.pixel_values(pil[part]).to(self.device)
                text = self.tokenizer(
                    prompts[part], padding=True, truncation=True, max_length=77, return_tensors="pt"
                ).to(self.device)
                e_i = self.model.visual_projection(self.model.vision_model(pixel_values=pix).pooler_output)
                e_t = self.model.text_projection(
                    self.model.text_model(
                        input_ids=text["input_ids"], attention_mask=text["attention_mask"]
                    ).pooler_output
                )
                cos = (F.normalize(e_i.float(), dim=-1) * F.normalize(e_t.float(), dim=-1)).sum(-1)  # [b]
                out.append(cos.cpu())
        cos = torch.cat(out)
        return scale.cpu() * cos, cos

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        scores, cos = self.scores(images, prompts)
        return RewardOutput(scores=scores, details=[{"cosine": c} for c in cos.tolist()])
