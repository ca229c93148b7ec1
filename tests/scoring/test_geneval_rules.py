"""The GenEval rules engine (docs/evaluation/geneval.md) on scripted detections, with
hand-computed answers."""

import pytest

from t2i_gcpo.scoring.detections import Detection
from t2i_gcpo.scoring.geneval_rules import (
    evaluate_detections,
    format_summary,
    relative_position,
    reward_detections,
    summarize,
)


def det(cls, box=(0, 0, 10, 10), score=0.99, color=None):
    return Detection(cls=cls, box=box, score=score, color=color)


def at(x, y, s=10):
    """A box of side s centred at (x, y)."""
    return (x - s / 2, y - s / 2, x + s / 2, y + s / 2)


SINGLE = {"tag": "single_object", "include": [{"class": "dog", "count": 1}], "prompt": "a photo of a dog"}
COUNT2 = {
    "tag": "counting",
    "include": [{"class": "dog", "count": 2}],
    "exclude": [{"class": "dog", "count": 3}],
    "prompt": "a photo of two dogs",
}
RED_DOG = {
    "tag": "colors",
    "include": [{"class": "dog", "count": 1, "color": "red"}],
    "prompt": "a photo of a red dog",
}
DOG_LEFT_OF_CAT = {
    "tag": "position",
    "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1, "position": ["left of", 0]}],
    "prompt": "a photo of a dog left of a cat",
}
COLOR_ATTR = {
    "tag": "color_attr",
    "include": [
        {"class": "circle", "count": 1, "color": "red"},
        {"class": "square", "count": 1, "color": "blue"},
    ],
    "prompt": "a photo of a red circle and a blue square",
}


# ---- relative_position ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (at(0, 0), at(20, 0), {"left of"}),  # offset (−20, 0), revised (−18, 0) → dx = −0.9
        (at(20, 0), at(0, 0), {"right of"}),
        (at(0, 0), at(0, 20), {"above"}),  # y grows downward
        (at(0, 20), at(0, 0), {"below"}),
        (at(0, 0), at(20, 20), {"left of", "above"}),  # revised (−18, −18)/28.28 → (−0.64, −0.64)
    ],
)
def test_relative_position_four_relations(a, b, expected):
    assert relative_position(a, b) == expected


def test_relative_position_margin_changes_the_answer():
    # A 5×2 at (0, 0), B 5×2 at (3, 4): raw offset (−3, −4)/5 = (−0.6, −0.8) would be left of + above;
    # revised = (−(3 − 0.1·10), −(4 − 0.1·4)) = (−2, −3.6) → /5 = (−0.4, −0.72): only above
    a = (-2.5, -1, 2.5, 1)
    b = (0.5, 3, 5.5, 5)
    assert relative_position(a, b) == {"above"}


def test_relative_position_overlapping_boxes_have_no_relation():
    # offset −1.5 < 0.1·(10 + 10) = 2: all revised components are 0 → no relation (the 1e-3 rule)
    assert relative_position(at(0, 0), at(1.5, 0)) == set()
    # offset −2.5: revised −0.5, dx = −0.5/2.5 = −0.2 → still no relation
    assert relative_position(at(0, 0), at(2.5, 0)) == set()
    # offset −12: revised −10, dx = −10/12 → left of
    assert relative_position(at(0, 0), at(12, 0)) == {"left of"}


# ---- evaluate_detections (GenEval's strict verdict) --------------------------------------------


def test_score_threshold_is_strictly_greater_than_0_3():
    assert evaluate_detections(SINGLE, [det("dog", score=0.31)]).correct
    r = evaluate_detections(SINGLE, [det("dog", score=0.3)])
    assert not r.correct and r.reason == "expected dog>=1, found 0"
    assert r.partial == 0.0
    assert evaluate_detections(SINGLE, [det("dog", score=0.2)], threshold=0.1).correct


def test_other_classes_do_not_count_and_extra_objects_are_fine():
    assert not evaluate_detections(SINGLE, [det("cat")]).correct
    assert evaluate_detections(SINGLE, [det("dog"), det("dog"), det("cat")]).correct


