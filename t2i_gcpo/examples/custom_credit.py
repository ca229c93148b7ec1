"""A token-credit scheme of your own, without forking: one function in a file of yours.

    t2i-gcpo train --prompts prompts/shapeworld_train.txt --algo dapo \\
        --credit examples/custom_credit.py:prompt_sensitivity --set credit.options.power=2
    python examples/custom_credit.py [OUT]   # two steps from Python (OUT: runs/example-custom-credit)

`prompt_sensitivity` gives each token a share of its sample's advantage that grows with how much the
prompt changed the model's belief in it, |log π(y_t | c⁺) − log π(y_t | c⁻)|^power (GCPO's idea, in
five lines). It declares the input it reads, "contrast", so the trainer records the negative context's
log-probs while sampling; its options are its keyword arguments (credit.options.NAME=VALUE), checked
against this signature. The weights keep each sequence's total credit (mass-preserving), as every
built-in scheme does (docs/guides/custom-credit.md).
"""

import sys
from pathlib import Path

from t2i_gcpo import api, credit_scheme


@credit_scheme(needs=("contrast",))
def prompt_sensitivity(inputs, power: float = 1.0):
    """inputs.mask, logp_pos, logp_neg: [B, T]. Returns w [B, T], Σ_t m·w = N per sequence."""
    m = inputs.mask.float()
    score = ((inputs.logp_pos - inputs.logp_neg).abs().float() ** power + 1e-6) * m
    return score * m.sum(1, keepdim=True) / score.sum(1, keepdim=True).clamp_min(1e-12)


def main(out: str = "runs/example-custom-credit") -> None:
    result = api.train(
        model="shapeworld",
        prompts=["a photo of a red circle", "a photo of a blue square", "a photo of two green triangles"],
        config="dapo",
        credit=f"{Path(__file__).resolve()}:prompt_sensitivity",  # recorded in config.yaml: resumable
        overrides={
            "credit.options.power": 2,
            "rollout.prompts_per_step": 2,
            "rollout.group_size": 4,
            "sample_every": 0,
            "eval_every": -1,
        },
        steps=2,
        seed=0,
        out=out,
    )
    for row in result.metrics:
        if "credit/weight_max" in row:
            print(
                f"step {row['step']}: reward {row['reward/mean']:.4f}, mean largest token weight "
                f"{row['credit/weight_max']:.2f} (uniform: 1)"
            )
        else:  # DAPO's dynamic sampling: every group scored alike, nothing to learn from
            print(f"step {row['step']}: reward {row['reward/mean']:.4f}, no update")
    print(f"run directory: {result.run_dir}; resume with: t2i-gcpo train --resume {result.run_dir} --steps 4")


if __name__ == "__main__":
    main(*sys.argv[1:])
