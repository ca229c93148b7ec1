"""A vision-language model from a local folder, asked for the probability of an answer's first token: what
GenEval 2's Soft-TIFA, VQAScore and TIFA read (facebookresearch/GenEval2, evaluation.py
``send_message_with_image``, commit a6e82d2289e8d418f27f0adee77908b07060eea3).

The reference's message is one user turn, the image then the question's text, through the processor's
chat template with the generation prompt added; it generates one token greedily and reads the softmax of
that step's scores. Here the same message goes through the same chat template, and the probabilities are
the softmax of the model's logits at the last position of the prompt — the same numbers (`generate` with
``do_sample=False`` applies no temperature, top-k or top-p to the scores it returns; Qwen3-VL's generation
config sets no repetition penalty), checked against ``generate``'s scores in tests/eval/test_geneval2.py:

    P(answers | image, question) = Σ_{a ∈ answers} softmax(z)[first_token(a)]

z the logits of the first answer position, first_token(a) the first id of ``tokenizer.encode(a)`` without
special tokens (Qwen's tokenizer adds none, so this is the reference's ``encode(answer)[0]``), each answer
of the list counted once per entry, as the reference sums them; the argmax token decoded is the
"prediction" TIFA compares. Any transformers image-text-to-text model whose processor has a chat template
loads (``AutoModelForImageTextToText``: Qwen2.5-VL, Qwen3-VL, …), from a local folder only. Questions are
batched with left padding (the last position is every row's own last token); a score does not depend on
its batch-mates beyond float rounding.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from t2i_gcpo.errors import UserError

DTYPES = ("auto", "float32", "bfloat16", "float16")


def first_token_ids(tokenizer: Any, answers: Sequence[str]) -> list[int]:
    """The first token id of each answer as the tokenizer encodes it alone, without special tokens."""
    ids = []
    for a in answers:
        encoded = tokenizer.encode(a, add_special_tokens=False)
        if not encoded:
            raise UserError(f"the answer {a!r} encodes to no token")
        ids.append(int(encoded[0]))
    return ids


class LocalVLM:
    """A transformers VLM and its processor (module docstring). ``probabilities(images, questions,
    answers)`` → one (probability of the answers, decoded argmax token) per question."""

    kind = "vqa"

    def __init__(
        self,
        model: Any,
        processor: Any,
        *,
        name: str,
        revision: str | None = None,
        dtype: str = "auto",
        batch_size: int = 8,
    ):
        """`name` the folder, `revision` its revision where the caller knows it
        (eval.protocol.folder_revision)."""
        self.model, self.processor = model.eval(), processor
        self.name, self.revision, self.dtype, self.batch_size = name, revision, dtype, int(batch_size)
        self.tokenizer = processor.tokenizer
        self.tokenizer.padding_side = "left"

    @classmethod
    def from_pretrained(
        cls,
        folder: str | os.PathLike,
        *,
        device: str = "cpu",
        dtype: str = "auto",
        batch_size: int = 8,
        revision: str | None = None,
        what: str = "--vqa",
    ) -> LocalVLM:
        """Load a local VLM folder (config.json, weights, processor files with a chat template); a one-line
        UserError for anything that is not one."""
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        from t2i_gcpo.outdir import read_json

        path = Path(folder).expanduser()
        if not path.is_dir():
            raise UserError(
                f"{what} {path}: not a folder (a local VLM checkpoint such as Qwen3-VL-8B-Instruct)"
            )
        if not (path / "config.json").is_file():
            raise UserError(f"{what} {path}: not a model folder (no config.json)")
        if dtype not in DTYPES:
            raise UserError(f"VQA dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        config = read_json(path / "config.json", follow=True)
        kind = config.get("model_type") if isinstance(config, dict) else None
        try:
            processor = AutoProcessor.from_pretrained(path, local_files_only=True)
            model = AutoModelForImageTextToText.from_pretrained(
                path, local_files_only=True, dtype=dtype if dtype == "auto" else getattr(torch, dtype)
            )
        except (OSError, ValueError, KeyError) as e:
            first = (str(e).splitlines() or [type(e).__name__])[0]
            raise UserError(
                f"{what} {path}: cannot load it as an image-text-to-text model ({kind}): {first}"
            ) from None
        if getattr(processor, "chat_template", None) is None or not hasattr(processor, "tokenizer"):
            raise UserError(
                f"{what} {path}: its processor has no chat template (an instruction-tuned VLM is needed)"
            )
        return cls(
            model.to(device),
            processor,
            name=str(path.resolve()),
            revision=revision,
            dtype=dtype,
            batch_size=batch_size,
        )

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def record(self) -> dict[str, Any]:
        """The scorer as a protocol records it (the fields of eval.protocol.scorer_record)."""
        return {
            "kind": "vqa",
            "name": self.name,
            "revision": self.revision,
            "dtype": self.dtype,
            "model_type": getattr(self.model.config, "model_type", None),
        }

    def messages(self, image: Any, question: str) -> list[dict]:
        """The reference's message: one user turn, the image then the text."""
        return [
            {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": question}],
            }
        ]

    def first_token_probs(self, images: Sequence[Any], questions: Sequence[str]) -> Any:
        """softmax of the first answer position's logits, [n, V] float32 on the CPU, for the pairs
        (images[i], questions[i]) (one forward pass: call it with at most `batch_size` pairs)."""
        import torch

        conversations = [self.messages(im.convert("RGB"), q) for im, q in zip(images, questions)]
        inputs = self.processor.apply_chat_template(
            conversations,
            tokenize=True,
            add_generation_prompt=True,
            return_dict=True,
            return_tensors="pt",
            processor_kwargs={"padding": True},
        )
        inputs = inputs.to(self.device)
        with torch.no_grad():
            logits = self.model(**inputs).logits[:, -1]  # [n, V]: left padding, every row ends at its prompt
        return torch.softmax(logits.float(), dim=-1).cpu()

    def probabilities(
        self, images: Sequence[Any], questions: Sequence[str], answers: Sequence[Sequence[str]]
    ) -> list[tuple[float, str]]:
        """(Σ of the answers' first-token probabilities, the decoded argmax token) per question."""
        out: list[tuple[float, str]] = []
        for s in range(0, len(images), self.batch_size):
            probs = self.first_token_probs(
                images[s : s + self.batch_size], questions[s : s + self.batch_size]
            )
            for row, wanted in zip(probs, answers[s : s + self.batch_size]):
                p = sum(float(row[i]) for i in first_token_ids(self.tokenizer, wanted))
                out.append((p, self.tokenizer.decode([int(row.argmax())])))
        return out
