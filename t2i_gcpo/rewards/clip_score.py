"""CLIPScore reward from local open_clip weights.

CLIPScore (Hessel et al., 2021, "CLIPScore: A Reference-free Evaluation Metric for Image
Captioning") is w·max(cos(E_I, E_T), 0). torchmetrics reports it with w = 100; this reward returns
it with w = 1, i.e. ``max(cos, 0)`` in [0, 1] (= torchmetrics' CLIPScore / 100), and the raw cosine
in each sample's details (``cosine``). The text is the prompt itself.

Weights come from a LOCAL file (e.g. the OpenAI ViT-L-14 ``open_clip_pytorch_model.bin``) or an
open_clip ``local-dir`` folder (open_clip_config.json + weights); nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards.base import RewardOutput

WEIGHT_FILES = (
    "open_clip_model.safetensors",
    "open_clip_pytorch_model.bin",
    "model.safetensors",
    "pytorch_model.bin",
)


def images_to_pil(images: torch.Tensor) -> list:
    """[B, 3, H, W] floats in [0, 1] → B RGB PIL images (8-bit, as an image saved to disk)."""
    from PIL import Image

    arr = (
        (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    )
    return [Image.fromarray(a) for a in arr]


def load_open_clip(
    checkpoint: str | Path, model_name: str, quick_gelu: bool, device: str | torch.device
) -> tuple:
    """(model, preprocess, tokenizer) of open_clip `model_name` with weights from a local path."""
    import open_clip

    path = Path(checkpoint).expanduser()
    if not path.exists():
        raise UserError(f"CLIP checkpoint '{path}' does not exist")
    if path.is_dir() and (path / "open_clip_config.json").is_file():
        # open_clip's own local layout (config + weights); it would silently use random weights
        # if none were there, so check first
        if not any(p.suffix in (".safetensors", ".bin", ".pth") for p in path.iterdir()):
            raise UserError(
                f"no CLIP weights (*.safetensors, *.bin, *.pth) next to '{path}/open_clip_config.json'"
            )
        name, kwargs = f"local-dir:{path}", {}
    else:
        if path.is_dir():
            found = [path / f for f in WEIGHT_FILES if (path / f).is_file()]
            if not found:
                raise UserError(f"no open_clip weights ({', '.join(WEIGHT_FILES)}) in '{path}'")
            path = found[0]
        if model_name not in open_clip.list_models():
            raise UserError(f"unknown open_clip model '{model_name}' (e.g. ViT-B-32, ViT-L-14, ViT-H-14)")
        name, kwargs = model_name, {"pretrained": str(path), "force_quick_gelu": quick_gelu}
    try:
        model, _, preprocess = open_clip.create_model_and_transforms(name, device=device, **kwargs)
    except Exception as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise UserError(f"cannot load '{checkpoint}' as open_clip {model_name}: {first}") from None
    return model.eval(), preprocess, open_clip.get_tokenizer(name)


class ClipScoreReward:
    """r_i = max(cos(CLIP_image(x_i), CLIP_text(prompt_i)), 0).

    quick_gelu: OpenAI's CLIP weights (the usual CLIPScore backbone) were trained with QuickGELU,
    which open_clip applies only for its ``openai`` tag, not for a weights file: keep True for
    them, pass False for weights trained with plain GELU (LAION, DataComp).
    """

    name = "clip"

    def __init__(
        self,
        checkpoint: str,
        model_name: str = "ViT-L-14",
        quick_gelu: bool = True,
        device: str | torch.device = "cpu",
        batch_size: int = 32,
    ):
        self.model, self.preprocess, self.tokenizer = load_open_clip(
            checkpoint, model_name, quick_gelu, device
        )
        self.batch_size = batch_size

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def cosine(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """cos(E_I, E_T) per (image, prompt) pair. [B]"""
        pil = images_to_pil(images)
        out = []
        for s in range(0, len(pil), self.batch_size):
            pix = torch.stack([self.preprocess(im) for im in pil[s : s + self.batch_size]]).to(self.device)
            txt = self.tokenizer(prompts[s : s + self.batch_size]).to(self.device)
            e_i = torch.nn.functional.normalize(self.model.encode_image(pix).float(), dim=-1)  # [b, D]
            e_t = torch.nn.functional.normalize(self.model.encode_text(txt).float(), dim=-1)  # [b, D]
            out.append((e_i * e_t).sum(-1).cpu())
        return torch.cat(out)

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        cos = self.cosine(images, prompts)
        return RewardOutput(scores=cos.clamp(min=0), details=[{"cosine": c} for c in cos.tolist()])
