"""Train the shipped ShapeWorld model for two steps with a Python reward on a list of prompts.

    python examples/train_with_python_reward.py [OUT]        # default OUT: runs/example-python-reward

The reward is an ordinary function of (images, prompts, metadata): here it pays for red pixels, so
GCPO pushes the model towards redder images. Any callable with that signature works, a lambda too.
"""

import sys

from t2i_gcpo import api


def redness(images, prompts, metadata):
    """images: [B, 3, H, W] in [0, 1]; prompts, metadata: B each. One score per image."""
    red, green, blue = images[:, 0], images[:, 1], images[:, 2]
    return (red - (green + blue) / 2).mean(dim=(1, 2))  # a tensor [B]


def main(out: str = "runs/example-python-reward") -> None:
    result = api.train(
        model="shapeworld",
        prompts=["a photo of a red circle", "a photo of a blue square", "a photo of two green triangles"],
        reward=redness,
        config="gcpo",
        overrides={"rollout.prompts_per_step": 2, "rollout.group_size": 4, "sample_every": 0},
        steps=2,
        seed=0,
        out=out,
    )
    for row in result.metrics:
        print(f"step {row['step']}: reward {row['reward/mean']:.4f}, groups kept {row['groups_kept']}")
    print(f"run directory: {result.run_dir}; last checkpoint: {result.checkpoint}")


if __name__ == "__main__":
    main(*sys.argv[1:])
