"""The HTTP client of `remote:` and `judge:` (t2i_gcpo/rewards/http_client.py) against fake servers on
loopback: one deadline for the whole request (a server answering a byte at a time is cut at it), an answer
size bound (a stream of 200 MB is not read whole), no redirect followed (credentials stay with the URL's
server), no proxy from the environment and the proxy given used (absolute-form for http, CONNECT for
https), URLs checked."""

from __future__ import annotations

import time

import pytest

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards import http_client
from t2i_gcpo.rewards.http_client import AnswerTooLarge, NoAnswer, request

from net_fixtures import Reply, fake_server, self_signed


def test_a_server_that_answers_a_byte_at_a_time_is_cut_at_the_whole_request_deadline():
    # the repro: one byte a second was accepted after 60 s with timeout=5 (timeouts were per read)
    with fake_server(lambda seen: Reply(body=b'{"ok": true}', drip=0.015)) as server:
        tic = time.perf_counter()
        with pytest.raises(NoAnswer, match=r"within the deadline \(0.3 s\)"):
            request(server.url + "/x", timeout=0.3, max_bytes=1 << 20)
        assert time.perf_counter() - tic < 0.8  # the answer takes ~1.5 s: each read came within 0.3 s
        answer = request(server.url + "/x", timeout=20, max_bytes=1 << 20)  # given the time, it arrives whole
        assert answer.status == 200 and answer.body == b'{"ok": true}'


def test_an_answer_larger_than_the_bound_is_refused_without_reading_it_whole():
    # the repro: an answer of 200 MB was read whole
    with fake_server(lambda seen: Reply(stream=200 << 20)) as server:
        tic = time.perf_counter()
        with pytest.raises(AnswerTooLarge, match=f"more than {1 << 20} bytes"):
            request(server.url, timeout=20, max_bytes=1 << 20)
        assert time.perf_counter() - tic < 5.0
    assert server.sent < 64 << 20  # the server stopped when the client hung up
    declared = Reply(body=b"x", headers={"Content-Length": str(200 << 20)})
    with fake_server(lambda seen: declared) as server:
        with pytest.raises(AnswerTooLarge, match=f"an answer of {200 << 20} bytes"):
            request(server.url, timeout=5, max_bytes=1 << 20)


def test_a_redirect_is_returned_never_followed_and_credentials_stay_with_the_first_server():
    with fake_server(lambda seen: Reply(body={"ok": True})) as elsewhere:
        moved = Reply(status=307, headers={"Location": elsewhere.url + "/steal"})
        with fake_server(lambda seen: moved) as server:
            answer = request(
                server.url + "/v1/chat/completions",
                method="POST",
                body=b"{}",
                timeout=5,
                max_bytes=1 << 20,
                headers={"Authorization": "Bearer secret"},
            )
            assert answer.status == 307 and elsewhere.seen == []  # nothing went to the other server
            line = http_client.redirect_line(server.url + "/v1/chat/completions", answer)
            assert f"a redirect to {elsewhere.url}/steal (another server; redirects are not followed)" in line
            assert server.seen[0].headers["authorization"] == "Bearer secret"
        here = Reply(status=308, headers={"Location": "/v2"})
        with fake_server(lambda seen: here) as server:
            answer = request(server.url + "/v1", timeout=5, max_bytes=1 << 20)
            assert "on the same server: give that URL instead" in http_client.redirect_line(
                server.url + "/v1", answer
            )


def test_the_environments_proxy_is_not_used_and_the_one_given_is(monkeypatch):
    with (
        fake_server(lambda seen: Reply(body={"via": "proxy"})) as proxy,
        fake_server(lambda seen: Reply(body={"via": "direct"})) as server,
    ):
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.setenv(name, proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        answer = request(server.url + "/health?x=1", timeout=5, max_bytes=1 << 20)
        assert answer.body == b'{"via": "direct"}' and proxy.seen == []
        answer = request(server.url + "/health?x=1", timeout=5, max_bytes=1 << 20, proxy=proxy.url)
        assert answer.body == b'{"via": "proxy"}' and server.seen[-1].path == "/health?x=1"
        assert proxy.seen[0].path == f"{server.url}/health?x=1"  # absolute-form: the proxy forwards it


def test_https_through_a_proxy_is_a_connect_tunnel_with_the_certificate_checked(tmp_path, monkeypatch):
    import ssl

    pair = self_signed(tmp_path)
    if pair is None:
        pytest.skip("openssl is not installed")
    trusted = ssl.create_default_context(cafile=pair[0])
    with (
        fake_server(lambda seen: Reply(body={"tls": True}), tls=pair) as server,
        fake_server(lambda seen: Reply(status=500), tunnel=True) as proxy,
    ):
        with pytest.raises(NoAnswer, match="TLS"):  # the system does not trust the test's certificate
            request(server.url + "/v1", timeout=5, max_bytes=1 << 20)
        monkeypatch.setattr(http_client, "tls_context", lambda: trusted)
        assert request(server.url + "/v1", timeout=5, max_bytes=1 << 20).body == b'{"tls": true}'
        answer = request(server.url + "/v1?k=2", timeout=5, max_bytes=1 << 20, proxy=proxy.url)
        assert answer.body == b'{"tls": true}' and proxy.tunnelled == [f"127.0.0.1:{server.port}"]
        assert server.seen[-1].path == "/v1?k=2"


def test_no_server_and_a_server_that_hangs_up_are_no_answer():
    from reward_fixtures import free_port

    with pytest.raises(NoAnswer, match="ConnectionRefusedError"):
        request(f"http://127.0.0.1:{free_port()}/", timeout=2, max_bytes=1 << 20)
    with fake_server(lambda seen: Reply(body=b"x" * 10, headers={"Content-Length": "1000"})) as server:
        with pytest.raises(NoAnswer, match="closed the connection before its answer was complete|not HTTP"):
            request(server.url, timeout=2, max_bytes=1 << 20)


@pytest.mark.parametrize(
    "url, needle",
    [
        ("http://user:pw@127.0.0.1:8000/v1", "holds credentials"),
        ("http://127.0.0.1:8000/v1#x", "fragment"),
        ("ftp://127.0.0.1/v1", "not an http(s) URL"),
        ("http://127.0.0.1:99999", "not a URL"),
        ("http:///v1", "not an http(s) URL"),
    ],
)
def test_urls_are_checked(url, needle):
    with pytest.raises(UserError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        http_client.split_url(url, "reward 'x'")


def test_a_proxy_is_a_plain_http_host_and_port():
    http_client.check_proxy("http://10.0.0.1:3128", "reward 'x'")
    for bad in ("https://10.0.0.1:3128", "http://10.0.0.1:3128/path", "http://u:p@10.0.0.1:3128"):
        with pytest.raises(UserError):
            http_client.check_proxy(bad, "reward 'x'")


def test_parse_answer_names_the_field():
    from pydantic import BaseModel

    class Answer(BaseModel):
        scores: list[float]

    assert http_client.parse_answer(b'{"scores": [1, 2.5]}', Answer).scores == [1.0, 2.5]
    for raw, needle in [
        (b'{"scores": [1, "2"]}', "'scores.1': input should be a valid number"),
        (b'{"scores": [true]}', "'scores.0'"),
        (b"[" * 10_000 + b"]" * 10_000, "nested too deeply"),
        (b"not json", "malformed JSON"),
        (b"\xff", "not UTF-8"),
    ]:
        with pytest.raises(ValueError, match=needle):
            http_client.parse_answer(raw, Answer)
