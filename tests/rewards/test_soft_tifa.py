"""The soft_tifa reward (t2i_gcpo/rewards/forms/soft_tifa.py): a tiny random Qwen3-VL's Soft-TIFA GM / AM of
each image over its prompt's atoms equals the reference's computation written again here (generate's scores,
their softmax summed over each answer's first token, scipy's geometric mean); a prompt without atoms is
refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import gmean

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards._common import images_to_pil
from t2i_gcpo.rewards.combine import check_prompts
from t2i_gcpo.rewards.registry import build_reward, check_reward_spec

from vlm_fixtures import GENEVAL2_ROWS, build_tiny_qwen3_vl, reference_probability


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return build_tiny_qwen3_vl(tmp_path_factory.mktemp("vlm") / "qwen3vl")


def reference_atoms(model, processor, image, row) -> list[float]:
    out = []
    for question, answer in row["vqa_list"]:
        if question.startswith("How many"):
            digits = {"one": "1", "four": "4"}.get(answer, "other")
            answers = [
                answer,
                answer.capitalize(),
                " " + answer,
                " " + answer.capitalize(),
                digits,
                " " + digits,
            ]
        else:
            answers = ["Yes", "yes", " yes", " Yes"]
        out.append(
            reference_probability(model, processor, image, f"{question} Answer in one word.", answers)[0]
        )
    return out


def test_soft_tifa_scores_are_the_references_over_each_prompts_atoms(vlm_dir):
    gm = build_reward(f"soft_tifa:{vlm_dir},float32,batch_size=3")
    am = build_reward(f"soft_tifa:{vlm_dir},float32,am")
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(4, 3, 40, 48, generator=gen)
    rows = [GENEVAL2_ROWS[0], GENEVAL2_ROWS[0], GENEVAL2_ROWS[1], GENEVAL2_ROWS[2]]
    prompts, metadata = [r["prompt"] for r in rows], [dict(r) for r in rows]
    out_gm, out_am = gm(images, prompts, metadata), am(images, prompts, metadata)
    inner = gm.inner
    model, processor = inner.vlm.model, inner.vlm.processor
    for i, (image, row) in enumerate(zip(images_to_pil(images), rows)):
        atoms = reference_atoms(model, processor, image, row)
        assert out_gm.details[i]["atoms"] == pytest.approx(atoms, rel=1e-4, abs=1e-8)
        assert float(out_gm.scores[i]) == pytest.approx(float(gmean(atoms)), rel=1e-4)
        assert float(out_am.scores[i]) == pytest.approx(float(np.mean(atoms)), rel=1e-4)
        assert out_gm.details[i]["soft_tifa_am"] == pytest.approx(float(out_am.scores[i]), rel=1e-6)
    assert inner.bounds == (0.0, 1.0) and 0 <= float(out_gm.scores.min()) <= float(out_gm.scores.max()) <= 1


def test_a_prompt_without_atoms_is_refused_in_one_line(vlm_dir, tmp_path):
    reward = build_reward(f"soft_tifa:{vlm_dir},float32")
    with pytest.raises(
        UserError, match=r"reward 'soft_tifa': prompt 1 \('a photo of a circle'\) carries no atoms"
    ):
        check_prompts(reward, [GENEVAL2_ROWS[0]["prompt"], "a photo of a circle"], [GENEVAL2_ROWS[0], {}])
    with pytest.raises(UserError, match="DIR .* does not exist"):
        check_reward_spec(f"soft_tifa:{tmp_path / 'none'}")
    with pytest.raises(UserError, match="holds no config.json"):
        check_reward_spec(f"soft_tifa:{tmp_path}")
