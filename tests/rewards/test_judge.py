"""The VLM judge (t2i_gcpo/rewards/forms/judge.py) against a fake OpenAI-compatible server on loopback
(http.server in a thread): scores parsed from the answers, the request it sends, bounded concurrency, and
a server that stalls, answers garbage or is down giving one line naming the reward after the bounded
retries — at start-up with no run folder left behind."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from PIL import Image

from t2i_gcpo.errors import RewardError, UserError
from t2i_gcpo.rewards.registry import build_reward

from cli_helpers import cli, error_line
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

FAST = "timeout=0.5,retries=1,backoff=0.05"


class FakeJudge:
    """A chat-completions server whose behaviour a test sets: 'ok' (answers "Final Score: N" with N from
    the prompt's length), 'garbage' (not JSON), 'noscore' (an answer without a score), 'stall' (sleeps past
    the client's timeout), 'http500'. Records every request body and the most requests in flight."""

    def __init__(self, mode: str = "ok"):
        self.mode, self.bodies, self.in_flight, self.max_in_flight = mode, [], 0, 0
        self.lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with judge.lock:
                    judge.bodies.append((self.path, body))
                    judge.in_flight += 1
                    judge.max_in_flight = max(judge.max_in_flight, judge.in_flight)
                time.sleep(0.05)  # long enough for requests to overlap
                if judge.mode == "stall":
                    time.sleep(2.0)
                status, payload = 200, b"<html>not json</html>"
                if judge.mode == "http500":
                    status, payload = 500, b""
                elif judge.mode != "garbage":
                    text = body["messages"][0]["content"][1]["text"]
                    score = 1 + len(text) % 5
                    answer = "I like it." if judge.mode == "noscore" else f"Good. Final Score: {score}"
                    payload = json.dumps(
                        {"choices": [{"message": {"role": "assistant", "content": answer}}]}
                    ).encode()
                with judge.lock:  # done before the answer leaves: the client can send its next one only after
                    judge.in_flight -= 1
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def judge_server():
    servers = []

    def start(mode="ok"):
        servers.append(FakeJudge(mode))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def images(n: int) -> torch.Tensor:
    return torch.rand(n, 3, 20, 30, generator=torch.Generator().manual_seed(0))


def test_scores_are_parsed_from_the_answers(judge_server):
    server = judge_server("ok")
    prompts = ["a", "ab", "abc", "abcd", "abcde", "abcdef"]
    reward = build_reward(f"judge:{server.url},model=judge-7b,concurrency=2,image_size=16")
    out = reward(images(6), prompts, [{}] * 6)
    template = reward.inner.template
    want = [(1 + len(template.replace("{prompt}", p)) % 5) / 5 for p in prompts]
    assert out.scores.tolist() == pytest.approx(want)
    assert out.details[0]["answer"].startswith("Good. Final Score:")
    assert len(server.bodies) == 6 and server.max_in_flight == 2  # bounded concurrency
    path, body = server.bodies[0]
    assert path == "/v1/chat/completions" and body["model"] == "judge-7b" and body["temperature"] == 0
    image_part, text_part = body["messages"][0]["content"]
    url = image_part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,") and text_part["type"] == "text"
    png = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert png.format == "PNG" and png.size == (16, 16)
    assert "Final Score:" in text_part["text"] and text_part["text"].rstrip().endswith("]")


def test_template_and_pattern_options(judge_server):
    server = judge_server("ok")
    spec = (
        f"judge:{server.url},template='Rate {{prompt}}, 1 to 5.',pattern='Score: "
        f"(\\d)',max_score=10,image_size=null"
    )
    out = build_reward(spec)(images(2), ["x", "yy"], [{}] * 2)
    asked = sorted(b["messages"][0]["content"][1]["text"] for _, b in server.bodies)  # concurrent: any order
    assert asked == ["Rate x, 1 to 5.", "Rate yy, 1 to 5."]
    assert out.scores.tolist() == pytest.approx([(1 + 15 % 5) / 10, (1 + 16 % 5) / 10])
    for bad, match in [
        (f"judge:{server.url},pattern='('", "not a regular expression"),
        (f"judge:{server.url},pattern=Score", "needs a group"),
        (f"judge:{server.url},template=Rate", "must hold {prompt}"),
        (f"judge:{server.url},concurrency=0", r"concurrency must be in \[1, 1024\]"),
        (f"judge:{server.url},timeout=0", "timeout must be > 0"),
        ("judge:ftp://example.org", "not an http"),
        ("judge", "URL missing"),
    ]:
        with pytest.raises(UserError, match=match):
            build_reward(bad)


@pytest.mark.parametrize(
    "mode, why",
    [
        ("garbage", "not a chat completion"),
        ("noscore", "no score in the answer"),
        ("stall", "within the deadline (0.5 s)"),
        ("http500", "HTTP 500 Internal Server Error"),
    ],
)
def test_a_failing_server_is_one_line_after_the_retries(judge_server, mode, why):
    server = judge_server(mode)
    reward = build_reward(f"judge:{server.url},{FAST},concurrency=1")
    tic = time.perf_counter()
    with pytest.raises(RewardError) as e:
        reward(images(1), ["a red circle"], [{}])
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"reward 'judge' ({server.url}/chat/completions)")
    assert "sample 0 ('a red circle')" in message and "after 2 tries" in message and why in message
    assert len(server.bodies) == 2  # the first try and one retry, no more
    assert time.perf_counter() - tic < 3.0 + (2.0 if mode == "stall" else 0.0)


def test_a_server_that_is_down(judge_server):
    reward = build_reward(f"judge:http://127.0.0.1:{free_port()}/v1,{FAST}")
    with pytest.raises(
        RewardError, match=r"sample 0 .* after 2 tries: ConnectionRefusedError: .*[Cc]onnection refused"
    ):
        reward(images(2), ["a", "b"], [{}] * 2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("judge_train")
    return str(tiny_policy_dir(root)), str(write_prompt_file(root / "p.jsonl"))


def train_args(tiny, out, reward):
    model, prompts = tiny
    return [
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
    ]


@pytest.mark.parametrize("mode", ["down", "garbage", "stall"])
def test_at_start_up_a_failing_judge_stops_the_run_before_its_folder(
    capsys, tmp_path, tiny, judge_server, mode
):
    url = f"http://127.0.0.1:{free_port()}/v1" if mode == "down" else judge_server(mode).url
    out = tmp_path / "run"
    code, _, err = cli(capsys, *train_args(tiny, out, f"0.5*shapeworld+0.5*judge:{url},{FAST}"))
    line = error_line(err)
    assert (
        code == 2
        and "reward 'judge'" in line
        and "after 2 tries" in line
        and "before the run started" in line
    )
    assert not out.exists()


def test_a_shapeworld_run_trains_with_the_judge_in_a_sum(capsys, tmp_path, tiny, judge_server):
    server = judge_server("ok")
    out = tmp_path / "run"
    code, _, err = cli(capsys, *train_args(tiny, out, f"0.5*shapeworld+0.5*judge:{server.url},{FAST}"))
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # the dry sample's 2 images, then 2 prompts × 2 per sampling round (dynamic sampling may draw again)
    assert rows[-1]["step"] == 1 and len(server.bodies) >= 2 + 4 and "reward/mean" in rows[-1]
