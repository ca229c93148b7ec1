"""A benchmark suite as a run's held-out evaluation (config eval_suite, t2i_gcpo/train/eval_suite.py): the
config's suite names are the registry's; a one-step run with eval_suite geneval2 (and the soft_tifa reward)
logs eval/geneval2/overall at step 0 equal to the reference's Soft-TIFA GM of the base model's held-out
images, regenerated here from the same generators; the judge suites run on a loopback judge, and a judge that
is down stops the run before its folder exists, in one line."""

from __future__ import annotations

import json

import pytest
import torch
from scipy.stats import gmean

from t2i_gcpo.config import EVAL_SUITES, GENEVAL2_METHODS, load_config
from t2i_gcpo.errors import UserError

from cli_helpers import cli, error_line
from judge_fixtures import LoopbackJudge, closed_port_url, completion, message_text
from tiny_models import tiny_policy_dir
from vlm_fixtures import GENEVAL2_ROWS, build_tiny_qwen3_vl, reference_probability, write_geneval2_data


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return str(tiny_policy_dir(root)), str(build_tiny_qwen3_vl(root / "qwen3vl"))


def test_the_configs_suite_names_are_the_registrys():
    from t2i_gcpo.eval.suites import suite_names
    from t2i_gcpo.eval.suites.geneval2 import METHODS

    assert EVAL_SUITES.names() == list(suite_names()) and GENEVAL2_METHODS == METHODS


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (
            ("eval_suite=geneval",),
            "config key 'eval_suite': must be one of geneval2, tiif, unigenbench, wise or null",
        ),
        (
            ("eval_suite=wise",),
            "config key 'eval_suite_options.data': eval_suite wise reads its prompts from a data file",
        ),
        (
            ("eval_suite=geneval2", "eval_suite_options.data=d.jsonl"),
            "config key 'eval_suite_options.vqa': eval_suite geneval2 needs",
        ),
        (
            ("eval_suite=tiif", "eval_suite_options.data=d"),
            "config key 'eval_suite_options.judge': eval_suite tiif is scored by a VLM judge",
        ),
        (
            (
                "eval_suite=wise",
                "eval_suite_options.data=d.json",
                "eval_suite_options.judge=http://x/v1",
                "eval_prompts=p.txt",
            ),
            "config key 'eval_prompts': eval_suite wise holds the held-out prompts",
        ),
    ],
)
def test_an_eval_suite_missing_what_it_reads_is_one_line(sets, expected):
    with pytest.raises(UserError) as e:
        load_config(None, None, None, sets)
    assert str(e.value).startswith(expected), str(e.value)


def train_args(policy, prompts, out, reward, *sets):
    return [
        "train",
        "--prompts",
        prompts,
        "--model",
        policy,
        "--reward",
        reward,
        "--out",
        out,
        "--steps",
        "1",
        "--report-to",
        "none",
        "--set",
        "task=prompts",
        "--set",
        "rollout.prompts_per_step=2",
        "--set",
        "rollout.group_size=2",
        "--set",
        "sample_every=0",
        "--set",
        "eval_images_per_prompt=2",
        *[x for s in sets for x in ("--set", s)],
    ]


