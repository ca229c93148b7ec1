"""`judge:` (t2i_gcpo/rewards/forms/judge.py) against fake chat servers on loopback that misbehave: a redirect
to another host gets neither the request nor the API key (a run: exit 2 before its folder), the environment's
proxy is not used and the one given is, a query string stays after the endpoint, the deadline is the whole
request's, answers are bounded and read into a schema (a score outside [0, max_score] is no score), and
`post_chat` is the request on its own."""

from __future__ import annotations

import time

import pytest
import torch

from t2i_gcpo.errors import RewardError
from t2i_gcpo.rewards.forms.judge import ChatCompletion, JudgeFailure, chat_url, post_chat
from t2i_gcpo.rewards.registry import build_reward

from cli_helpers import cli, error_line
from net_fixtures import Reply, fake_server
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

FAST = "retries=0,backoff=0.01,timeout=3,image_size=8"


def completion(text: str = "Final Score: 4", **extra) -> Reply:
    return Reply(body={"choices": [{"message": {"role": "assistant", "content": text}}], **extra})


def images(n: int = 1) -> torch.Tensor:
    return torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("judge_untrusted")
    return str(tiny_policy_dir(root)), str(write_prompt_file(root / "p.jsonl"))


def test_a_redirect_to_another_host_gets_neither_the_request_nor_the_key(capsys, tmp_path, tiny, monkeypatch):
    # the repro: judge: followed a redirect to another host and sent it Authorization: Bearer $OPENAI_API_KEY
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    with fake_server(lambda seen: completion()) as elsewhere:
        moved = Reply(status=307, headers={"Location": f"{elsewhere.url}/v1/chat/completions"})
        with fake_server(lambda seen: moved) as judge:
            model, prompts = tiny
            out = tmp_path / "run"
            code, _, err = cli(
                capsys,
                "train",
                "--prompts",
                prompts,
                "--model",
                model,
                "--out",
                out,
                "--steps",
                "1",
                "--reward",
                f"judge:{judge.url}/v1,{FAST}",
                "--report-to",
                "none",
                "--set",
                "rollout.prompts_per_step=2",
                "--set",
                "rollout.group_size=2",
            )
            assert judge.seen and judge.seen[0].headers["authorization"] == "Bearer sk-secret"
    line = error_line(err)
    assert code == 2 and f"a redirect to {elsewhere.url}/v1/chat/completions (another server" in line, line
    assert "before the run started" in line and "sk-secret" not in err
    assert elsewhere.seen == [] and list(tmp_path.iterdir()) == []


def test_the_environments_proxy_is_not_used_and_the_one_given_is(monkeypatch):
    with (
        fake_server(lambda seen: completion("Final Score: 2")) as proxy,
        fake_server(lambda seen: completion("Final Score: 4")) as judge,
    ):
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy.url)
        assert build_reward(f"judge:{judge.url}/v1,{FAST}")(
            images(), ["a"], [{}]
        ).scores.tolist() == pytest.approx([0.8])
        assert proxy.seen == []
        through = build_reward(f"judge:{judge.url}/v1,{FAST},proxy={proxy.url}")
        assert through(images(), ["a"], [{}]).scores.tolist() == pytest.approx([0.4])
        assert proxy.seen[0].path == f"{judge.url}/v1/chat/completions"


def test_a_query_string_stays_after_the_endpoint():
    assert chat_url("https://h.example/openai/deployments/x?api-version=2024-06-01") == (
        "https://h.example/openai/deployments/x/chat/completions?api-version=2024-06-01"
    )
    assert chat_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1/chat/completions"
    assert (
        chat_url("http://127.0.0.1:8000/v1/chat/completions?a=1")
        == "http://127.0.0.1:8000/v1/chat/completions?a=1"
    )
    with fake_server(lambda seen: completion()) as judge:
        build_reward(f"judge:{judge.url}/v1?api-version=7,{FAST}")(images(), ["a"], [{}])
        assert judge.seen[0].path == "/v1/chat/completions?api-version=7"


def test_the_deadline_is_the_whole_requests_and_answers_are_bounded():
    with fake_server(lambda seen: Reply(body=completion().body, drip=0.02)) as judge:
        reward = build_reward(f"judge:{judge.url}/v1,retries=1,backoff=0.01,timeout=0.5,image_size=8")
        tic = time.perf_counter()
        with pytest.raises(
            RewardError, match=r"after 2 tries: no complete answer within the deadline \(0.5 s\)"
        ):
            reward(images(), ["a"], [{}])
        assert time.perf_counter() - tic < 2.0
    with fake_server(lambda seen: Reply(stream=200 << 20)) as judge:
        with pytest.raises(RewardError, match="an answer of more than 1048576 bytes"):
            build_reward(f"judge:{judge.url}/v1,{FAST},max_answer_mb=1")(images(), ["a"], [{}])
    assert judge.sent < 64 << 20


MALFORMED = {
    "no choices": (Reply(body={"choices": []}), "'choices': list should have at least 1 item"),
    "content that is a number": (
        Reply(body={"choices": [{"message": {"content": 4}}]}),
        "'choices.0.message.content': input should be a valid string",
    ),
    "a score above max_score": (
        completion(
            "Final Score: 45",
        ),
        "outside [0, max_score=5]",
    ),
    "a score that is not finite": (completion("Final Score: nan"), "outside [0, max_score=5]"),
    "an HTML page": (Reply(body=b"<html>"), "not a chat completion: the answer is malformed JSON"),
}


@pytest.mark.parametrize("what", list(MALFORMED))
def test_a_malformed_answer_is_no_score(what):
    reply, needle = MALFORMED[what]
    pattern = r"Final Score:\s*(\S+)"  # loose on purpose: it reads '45' and 'nan'
    with fake_server(lambda seen: reply) as judge:
        reward = build_reward(f"judge:{judge.url}/v1,{FAST},pattern='{pattern}'")
        with pytest.raises(RewardError) as e:
            reward(images(), ["a"], [{}])
    assert "\n" not in str(e.value) and needle in str(e.value), str(e.value)


def test_post_chat_is_the_request_on_its_own():
    with fake_server(lambda seen: completion("yes", usage={"total_tokens": 3})) as judge:
        answer = post_chat(
            chat_url(judge.url + "/v1"),
            {"messages": [{"role": "user", "content": "ok?"}]},
            api_key="k",
            timeout=2,
        )
        assert (
            isinstance(answer, ChatCompletion)
            and answer.text == "yes"
            and answer.usage == {"total_tokens": 3}
        )
        assert judge.seen[0].headers["authorization"] == "Bearer k" and judge.seen[0].json()["messages"]
    with fake_server(lambda seen: Reply(status=429, body=b"slow down")) as judge:
        with pytest.raises(JudgeFailure, match="HTTP 429 Too Many Requests: slow down"):
            post_chat(chat_url(judge.url), {"messages": []}, timeout=2)
