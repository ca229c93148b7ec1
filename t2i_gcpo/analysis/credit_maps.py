"""Credit maps and credit lift outside training: sample a group per prompt, reward it, compute every
scheme's token weights, draw them, and measure credit lift (docs/worlds/shapeworld.md#credit-lift); for text,
token heatmaps and step lift against the first wrong step (docs/worlds/arithmetic.md#step-lift). With a scheme
that needs branches (vine) the samples are branched (train/branches.grow) and each gets a value map
(docs/concepts/tree_credit.md#value-maps); with one that needs step rewards (stepwise, masked models) every
reveal step's prediction is scored and each sample gets its reward trajectory
(docs/concepts/tree_credit.md#stepwise-rewards)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from t2i_gcpo.config import TrainConfig
from t2i_gcpo.core.schemes import get_scheme
from t2i_gcpo.errors import UserError
from t2i_gcpo.outdir import write_file


def base_model(policy) -> str:
    """The shipped model of the policy's family: DGPO's default reference in credit maps."""
    from t2i_gcpo.policies.masked import MaskedPolicy

    if policy.output == "text":
        return "arithmetic"
    if isinstance(policy, MaskedPolicy):
        return "shapeworld-masked"
    return "shapeworld-64" if tuple(policy.layout.grid) == (16, 16) else "shapeworld"


VALUE_POINTS = 4  # image value maps: branch every S / 4 decision steps (3 points per sample)


def branches_needed(schemes: tuple[str, ...]) -> bool:
    """Whether any of `schemes` reads branched continuations (vine, or a user's scheme that needs them)."""
    return any("branches" in get_scheme(s).needs for s in schemes)


def step_rewards_needed(schemes: tuple[str, ...]) -> bool:
    """Whether any of `schemes` reads r(x̂_s), the rewards of the predictions over the reveal
    steps (stepwise)."""
    return any("step_rewards" in get_scheme(s).needs for s in schemes)


def servable(schemes: tuple[str, ...], policy, given: bool) -> tuple[str, ...]:
    """The schemes the policy's family can serve (`PolicyCapabilities`): all of those
    `given`, else an error."""
    from t2i_gcpo.train.credit import check_capabilities

    kept = []
    for name in schemes:
        try:
            check_capabilities(name, policy)
            kept.append(name)
        except UserError:
            if given:
                raise
    return tuple(kept)


def value_branching(cfg: TrainConfig, ro):
    """The branching credit-map uses: a run's (`branching.*`), but every S / 4 of the S decision steps of the
    group's longest sample, so every model (64 or 256 raster tokens, 8 reveal steps, a text of any length)
    gets 3 points."""
    from t2i_gcpo.policies.branching import decision_steps

    k = max(1, int(decision_steps(ro).max()) // VALUE_POINTS)
    return dataclasses.replace(cfg.branching, rule="every_k", k=k)


def grow_values(
    cfg: TrainConfig, policy, reward, ro, rewards, slots: list[int], seed: int, sampling
) -> tuple:
    """Branch a chunk's groups (train/branches.grow, keyed by the groups' slots as a run keys its own) → (the
    tree, each sample's value fields (train/visuals.sample_values), continuations)."""
    from t2i_gcpo.train.branches import grow
    from t2i_gcpo.train.visuals import sample_values, tree_include_root

    grown = grow(policy, reward, ro, slots, value_branching(cfg, ro), seed, sampling, "pos")
    return grown.tree, sample_values(ro, rewards, grown.tree, tree_include_root(cfg)), grown.samples


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
    negative: str | None = None,
    schemes_given: bool = True,
    settings: dict | None = None,
) -> str:
    """Returns the printed summary (credit-lift table when the reward reports object grids). `schemes_given`:
    the schemes were named by the user (one the model's family cannot serve is an error); else they are the
    registry's, and those the family cannot serve are left out. `settings`: recorded in `out`
    (`outdir.write_settings_record`) before its first figure."""
    from tqdm import tqdm

    from t2i_gcpo.core.advantages import group_advantages
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.policies.sampling import resolve_guidance_scale
    from t2i_gcpo.rewards.registry import build_reward
    from t2i_gcpo.tasks.geneval import object_grids
    from t2i_gcpo.tasks.loop import group_generators, sample_and_score
    from t2i_gcpo.tasks.registry import get_task
    from t2i_gcpo.train.credit import scheme_weights
    from t2i_gcpo.train.visuals import reveal_grids, to_uint8
    from t2i_gcpo.viz.credit_map import credit_figure, step_figure, write_credit_html
    from t2i_gcpo.viz.lift import credit_lift, lift_table

    if limit is not None and limit < 1:
        raise UserError(f"limit must be >= 1 (got {limit})")
    cfg = TrainConfig()
    if negative is not None:
        cfg.model_options.negative = negative
        cfg.validate()
    policy = load_policy(model, cfg.model_options if negative is not None else None).eval()
    task = get_task(policy.default_task, policy)
    prompts = [task.parse(p) for p in prompt_texts]
    if prompt_file:
        prompts += task.load_prompts(prompt_file)[:limit]
    if not prompts:
        raise UserError("no prompts given")
    policy.check_prompts([p.text for p in prompts])
    schemes = servable(schemes, policy, schemes_given)
    ref = None
    reference = reference or base_model(policy)
    if any("ref_dists" in get_scheme(s).needs for s in schemes):
        ref = load_policy(reference).eval()
    reward = build_reward(
        reward_spec or task.default_reward or "shapeworld", grid=policy.layout.grid, output=policy.output
    )
    sampling = dataclasses.replace(
        policy.default_sampling(), guidance_scale=resolve_guidance_scale(policy, cfg_scale)
    )
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    clear_credit_outputs(out_dir)  # all checks passed: an earlier run's figures must not outlive it
    if settings is not None:
        from t2i_gcpo.outdir import write_settings_record

        write_settings_record(out_dir, "credit-map", settings)
    if policy.output == "text":
        summary = _text_maps(
            policy,
            task,
            reward,
            prompts,
            ref,
            schemes,
            group_size,
            sampling,
            seed,
            out_dir,
            batch_prompts,
            model,
        )
        return summary + _self_reference_note(ref, reference, model)
    rows, cols = policy.layout.grid
    lifts: dict[str, list[float]] = {s: [] for s in schemes}
    groups = []
    continuations = predictions = 0
    stepwise = step_rewards_needed(schemes)
    if stepwise:  # the same samples, their predictions over the reveal steps kept
        sampling = dataclasses.replace(sampling, record_predictions=True)
    starts = range(0, len(prompts), batch_prompts)
    for start in tqdm(starts, desc="credit maps", unit="batch"):
        chunk = prompts[start : start + batch_prompts]
        keys = range(start, start + len(chunk))
        scored = sample_and_score(
            policy, reward, chunk, group_size, sampling, group_generators(seed, "credit-map", keys)
        )
        ro, rew, images = scored.rollout, scored.reward, scored.outputs
        adv = group_advantages(rew.scores, group_size)
        tree, values = None, [{}] * len(ro)
        if branches_needed(schemes):
            tree, values, n = grow_values(cfg, policy, reward, ro, rew.scores, list(keys), seed, sampling)
            continuations += n
            for v in values:
                v["value_grid"] = v.pop("value_tokens").reshape(rows, cols)
        steps = [{}] * len(ro)
        if stepwise:
            steps, n = step_fields(policy, reward, ro, rew.scores, images)
            predictions += n
        weights = scheme_weights(
            cfg.credit, ro, adv, policy, ref, "pos", schemes, rewards=rew.scores, tree=tree
        )
        grids = object_grids(rew.details, ro.tokens.shape[1])
        if grids is not None:
            for name, w in weights.items():
                lifts[name] += credit_lift(w, grids, ro.loss_mask).tolist()
        pix = to_uint8(images)
        reveal = reveal_grids(ro, rows, cols)
        for p, record in enumerate(chunk):
            idx = range(p * group_size, (p + 1) * group_size)
            samples = [
                {
                    "image": pix[i],
                    "reward": float(rew.scores[i]),
                    "advantage": float(adv[i]),
                    "weights": {k: w[i].reshape(rows, cols).numpy() for k, w in weights.items()},
                    "reveal_step": reveal[i],
                    **({"object_grid": grids[i].reshape(rows, cols).numpy()} if grids is not None else {}),
                    **values[i],
                    **steps[i],
                }
                for i in idx
            ]
            n = start + p
            fig = credit_figure(samples, list(weights), out_dir / f"{n:05d}.png", title=record.text)
            group = {"prompt": record.text, "samples": samples, "schemes": list(weights), "figure": fig}
            if stepwise:
                group["step_figure"] = step_figure(
                    samples,
                    out_dir / f"{n:05d}_steps.png",
                    title=f"{record.text}: the prediction after each reveal step",
                )
            groups.append(group)
    html = write_credit_html(out_dir, groups, title=f"Credit maps — {model}")
    lifts = {k: v for k, v in lifts.items() if v}
    summary = f"wrote {len(groups)} figures and {html}" + _continuations_note(
        continuations, branches_needed(schemes)
    )
    if stepwise:
        summary += (
            f"\nstepwise: {predictions} predictions over the reveal steps scored for the reward trajectories"
        )
    if lifts:
        write_file(out_dir / "lift.json", json.dumps(lifts))
        summary = lift_table(lifts) + "\n" + summary
    return summary + _self_reference_note(ref, reference, model)


def step_fields(policy, reward, ro, scores, images) -> tuple[list[dict], int]:
    """Score the rollout's predictions over the reveal steps (train/credit.score_step_predictions; r(x̂_s) into
    ``ro.state``) → (each sample's ``step_rewards`` and ``step_images`` for `viz.credit_map`,
    predictions scored)."""
    from t2i_gcpo.policies.base import STEP_REWARDS
    from t2i_gcpo.train.credit import score_step_predictions
    from t2i_gcpo.train.visuals import to_uint8

    rewards, calls, outputs = score_step_predictions(policy, reward, ro, scores, keep_outputs=True)
    ro.state[STEP_REWARDS] = rewards
    pix = [to_uint8(o) for o in outputs] + [to_uint8(images)]  # x̂_0 … x̂_{S−2}, then the sample
    fields = [
        {"step_rewards": rewards[i].tolist(), "step_images": [p[i] for p in pix]} for i in range(len(ro))
    ]
    return fields, len(ro) * calls


def _continuations_note(continuations: int, branched: bool) -> str:
    return (
        f"\nbranching: {continuations} continuations sampled and scored for the value maps"
        if branched
        else ""
    )


def _self_reference_note(ref, reference: str, model: str) -> str:
    if ref is not None and reference == model:
        return "\nnote: the reference is the model itself, so DGPO's weights are uniform (give --reference)."
    return ""


def _text_maps(
    policy,
    task,
    reward,
    prompts,
    ref,
    schemes,
    group_size,
    sampling,
    seed,
    out_dir: Path,
    batch_prompts: int,
    model: str,
) -> str:
    """Token heatmaps of every group (one HTML page) and step lift per scheme over the failed samples."""
    from tqdm import tqdm

    from t2i_gcpo.core.advantages import group_advantages
    from t2i_gcpo.tasks.loop import group_generators, sample_and_score
    from t2i_gcpo.train.credit import scheme_weights
    from t2i_gcpo.viz.lift import lift_table
    from t2i_gcpo.viz.text_heatmap import text_heatmap_figure, write_text_heatmap

    if not task.lays_out_text:
        raise UserError(f"task '{task.name}' cannot lay out text samples for credit maps")
    from t2i_gcpo.train.visuals import attach_text_values

    cfg = TrainConfig()
    lifts: dict[str, list[float]] = {s: [] for s in schemes}
    samples = []
    continuations = 0
    for start in tqdm(range(0, len(prompts), batch_prompts), desc="credit maps", unit="batch"):
        chunk = prompts[start : start + batch_prompts]
        scored = sample_and_score(
            policy,
            reward,
            chunk,
            group_size,
            sampling,
            group_generators(seed, "credit-map", range(start, start + len(chunk))),
        )
        ro, rew = scored.rollout, scored.reward
        adv = group_advantages(rew.scores, group_size)
        tree = values = None
        if branches_needed(schemes):
            slots = list(range(start, start + len(chunk)))
            tree, values, n = grow_values(cfg, policy, reward, ro, rew.scores, slots, seed, sampling)
            continuations += n
        weights = scheme_weights(
            cfg.credit, ro, adv, policy, ref, "pos", schemes, rewards=rew.scores, tree=tree
        )
        for name, w in weights.items():
            lifts[name] += task.sample_lifts(w, ro, rew.details).tolist()
        group = task.text_samples(ro, weights, rew.details, rew.scores, adv)
        if values is not None:
            attach_text_values(group, ro, values)
        for p, record in enumerate(chunk):  # a picture of each prompt's first samples
            text_heatmap_figure(
                group[p * group_size : p * group_size + 4],
                out_dir / f"{start + p:05d}.png",
                title=record.text,
            )
        samples += group
    page = write_text_heatmap(out_dir / "credit_maps.html", samples, title=f"Token credit — {model}")
    write_file(out_dir / "lift.json", json.dumps(lifts))
    return (
        "step lift (credit share on the first wrong step over its token share; failed samples):\n"
        + lift_table(lifts)
        + f"\nwrote {page} and one PNG per prompt"
        + _continuations_note(continuations, branches_needed(schemes))
    )


CREDIT_OUTPUTS = re.compile(r"\d{5}(_steps)?\.png|credit_maps\.html|lift\.json")  # what credit-map writes


def check_credit_out(out_dir: Path) -> None:
    """A credit-map run replaces the figures of an earlier one in `out_dir`; a folder holding files named
    like them but no credit_maps.html is someone else's and refused (before any model is loaded)."""
    if not out_dir.is_dir() or (out_dir / "credit_maps.html").is_file():
        return
    ours = sorted(p.name for p in out_dir.iterdir() if CREDIT_OUTPUTS.fullmatch(p.name))
    if ours:
        raise UserError(
            f"--out {out_dir} holds {ours[0]} but no credit_maps.html (not a credit-map folder); "
            "choose another folder"
        )


def clear_credit_outputs(out_dir: Path) -> None:
    """Remove an earlier credit-map run's figures, page and lift table (a smaller run left the rest)."""
    check_credit_out(out_dir)
    for path in out_dir.iterdir():
        if CREDIT_OUTPUTS.fullmatch(path.name) and path.is_file():
            path.unlink()