def test_counting_uses_0_9_threshold_and_exclude():
    two_sure_one_unsure = [det("dog", score=0.95), det("dog", score=0.92), det("dog", score=0.85)]
    assert evaluate_detections(COUNT2, two_sure_one_unsure).correct  # the 0.85 one is not kept
    r = evaluate_detections(COUNT2, two_sure_one_unsure, threshold=0.3)
    assert not r.correct and r.reason == "expected dog<3, found 3"
    assert r.partial == pytest.approx(1 / 2)  # count check passes, exclude fails
    r = evaluate_detections(COUNT2, [det("dog", score=0.95), det("dog", score=0.89)])
    assert not r.correct and r.reason == "expected dog>=2, found 1"


def test_max_per_class_caps_detections():
    many = [det("dog", score=0.95) for _ in range(20)]
    meta = {
        "tag": "counting",
        "include": [{"class": "dog", "count": 4}],
        "exclude": [{"class": "dog", "count": 17}],
    }
    assert evaluate_detections(meta, many).correct  # 16 kept < 17
    r = evaluate_detections(meta, many, max_per_class=20)
    assert not r.correct and r.reason == "expected dog<17, found 20"


def test_colour_checks_the_top_count_objects():
    assert evaluate_detections(RED_DOG, [det("dog", color="red")]).correct
    # the best-scoring dog is blue, a lower-scoring red dog does not help
    r = evaluate_detections(
        RED_DOG, [det("dog", score=0.5, color="red"), det("dog", score=0.9, color="blue")]
    )
    assert not r.correct
    assert r.reason == "expected red dog>=1, found 0 red; and 1 blue"
    assert r.partial == pytest.approx(1 / 2)
    # a colour classifier overrides det.color
    assert evaluate_detections(RED_DOG, [det("dog", color="blue")], color_of=lambda d: "red").correct
    r = evaluate_detections(RED_DOG, [det("dog", color=None)])
    assert not r.correct and "1 unknown" in r.reason


def test_colour_of_several_objects():
    meta = {"tag": "colors", "include": [{"class": "cup", "count": 2, "color": "green"}], "prompt": "x"}
    dets = [
        det("cup", color="green"),
        det("cup", color="pink", score=0.8),
        det("cup", color="green", score=0.5),
    ]
    r = evaluate_detections(meta, dets)
    assert not r.correct
    assert r.reason == "expected green cup>=2, found 1 green; and 1 green, 1 pink"


def test_position_pass_fail_and_reasons():
    left = [det("cat", at(20, 10)), det("dog", at(5, 10))]
    assert evaluate_detections(DOG_LEFT_OF_CAT, left).correct
    right = [det("cat", at(5, 10)), det("dog", at(20, 10))]
    r = evaluate_detections(DOG_LEFT_OF_CAT, right)
    assert not r.correct and r.reason == "expected dog left of target, found right of target"
    overlap = [det("cat", at(5, 10)), det("dog", at(6, 10))]
    r = evaluate_detections(DOG_LEFT_OF_CAT, overlap)
    assert not r.correct and r.reason == "expected dog left of target, found no relation target"
    assert r.partial == pytest.approx(2 / 3)  # two counts pass, the position fails


def test_position_every_found_object_against_every_target():
    meta = {
        "tag": "position",
        "include": [{"class": "cat", "count": 2}, {"class": "dog", "count": 1, "position": ["left of", 0]}],
    }
    both_right = [det("cat", at(30, 10)), det("cat", at(50, 10)), det("dog", at(5, 10))]
    assert evaluate_detections(meta, both_right).correct
    one_left = [det("cat", at(30, 10)), det("cat", at(0, 10)), det("dog", at(15, 10))]
    assert not evaluate_detections(meta, one_left).correct


def test_unmatched_target_fails_position():
    r = evaluate_detections(DOG_LEFT_OF_CAT, [det("dog", at(5, 10))])
    assert not r.correct
    assert r.reason == "expected cat>=1, found 0\nno target for dog to be left of"
    assert r.partial == pytest.approx(1 / 3)


def test_all_includes_are_anded():
    r = evaluate_detections(COLOR_ATTR, [det("circle", color="red")])
    assert not r.correct and r.reason == "expected square>=1, found 0"
    assert r.partial == pytest.approx(2 / 4)  # circle count + colour pass; square count + colour fail
    assert evaluate_detections(COLOR_ATTR, [det("circle", color="red"), det("square", color="blue")]).correct


