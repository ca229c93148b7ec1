"""Arithmetic: the embedded offline text-reasoning world (docs/worlds/arithmetic.md).

Short integer problems ("12+7*3=?") answered with one reduction per line and a final "#### 33";
noisy worked solutions to pretrain a tiny character-level model with base accuracy well below 1;
answer, format and DAPO overlong rewards; the first wrong step of a failed completion, as an exact
character span, for step lift; GSM8K-style problem files; the prompt frame and GCPO's text negative
contexts. Pure Python: `transformers` and `tokenizers` are imported only to build the tokenizer.
"""

from t2i_gcpo.worlds.arithmetic.checking import (
    correctness_reward,
    extract_answer,
    first_wrong_step,
    format_reward,
    overlong_penalty,
    parse_step,
    span_to_token_indices,
)
from t2i_gcpo.worlds.arithmetic.files import answer_from_text, read_problem_file, write_problems
from t2i_gcpo.worlds.arithmetic.problems import (
    MAX_OPERAND,
    MAX_OPS,
    MAX_VALUE,
    MIN_OPS,
    Problem,
    Step,
    expression_tree,
    generate_problem,
    generate_problems,
    make_splits,
    parse_expression,
    parse_question,
    reductions,
    solve,
)
from t2i_gcpo.worlds.arithmetic.prompts import (
    CHAT_TEMPLATE,
    NEGATIVE_CONTEXTS,
    PROMPT_TEMPLATE,
    WRONG_ANSWER_NOTE,
    NegativeContext,
    format_prompt,
    negative_prompt,
)
from t2i_gcpo.worlds.arithmetic.solutions import NoisySolution, noisy_solution, render_solution, solution_text
from t2i_gcpo.worlds.arithmetic.tokenizer import (
    ALPHABET,
    SPECIAL_TOKENS,
    build_tokenizer,
    check_characters,
    unknown_characters,
)

__all__ = [
    "ALPHABET",
    "CHAT_TEMPLATE",
    "MAX_OPERAND",
    "MAX_OPS",
    "MAX_VALUE",
    "MIN_OPS",
    "NEGATIVE_CONTEXTS",
    "PROMPT_TEMPLATE",
    "SPECIAL_TOKENS",
    "WRONG_ANSWER_NOTE",
    "NegativeContext",
    "NoisySolution",
    "Problem",
    "Step",
    "answer_from_text",
    "build_tokenizer",
    "check_characters",
    "correctness_reward",
    "expression_tree",
    "extract_answer",
    "first_wrong_step",
    "format_prompt",
    "format_reward",
    "generate_problem",
    "generate_problems",
    "make_splits",
    "negative_prompt",
    "noisy_solution",
    "overlong_penalty",
    "parse_expression",
    "parse_question",
    "parse_step",
    "read_problem_file",
    "reductions",
    "render_solution",
    "solution_text",
    "solve",
    "span_to_token_indices",
    "unknown_characters",
    "write_problems",
]
