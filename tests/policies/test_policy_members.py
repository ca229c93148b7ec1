"""The members the trainer reads of a policy are declared by the protocol; the ones with a default
(`MEMBER_DEFAULTS`) may be left out by a family and are then set when it is loaded."""

from t2i_gcpo.policies.base import MEMBER_DEFAULTS, missing_members, policy_members, with_member_defaults
from t2i_gcpo.train.collect import decode_fallbacks

import toy_family


def test_decode_session_is_declared_with_a_default():
    assert "decode_session" in policy_members() and MEMBER_DEFAULTS == {"decode_session": None}


def test_a_family_without_a_decode_loop_gets_none_and_the_trainer_reads_it(tmp_path):
    policy = toy_family.ToyPolicy()
    assert not hasattr(policy, "decode_session")  # the toy family does not declare it
    assert missing_members(policy) == []  # and is a policy all the same
    assert with_member_defaults(policy).decode_session is None
    assert decode_fallbacks(policy) is None  # no loop: nothing captured, nothing to report


def test_loading_a_family_sets_the_defaults(tmp_path):
    from t2i_gcpo.policies.registry import load_policy

    path = toy_family.build_tiny_toy(tmp_path)
    toy_family.register()
    try:
        assert load_policy(path).decode_session is None  # "toy:…/toy"
    finally:
        toy_family.unregister()


def test_a_model_lacking_a_member_without_default_is_named():
    class NotAPolicy:
        output = "image"

    missing = missing_members(NotAPolicy())
    assert "rollout" in missing and "decode_session" not in missing
