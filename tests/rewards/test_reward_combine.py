"""Rewards from local weights and reward combinators: CLIPScore on a tiny random open_clip model,
weighted sums, user callables, the NaN/exception guard, the reward registry and the GenEval reward."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.combine import CallableReward, RewardError, WeightedSum, call_reward
from t2i_gcpo.rewards.registry import build_reward
from t2i_gcpo.scoring.detections import Detection

TINY_CLIP = "t2i-gcpo-tiny-clip"
TINY_CFG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "patch_size": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


@pytest.fixture(scope="module")
def clip_ckpt(tmp_path_factory):
    """A tiny random open_clip model registered under TINY_CLIP; its state dict saved to a file."""
    import open_clip

    d = tmp_path_factory.mktemp("clip")
    (d / "configs").mkdir()
    (d / "configs" / f"{TINY_CLIP}.json").write_text(json.dumps(TINY_CFG))
    open_clip.add_model_config(d / "configs")
    torch.manual_seed(0)
    model = open_clip.create_model(TINY_CLIP, pretrained=None)
    torch.save(model.state_dict(), d / "tiny.pt")
    return d / "tiny.pt"


def _images(n: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, 48, 48, generator=torch.Generator().manual_seed(seed))  # [B, 3, H, W] in [0, 1]


class Const:
    """A fake reward returning fixed scores (and a detail per sample)."""

    def __init__(self, name, scores):
        self.name, self.scores = name, scores

    def __call__(self, images, prompts, metadata):
        return RewardOutput(torch.tensor(self.scores), [{"x": i} for i in range(len(prompts))])


# ----------------------------------------------------------------------------- CLIPScore
def test_clip_score_range_and_definition(clip_ckpt):
    import open_clip

    from t2i_gcpo.rewards.forms.clip_score import ClipScoreReward, images_to_pil

    reward = ClipScoreReward(str(clip_ckpt), TINY_CLIP, quick_gelu=False, batch_size=2)
    images, prompts = _images(5), ["a red circle", "a dog", "two cats", "a red circle", "blue"]
    out = reward(images, prompts, [{}] * 5)
    assert out.scores.shape == (5,) and len(out.details) == 5
    assert ((out.scores >= 0) & (out.scores <= 1)).all()
    cos = torch.tensor([d["cosine"] for d in out.details])
    assert torch.allclose(out.scores, cos.clamp(min=0))

    # by hand: the same weights loaded by open_clip, cosine of the normalised embeddings
    model, _, pre = open_clip.create_model_and_transforms(TINY_CLIP, pretrained=str(clip_ckpt))
    model.eval()
    with torch.no_grad():
        e_i = model.encode_image(torch.stack([pre(im) for im in images_to_pil(images)]))
        e_t = model.encode_text(open_clip.get_tokenizer(TINY_CLIP)(prompts))
    want = torch.nn.functional.cosine_similarity(e_i, e_t, dim=-1)
    assert torch.allclose(cos, want, atol=1e-5)
    # order-equivariant and independent of the internal batch size
    perm = [4, 2, 0, 1, 3]
    big = ClipScoreReward(str(clip_ckpt), TINY_CLIP, quick_gelu=False, batch_size=32)
    again = big(images[perm], [prompts[i] for i in perm], [{}] * 5)
    assert torch.allclose(again.scores, out.scores[perm], atol=1e-5)


def test_clip_score_open_clip_local_dir(clip_ckpt, tmp_path):
    """open_clip's own folder layout (open_clip_config.json + weights) scores like the file form."""
    import shutil

    from t2i_gcpo.rewards.forms.clip_score import ClipScoreReward

    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CFG}))
    shutil.copy(clip_ckpt, tmp_path / "open_clip_pytorch_model.bin")
    images, prompts = _images(3), ["a", "b c", "d"]
    from_dir = ClipScoreReward(str(tmp_path))(images, prompts, [{}] * 3)
    from_file = ClipScoreReward(str(clip_ckpt), TINY_CLIP, quick_gelu=False)(images, prompts, [{}] * 3)
    assert torch.allclose(from_dir.scores, from_file.scores, atol=1e-5)


def test_clip_score_errors(clip_ckpt, tmp_path):
    from t2i_gcpo.rewards.forms.clip_score import ClipScoreReward

    with pytest.raises(UserError, match="does not exist"):
        ClipScoreReward(str(tmp_path / "missing.pt"), TINY_CLIP)
    with pytest.raises(UserError, match="unknown open_clip model"):
        ClipScoreReward(str(clip_ckpt), "ViT-Nonexistent-99")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="cannot load"):
        ClipScoreReward(str(bad), TINY_CLIP)
    (tmp_path / "cfgonly").mkdir()
    (tmp_path / "cfgonly" / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CFG}))
    with pytest.raises(UserError, match="no CLIP weights"):
        ClipScoreReward(str(tmp_path / "cfgonly"), TINY_CLIP)


