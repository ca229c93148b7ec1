"""VQAScore-style alignment from a local VQA model (Lin et al. 2024, "Evaluating Text-to-Visual Generation
with Image-to-Text Generation", arXiv 2404.01291): the probability that a VQA model answers "yes" to "does
this image show the prompt?".

    r_i = P(answer | x_i, question(prompt_i)) = exp(mean_t log p(a_t | a_<t, x_i, question))      (in (0, 1])

the answer's tokens a_t including its end token, the mean over them (a geometric mean of the token
probabilities). The formula is linzhiqiu/t2v_metrics' VQAScore: t2v_metrics/models/vqascore_models/
instructblip_model.py ``forward`` (commit 335e4c2c3452df52e32fe3c583d9458235e7d9e1): exp(−cross-entropy
averaged over the answer's label tokens), question ``Does this figure show "{}"? Please answer yes or
no.``, answer ``yes``. The model is the one the DPG-Bench evaluation loads (t2i_gcpo/eval/dpg.py): a
transformers BLIP VQA model (``BlipForQuestionAnswering``, e.g. Salesforce/blip-vqa-base or
blip-vqa-capfilt-large), run as its ``generate`` runs it — the vision tower, the question encoded over the
image, the answer decoder started from its BOS token — with the answer teacher-forced instead of sampled.
Questions are batched only with questions of their own length, unpadded: BLIP's text layers in
transformers 5 drop the cross-attention's padding mask (``generate`` passes all ones anyway), so a padded
question would change the answer's probability; a score then does not depend on its batch-mates (a
group's samples share their prompt, hence their question, and batch whole). Images are preprocessed
as BLIP's processor does on PIL images (`BlipImageProcessorPil`: 384 × 384 bicubic, no crop, CLIP's mean
and std), the reference BLIP's transform.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards._common import chunks, images_to_pil, load_processor_model
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.registry import Arg, Option, register_reward

if TYPE_CHECKING:
    import torch

SOURCE = (
    "linzhiqiu/t2v_metrics vqascore_models/instructblip_model.py forward (335e4c2), on transformers' BLIP VQA"
)
QUESTION = 'Does this figure show "{}"? Please answer yes or no.'
ANSWER = "yes"


@register_reward(
    "vqa",
    scores="image",
    doc='VQAScore: P("yes") from a BLIP VQA model asked whether the image shows the prompt, in (0, 1]',
    weights="a transformers BLIP VQA folder: Salesforce/blip-vqa-base or Salesforce/blip-vqa-capfilt-large",
    source=SOURCE,
    licence="BSD-3-Clause (Salesforce BLIP)",
    example="vqa:/models/blip-vqa-base",
)
def load(
    folder: Annotated[
        str,
        Arg(
            "a transformers BLIP VQA folder (BlipForQuestionAnswering)",
            kind="dir",
            metavar="DIR",
            needs=("config.json", ("model.safetensors", "pytorch_model.bin")),
        ),
    ],
    *,
    question: Annotated[str, Option("the question asked, {} the prompt")] = QUESTION,
    answer: Annotated[str, Option("the answer whose probability is the score")] = ANSWER,
    batch_size: Annotated[int, Option("images per forward pass", low=1, high=4096)] = 16,
    device: str = "cpu",
) -> VQAReward:
    return VQAReward.from_pretrained(
        folder, question=question, answer=answer, batch_size=batch_size, device=device
    )


def load_blip_vqa(folder: str, device: str | torch.device = "cpu") -> tuple:
    """(BlipForQuestionAnswering, BlipImageProcessorPil, tokenizer) from a local folder; a one-line
    UserError for a folder that is not a BLIP VQA model."""
    return load_processor_model(
        "vqa",
        "BLIP VQA model",
        folder,
        "blip",
        "BlipForQuestionAnswering",
        "BlipImageProcessorPil",
        architecture="BlipForQuestionAnswering",
        expected="use e.g. Salesforce/blip-vqa-base",
        device=device,
    )


class VQAReward:
    """r_i = P(answer | image_i, question(prompt_i)) (module docstring); details: ``question``."""

    name = "vqa"
    bounds = (0.0, 1.0)

    def __init__(
        self,
        model,
        image_processor,
        tokenizer,
        question: str = QUESTION,
        answer: str = ANSWER,
        batch_size: int = 16,
    ):
        if "{}" not in question:
            raise UserError(
                f"reward 'vqa': the question must hold {{}} where the prompt goes, got {question!r}"
            )
        self.model, self.image_processor, self.tokenizer = model, image_processor, tokenizer
        self.question, self.answer, self.batch_size = question, answer, int(batch_size)
        ids = tokenizer(answer, return_tensors="pt")["input_ids"][0]  # [CLS] a_1 … a_n [SEP]
        if len(ids) < 2:
            raise UserError(f"reward 'vqa': the answer {answer!r} has no tokens")
        ids = ids.clone()
        ids[0] = model.config.text_config.bos_token_id  # the decoder starts from BOS, as `generate` does
        self.answer_ids = ids  # [n + 2]

    @classmethod
    def from_pretrained(
        cls,
        folder: str,
        question: str = QUESTION,
        answer: str = ANSWER,
        batch_size: int = 16,
        device: str | torch.device = "cpu",
    ) -> VQAReward:
        return cls(*load_blip_vqa(folder, device), question=question, answer=answer, batch_size=batch_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def pixel_values(self, images: list) -> torch.Tensor:
        return self.image_processor(images=images, return_tensors="pt")["pixel_values"]

    def probabilities(self, images: list, question_ids: torch.Tensor) -> torch.Tensor:
        """P(answer | image, question) per pair, [n], for questions of one length ([n, T] token ids)."""
        import torch

        m = self.model
        pix = self.pixel_values(images).to(self.device)
        ids = question_ids.to(self.device)
        image_embeds = m.vision_model(pixel_values=pix)[0]  # [n, P, D]
        question = m.text_encoder(
            input_ids=ids, attention_mask=torch.ones_like(ids), encoder_hidden_states=image_embeds
        )[0]  # [n, T, D]
        answer = self.answer_ids.to(self.device).expand(len(images), -1)  # [n, L]
        logits = m.text_decoder(input_ids=answer, encoder_hidden_states=question).logits  # [n, L, V]
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, answer[:, 1:, None])[..., 0]
        return logp.mean(-1).exp()

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        import torch

        pil = images_to_pil(images)
        questions = [self.question.replace("{}", p) for p in prompts]
        ids = [self.tokenizer(q, return_tensors="pt")["input_ids"][0] for q in questions]
        scores = torch.zeros(len(pil))
        by_length: dict[int, list[int]] = {}
        for i, q in enumerate(ids):
            by_length.setdefault(len(q), []).append(i)
        with torch.no_grad():
            for rows in by_length.values():
                for part in chunks(len(rows), self.batch_size):
                    which = rows[part]
                    scores[which] = self.probabilities(
                        [pil[i] for i in which], torch.stack([ids[i] for i in which])
                    ).cpu()
        return RewardOutput(scores=scores, details=[{"question": q} for q in questions])
