"""The benchmark suite behind ``python -m benchmarks``: one module per section, each with a `TITLE` and
``run(ctx) -> dict`` (rows, columns, timing, summary, reading); common.py holds what they share,
flops.py the FLOP counts, report.py the JSON and markdown writers, runner.py the command."""

SECTIONS = [
    "peak",
    "samplers",
    "decode_loops",
    "text_vs_generate",
    "janus_vs_generate",
    "janus_scale",
    "meissonic_scale",
    "llamagen",
    "rl_step",
    "scaling",
    "branch_cost",
    "tree_step",
    "progress",
    "compare_cost",
    "rewards",
    "reward_overlap",
    "step_memory",
    "reward_server",
]
