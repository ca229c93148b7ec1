"""Soft-TIFA as a reward (GenEval 2's metric, arXiv 2512.16853; docs/evaluation/geneval2.md#as-a-reward): a
local VLM's probability of each atom's correct answer, read from its logits, combined over the prompt's atoms.

    r_i = Soft-TIFA GM(x_i) = (Π_k s_ik)^{1/K_i}      (mean=am: (1/K_i) Σ_k s_ik),   s_ik = P(A_k | x_i, q_k)

with q_k "<question> Answer in one word." and A_k the answer list of atom k, both as GenEval 2's reference
builds them (t2i_gcpo/scoring/soft_tifa.py), and P the softmax of the VLM's first answer position
(t2i_gcpo/scoring/vlm.py). The atoms are the prompt's: its metadata carries GenEval 2's ``vqa_list``
([question, answer] pairs) — a .jsonl prompt file in GenEval 2's format, read by ``task: prompts``, gives it;
a prompt without atoms is refused before the run starts. Details per sample: ``soft_tifa_am``,
``soft_tifa_gm``, ``tifa`` (the hard score of the same answers) and the atoms' ``atoms`` probabilities.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from t2i_gcpo.errors import UserError, shorten
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.registry import Arg, Option, register_reward

if TYPE_CHECKING:
    import torch

SOURCE = "facebookresearch/GenEval2 evaluation.py soft_tifa (a6e82d2), on a transformers VLM's logits"


@register_reward(
    "soft_tifa",
    scores="image",
    doc="Soft-TIFA (GenEval 2): a local VLM's probability of each atom's answer, geometric mean over the "
    "prompt's atoms (its metadata's vqa_list)",
    weights="a local transformers image-text-to-text VLM folder: Qwen/Qwen3-VL-8B-Instruct is GenEval 2's",
    source=SOURCE,
    licence="the VLM's (Qwen3-VL: Apache-2.0)",
    example="soft_tifa:/models/Qwen3-VL-8B-Instruct",
)
def load(
    folder: Annotated[
        str,
        Arg(
            "a local VLM folder (AutoModelForImageTextToText with a chat template)",
            kind="dir",
            metavar="DIR",
            needs=("config.json",),
        ),
    ],
    *,
    mean: Annotated[
        Literal["gm", "am"], Option("over the atoms: geometric (the prompt-level score) or arithmetic")
    ] = "gm",
    dtype: Annotated[
        Literal["auto", "float32", "bfloat16", "float16"], Option("the VLM's dtype (auto: its checkpoint's)")
    ] = "auto",
    batch_size: Annotated[int, Option("questions per forward pass", low=1, high=4096)] = 8,
    device: str = "cpu",
) -> SoftTifaReward:
    from t2i_gcpo.scoring.vlm import LocalVLM

    vlm = LocalVLM.from_pretrained(
        folder, device=device, dtype=dtype, batch_size=batch_size, what="reward 'soft_tifa':"
    )
    return SoftTifaReward(vlm, mean=mean)


def atoms_of(meta: dict, where: str) -> list:
    """The [question, answer] pairs a prompt's metadata carries (GenEval 2's vqa_list), checked."""
    pairs = meta.get("vqa_list") if isinstance(meta, dict) else None
    if (
        not isinstance(pairs, list)
        or not pairs
        or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) and x.strip() for x in p)
            for p in pairs
        )
    ):
        raise UserError(
            f"reward 'soft_tifa': {where} carries no atoms: its metadata needs GenEval 2's 'vqa_list' "
            "([question, answer] pairs; a .jsonl prompt file in GenEval 2's format, with task: prompts)"
        )
    return pairs


class SoftTifaReward:
    """r_i = Soft-TIFA GM (or AM) of sample i over its prompt's atoms (module docstring)."""

    name = "soft_tifa"
    bounds = (0.0, 1.0)

    def __init__(self, vlm, mean: str = "gm"):
        if mean not in ("gm", "am"):
            raise UserError(f"reward 'soft_tifa': mean must be gm or am, got {mean!r}")
        self.vlm, self.mean = vlm, mean

    def check_prompts(self, prompts: list[str], metadata: list[dict]) -> None:
        for i, (p, m) in enumerate(zip(prompts, metadata)):
            atoms_of(m, f"prompt {i} ({shorten(p, 60)!r})")

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        import torch

        from t2i_gcpo.rewards._common import images_to_pil
        from t2i_gcpo.scoring.soft_tifa import atom_questions, image_scores, tifa_hit

        pil = images_to_pil(images)
        asked = []  # (sample, question, answers)
        for i, meta in enumerate(metadata):
            atoms = atoms_of(meta, f"prompt {shorten(prompts[i], 60)!r}")
            asked += [(i, text, answers) for text, answers in atom_questions({"vqa_list": atoms})]
        got = self.vlm.probabilities(
            [pil[i] for i, _, _ in asked], [q for _, q, _ in asked], [a for _, _, a in asked]
        )
        soft: list[list[float]] = [[] for _ in pil]
        hard: list[list[float]] = [[] for _ in pil]
        for (i, _, answers), (p, pred) in zip(asked, got):
            soft[i].append(p)
            hard[i].append(tifa_hit(pred, answers))
        details = [{**image_scores(s, h), "atoms": s} for s, h in zip(soft, hard)]
        key = "soft_tifa_gm" if self.mean == "gm" else "soft_tifa_am"
        return RewardOutput(
            scores=torch.tensor([d[key] for d in details], dtype=torch.float32), details=details
        )
