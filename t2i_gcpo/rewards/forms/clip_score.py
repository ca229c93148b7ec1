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
from typing import TYPE_CHECKING, Annotated

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards._common import images_to_pil
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.registry import Arg, Option, register_reward, split_outside_quotes

if TYPE_CHECKING:
    import torch

WEIGHT_FILES = (
    "open_clip_model.safetensors",
    "open_clip_pytorch_model.bin",
    "model.safetensors",
    "pytorch_model.bin",
)


DEFAULT_CLIP_MODEL = "ViT-L-14"


def _split(rest: str) -> list[str]:
    """'CKPT[:MODEL][,option=…]' → [CKPT, MODEL?, options…]; a path that exists as written wins
    over a ':' split."""
    first, *others = split_outside_quotes(rest, ",")
    ckpt = first.strip()
    if Path(ckpt).expanduser().exists() or ":" not in ckpt:
        return [ckpt, *others]
    ckpt, model = ckpt.rsplit(":", 1)
    return [ckpt, *([model] if model else []), *others]


def _join(fields: list[str]) -> str:
    head = fields[0] + (f":{fields[1]}" if len(fields) > 1 and "=" not in fields[1] else "")
    rest = fields[2:] if head != fields[0] else fields[1:]
    return ",".join([head, *rest])


@register_reward(
    "clip",
    scores="image",
    doc="CLIPScore: max(cos(CLIP image, CLIP text), 0) of each image and its prompt",
    weights="an open_clip checkpoint file or local-dir folder, e.g. OpenAI ViT-L-14 "
    "(hf: timm/vit_large_patch14_clip_224.openai, open_clip_pytorch_model.bin)",
    source="Hessel et al. 2021, CLIPScore (w = 1: torchmetrics' CLIPScore / 100)",
    licence="MIT (OpenAI CLIP weights)",
    usage="clip:CKPT_PATH[:MODEL_NAME]",
    example="clip:/models/ViT-L-14/open_clip_pytorch_model.bin:ViT-L-14",
    split=_split,
    join=_join,
)
def load(
    ckpt_path: Annotated[str, Arg("open_clip weights: a file or a local-dir folder", kind="path")],
    model_name: Annotated[str, Arg("the open_clip architecture")] = DEFAULT_CLIP_MODEL,
    *,
    quick_gelu: Annotated[
        bool, Option("QuickGELU, as OpenAI's weights were trained; false for LAION's")
    ] = True,
    batch_size: Annotated[int, Option("images per forward pass", low=1)] = 32,
    device: str = "cpu",
) -> ClipScoreReward:
    return ClipScoreReward(ckpt_path, model_name or DEFAULT_CLIP_MODEL, quick_gelu, device, batch_size)


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

    def cosine(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """cos(E_I, E_T) per (image, prompt) pair. [B]"""
        import torch

        pil = images_to_pil(images)
        out = []
        for s in range(0, len(pil), self.batch_size):
            pix = torch.stack([self.preprocess(im) for im in pil[s : s + self.batch_size]]).to(self.device)
            txt = self.tokenizer(prompts[s : s + self.batch_size]).to(self.device)
            with torch.no_grad():
                e_i = torch.nn.functional.normalize(self.model.encode_image(pix).float(), dim=-1)  # [b, D]
                e_t = torch.nn.functional.normalize(self.model.encode_text(txt).float(), dim=-1)  # [b, D]
            out.append((e_i * e_t).sum(-1).cpu())
        return torch.cat(out)

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        cos = self.cosine(images, prompts)
        return RewardOutput(scores=cos.clamp(min=0), details=[{"cosine": c} for c in cos.tolist()])
