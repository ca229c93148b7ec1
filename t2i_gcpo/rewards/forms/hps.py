"""HPSv2 / HPSv2.1 (Wu et al. 2023, "Human Preference Score v2: A Solid Benchmark for Evaluating Human
Preferences of Text-to-Image Synthesis", arXiv 2306.09341): open_clip ViT-H-14 fine-tuned on HPD v2.

    r_i = cos(E_I(x_i), E_T(prompt_i))       (the model's normalised features; no logit scale)

Scored as the reference scores: tgxs002/HPSv2, hpsv2/img_score.py ``score`` (commit 708ffb3): the model
``create_model_and_transforms('ViT-H-14', …, light_augmentation=True, output_dict=True)`` with the
checkpoint's ``state_dict`` loaded over it, the ViT-H-14 tokenizer, and the diagonal of
``image_features @ text_features.T``. Its ``preprocess_val`` (``light_augmentation=True`` →
``image_transform(…, resize_longest_max=True)``, hpsv2/src/open_clip/transform.py): to a tensor, resize
the long side to 224 (bicubic, on the tensor), pad the short side with black, normalise with CLIP's mean
and std (`t2i_gcpo.rewards._common.pad_to_square`). Differences: the reference runs under CUDA fp16
autocast, this in float32; torchvision antialiases a tensor resize since 0.17 (the reference, on today's
torchvision, does too; HPSv2 was trained on an older one, which did not: ``antialias=false`` gives that);
a non-square image whose long side is already 224 is padded here (the reference leaves it unpadded and
its model fails).

Weights: the checkpoint file HPS_v2.1_compressed.pt or HPS_v2_compressed.pt (Hugging Face xswu/HPSv2), a
torch pickle holding ``state_dict``; read with ``weights_only=True``. The architecture is open_clip's
ViT-H-14 (``arch=`` another open_clip config, e.g. one registered with ``open_clip.add_model_config``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards._common import OPENAI_MEAN, OPENAI_STD, chunks, images_to_pil, pad_to_square
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.registry import Arg, Option, register_reward

if TYPE_CHECKING:
    import torch

SOURCE = "tgxs002/HPSv2 hpsv2/img_score.py (708ffb3) with its open_clip fork's transform.py"


@register_reward(
    "hps",
    scores="image",
    doc="HPSv2 / HPSv2.1: open_clip ViT-H-14 trained on human preferences, cos(image, prompt)",
    weights="HPS_v2.1_compressed.pt (or HPS_v2_compressed.pt) from Hugging Face xswu/HPSv2",
    source=SOURCE,
    licence="Apache-2.0 (the HPSv2 code; see the model card for the weights)",
    example="hps:/models/HPS_v2.1_compressed.pt",
)
def load(
    checkpoint: Annotated[
        str, Arg("an HPSv2 checkpoint file (HPS_v2.1_compressed.pt)", kind="file", metavar="FILE")
    ],
    *,
    arch: Annotated[str, Option("the checkpoint's open_clip architecture")] = "ViT-H-14",
    antialias: Annotated[
        bool, Option("antialias the resize (torchvision ≥ 0.17, the default); false as before")
    ] = True,
    batch_size: Annotated[int, Option("images per forward pass", low=1, high=4096)] = 16,
    device: str = "cpu",
) -> HPSReward:
    return HPSReward.from_checkpoint(
        checkpoint, arch=arch, antialias=antialias, batch_size=batch_size, device=device
    )


class HPSReward:
    """r_i = cos(image_i, prompt_i) under the HPS model (module docstring)."""

    name = "hps"

    def __init__(self, model, tokenizer, image_size: int, antialias: bool = True, batch_size: int = 16):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.image_size = int(image_size)
        self.antialias = bool(antialias)
        self.batch_size = int(batch_size)

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: str,
        arch: str = "ViT-H-14",
        antialias: bool = True,
        batch_size: int = 16,
        device: str | torch.device = "cpu",
    ) -> HPSReward:
        import open_clip

        from t2i_gcpo.rewards._common import load_strict, read_state_dict

        if arch not in open_clip.list_models():
            raise UserError(f"reward 'hps': unknown open_clip architecture '{arch}' (HPSv2 is ViT-H-14)")
        state = read_state_dict(checkpoint, "the HPS checkpoint")
        model = open_clip.create_model(
            arch, pretrained=None, precision="fp32", device="cpu", force_quick_gelu=False
        )
        load_strict(model, state, f"an HPS checkpoint for open_clip {arch}", checkpoint)
        size = model.visual.image_size
        size = size[0] if isinstance(size, (tuple, list)) else size
        return cls(model.to(device), open_clip.get_tokenizer(arch), size, antialias, batch_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def pixel_values(self, images: list) -> torch.Tensor:
        """HPSv2's evaluation transform of PIL images → [n, 3, S, S] (module docstring)."""
        import torch

        return torch.stack(
            [pad_to_square(im, self.image_size, OPENAI_MEAN, OPENAI_STD, self.antialias) for im in images]
        )

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        import torch

        pil, out = images_to_pil(images), []
        with torch.no_grad():
            for part in chunks(len(pil), self.batch_size):
                pix = self.pixel_values(pil[part]).to(self.device)
                text = self.tokenizer(prompts[part]).to(self.device)
                e_i = self.model.encode_image(pix, normalize=True).float()  # [b, D]
                e_t = self.model.encode_text(text, normalize=True).float()  # [b, D]
                out.append((e_i * e_t).sum(-1).cpu())
        return RewardOutput(scores=torch.cat(out))
