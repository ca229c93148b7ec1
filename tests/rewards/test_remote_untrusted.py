"""`remote:` (t2i_gcpo/rewards/remote.py) against fake reward servers on loopback that answer what no server
of ours would: every malformed answer and every malformed /health field is one line naming the field (a run:
exit 2 before its folder exists), never a reward; redirects are not followed, the environment's proxy is not
used, the deadline is the whole request's and answers are bounded; a call is split to the
server's declared limits."""

from __future__ import annotations

import json
import math
import re
import time

import pytest
import torch

from t2i_gcpo.errors import RewardError, UserError
from t2i_gcpo.rewards.registry import build_reward
from t2i_gcpo.rewards.remote import Client

from cli_helpers import cli, error_line
from net_fixtures import Reply, fake_server, health, reward_server, scores_for
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

FAST = "retries=0,backoff=0.01,timeout=3"


def images(n: int = 2, size: int = 8) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(0))


def answering(body, **info):
    """A fake reward server answering `body` (data sent as JSON, or a Reply) to every /score."""
    return reward_server(health(**info), lambda seen: body if isinstance(body, Reply) else Reply(body=body))


MALFORMED_ANSWERS = {
    # the repro: a "scores" object of the right size had its keys read as scores (reward/mean 3.5, exit 0)
    "scores as an object": (
        {"scores": {"3": 0, "4": 0}, "details": [{}, {}]},
        "'scores': input should be a valid list",
    ),
    "scores as strings": (
        {"scores": ["0.5", "0.5"], "details": [{}, {}]},
        "'scores.0': input should be a valid number",
    ),
    "scores as booleans": (
        {"scores": [True, False], "details": [{}, {}]},
        "'scores.0': input should be a valid number",
    ),
    "a NaN score": (
        b'{"scores": [NaN, 0.5], "details": [{}, {}]}',
        "'scores.0': input should be a finite number",
    ),
    "a score out of bounds": (
        {"scores": [3.5, 0.5], "details": [{}, {}]},
        "'scores.0' is 3.5, outside the bounds the server declares [0, 1]",
    ),
    "one score too few": (
        {"scores": [0.5], "details": [{}, {}]},
        "'scores' holds 1 scores for the 2 images sent",
    ),
    "details of the wrong count": ({"scores": [0.5, 0.5], "details": [{}]}, "'details' holds 1 entries"),
    "details that are not objects": (
        {"scores": [0.5, 0.5], "details": [1, 2]},
        "'details.0': input should be a valid dictionary",
    ),
    "no details": ({"scores": [0.5, 0.5]}, "'details': field required"),
    "deep JSON": (b"[" * 50_000 + b"]" * 50_000, "nested too deeply"),
    "not JSON": (b"<html>", "malformed JSON"),
}


@pytest.mark.parametrize("what", list(MALFORMED_ANSWERS))
def test_a_malformed_answer_is_one_line_naming_the_field_never_a_reward(what):
    body, needle = MALFORMED_ANSWERS[what]
    with fake_server(answering(body)) as server:
        reward = build_reward(f"remote:{server.url},{FAST}")
        with pytest.raises(RewardError) as e:
            reward(images(2), ["a", "b"], [{}, {}])
    line = str(e.value)
    assert "\n" not in line and "a malformed answer from the server" in line and needle in line, line
    assert line.startswith(f"reward 'fake' (remote {server.url}), samples 0–1")


def test_the_declared_terms_of_a_sum_are_a_row_of_finite_scores_per_image():
    terms = [["shapeworld", 0.5], ["clip", 2.0]]
    good = {"scores": [1.0, 1.0], "details": [{"clip/cosine": 0.1}] * 2, "terms": [[1.0, 0.25], [1.0, 0.25]]}
    with fake_server(answering(good, terms=terms, bounds=None)) as server:
        out = build_reward(f"remote:{server.url},{FAST}")(images(2), ["a", "b"], [{}, {}])
        assert out.scores.tolist() == [1.0, 1.0] and out.term_names == ("shapeworld", "clip")
        assert out.terms.tolist() == [[1.0, 0.25], [1.0, 0.25]] and out.details[1] == {"clip/cosine": 0.1}
    for rows, needle in [
        (None, "'terms' is missing: the server declares a sum of shapeworld, clip"),
        ([[1.0, 0.25]], "'terms' holds 1 rows for the 2 images sent"),
        ([[1.0], [1.0]], "'terms.0' holds 1 scores for the 2 declared terms"),
        ([[1.0, "x"], [1.0, 0.0]], "'terms.0.1'"),
        ([[1.0, True], [1.0, 0.0]], "'terms.0.1'"),
        ([[1.0, float("nan")], [1.0, 0.0]], "'terms.0.1'"),
    ]:
        bad = {"scores": [1.0, 1.0], "details": [{}, {}], **({"terms": rows} if rows is not None else {})}
        with fake_server(answering(bad, terms=terms, bounds=None)) as server:
            with pytest.raises(RewardError, match=re.escape(needle)):
                build_reward(f"remote:{server.url},{FAST}")(images(2), ["a", "b"], [{}, {}])


