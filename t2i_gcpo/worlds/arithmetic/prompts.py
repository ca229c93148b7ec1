"""What the tiny model reads: the prompt frame and GCPO's text negative contexts
(docs/concepts/credit.md#gcpo, docs/worlds/arithmetic.md).

    Q: 12+7*3=?
    A:
    7*3=21        ← the completion starts after "A:\\n"
    ...

The frame ends in a newline so that every solution line, the first included, follows a newline.
Negative contexts keep the frame and change only the question slot, so that the completion is
conditioned on the same "A:\\n" cue and Δ_t measures what the question contributes:

- `empty`: the question removed — "Q: \\nA:\\n";
- `wrong_answer`: the question, then on its own line WRONG_ANSWER_NOTE — expressible because the
  tiny alphabet has letters (`tokenizer.ALPHABET`). Unless its pretraining pairs the note with wrong
  solutions, the tiny model cannot follow it: c⁻ is then c⁺ plus unfamiliar text, so `empty` is
  the telling context for the tiny model and `wrong_answer` one for instruction-following LMs;
- a user template containing "{question}": its text, the question substituted, fills the slot.

The tokenizer carries the frame as its chat template (CHAT_TEMPLATE: a user turn is "Q: …\\n", the
generation prompt "A:\\n"), so a generic chat-template text policy that puts the question, an empty
message, or "{question}\\n{note}" in the user turn builds exactly these three inputs.
"""

from __future__ import annotations

from typing import Literal

from t2i_gcpo.errors import UserError, shorten

PROMPT_TEMPLATE = "Q: {question}\nA:\n"
CHAT_TEMPLATE = (  # PROMPT_TEMPLATE as a transformers chat template (Jinja)
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ 'Q: ' + m['content'] + '\\n' }}"
    "{% else %}{{ 'A:\\n' + m['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'A:\\n' }}{% endif %}"
)
WRONG_ANSWER_NOTE = "Note: Intentionally generate an incorrect answer."
NEGATIVE_CONTEXTS = ("empty", "wrong_answer")
NegativeContext = Literal["empty", "wrong_answer"]


def format_prompt(question: str) -> str:
    """The model input for a question: "Q: {question}\\nA:\\n"."""
    return PROMPT_TEMPLATE.replace("{question}", question)


def negative_prompt(question: str, context: NegativeContext | str) -> str:
    """The negative-context input c⁻ for `question`: "empty", "wrong_answer", or a user template
    containing "{question}" (module docstring); `UserError` for anything else."""
    if context == "empty":
        return format_prompt("")
    if context == "wrong_answer":
        return format_prompt(f"{question}\n{WRONG_ANSWER_NOTE}")
    if "{question}" not in context:
        raise UserError(
            f"negative context {shorten(context)!r} is neither one of {', '.join(NEGATIVE_CONTEXTS)} "
            "nor a template containing {question}"
        )
    return format_prompt(context.replace("{question}", question))
