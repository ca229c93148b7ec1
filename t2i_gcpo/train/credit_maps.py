"""Credit maps and credit lift outside training: sample a group per prompt, reward it, compute every
scheme's token weights, draw them, and measure credit lift (SPEC §6)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from t2i_gcpo.config import TrainConfig
from t2i_gcpo.core.advantages import group_advantages
from t2i_gcpo.errors import UserError


def run_credit_maps(
    prompt_texts: list[str],
    prompt_file: str | None,
    limit: int | None,
    model: str,
    reference: str | None,
    schemes: tuple[str, ...],
    group_size: int,
    cfg_scale: float | None,
    reward_spec: str,
    seed: int,
    out: str,
    batch_prompts: int = 8,
) -> str:
    """Returns the printed summary (credit-lift table when the reward reports object grids)."""
    from tqdm import tqdm

    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.rewards.combine import call_reward
    from t2i_gcpo.rewards.registry import build_reward
    from t2i_gcpo.train.data import load_prompts
    from t2i_gcpo.train.run import default_cfg_scale
    from t2i_gcpo.train.trainer import attach_object_grids
    from t2i_gcpo.train.visuals import scheme_weights, to_uint8
    from t2i_gcpo.viz.credit_map import credit_figure, write_credit_html
    from t2i_gcpo.viz.lift import credit_lift, lift_table
    from t2i_gcpo.worlds.shapeworld import parse_prompt

    cfg = TrainConfig()
    metadata = [parse_prompt(p) for p in prompt_texts]
    if prompt_file:
        metadata += load_prompts(prompt_file)[:limit]
    if not metadata:
        raise UserError("no prompts given")
    policy = load_policy(model).eval()
    policy.check_prompts([m["prompt"] for m in metadata])
    ref = None
    if "dgpo" in schemes:
        ref = load_policy(reference or "shapeworld").eval()
    reward = build_reward(reward_spec, grid=policy.grid_shape)
    cfg_scale = default_cfg_scale(policy) if cfg_scale is None else cfg_scale
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, cols = policy.grid_shape
    lifts: dict[str, list[float]] = {s: [] for s in schemes}
    groups = []
    chunks = [metadata[i : i + batch_prompts] for i in range(0, len(metadata), batch_prompts)]
    for c, chunk in enumerate(tqdm(chunks, desc="credit maps", unit="batch")):
        g = torch.Generator().manual_seed(seed * 1_000_003 + c)
        with torch.no_grad():
            ro = policy.rollout([m["prompt"] for m in chunk], group_size, cfg_scale, 1.0, generator=g)
            images = policy.decode(ro)
        meta_rows = [m for m in chunk for _ in range(group_size)]
        rew = call_reward(reward, images, ro.prompts, meta_rows)
        attach_object_grids(ro, rew)
        adv = group_advantages(rew.scores, group_size)
        weights = scheme_weights(policy, ref, ro, adv, group_size, cfg.credit, "cond", schemes)
        if "object_grid" in ro.extras:
            for name, w in weights.items():
                lifts[name] += credit_lift(w, ro.extras["object_grid"], ro.mask).tolist()
        pix = to_uint8(images)
        for p, meta in enumerate(chunk):
            idx = range(p * group_size, (p + 1) * group_size)
            samples = [
                {
                    "image": pix[i],
                    "reward": float(rew.scores[i]),
                    "advantage": float(adv[i]),
                    "weights": {k: w[i].reshape(rows, cols).numpy() for k, w in weights.items()},
                    **(
                        {"object_grid": ro.extras["object_grid"][i].reshape(rows, cols).numpy()}
                        if "object_grid" in ro.extras
                        else {}
                    ),
                }
                for i in idx
            ]
            n = c * batch_prompts + p
            fig = credit_figure(samples, list(weights), out_dir / f"{n:05d}.png", title=meta["prompt"])
            groups.append(
                {"prompt": meta["prompt"], "samples": samples, "schemes": list(weights), "figure": fig}
            )
    html = write_credit_html(out_dir, groups, title=f"Credit maps — {model}")
    lifts = {k: v for k, v in lifts.items() if v}
    summary = f"wrote {len(groups)} figures and {html}"
    if lifts:
        (out_dir / "lift.json").write_text(json.dumps(lifts))
        summary = lift_table(lifts) + "\n" + summary
    if "dgpo" in schemes and (reference or "shapeworld") == model:
        summary += (
            "\nnote: DGPO's reference is the model itself, so its weights are uniform (give --reference)."
        )
    return summary