MALFORMED_HEALTH = {
    "protocol as text": ({"protocol": "1"}, "speaks protocol '1'"),
    "a version that is a number": ({"version": 5}, "'version': input should be a valid string"),
    "an empty name": ({"name": ""}, "'name': string should have at least 1 character"),
    "bounds of text": ({"bounds": ["a", "b"]}, "'bounds.0': input should be a valid number"),
    "bounds upside down": ({"bounds": [1, 0]}, "has its low above its high"),
    "bounds of three": ({"bounds": [0, 1, 2]}, "'bounds'"),
    "infinite bounds": ({"bounds": [0, float("inf")]}, "'bounds.1': input should be a finite number"),
    "terms with a text weight": ({"terms": [["a", "x"]]}, "'terms.0.1': input should be a valid number"),
    "terms named twice": ({"terms": [["a", 1], ["a", 2]]}, "names a term twice"),
    "context as text": ({"context": "grid"}, "'context': input should be a valid list"),
    "max_images 0": ({"max_images": 0}, "'max_images': input should be greater than or equal to 1"),
    "max_images as text": ({"max_images": "512"}, "'max_images': input should be a valid integer"),
    "max_images true": ({"max_images": True}, "'max_images': input should be a valid integer"),
    "max_pixels negative": ({"max_pixels": -1}, "'max_pixels'"),
    "no spec": ({"spec": None}, "'spec': input should be a valid string"),
}


@pytest.mark.parametrize("what", list(MALFORMED_HEALTH))
def test_every_malformed_health_field_is_one_line(what):
    fields, needle = MALFORMED_HEALTH[what]
    with fake_server(reward_server(health(**fields), scores_for)) as server:
        with pytest.raises(UserError) as e:
            Client(server.url, retries=0).health()
    assert "\n" not in str(e.value) and needle in str(e.value), str(e.value)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("untrusted")
    return str(tiny_policy_dir(root)), str(write_prompt_file(root / "p.jsonl"))


def train(capsys, tiny, out, reward):
    model, prompts = tiny
    return cli(
        capsys,
        "train",
        "--prompts",
        prompts,
        "--model",
        model,
        "--reward",
        reward,
        "--out",
        out,
        "--steps",
        "1",
        "--report-to",
        "none",
        "--set",
        "rollout.prompts_per_step=2",
        "--set",
        "rollout.group_size=2",
        "--set",
        "sample_every=0",
        "--set",
        "eval_every=-1",
    )


def test_a_run_against_a_server_answering_scores_as_an_object_stops_before_its_folder(capsys, tmp_path, tiny):
    def keys_as_scores(seen):
        n = len(seen.json()["images"])
        return Reply(body={"scores": {str(3 + i % 2): 0 for i in range(n)}, "details": [{}] * n})

    with fake_server(reward_server(health(), keys_as_scores)) as server:
        code, _, err = train(capsys, tiny, tmp_path / "run", f"remote:{server.url},{FAST}")
    line = error_line(err)
    assert code == 2 and "'scores': input should be a valid list" in line and "before the run started" in line
    assert not (tmp_path / "run").exists() and list(tmp_path.iterdir()) == []


def test_a_malformed_health_stops_a_run_before_the_model_loads(capsys, tmp_path, tiny, monkeypatch):
    # the repro: bounds the client took as they came made a traceback at the end of a finished run
    import t2i_gcpo.policies.registry as policies

    monkeypatch.setattr(policies, "load_policy", lambda *a, **k: pytest.fail("the model loaded"))
    with fake_server(reward_server(health(bounds=["a", "b"]), scores_for)) as server:
        code, _, err = train(capsys, tiny, tmp_path / "run", f"remote:{server.url},{FAST}")
    line = error_line(err)
    assert code == 2 and "answered /health with a malformed field: 'bounds.0'" in line, line
    assert list(tmp_path.iterdir()) == []


