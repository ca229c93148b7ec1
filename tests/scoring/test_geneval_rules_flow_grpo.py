"""The two partial-credit variants of `reward_detections` on scripted detections, hand-computed:
"spec" (docs/evaluation/geneval.md#geneval-as-a-reward, clipped to [0, 1], the default) and "flow_grpo"
(flow_grpo's reward code)."""

import pytest

from t2i_gcpo.scoring.detections import Detection
from t2i_gcpo.scoring.geneval_rules import PARTIAL_VARIANTS, reward_detections


def det(cls, box=(0, 0, 10, 10), score=0.99, color=None):
    return Detection(cls=cls, box=box, score=score, color=color)


def at(x, y, s=10):
    return (x - s / 2, y - s / 2, x + s / 2, y + s / 2)


SINGLE = {"tag": "single_object", "include": [{"class": "dog", "count": 1}], "prompt": "a photo of a dog"}
DOG_LEFT_OF_CAT = {
    "tag": "position",
    "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1, "position": ["left of", 0]}],
}
RED_DOG_LEFT_OF_CAT = {
    "tag": "color_position",
    "include": [
        {"class": "cat", "count": 1},
        {"class": "dog", "count": 1, "color": "red", "position": ["left of", 0]},
    ],
}
THREE_DOGS = {
    "tag": "counting",
    "include": [{"class": "dog", "count": 3}],
    "exclude": [{"class": "dog", "count": 4}],
}
CAT = det("cat", at(20, 10))


def both(meta, dets):
    """(spec partial, flow_grpo partial); the strict verdicts agree."""
    spec = reward_detections(meta, dets)
    flow = reward_detections(meta, dets, variant="flow_grpo")
    assert spec.correct == flow.correct
    assert reward_detections(meta, dets, variant="spec") == spec  # "spec" is the default
    return spec.partial, flow.partial


def test_variants_listed_and_checked():
    assert PARTIAL_VARIANTS == ("spec", "flow_grpo")
    with pytest.raises(ValueError, match="variant"):
        reward_detections(SINGLE, [], variant="flowgrpo")


def test_over_count_clipped_vs_negative():
    assert both(SINGLE, [det("dog")]) == (1.0, 1.0)
    assert both(SINGLE, []) == (0.0, 0.0)
    assert both(SINGLE, [det("dog")] * 2) == (0.0, 0.0)  # 1 − |1 − 2|/1 = 0
    assert both(SINGLE, [det("dog")] * 3) == (0.0, -1.0)  # 1 − |1 − 3|/1 = −1, clipped here
    spec, flow = both(THREE_DOGS, [det("dog")] * 7)  # 1 − 4/3
    assert spec == 0.0 and flow == pytest.approx(-1 / 3)
    spec, flow = both(THREE_DOGS, [det("dog")] * 2)  # under-count: same in both, 1 − 1/3
    assert spec == flow == pytest.approx(2 / 3)


def test_flow_grpo_caps_16_detections_per_class():
    spec, flow = both(SINGLE, [det("dog")] * 20)
    assert spec == 0.0  # 1 − 19 clipped
    assert flow == -14.0  # 16 kept: 1 − |1 − 16|/1 = 1 − 15


def test_failed_position_two_thirds_vs_three_quarters():
    assert both(DOG_LEFT_OF_CAT, [CAT, det("dog", at(5, 10))]) == (1.0, 1.0)
    spec, flow = both(DOG_LEFT_OF_CAT, [CAT, det("dog", at(35, 10))])
    assert spec == pytest.approx(2 / 3)  # [cat 1, dog 1, position 0]
    assert flow == pytest.approx(3 / 4)  # [cat 1, dog 1, position 0, then 1]


def test_missing_target():
    spec, flow = both(DOG_LEFT_OF_CAT, [det("dog", at(5, 10))])
    assert spec == flow == pytest.approx(1 / 3)  # [cat 0, dog 1, position 0] in both


def test_wrong_count_of_a_positioned_clause():
    two = [CAT, det("dog", at(5, 10)), det("dog", at(5, 30))]
    assert both(DOG_LEFT_OF_CAT, two) == pytest.approx((1 / 3, 1 / 3))  # [1, 0, 0] in both
    three = two + [det("dog", at(5, 50))]
    spec, flow = both(DOG_LEFT_OF_CAT, three)
    assert spec == pytest.approx(1 / 3)  # [1, 0 (clipped), 0]
    assert flow == pytest.approx(0.0)  # [1, −1, 0]


def test_colour_and_position_on_one_clause():
    red_left = [CAT, det("dog", at(5, 10), color="red")]
    assert both(RED_DOG_LEFT_OF_CAT, red_left) == (1.0, 1.0)
    # two red dogs: spec [cat 1, count 0, colour 0, position 0]; flow [1, 0, one 0 for both]
    spec, flow = both(RED_DOG_LEFT_OF_CAT, red_left + [det("dog", at(5, 30), color="red")])
    assert spec == pytest.approx(1 / 4) and flow == pytest.approx(1 / 3)
    # blue dog on the left: spec [1, 1, colour 0, position 0]; flow [1, 1, 0] (no position term)
    spec, flow = both(RED_DOG_LEFT_OF_CAT, [CAT, det("dog", at(5, 10), color="blue")])
    assert spec == pytest.approx(1 / 2) and flow == pytest.approx(2 / 3)
    # red dog on the right: spec [1, 1, 1, 0]; flow [1, 1, 1, 0, 1]
    spec, flow = both(RED_DOG_LEFT_OF_CAT, [CAT, det("dog", at(35, 10), color="red")])
    assert spec == pytest.approx(3 / 4) and flow == pytest.approx(4 / 5)


def test_colour_terms_agree():
    meta = {"tag": "colors", "include": [{"class": "cup", "count": 2, "color": "green"}]}
    dets = [det("cup", color="green"), det("cup", color="pink")]
    assert both(meta, dets) == pytest.approx((0.75, 0.75))  # [1, 1 − |2 − 1|/2]


def test_several_subjects_of_one_relation():
    """Extended metadata (multi_position): both subjects must be left of the target."""
    meta = {
        "tag": "multi_position",
        "include": [
            {"class": "cat", "count": 1},
            {"class": "dog", "count": 1, "position": ["left of", 0]},
            {"class": "cow", "count": 1, "position": ["left of", 0]},
        ],
    }
    ok = [CAT, det("dog", at(5, 10)), det("cow", at(0, 30))]
    assert both(meta, ok) == (1.0, 1.0)
    cow_right = [CAT, det("dog", at(5, 10)), det("cow", at(40, 10))]
    spec, flow = both(meta, cow_right)
    assert spec == pytest.approx(4 / 5)  # [1, 1, 1, pos 1, pos 0]
    assert flow == pytest.approx(5 / 6)  # [1, 1, pos 1, 1, pos 0, 1]
