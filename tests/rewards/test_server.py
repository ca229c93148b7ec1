"""The reward server (t2i_gcpo/rewards/server.py, `t2i-gcpo reward-server`) and its client (``remote:URL``,
t2i_gcpo/rewards/remote.py) on loopback: a run scored through the server is the run scored in process,
metric for metric and weight for weight; bad requests get a 4xx with one line and the server goes on; a
server that is not there, or serves another spec than a resumed run recorded, is one line before anything
is written; a server killed mid-run stops the run with one line, and the run resumes to the uninterrupted
result once the server is back (slow)."""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
import torch
from PIL import Image

from cli_helpers import cli, error_line
from repo_paths import REPO
from reward_fixtures import assert_same_run, free_port, resume, rows, serving, train
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny prior, a prompt file, and the two-step run with the reward in process."""
    root = tmp_path_factory.mktemp("served")
    model, prompts = str(tiny_policy_dir(root)), str(write_prompt_file(root / "p.jsonl"))
    assert train(root / "in_process", model, prompts) == 0
    return {"root": root, "model": model, "prompts": prompts, "base": root / "in_process"}


def test_a_run_scored_by_the_server_is_the_run_scored_in_process(tiny, tmp_path):
    with serving("shapeworld") as url:
        assert train(tmp_path / "remote", tiny["model"], tiny["prompts"], "--reward", f"remote:{url}") == 0
    assert_same_run(tiny["base"], tmp_path / "remote")
    saved = (tmp_path / "remote" / "config.yaml").read_text()
    assert f"reward: remote:{url},serves=shapeworld,version=" in saved  # what scored it, in the run's config


def test_the_server_builds_the_reward_for_the_clients_grid(tmp_path):
    """ShapeWorld's object masks are on the policy's token grid: the client sends it, the
    server scores on it."""
    from t2i_gcpo.rewards.registry import build_reward

    images = torch.rand(2, 3, 16, 16)
    meta = [
        {
            "prompt": "a photo of a circle",
            "tag": "single_object",
            "include": [{"class": "circle", "count": 1}],
        }
    ] * 2
    local = build_reward("shapeworld", grid=(4, 4))(images, ["a photo of a circle"] * 2, meta)
    with serving("shapeworld") as url:
        remote = build_reward(f"remote:{url}", grid=(4, 4))(images, ["a photo of a circle"] * 2, meta)
    assert torch.equal(local.scores, remote.scores)
    assert [torch.as_tensor(d["object_grid"]).shape for d in remote.details] == [(4, 4)] * 2
    for a, b in zip(local.details, remote.details):
        assert a["partial"] == b["partial"] and a["strict"] == b["strict"]
        assert torch.equal(torch.as_tensor(a["object_grid"]), torch.as_tensor(b["object_grid"]))


# ----------------------------------------------------------------------------------------- bad requests
def png(size: int = 16) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def post(url: str, body: bytes | None, headers: dict | None = None, path: str = "/score") -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("POST", path)
    for key, value in (headers if headers is not None else {"Content-Length": str(len(body or b""))}).items():
        conn.putheader(key, value)
    conn.endheaders()
    if body:
        conn.send(body)
    response = conn.getresponse()
    status, data = response.status, json.loads(response.read())
    conn.close()
    return status, data


def request(images: list[str], prompts: list[str], **extra) -> bytes:
    return json.dumps({"images": images, "prompts": prompts, **extra}).encode()


GOOD = request([b64(png())] * 2, ["a photo of a circle"] * 2)
BAD = {
    "not JSON": (b"images=1", None, 400, "not valid JSON"),
    "a truncated PNG": (request([b64(png()[:40])], ["p"]), None, 400, "image 0 is not a readable PNG"),
    "10,000 images": (
        request([b64(png(4))] * 10_000, ["p"] * 10_000),
        None,
        413,
        "10000 images in one request",
    ),
    "prompts of the wrong length": (
        request([b64(png())] * 3, ["p"] * 2),
        None,
        400,
        "3 images but 2 prompts",
    ),
    "metadata of the wrong length": (
        request([b64(png())] * 2, ["p"] * 2, metadata=[{}]),
        None,
        400,
        "1 metadata",
    ),
    "not base64": (request(["%%%"], ["p"]), None, 400, "image 0 is not base64"),
    "a JPEG": (None, None, 400, "not a PNG"),
    "images of two sizes": (
        request([b64(png(16)), b64(png(8))], ["p", "p"]),
        None,
        400,
        "one size per request",
    ),
    "no Content-Length": (b"", {}, 411, "Content-Length"),
    "a body larger than the bound": (
        b"",
        {"Content-Length": str(10**12)},
        413,
        "bytes, more than this server takes",
    ),
    "a bad grid": (request([b64(png())], ["p"], context={"grid": [0, 4]}), None, 400, "context.grid"),
}


def jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buffer, format="JPEG")
    return request([b64(buffer.getvalue())], ["p"])


def test_bad_requests_get_a_4xx_with_one_line_and_the_server_stays_up():
    with serving("shapeworld", max_images=512) as url:
        for what, (body, headers, status, needle) in BAD.items():
            body = jpeg() if what == "a JPEG" else body
            got, answer = post(url, body, headers)
            assert got == status and needle in answer["error"], (what, got, answer)
            assert "\n" not in answer["error"] and len(answer["error"]) < 300, what
            ok, scored = post(url, GOOD)  # still serving, and scoring right
            assert ok == 200 and len(scored["scores"]) == 2, (what, scored)
        assert post(url, GOOD, path="/nothing")[0] == 404


def test_a_reward_that_fails_on_the_server_is_a_500_with_its_line_and_the_client_says_so():
    from t2i_gcpo.errors import RewardError
    from t2i_gcpo.rewards.registry import build_reward

    spec = f"{REPO / 'tests' / 'train_fixtures.py'}:nan_reward"
    with serving(spec) as url:
        status, answer = post(url, GOOD)
        assert status == 500 and "NaN" in answer["error"]
        reward = build_reward(f"remote:{url},retries=0")
        with pytest.raises(RewardError, match=r"the server failed \(HTTP 500\).*NaN"):
            reward(torch.rand(2, 3, 8, 8), ["a", "b"], [{}, {}])


# ----------------------------------------------------------------------------------------- start-up
def test_a_server_that_is_not_there_is_one_line_before_the_run_folder_exists(
    tiny, tmp_path, capsys, monkeypatch
):
    import t2i_gcpo.policies.registry as policies

    def no_loading(*args, **kwargs):
        raise AssertionError("the server is asked before the model loads")

    monkeypatch.setattr(policies, "load_policy", no_loading)
    out = tmp_path / "run"
    port = free_port()
    code, _, err = cli(
        capsys,
        "train",
        "--prompts",
        tiny["prompts"],
        "--model",
        tiny["model"],
        "--out",
        out,
        "--reward",
        f"remote:http://127.0.0.1:{port},retries=1,backoff=0.01",
        "--steps",
        "1",
    )
    line = error_line(err)
    assert code == 2 and f"no reward server answers at http://127.0.0.1:{port}" in line, line
    assert "2 tries" in line and "t2i-gcpo reward-server --reward SPEC --port" in line
    assert not out.exists()


def test_a_bare_address_says_to_write_remote(tiny, tmp_path, capsys):
    code, _, err = cli(
        capsys,
        "train",
        "--prompts",
        tiny["prompts"],
        "--model",
        tiny["model"],
        "--out",
        tmp_path / "run",
        "--reward",
        "http://127.0.0.1:8100",
    )
    assert code == 2 and "write remote:URL" in error_line(err) and not (tmp_path / "run").exists()


def test_a_resumed_run_refuses_a_server_that_serves_another_spec(tiny, tmp_path, capsys):
    run, port = tmp_path / "run", free_port()
    with serving("shapeworld", port=port) as url:
        assert train(run, tiny["model"], tiny["prompts"], "--reward", f"remote:{url}", steps=1) == 0
    with serving("shapeworld:flow_grpo", port=port):  # another spec on the run's address
        code, _, err = cli(capsys, "train", "--resume", run, "--steps", "2")
    line = error_line(err)
    assert (
        code == 2 and "serves 'shapeworld:flow_grpo', but this run was trained with 'shapeworld'" in line
    ), line
    assert [r["step"] for r in rows(run)] == [1]  # nothing more was written


def test_health_names_the_terms_of_a_served_sum_and_the_client_takes_them():
    from t2i_gcpo.rewards.combine import reward_bounds, reward_terms
    from t2i_gcpo.rewards.registry import build_reward

    with serving("0.5*shapeworld+2*shapeworld:flow_grpo") as url:
        reward = build_reward(f"remote:{url}")
        assert reward_terms(reward) == [("shapeworld", 0.5), ("shapeworld#2", 2.0)]
        assert reward_bounds(reward) is None  # flow_grpo's partial credit has none
        out = reward(torch.rand(3, 3, 8, 8), ["a photo of a circle"] * 3, [{}] * 3)
        assert out.term_names == ("shapeworld", "shapeworld#2") and out.terms.shape == (3, 2)
        assert torch.allclose(out.scores, out.terms @ torch.tensor([0.5, 2.0]))
        assert "shapeworld/partial" in out.details[0] and "shapeworld" not in out.details[0]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--reward", "nonsense"], "unknown reward 'nonsense'"),
        (["--reward", "shapeworld:speed=3"], "no option 'speed'"),
        (["--reward", "shapeworld", "--device", "cuda:7"], "--device cuda:7: this machine has"),
        (["--reward", "shapeworld", "--device", "tpu"], "'tpu' is not a device"),
    ],
)
def test_reward_server_refuses_bad_input_with_one_line(capsys, args, needle):
    code, _, err = cli(capsys, "reward-server", *args, "--check")
    assert code == 2 and needle in error_line(err)


def test_a_port_in_use_is_one_line(capsys):
    port = free_port()
    with serving("shapeworld", port=port):
        code, _, err = cli(capsys, "reward-server", "--reward", "shapeworld", "--port", port)
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in error_line(err)


def test_reward_server_check_prints_what_it_would_serve(capsys):
    code, out, err = cli(capsys, "reward-server", "--reward", "shapeworld", "--check", "--max-mpx", "8")
    info = json.loads(out)
    assert code == 0 and info["spec"] == "shapeworld" and info["context"] == ["grid"], err
    assert info["max_pixels"] == 8 << 20 and info["max_side"] == 4096 and info["max_bytes"] == 256 << 20
    code, _, err = cli(capsys, "reward-server", "--reward", "arithmetic", "--check")
    assert code == 2 and "serves image rewards" in error_line(err)


# ----------------------------------------------------------------------------------------- killed mid-run
def start_server(spec: str, port: int) -> subprocess.Popen:
    """`t2i-gcpo reward-server` in a process of its own, once it listens."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLOW_REWARD_SECONDS": "0.4"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "t2i_gcpo.cli",
            "reward-server",
            "--reward",
            spec,
            "--port",
            str(port),
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    line = proc.stdout.readline()
    assert "serving" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc


