"""What the model rewards share: samples as 8-bit images, the CLIP family's image transforms, and reading a
weights file. Imports torch, torchvision and PIL inside the functions (the reward files import this
module at the top, and ``--help`` reads their registrations without torch).

The transforms are the references' own, written once here and checked against an independent
computation on a non-square image in tests/rewards/test_reward_models.py:

- `clip_center_crop`: OpenAI CLIP's ``_transform`` (github.com/openai/CLIP, clip/clip.py): resize the
  short side to n with PIL bicubic, centre crop n × n, [0, 1], normalise (OPENAI_MEAN, OPENAI_STD). The
  LAION aesthetic predictor uses it (through ``clip.load``), as does open_clip's eval transform for the
  OpenAI weights.
- `pad_to_square`: HPSv2's evaluation transform (its open_clip fork, transform.py ``image_transform``
  with ``resize_longest_max=True``, which ``img_score.py`` asks for with ``light_augmentation=True``): to a
  tensor first, resize the long side to n (bicubic on the tensor), pad the short side with zeros
  (black) split floor/ceil, then normalise.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from t2i_gcpo.errors import UserError

if TYPE_CHECKING:
    import torch
    from PIL import Image

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)  # CLIP's normalisation (OpenAI; LAION's CLIP-H keeps it)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


def images_to_pil(images: torch.Tensor) -> list[Image.Image]:
    """[B, 3, H, W] floats in [0, 1] → B RGB PIL images (8-bit, as an image saved to disk)."""
    import torch
    from PIL import Image

    arr = (
        (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    )
    return [Image.fromarray(a) for a in arr]


def chunks(n: int, size: int) -> Iterator[slice]:
    """Slices of range(n), `size` at a time."""
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def clip_center_crop(
    image: Image.Image, size: int, mean: Sequence[float] = OPENAI_MEAN, std: Sequence[float] = OPENAI_STD
) -> torch.Tensor:
    """OpenAI CLIP's preprocessing of one image → [3, size, size] (module docstring)."""
    import torchvision.transforms.functional as TF
    from torchvision.transforms import InterpolationMode

    image = TF.resize(image.convert("RGB"), size, interpolation=InterpolationMode.BICUBIC)
    image = TF.center_crop(image, [size, size])
    return TF.normalize(TF.to_tensor(image), mean, std)


def pad_to_square(
    image: Image.Image,
    size: int,
    mean: Sequence[float] = OPENAI_MEAN,
    std: Sequence[float] = OPENAI_STD,
    antialias: bool = True,
) -> torch.Tensor:
    """HPSv2's preprocessing of one image → [3, size, size] (module docstring). The reference resizes only
    when the long side is not already `size` (and then leaves a non-square image unpadded, which its
    model cannot take); here an image whose long side is `size` is padded all the same."""
    import torchvision.transforms.functional as TF
    from torchvision.transforms import InterpolationMode

    x = TF.to_tensor(image.convert("RGB"))  # [3, H, W] in [0, 1]
    h, w = x.shape[1:]
    scale = size / max(h, w)
    if scale != 1.0:
        new = [round(h * scale), round(w * scale)]
        x = TF.resize(x, new, interpolation=InterpolationMode.BICUBIC, antialias=antialias)
    pad_h, pad_w = size - x.shape[1], size - x.shape[2]
    x = TF.pad(x, [pad_w // 2, pad_h // 2, pad_w - pad_w // 2, pad_h - pad_h // 2], fill=0)
    return TF.normalize(x, mean, std)


def read_state_dict(path: str | Path, what: str) -> dict[str, Any]:
    """The tensors of a weights file (safetensors, or a torch pickle read with ``weights_only=True``: a
    file that needs arbitrary code to load is refused); a checkpoint's ``state_dict`` entry when it has
    one, and a ``module.`` prefix (DDP) dropped. A one-line UserError naming `what` otherwise."""
    import torch

    path = Path(path).expanduser()
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            data: Any = load_file(str(path))
        else:
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise UserError(f"cannot read {what} {path}: {type(e).__name__}: {first}") from None
    if isinstance(data, dict) and isinstance(data.get("state_dict"), dict):
        data = data["state_dict"]
    if not isinstance(data, dict) or not all(torch.is_tensor(v) for v in data.values()):
        raise UserError(f"{what} {path} holds no state dict of tensors")
    return {k.removeprefix("module."): v for k, v in data.items()}


def load_strict(module: torch.nn.Module, state: dict[str, Any], what: str, path: str | Path) -> None:
    """`state` into `module`, every key matching and every shape equal; a one-line UserError otherwise."""
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    wrong = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or wrong:
        parts = []
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
            if keys:
                parts.append(f"{len(keys)} {label} (e.g. {keys[0]})")
        raise UserError(f"{path} is not {what}: {', '.join(parts)}")
    module.load_state_dict(state)


def load_processor_model(
    reward: str,
    what: str,
    folder: str | Path,
    model_type: str,
    model_class: str,
    image_processor_class: str,
    *,
    architecture: str | None = None,
    processor: str | Path | None = None,
    expected: str = "",
    device: str | torch.device = "cpu",
) -> tuple[Any, Any, Any]:
    """(model, image processor, tokenizer) of the transformers model in the local `folder` (`what` names it in
    messages: "BLIP VQA model"), in float32 on
    `device` and in eval mode: `model_class` (a transformers class name) read from it, `image_processor_class`
    and the tokenizer from `processor` (default: the same folder). Its ``config.json`` must say `model_type`
    (and, where it lists architectures, `architecture`); anything else, or files that do not load, is a
    one-line UserError naming `reward` and saying what was `expected` ("use e.g.
    Salesforce/blip-vqa-base")."""
    import transformers

    from t2i_gcpo.outdir import read_json

    path = Path(folder).expanduser()
    config = read_json(path / "config.json", follow=True)  # a model cache links its files
    config = config if isinstance(config, dict) else {}
    archs = config.get("architectures") or []
    if config.get("model_type") != model_type or (architecture and archs and architecture not in archs):
        found = f"config.json model_type {config.get('model_type')!r}" + (f", {archs}" if archs else "")
        raise UserError(
            f"reward '{reward}': {path} is not a {what} ({found}){'; ' + expected if expected else ''}"
        )
    proc = Path(processor).expanduser() if processor else path
    try:
        model = getattr(transformers, model_class).from_pretrained(
            path, local_files_only=True, dtype="float32"
        )
        image_processor = _image_processor(image_processor_class).from_pretrained(proc, local_files_only=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(proc, local_files_only=True)
    except (OSError, ValueError) as e:
        raise UserError(f"reward '{reward}': cannot load {path}: {str(e).splitlines()[0]}") from None
    return model.to(device).eval(), image_processor, tokenizer


def _image_processor(name: str) -> Any:
    """A transformers image processor class by name (the PIL ones live in their model's module)."""
    import importlib

    import transformers

    if hasattr(transformers, name):
        return getattr(transformers, name)
    family = name.removesuffix("ImageProcessorPil").lower()
    return getattr(importlib.import_module(f"transformers.models.{family}"), name)