# ---- reward_detections (flow_grpo variant, docs/evaluation/geneval.md#geneval-as-a-reward) ----------


def test_reward_count_terms():
    meta3 = {
        "tag": "counting",
        "include": [{"class": "dog", "count": 3}],
        "exclude": [{"class": "dog", "count": 4}],
    }
    r = reward_detections(meta3, [det("dog")] * 2)
    assert not r.correct and r.partial == pytest.approx(1 - 1 / 3)
    assert reward_detections(meta3, [det("dog")] * 3).partial == 1.0
    assert reward_detections(meta3, [det("dog")] * 4).partial == pytest.approx(1 - 1 / 3)
    assert reward_detections(meta3, [det("dog")] * 7).partial == 0.0  # 1 − 4/3 clipped at 0
    # counting threshold 0.9 applies here too
    assert reward_detections(meta3, [det("dog", score=0.8)] * 3).partial == 0.0


def test_reward_needs_exact_count_where_geneval_takes_top_count():
    two = [det("dog"), det("dog")]
    assert evaluate_detections(SINGLE, two).correct
    r = reward_detections(SINGLE, two)
    assert not r.correct and r.partial == 0.0  # 1 − |1 − 2|/1
    assert r.reason == "expected dog==1, found 2"


def test_reward_colour_terms():
    r = reward_detections(COLOR_ATTR, [det("circle", color="red"), det("square", color="green")])
    assert not r.correct and r.partial == pytest.approx((1 + 1 + 1 + 0) / 4)
    # a wrong count zeroes its colour term: 2 circles (count term 0, colour 0) + square right (1, 1)
    r = reward_detections(
        COLOR_ATTR, [det("circle", color="red"), det("circle", color="red"), det("square", color="blue")]
    )
    assert r.partial == pytest.approx((0 + 0 + 1 + 1) / 4)
    meta = {"tag": "colors", "include": [{"class": "cup", "count": 2, "color": "green"}]}
    r = reward_detections(meta, [det("cup", color="green"), det("cup", color="pink")])
    assert r.partial == pytest.approx((1 + 0.5) / 2)  # colour term 1 − |2 − 1|/2


def test_reward_position_terms():
    left = [det("cat", at(20, 10)), det("dog", at(5, 10))]
    r = reward_detections(DOG_LEFT_OF_CAT, left)
    assert r.correct and r.partial == 1.0
    right = [det("cat", at(5, 10)), det("dog", at(20, 10))]
    r = reward_detections(DOG_LEFT_OF_CAT, right)
    assert not r.correct and r.partial == pytest.approx(2 / 3)
    r = reward_detections(DOG_LEFT_OF_CAT, [det("dog", at(5, 10))])  # target missing
    assert not r.correct and r.partial == pytest.approx(1 / 3)
    two_dogs = left + [det("dog", at(4, 30))]  # wrong count: its position term is 0
    assert reward_detections(DOG_LEFT_OF_CAT, two_dogs).partial == pytest.approx((1 + 0.0 + 0) / 3)


def test_reward_strict_respects_excludes():
    meta = {
        "tag": "two_object",
        "include": [{"class": "cat", "count": 1}],
        "exclude": [{"class": "dog", "count": 1}],
    }
    r = reward_detections(meta, [det("cat"), det("dog")])
    assert not r.correct and r.partial == 1.0 and r.reason == "expected dog<1, found 1"


# ---- summary -----------------------------------------------------------------------------------


def test_summarize_is_unweighted_mean_of_tags():
    s = summarize({"colors": [True, False, True, True], "position": [False], "counting": []})
    assert s["tags"]["colors"] == {"score": 0.75, "correct": 3, "total": 4}
    assert s["tags"]["position"]["score"] == 0.0
    assert "counting" not in s["tags"]
    assert s["overall"] == pytest.approx(0.375)
    assert format_summary(s) == (
        "colors   = 75.00% (3 / 4)\nposition = 0.00% (0 / 1)\nOverall score (avg. over 2 tasks): 0.37500"
    )