@pytest.mark.slow
def test_a_server_killed_mid_run_stops_it_with_one_line_and_resume_continues_to_the_same_result(
    tiny, tmp_path, capsys
):
    from reward_fixtures import final_weights

    spec, port = f"{REPO / 'tests' / 'reward_fixtures.py'}:slow_shapeworld", free_port()
    run, steps = tmp_path / "run", 5
    server = start_server(spec, port)
    try:

        def kill_after_step_two() -> None:
            while not ((run / "metrics.jsonl").is_file() and len(rows(run)) >= 2):
                time.sleep(0.02)
            server.kill()

        killer = threading.Thread(target=kill_after_step_two, daemon=True)
        killer.start()
        capsys.readouterr()
        reward = f"remote:http://127.0.0.1:{port},retries=1,backoff=0.1,timeout=10"
        code = train(
            run, tiny["model"], tiny["prompts"], "--reward", reward, "--set", "save_every=1", steps=steps
        )
        killer.join(5)
    finally:
        server.kill()
        server.wait()
    line = error_line(capsys.readouterr().err, ignore="%|")  # the progress bar (it/s or s/it)
    done = rows(run)[-1]["step"]
    assert code == 2 and "no answer after 2 tries" in line and f"step {done + 1}:" in line, line
    assert f"the checkpoint of step {done} is kept" in line and f"t2i-gcpo train --resume {run}" in line
    assert (
        2 <= done < steps
        and torch.isfinite(torch.cat([w.flatten() for w in final_weights(run).values()])).all()
    )
    server = start_server(spec, port)  # the server back, on its address
    try:
        assert resume(run, steps) == 0
    finally:
        server.kill()
        server.wait()
    whole = tmp_path / "whole"
    assert train(whole, tiny["model"], tiny["prompts"], "--set", "save_every=1", steps=steps) == 0
    assert_same_run(whole, run)
    shutil.rmtree(tmp_path)