@pytest.mark.slow  # a training run and a reference scoring: ≈ 9 s beside other jobs
def test_a_run_with_eval_suite_geneval2_logs_the_references_soft_tifa_of_its_held_out_images(
    tmp_path, capsys, models
):
    policy_dir, vlm = models
    data = write_geneval2_data(tmp_path / "geneval2_data.jsonl")
    out = tmp_path / "run"
    code, stdout, err = cli(
        capsys,
        *train_args(
            policy_dir,
            data,
            out,
            f"soft_tifa:{vlm},float32",
            "eval_every=1",
            "eval_suite=geneval2",
            f"eval_suite_options.data={data}",
            f"eval_suite_options.vqa={vlm}",
            "eval_suite_options.dtype=float32",
        ),
    )
    assert code == 0, err
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/geneval2/overall" in r]
    assert [r["step"] for r in evals] == [0, 1] and "held-out geneval2 (Soft-TIFA GM)" in stdout + err
    assert set(evals[0]) >= {"eval/geneval2/atoms_2", "eval/geneval2/atoms_3"} and "reward/mean" in rows[1]
    # step 0 is the base model: its held-out images regenerated from the same generators,
    # scored the reference's way
    from t2i_gcpo.config import from_dict
    from t2i_gcpo.outdir import read_yaml
    from t2i_gcpo.policies.base import PromptRecord
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.rewards._common import images_to_pil
    from t2i_gcpo.scoring.soft_tifa import answer_list
    from t2i_gcpo.tasks.loop import group_generators, sample_and_decode
    from t2i_gcpo.train.run_settings import sampling_params

    cfg = from_dict(read_yaml(out / "config.yaml"))
    policy = load_policy(policy_dir).eval()
    gens = group_generators(cfg.seed, "eval", range(3))
    _, images = sample_and_decode(
        policy, [PromptRecord(r["prompt"]) for r in GENEVAL2_ROWS], 2, sampling_params(cfg), gens
    )
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(vlm, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(vlm)
    gms, by_count = [], {}
    for j, image in enumerate(images_to_pil(images)):
        row = GENEVAL2_ROWS[j // 2]
        soft = [
            reference_probability(model, processor, image, f"{q} Answer in one word.", answer_list(q, a))[0]
            for q, a in row["vqa_list"]
        ]
        gms.append(float(gmean(soft)))
        by_count.setdefault(row["atom_count"], []).append(gms[-1])
    assert evals[0]["eval/geneval2/overall"] == pytest.approx(sum(gms) / len(gms), rel=1e-4)
    assert evals[0]["eval/geneval2/atoms_3"] == pytest.approx(sum(by_count[3]) / len(by_count[3]), rel=1e-4)


WISE_SHAPES = [
    {
        "Prompt": "a photo of a circle",
        "Explanation": "a circle",
        "Category": "Cultural knowledge",
        "Subcategory": "Art",
        "prompt_id": 3,
    },
    {
        "Prompt": "a photo of two squares",
        "Explanation": "two squares",
        "Category": "Physical Knowledge",
        "Subcategory": "Optics",
        "prompt_id": 800,
    },
]


def test_a_run_with_a_judge_suite_and_a_judge_that_is_down(tmp_path, capsys, models):
    policy_dir, _ = models
    prompts = tmp_path / "p.txt"
    prompts.write_text("a photo of a circle\na photo of a square\n")
    data = tmp_path / "merge.json"
    data.write_text(json.dumps(WISE_SHAPES))
    fast = (
        "eval_suite_options.timeout=0.5",
        "eval_suite_options.retries=1",
        "eval_suite_options.backoff=0.01",
    )
    out = tmp_path / "down"
    code, _, err = cli(
        capsys,
        *train_args(
            policy_dir,
            prompts,
            out,
            "shapeworld",
            "eval_suite=wise",
            f"eval_suite_options.data={data}",
            f"eval_suite_options.judge={closed_port_url()}",
            *fast,
        ),
    )
    line = error_line(err)
    assert (
        code == 2
        and "eval_suite wise:" in line
        and "after 2 tries" in line
        and "before the run started" in line
    )
    assert not out.exists()
    with LoopbackJudge(lambda body: completion(f"Score: {int('circle' in message_text(body))}")) as judge:
        out = tmp_path / "run"
        code, _, err = cli(
            capsys,
            *train_args(
                policy_dir,
                prompts,
                out,
                "shapeworld",
                "eval_suite=wise",
                "eval_every=1",
                f"eval_suite_options.data={data}",
                f"eval_suite_options.judge={judge.url}",
                *fast,
            ),
        )
        assert code == 0, err
        asked = len(judge.bodies)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/wise/overall" in r]
    assert [r["step"] for r in evals] == [0, 1]
    assert asked == 1 + 2 * 4  # the probe, then 2 prompts × 2 images, twice
    for r in evals:
        assert r["eval/wise/CULTURE"] == 1.0 and r["eval/wise/PHYSICS"] == 0.0
        assert r["eval/wise/overall"] == pytest.approx(0.4 / 0.52)
