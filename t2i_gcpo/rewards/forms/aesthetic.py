"""The LAION aesthetic predictor v2 (Schuhmann, "improved-aesthetic-predictor", the "sac+logos+ava1" linear
MSE model): a small MLP on the normalised CLIP ViT-L/14 image embedding, predicting a 1–10 rating.

    r_i = MLP(e_i / ‖e_i‖),   e_i = CLIP ViT-L/14 image embedding of x_i (the prompt is not read)

Scored as the reference scores: christophschuhmann/improved-aesthetic-predictor, simple_inference.py
(commit ef51e2fa4c74e4805b7ef8d20c26f9584c3fca29): ``clip.load("ViT-L/14")`` and its preprocess (short
side to 224 by PIL bicubic, centre crop, CLIP's mean and std: `t2i_gcpo.rewards._common.clip_center_crop`),
``encode_image``, an L2 normalisation (a zero vector left as it is), then the MLP — Linear 768→1024,
Dropout, Linear →128, Dropout, Linear →64, Dropout, Linear →16, Linear →1, no activations (the ReLUs are
commented out in the reference, and the linearMSE weights were trained so). Differences: the CLIP model is
open_clip's ViT-L-14 with QuickGELU from the OpenAI weights (the same network as ``clip.load``), in float32
(``clip.load`` on CUDA runs fp16).

Weights: CLIP_CKPT, the OpenAI ViT-L/14 weights as open_clip reads them (a file, e.g. Hugging Face
timm/vit_large_patch14_clip_224.openai open_clip_pytorch_model.bin, or an open_clip local-dir folder), and
HEAD, the MLP's state dict sac+logos+ava1-l14-linearMSE.pth from the reference repository (keys
``layers.{0,2,4,6,7}.{weight,bias}``; its sizes are read from the file).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards._common import OPENAI_MEAN, OPENAI_STD, chunks, clip_center_crop, images_to_pil
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.registry import Arg, Option, register_reward

if TYPE_CHECKING:
    import torch

SOURCE = "christophschuhmann/improved-aesthetic-predictor simple_inference.py (ef51e2f)"
LINEAR_LAYERS = (0, 2, 4, 6, 7)  # the reference's nn.Sequential: Linear, Dropout, …, Linear, Linear
DROPOUT = {1: 0.2, 3: 0.2, 5: 0.1}


@register_reward(
    "aesthetic",
    scores="image",
    doc="LAION aesthetic predictor v2: an MLP on the CLIP ViT-L/14 image embedding, a 1–10 rating",
    weights="OpenAI CLIP ViT-L/14 (open_clip file or folder) and sac+logos+ava1-l14-linearMSE.pth "
    "(christophschuhmann/improved-aesthetic-predictor)",
    source=SOURCE,
    licence="MIT (OpenAI CLIP); the head: see the improved-aesthetic-predictor repository",
    example="aesthetic:/models/ViT-L-14/open_clip_pytorch_model.bin,'/models/sac+logos+ava1-l14-linearMSE.pth'",
)
def load(
    clip_ckpt: Annotated[
        str, Arg("OpenAI CLIP ViT-L/14 weights: a file or an open_clip local-dir folder", kind="local")
    ],
    head: Annotated[str, Arg("the MLP head, sac+logos+ava1-l14-linearMSE.pth", kind="file")],
    *,
    clip_model: Annotated[str, Option("the open_clip architecture of CLIP_CKPT")] = "ViT-L-14",
    quick_gelu: Annotated[bool, Option("QuickGELU, as OpenAI's weights were trained")] = True,
    batch_size: Annotated[int, Option("images per forward pass", low=1, high=4096)] = 16,
    device: str = "cpu",
) -> AestheticReward:
    from t2i_gcpo.rewards.forms.clip_score import load_open_clip

    model, _, _ = load_open_clip(clip_ckpt, clip_model, quick_gelu, device)
    mlp = load_head(head, int(model.visual.output_dim))
    return AestheticReward(model, mlp.to(device), batch_size)


def load_head(path: str, embed_dim: int) -> torch.nn.Sequential:
    """The reference's MLP with the weights of `path`, its layer sizes read from the file."""
    import torch

    from t2i_gcpo.rewards._common import read_state_dict

    state = read_state_dict(path, "the aesthetic head")
    want = {f"layers.{i}.{p}" for i in LINEAR_LAYERS for p in ("weight", "bias")}
    if set(state) != want:
        extra = sorted(set(state) ^ want)[:1]
        raise UserError(
            f"reward 'aesthetic': {path} is not an aesthetic predictor head (layers.0/2/4/6/7 "
            f"weight and bias; differs at {extra[0]})"
        )
    layers: list[torch.nn.Module] = []
    for i in range(LINEAR_LAYERS[-1] + 1):
        if i in LINEAR_LAYERS:
            out_f, in_f = state[f"layers.{i}.weight"].shape
            layers.append(torch.nn.Linear(in_f, out_f))
        else:
            layers.append(torch.nn.Dropout(DROPOUT[i]))
    mlp = torch.nn.Sequential(*layers)
    if mlp[0].in_features != embed_dim or mlp[-1].out_features != 1:
        raise UserError(
            f"reward 'aesthetic': {path} takes {mlp[0].in_features}-d embeddings to "
            f"{mlp[-1].out_features} outputs; the CLIP model gives {embed_dim}-d (ViT-L/14: 768) and "
            "the head must give 1"
        )
    mlp.load_state_dict({k.removeprefix("layers."): v.float() for k, v in state.items()})
    return mlp.eval()


class AestheticReward:
    """r_i = MLP(normalised CLIP embedding of image i) (module docstring); details: none."""

    name = "aesthetic"

    def __init__(self, clip_model, head, batch_size: int = 16):
        self.clip = clip_model.eval()
        self.head = head.eval()
        size = clip_model.visual.image_size
        self.image_size = int(size[0] if isinstance(size, (tuple, list)) else size)
        self.batch_size = int(batch_size)

    @property
    def device(self) -> torch.device:
        return next(self.clip.parameters()).device

    def pixel_values(self, images: list) -> torch.Tensor:
        """OpenAI CLIP's preprocessing of PIL images → [n, 3, S, S]."""
        import torch

        return torch.stack([clip_center_crop(im, self.image_size, OPENAI_MEAN, OPENAI_STD) for im in images])

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        import torch

        pil, out = images_to_pil(images), []
        with torch.no_grad():
            for part in chunks(len(pil), self.batch_size):
                e = self.clip.encode_image(self.pixel_values(pil[part]).to(self.device)).float()  # [b, D]
                norm = e.norm(dim=-1, keepdim=True)
                e = e / torch.where(norm == 0, torch.ones_like(norm), norm)
                out.append(self.head(e)[:, 0].cpu())
        return RewardOutput(scores=torch.cat(out))