# ----------------------------------------------------------------------------- combinators
def test_weighted_sum_arithmetic_and_details():
    a, b = Const("a", [1.0, 2.0, 3.0]), Const("b", [0.5, 0.0, -1.0])
    out = WeightedSum([(a, 0.7), (b, 0.3)])(None, ["p"] * 3, [{}] * 3)
    assert torch.allclose(out.scores, torch.tensor([0.85, 1.4, 1.8]))
    assert out.term_names == ("a", "b") and out.terms.tolist() == [[1.0, 0.5], [2.0, 0.0], [3.0, -1.0]]
    assert out.details[1] == {"a/x": 1, "b/x": 1}  # what is not a score, under each term's name
    twice = WeightedSum([(a, 1.0), (Const("a", [1.0, 1.0, 1.0]), -2.0)])
    assert twice.name == "1*a+-2*a#2"
    out2 = twice(None, ["p"] * 3, [{}] * 3)
    assert torch.allclose(out2.scores, torch.tensor([-1.0, 0.0, 1.0]))
    assert out2.term_names == ("a", "a#2") and out2.terms[:, 1].tolist() == [1.0, 1.0, 1.0]
    assert set(out2.details[0]) == {"a/x", "a#2/x"}


def test_nan_exception_and_length_raise_reward_error():
    assert issubclass(RewardError, UserError)
    with pytest.raises(RewardError, match=r"reward 'b' returned NaN/inf for sample\(s\) \[1\]"):
        WeightedSum([(Const("a", [1.0, 1.0]), 1.0), (Const("b", [0.0, float("nan")]), 1.0)])(
            None, ["p", "q"], [{}, {}]
        )

    class Boom:
        name = "boom"

        def __call__(self, images, prompts, metadata):
            raise KeyError("tag")

    with pytest.raises(RewardError, match="reward 'boom' failed: KeyError"):
        call_reward(Boom(), None, ["p"], [{}])
    with pytest.raises(RewardError, match=r"reward 'short' returned \(1,\) scores for 2 samples"):
        call_reward(Const("short", [1.0]), None, ["p", "q"], [{}, {}])


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            import torch
            from t2i_gcpo.rewards.base import RewardOutput

            def brightness(images, prompts, metadata):
                return images.mean(dim=(1, 2, 3)).tolist()          # a list of floats

            def length(images, prompts, metadata):
                return torch.tensor([float(len(p)) for p in prompts])  # a tensor

            def tagged(images, prompts, metadata):
                return RewardOutput(torch.ones(len(prompts)), [{"tag": m.get("tag")} for m in metadata])

            def nan(images, prompts, metadata):
                return [float("nan")] * len(prompts)

            def broken(images, prompts, metadata):
                return 1 / 0

            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "my_rewards.py"


def test_callable_reward_forms(user_module):
    images, prompts = _images(2), ["ab", "abcd"]
    r = CallableReward("my_rewards:brightness")
    assert r.name == "brightness"
    assert torch.allclose(r(images, prompts, [{}, {}]).scores, images.mean(dim=(1, 2, 3)))
    assert CallableReward("my_rewards:length")(images, prompts, [{}, {}]).scores.tolist() == [2.0, 4.0]
    out = CallableReward(f"{user_module}:tagged")(images, prompts, [{"tag": "colors"}, {}])  # file.py form
    assert out.details == [{"tag": "colors"}, {"tag": None}]
    with pytest.raises(RewardError, match="reward 'nan' returned NaN"):
        CallableReward("my_rewards:nan")(images, prompts, [{}, {}])
    with pytest.raises(RewardError, match="reward 'broken'.*ZeroDivisionError"):
        CallableReward("my_rewards:broken")(images, prompts, [{}, {}])


def test_callable_reward_import_errors(user_module, tmp_path):
    with pytest.raises(UserError, match="cannot import reward module 'no_such_module_xyz'.*PYTHONPATH"):
        CallableReward("no_such_module_xyz:f")
    with pytest.raises(UserError, match="has no function 'missing'"):
        CallableReward("my_rewards:missing")
    with pytest.raises(UserError, match="is not a function"):
        CallableReward("my_rewards:NOT_CALLABLE")
    with pytest.raises(UserError, match="does not exist"):
        CallableReward(f"{tmp_path}/nope.py:f")
    (tmp_path / "syntax_err.py").write_text("def f(:\n")
    with pytest.raises(UserError, match="cannot import reward file.*SyntaxError"):
        CallableReward(f"{tmp_path}/syntax_err.py:f")