def test_a_redirect_is_not_followed(capsys):
    with fake_server(reward_server(health(), scores_for)) as elsewhere:
        moved = Reply(status=307, headers={"Location": elsewhere.url + "/health"})
        with fake_server(lambda seen: moved) as server:
            with pytest.raises(
                UserError,
                match=rf"answered /health with HTTP 307, a redirect to {elsewhere.url}/health "
                r"\(another server; redirects are not followed\)",
            ):
                build_reward(f"remote:{server.url},{FAST}")
        assert elsewhere.seen == []
    with fake_server(reward_server(health(), lambda seen: moved)) as server:
        with pytest.raises(RewardError, match=r"the server answered \(HTTP 307\): HTTP 307, a redirect"):
            build_reward(f"remote:{server.url},{FAST}")(images(2), ["a", "b"], [{}, {}])
        assert elsewhere.seen == []


def test_the_deadline_is_the_whole_requests_and_answers_are_bounded():
    # ~3 s in all, each byte in time
    slow = Reply(body={"scores": [0.5, 0.5], "details": [{}, {}]}, drip=0.02)
    with fake_server(answering(slow)) as server:
        reward = build_reward(f"remote:{server.url},retries=1,backoff=0.01,timeout=0.5")
        tic = time.perf_counter()
        with pytest.raises(RewardError, match=r"no answer after 2 tries .*within the deadline \(0.5 s\)"):
            reward(images(2), ["a", "b"], [{}, {}])
        assert time.perf_counter() - tic < 2.0
    with fake_server(answering(Reply(stream=200 << 20))) as server:
        reward = build_reward(f"remote:{server.url},{FAST},max_answer_mb=1")
        with pytest.raises(RewardError, match=r"an answer of more than 1048576 bytes \(max_answer_mb=1\)"):
            reward(images(2), ["a", "b"], [{}, {}])
    assert server.sent < 64 << 20


def test_the_environments_proxy_is_not_used_and_the_one_given_is(monkeypatch):
    with (
        fake_server(reward_server(health(name="via proxy"), scores_for)) as proxy,
        fake_server(reward_server(health(), scores_for)) as server,
    ):
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy.url)
        out = build_reward(f"remote:{server.url},{FAST}")(images(2), ["a", "b"], [{}, {}])
        assert out.scores.tolist() == [0.5, 0.5] and proxy.seen == []
        reward = build_reward(f"remote:{server.url},{FAST},proxy={proxy.url}")
        assert reward.name == "via proxy" and reward(images(1), ["a"], [{}]).scores.tolist() == [0.5]
        assert [s.path for s in proxy.seen] == [f"{server.url}/health", f"{server.url}/score"]
    with pytest.raises(UserError, match=r"proxy: 'socks5://127.0.0.1:1080' is not an http\(s\) URL"):
        build_reward("remote:http://127.0.0.1:1,proxy=socks5://127.0.0.1:1080")


def test_a_call_is_split_to_the_servers_declared_pixels_and_bytes():
    def echo(seen):  # each image's score: its index in the call, read from its prompt
        prompts = seen.json()["prompts"]
        return Reply(body={"scores": [float(p) / 100 for p in prompts], "details": [{} for _ in prompts]})

    prompts = [str(i) for i in range(10)]
    with fake_server(reward_server(health(max_pixels=3 * 64, max_images=64), echo)) as server:
        out = build_reward(f"remote:{server.url},{FAST}")(images(10, 8), prompts, [{}] * 10)
        sizes = sorted(len(s.json()["images"]) for s in server.seen if s.path == "/score")  # 2 in flight
        assert sizes == [1, 3, 3, 3] and out.scores.tolist() == pytest.approx([i / 100 for i in range(10)])
    one = len(json.dumps({"images": ["x" * 400], "prompts": ["0"], "metadata": [{}]}))
    with fake_server(reward_server(health(max_bytes=one * 3), echo)) as server:
        noisy = torch.rand(10, 3, 8, 8, generator=torch.Generator().manual_seed(1))
        out = build_reward(f"remote:{server.url},{FAST}")(noisy, prompts, [{}] * 10)
        bodies = [s.body for s in server.seen if s.path == "/score"]
        assert len(bodies) > 1 and all(len(b) <= one * 3 for b in bodies)
        assert out.scores.tolist() == pytest.approx([i / 100 for i in range(10)])
    with fake_server(reward_server(health(max_pixels=32), echo)) as server:
        with pytest.raises(RewardError, match="holds more pixels than the server takes in a request"):
            build_reward(f"remote:{server.url},{FAST}")(images(1, 8), ["0"], [{}])
    assert math.isfinite(out.scores.sum().item())
