"""Pictures a run writes every `sample_every` steps: a grid of the step's samples and the credit
maps of one group under every credit scheme (the trained one first); for text, one HTML page of the
group's completions with every token coloured by its weight under each scheme. A run whose batches carry
continuations (`Batch.tree`, a scheme that needs "branches": vine) also draws value maps: V(prefix) along the
decoding order (docs/concepts/tree_credit.md#value-maps); one trained with stepwise rewards adds each sample's
reward trajectory over the reveal steps (docs/concepts/tree_credit.md#stepwise-rewards)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from t2i_gcpo.config import TrainConfig
from t2i_gcpo.core.tree import Tree
from t2i_gcpo.core.tree_credit import prefix_values
from t2i_gcpo.policies.base import STEP_REWARDS, Policy, Rollout
from t2i_gcpo.tasks.base import Task
from t2i_gcpo.train.batch import Batch
from t2i_gcpo.train.credit import TRAIN_CONTEXT, scheme_options, scheme_weights

MAX_VALUE_GROUPS = 4  # groups drawn in a step's value maps


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """[B, 3, H, W] in [0, 1] → [B, H, W, 3] uint8."""
    return (images.clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).cpu().numpy()


def image_grid(images: np.ndarray, cols: int, scale: int = 4, pad: int = 2) -> np.ndarray:
    """Tile [B, H, W, 3] uint8 images into one upscaled (nearest) grid with white gutters."""
    b, h, w, _ = images.shape
    rows = -(-b // cols)
    H, W = h * scale, w * scale
    grid = np.full((rows * (H + pad) + pad, cols * (W + pad) + pad, 3), 255, np.uint8)
    for i, img in enumerate(images):
        r, c = divmod(i, cols)
        big = img.repeat(scale, 0).repeat(scale, 1)
        grid[pad + r * (H + pad) : pad + r * (H + pad) + H, pad + c * (W + pad) : pad + c * (W + pad) + W] = (
            big
        )
    return grid


def reveal_grids(rollout: Rollout, rows: int, cols: int) -> list[np.ndarray | None]:
    """Per sample, the step that revealed each token as a [rows, cols] grid (masked models), or None
    where tokens were decided in raster order (autoregressive: step t decides token t)."""
    raster = torch.arange(rollout.step.shape[1], device=rollout.step.device)
    return [None if torch.equal(s, raster) else s.reshape(rows, cols).cpu().numpy() for s in rollout.step]


def sample_values(ro: Rollout, rewards: torch.Tensor, tree: Tree, include_root: bool = True) -> list[dict]:
    """Each sample's value map (`core.tree_credit.prefix_values`) as the fields `viz.credit_map` draws:
    ``value_tokens`` [T] (V of the prefix each token was decided under, NaN on padding), ``value_centre``
    (V_0, its group's mean reward), ``value_path`` [V_0, V_1 … V_K, r] and ``value_points`` [t_1 … t_K]."""
    tree = tree.to("cpu")
    points = tree.points
    values = prefix_values(rewards.cpu(), ro.group_size, tree, ro.mask.cpu(), ro.step.cpu(), include_root)
    out = []
    for i in range(len(ro)):
        used = points[i] >= 0
        k = int(used.sum())
        out.append(
            {
                "value_tokens": values.token[i].numpy(),
                "value_centre": float(values.path[i, 0]),
                "value_path": [*values.path[i, : k + 1].tolist(), float(values.path[i, -1])],
                "value_points": points[i, used].tolist(),
            }
        )
    return out


def batch_tree(batch: Batch, idx: torch.Tensor) -> Tree | None:
    """Rows `idx` of the batch's continuations (None: a batch without them)."""
    return None if batch.tree is None else batch.tree.select(idx)


def tree_include_root(cfg: TrainConfig) -> bool:
    """The trained scheme's include_root option (segment values' convention; True when it has none)."""
    return bool(scheme_options(cfg.credit, cfg.credit.scheme).get("include_root", True))


def save_sample_grid(
    path: Path, batch: Batch, group_size: int, max_groups: int = 4, within: Path | None = None
) -> Path:
    """The step's first groups side by side, each row captioned with its prompt, written as a PNG at `path`
    (outdir.write_file: never through a link; `within`: the run directory)."""
    from PIL import Image, ImageDraw, ImageFont

    from t2i_gcpo.outdir import write_file

    G = group_size
    n = min(len(batch.rollout), max_groups * G)
    grid = image_grid(to_uint8(batch.outputs[:n]), cols=G)
    font = ImageFont.load_default(size=13)  # Pillow's default size (10) runs the words together
    caption_h = 18
    rows = -(-n // G)
    row_h = (grid.shape[0] - 2) // rows
    canvas = Image.new("RGB", (grid.shape[1], grid.shape[0] + rows * caption_h), "white")
    draw = ImageDraw.Draw(canvas)
    for r in range(rows):
        y = r * (row_h + caption_h)
        draw.text((4, y + 1), batch.rollout.prompts[r * G].text[:90], fill="black", font=font)
        canvas.paste(Image.fromarray(grid[r * row_h : r * row_h + row_h + 2]), (0, y + caption_h))
    return write_file(path, lambda f: canvas.save(f, format="PNG"), within)


def group_weights(
    batch: Batch, policy: Policy, reference: Policy | None, cfg: TrainConfig
) -> tuple[Rollout, dict[str, torch.Tensor]]:
    """The first group's rollout and its weights under every registered scheme (the trained one first;
    schemes that compare with a reference only when the run has one, those that read continuations only
    when the batch has them)."""
    from t2i_gcpo.core.schemes import CREDIT_SCHEMES

    idx = torch.arange(batch.rollout.group_size)
    first = cfg.credit.scheme
    order = (first, *[x for x in CREDIT_SCHEMES if x != first])
    ro = batch.rollout.select(idx)
    weights = scheme_weights(
        cfg.credit,
        ro,
        batch.advantages[idx].to(ro.mask.device),
        policy,
        reference,
        TRAIN_CONTEXT[cfg.rollout.train_logp],
        order,
        rewards=batch.reward.scores[idx],
        tree=batch_tree(batch, idx),
        leaves=None if batch.leaves is None else batch.leaves.select(idx),
    )
    return ro.to("cpu"), {name: w.cpu() for name, w in weights.items()}  # drawn on the CPU


def save_text_heatmap(
    path: Path,
    batch: Batch,
    policy: Policy,
    reference: Policy | None,
    cfg: TrainConfig,
    step: int,
    task: Task,
    within: Path | None = None,
) -> Path | None:
    """The first group's completions as a token heatmap page (`viz.text_heatmap`), with the task's
    marks (the first wrong step for arithmetic); None when the task cannot lay out text samples."""
    from t2i_gcpo.viz.text_heatmap import write_text_heatmap

    if not task.lays_out_text:
        return None
    G = batch.rollout.group_size
    ro, weights = group_weights(batch, policy, reference, cfg)
    samples = task.text_samples(
        ro, weights, batch.reward.details[:G], batch.reward.scores[:G], batch.advantages[:G]
    )
    if batch.tree is not None:  # the value map: one more column, V(prefix) of each token
        tree = batch_tree(batch, torch.arange(G))
        attach_text_values(
            samples, ro, sample_values(ro, batch.reward.scores[:G], tree, tree_include_root(cfg))
        )
    return write_text_heatmap(path, samples, title=f"step {step}: {ro.prompts[0].text}", within=within)


def attach_text_values(samples: list, ro: Rollout, values: list[dict]) -> None:
    """Give each text heatmap sample (`viz.text_heatmap.TextSample`, its valid tokens) its value map."""
    for s, v, m in zip(samples, values, ro.mask.cpu() > 0):
        s.values, s.value_centre = v["value_tokens"][m.numpy()], v["value_centre"]


def image_values(
    ro: Rollout, rewards: torch.Tensor, tree: Tree, rows: int, cols: int, include: bool
) -> list[dict]:
    """`sample_values` with each sample's values as its [rows, cols] token grid (``value_grid``)."""
    out = sample_values(ro, rewards, tree, include)
    for v in out:
        v["value_grid"] = v.pop("value_tokens").reshape(rows, cols)
    return out


def save_credit_maps(
    path: Path,
    batch: Batch,
    policy: Policy,
    reference: Policy | None,
    cfg: TrainConfig,
    step: int,
    within: Path | None = None,
) -> Path:
    """The first group's samples with their weights under every registered scheme (the trained one
    first); schemes that compare with a reference are drawn when the run has one. A batch with
    continuations (`Batch.tree`) adds each sample's value map as a column, and writes the value maps of the
    step's first groups to ``<run>/value_maps/`` (`path`'s name, beside its folder)."""
    from t2i_gcpo.viz.credit_map import credit_figure, value_figure

    G = batch.rollout.group_size
    ro, weights = group_weights(batch, policy, reference, cfg)
    rows, cols = policy.layout.grid
    images = to_uint8(batch.outputs[: MAX_VALUE_GROUPS * G])
    reveal = reveal_grids(ro, rows, cols)
    samples = [
        {
            "image": images[i],
            "reward": float(batch.reward.scores[i]),
            "advantage": float(batch.advantages[i]),
            "weights": {k: w[i].reshape(rows, cols).cpu().numpy() for k, w in weights.items()},
            "reveal_step": reveal[i],
        }
        for i in range(G)
    ]
    if STEP_REWARDS in ro.state:  # stepwise credit: each sample's reward trajectory over the reveal steps
        for s, r in zip(samples, ro.state[STEP_REWARDS]):
            s["step_rewards"] = r.tolist()
    if batch.tree is not None:
        n = min(len(batch.rollout), MAX_VALUE_GROUPS * G)
        idx = torch.arange(n)
        values = image_values(
            batch.rollout.select(idx),
            batch.reward.scores[:n],
            batch_tree(batch, idx),
            rows,
            cols,
            tree_include_root(cfg),
        )
        for s, v in zip(samples, values):
            s.update(v)
        drawn = [{"image": images[i], "reward": float(batch.reward.scores[i]), **values[i]} for i in range(n)]
        value_figure(
            [drawn[g : g + G] for g in range(0, n, G)],
            path.parent.parent / "value_maps" / path.name,
            title=f"step {step}: V(prefix) of the first groups",
            within=within,
        )
    return credit_figure(
        samples, list(weights), path, title=f"step {step}: {ro.prompts[0].text}", within=within
    )
