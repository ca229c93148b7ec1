"""`t2i-gcpo train` on masked generators through the CLI: the built-in masked prior (`masked:DIR`) and a
tiny random aMUSEd (`amused:DIR`), under both log-prob estimators and the credit schemes that read
the reveal step. A step changes the transformer's weights (the VQ and the text encoder stay frozen),
lowers the loss it took on its own batch (raising the samples with positive advantage against the
others); the checkpoint
resumes; the credit maps show the reveal order."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

import t2i_gcpo.train.scoring as scoring_module  # round_scorer picks sample_and_score up from here
from t2i_gcpo.cli import main
from t2i_gcpo.config import from_dict
from t2i_gcpo.core.advantages import group_advantages
from t2i_gcpo.core.losses import policy_loss
from t2i_gcpo.policies.registry import load_policy, split_spec
from t2i_gcpo.train.credit import compute_weights

from tiny_models import PROMPTS, build_tiny_amused, build_tiny_masked
from train_fixtures import write_prompt_file

# float32 whatever the machine ('auto' picks bf16 where native): recorded ≡ replayed log-probs is
# asserted to float32 tolerances (tests/tasks/test_sampler_precision.py covers bf16)
FAST = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=2",
    "rollout.steps=4",
    "sample_every=1",
    "save_every=1",
    "eval_every=-1",
    "rollout.autocast=none",
    "optim.autocast=none",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("masked_train")
    out = {"masked": build_tiny_masked(str(root)), "prompts": str(write_prompt_file(root / "p.jsonl"))}
    build_tiny_amused(str(root / "amused"))  # diffusers is a dependency: no skip when it is missing
    out["amused"] = str(root / "amused")
    geneval = root / "geneval.txt"
    geneval.write_text("a photo of a cat\na photo of two dogs\na photo of a red car\na photo of a bench\n")
    out["geneval_prompts"] = str(geneval)
    return out


def cli_train(models, family, out, algo, extra=(), steps=1, capture=None, monkeypatch=None, lr=3e-3):
    prompts = models["geneval_prompts"] if family == "amused" else models["prompts"]
    if capture is not None:  # keep each step's scored rollout
        real = scoring_module.sample_and_score

        def keep(*args, **kwargs):
            scored = real(*args, **kwargs)
            capture.append(scored)
            return scored

        monkeypatch.setattr(scoring_module, "sample_and_score", keep)
    args = [
        "train",
        "--prompts",
        prompts,
        "--model",
        f"{family}:{models[family]}",
        "--reward",
        "train_fixtures:redness",
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--algo",
        algo,
        "--seed",
        "0",
        "--set",
        f"optim.lr={lr}",
    ]
    for kv in (*FAST, *extra):
        args += ["--set", kv]
    try:
        main(args)
    except SystemExit as e:
        assert e.code in (0, None), f"exit {e.code}"
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def state(path) -> dict[str, torch.Tensor]:
    policy = load_policy(str(path))
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


CASES = [
    ("masked", "dapo", "trajectory"),
    ("masked", "gcpo", "remask"),
    ("masked", "dgpo", "trajectory"),
    ("amused", "gcpo", "trajectory"),
    ("amused", "dapo", "remask"),
]


@pytest.mark.parametrize("family,algo,estimator", CASES)
def test_a_cli_step_trains_the_transformer_toward_positive_advantages(
    models, tmp_path, monkeypatch, family, algo, estimator
):
    scored = []
    out = tmp_path / "run"
    extra = [f"model_options.estimator={estimator}", "model_options.remask_count=3", "sample_every=0"]
    # a first-order step: Adam moves every weight by ≈ lr at its first step, whatever the gradient
    rows = cli_train(models, family, out, algo, extra, capture=scored, monkeypatch=monkeypatch, lr=1e-6)
    assert rows[0]["step"] == 1 and rows[0]["groups_kept"] == 2
    base = load_policy(f"{family}:{models[family]}", _options(estimator)).eval()
    trained = load_policy(str(out / "checkpoints" / "step_000001" / "model"), _options(estimator)).eval()
    assert split_spec(str(out / "checkpoints" / "step_000001" / "model"))[0] == family  # found by its files
    a, b = base.state_dict(), trained.state_dict()
    changed = {k for k in a if not torch.equal(a[k], b[k])}
    frozen = ("vq.", "vqvae.", "text_encoder.")
    assert changed and not [k for k in changed if k.startswith(frozen)], "transformer trained, rest frozen"

    ro = scored[0].rollout
    adv = group_advantages(scored[0].reward.scores, ro.group_size)
    with torch.no_grad():
        before = base.logprobs(ro, "pos")
        after = trained.logprobs(ro, "pos")
    assert torch.allclose(before * ro.mask, ro.logp["pos"] * ro.mask, atol=1e-4), "recorded = replayed"
    assert not torch.allclose(before, after)
    # the step lowered the loss it was taking on its own batch (to first order, Adam's first step
    # moves against the sign of the gradient): the trainer's weights, aggregation and advantages
    cfg = from_dict(yaml.safe_load((out / "config.yaml").read_text()))
    weights = compute_weights(cfg.credit, ro, adv, base, base, "pos")

    def loss(logp):
        return policy_loss(
            logp,
            ro.logp["pos"],
            adv,
            ro.mask,
            weights=weights,
            aggregation=cfg.loss.aggregation,
            max_len=ro.max_len,
        )[0]

    assert loss(after) < loss(before), (loss(after), loss(before))
    # … which, to first order, raises the advantage-weighted log-likelihood of the batch (Σ A·Δ log π:
    # what a policy-gradient step ascends; a mean over positive against negative samples is not
    # implied by it when the advantages differ in size)
    delta = ((after - before) * weights * ro.mask).sum(-1)
    assert (adv * delta).sum() > 0, (adv, delta)


def _options(estimator):
    from t2i_gcpo.config import ModelOptions

    return ModelOptions(estimator=estimator, remask_count=3)


def test_step_granularity_and_credit_maps_show_the_reveal_order(models, tmp_path):
    from t2i_gcpo.config import CreditConfig
    from t2i_gcpo.policies.base import PromptRecord, SamplingParams
    from t2i_gcpo.tasks.loop import group_generators
    from t2i_gcpo.train.credit import compute_weights
    from t2i_gcpo.train.visuals import reveal_grids

    out = tmp_path / "run"
    rows = cli_train(models, "masked", out, "gcpo", ["credit.granularity=step"], steps=2)
    assert [r["step"] for r in rows] == [1, 2] and all(r["loss/policy"] is not None for r in rows)
    assert (out / "credit_maps" / "step_000002.png").is_file()

    policy = load_policy(f"masked:{models['masked']}")
    sampling = SamplingParams(guidance_scale=2.0, steps=4)
    ro = policy.rollout([PromptRecord(PROMPTS[0])], 4, sampling, group_generators(0, "t", [0]))
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    token = compute_weights(CreditConfig(scheme="gcpo"), ro, adv, policy, None, "pos")
    pooled = compute_weights(CreditConfig(scheme="gcpo", granularity="step"), ro, adv, policy, None, "pos")
    assert not torch.allclose(token, pooled)
    for i in range(len(ro)):  # one weight per reveal step, the mean of its tokens' weights
        for s in ro.step[i].unique():
            at = ro.step[i] == s
            assert torch.allclose(pooled[i][at], pooled[i][at][0].expand(int(at.sum())))
    grids = reveal_grids(ro, 4, 4)
    assert all(g is not None and g.shape == (4, 4) and set(g.ravel()) == {0, 1, 2, 3} for g in grids)


@pytest.mark.slow  # a long end-to-end run (the default tier keeps its lighter siblings)
def test_resume_of_a_masked_run_matches_uninterrupted(models, tmp_path):
    extra = ["model_options.estimator=remask"]
    full = cli_train(models, "masked", tmp_path / "full", "dapo", extra, steps=2)
    cli_train(models, "masked", tmp_path / "part", "dapo", extra, steps=1)
    try:
        main(["train", "--resume", str(tmp_path / "part"), "--steps", "2", "--trust-run-code"])
    except SystemExit as e:
        assert e.code in (0, None)
    part = [json.loads(x) for x in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(full, part):
        assert a["reward/mean"] == pytest.approx(b["reward/mean"], abs=1e-6)
        assert a["loss/policy"] == pytest.approx(b["loss/policy"], abs=1e-6)
    sa = state(tmp_path / "full" / "checkpoints" / "step_000002" / "model")
    sb = state(tmp_path / "part" / "checkpoints" / "step_000002" / "model")
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_estimator_on_an_autoregressive_model_is_one_line_error(models, tmp_path, capsys):
    from tiny_models import tiny_policy_dir

    ar = tiny_policy_dir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(
            [
                "train",
                "--prompts",
                models["prompts"],
                "--model",
                str(ar),
                "--out",
                str(tmp_path / "r"),
                "--set",
                "model_options.estimator=remask",
            ]
        )
    assert e.value.code != 0
    err = capsys.readouterr().err.strip()
    assert "applies to amused, masked, meissonic and showo models only" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


@pytest.mark.slow  # a long end-to-end run (the default tier keeps its lighter siblings)
def test_a_checkpoint_trained_under_a_reveal_order_samples_in_it(models, tmp_path):
    for order in ("random", "confidence"):
        out = tmp_path / order
        cli_train(models, "masked", out, "dapo", [f"rollout.reveal_order={order}"], steps=1)
        trained = load_policy(str(out / "checkpoints" / "step_000001" / "model"))
        assert trained.config.reveal_order == order  # what eval, sample and credit-map will use
    untouched = tmp_path / "default"
    cli_train(models, "masked", untouched, "dapo", steps=1)
    base = load_policy(f"masked:{models['masked']}").config.reveal_order
    assert load_policy(str(untouched / "checkpoints" / "step_000001" / "model")).config.reveal_order == base
    amused = tmp_path / "amused"  # aMUSEd keeps it beside the pipeline's folders
    cli_train(models, "amused", amused, "dapo", ["rollout.reveal_order=random"], steps=1)
    trained = load_policy(str(amused / "checkpoints" / "step_000001" / "model"))
    assert trained.default_sampling().reveal_order == "random"