# ----------------------------------------------------------------------------- registry
def test_build_reward_forms(user_module, clip_ckpt):
    images, prompts = _images(2), ["ab", "abcd"]
    r = build_reward("my_rewards:length")
    assert r.name == "length" and r(images, prompts, [{}, {}]).scores.tolist() == [2.0, 4.0]

    s = build_reward("0.7*my_rewards:length + 0.3*my_rewards:brightness")
    want = 0.7 * torch.tensor([2.0, 4.0]) + 0.3 * images.mean(dim=(1, 2, 3))
    assert torch.allclose(s(images, prompts, [{}, {}]).scores, want)
    assert s.name == "0.7*length+0.3*brightness"
    assert torch.allclose(
        build_reward("2*my_rewards:length")(images, prompts, [{}, {}]).scores, torch.tensor([4.0, 8.0])
    )

    clip = build_reward(f"clip:{clip_ckpt}:{TINY_CLIP}")
    assert clip.name == "clip"
    both = build_reward(f"0.5*clip:{clip_ckpt}:{TINY_CLIP}+0.5*my_rewards:length")
    out = both(images, prompts, [{}, {}])
    cos = clip(images, prompts, [{}, {}]).scores
    assert torch.allclose(out.scores, 0.5 * cos + 0.5 * torch.tensor([2.0, 4.0]), atol=1e-5)
    assert "clip/cosine" in out.details[0]

    with pytest.raises(RewardError, match="reward 'nan'"):  # single rewards are guarded too
        build_reward("my_rewards:nan")(images, prompts, [{}, {}])


def test_build_reward_errors(tmp_path):
    for spec in ("", "nonsense", "geneval:only_one_path"):
        with pytest.raises(UserError, match="clip:CKPT_PATH|geneval:DETECTOR_DIR|empty reward"):
            build_reward(spec)
    with pytest.raises(UserError, match="does not exist"):
        build_reward(f"clip:{tmp_path}/none.pt")


# ----------------------------------------------------------------------------- GenEval reward
class FakeDetector:
    """Returns fixed detections and records the images it saw."""

    def __init__(self, detections):
        self.detections, self.seen = detections, []

    def __call__(self, image):
        self.seen.append(image.size)
        return self.detections


class FakeColors:
    def color_of(self, image):
        return lambda det: det.color


def test_geneval_reward_wiring_with_fake_rules(monkeypatch):
    """Detector and colour classifier are called per image and the rules' result becomes the score
    (real rules engine not needed: `reward_detections` is replaced by a recording fake)."""
    from types import SimpleNamespace

    import t2i_gcpo.scoring.geneval_rules as rules
    from t2i_gcpo.rewards.forms.geneval_reward import GenEvalReward

    calls = []

    def fake_rules(metadata, detections, color_of, variant="spec"):
        calls.append((metadata["tag"], len(detections), color_of(detections[0]), variant))
        return SimpleNamespace(correct=metadata["tag"] == "single_object", partial=0.25, reason="fake")

    monkeypatch.setattr(rules, "reward_detections", fake_rules, raising=False)
    dets = [Detection(cls="dog", box=(0, 0, 10, 10), score=0.9, color="red")]
    det = FakeDetector(dets)
    meta = [
        {"tag": "single_object", "include": [{"class": "dog", "count": 1}]},
        {"tag": "colors", "include": []},
    ]
    out = GenEvalReward(det, FakeColors())(_images(2), ["a photo of a dog", "x"], meta)
    assert out.scores.tolist() == [0.25, 0.25] and det.seen == [(48, 48), (48, 48)]
    assert calls == [("single_object", 1, "red", "spec"), ("colors", 1, "red", "spec")]
    assert out.details[0] == {"strict": 1.0, "partial": 0.25, "reason": "fake", "tag": "single_object"}
    strict = GenEvalReward(det, FakeColors(), score="strict")(_images(2), ["a", "b"], meta)
    assert strict.scores.tolist() == [1.0, 0.0]
    with pytest.raises(UserError, match="needs GenEval metadata"):
        GenEvalReward(det, FakeColors())(_images(1), ["a"], [{}])


def test_geneval_reward_with_real_rules():
    """Partial credit (docs/evaluation/geneval.md#geneval-as-a-reward) through the real rules engine."""
    from t2i_gcpo.rewards.forms.geneval_reward import GenEvalReward

    dog = Detection(cls="dog", box=(0, 0, 10, 10), score=0.95, color="red")
    meta = {"tag": "two_object", "include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1}]}
    out = GenEvalReward(FakeDetector([dog]), FakeColors())(_images(1), ["a dog and a cat"], [meta])
    # dog: 1 − |1 − 1|/1 = 1; cat: 1 − |1 − 0|/1 = 0 → mean 0.5; strict: fails
    assert out.scores.tolist() == [0.5] and out.details[0]["strict"] == 0.0
