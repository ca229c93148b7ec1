"""The reward server (t2i_gcpo/rewards/server.py) against hostile and careless clients on loopback, with small
deadlines: slow clients hold no slot and are cut at the head and body deadlines, a PNG bomb is refused from
its headers before anything is decoded, 64 clients at once are all answered, the grid cache is bounded, every
malformed body (deep JSON included) is a 4xx naming what is wrong, the bodies held in memory are bounded, and
clients that hang up leave one line in the log and no traceback. After every hostile client the server still
scores a good request."""

from __future__ import annotations

import json
import resource
import struct
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest

import t2i_gcpo.rewards.server as server_mod

from net_fixtures import b64, closed_within, png, post, raw_client, real_server, score_body, still_serving


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(server_mod, "HEAD_SECONDS", 0.5)


def head(length: int, path: str = "/score") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode()


def test_slow_clients_hold_no_slot_and_are_cut_at_the_body_deadline(fast):
    with real_server(body_timeout=1.0) as (url, service, _):
        slow = [raw_client(url) for _ in range(2 * server_mod.PENDING)]
        for sock in slow:  # each sends its head and a first byte of a body it never finishes
            sock.sendall(head(10_000) + b"{")
        time.sleep(0.2)
        tic = time.perf_counter()
        assert still_serving(url)  # all slots were free: the slow clients hold none
        assert time.perf_counter() - tic < 1.0
        for sock in slow:
            closed, got = closed_within(sock, 3.0)
            status_line = got.split(b"\r\n")[0]
            assert closed and b" 408 " in status_line and b"did not arrive within 1 s" in got, got[:200]
            sock.close()
        assert still_serving(url)


def test_a_head_that_never_ends_is_closed_at_its_deadline(fast):
    with real_server() as (url, _, _):
        sock = raw_client(url)
        sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")  # and no more
        tic = time.perf_counter()
        closed, _ = closed_within(sock, 3.0)
        assert closed and 0.3 < time.perf_counter() - tic < 2.0
        idle = raw_client(url)  # a connection that sends nothing at all
        assert closed_within(idle, 3.0)[0]
        sock.close()
        idle.close()
        assert still_serving(url)


def bare_png(width: int, height: int) -> bytes:
    """A PNG of the size its header says, blank (all zero): a few KB that decode to width × height pixels."""
    row = b"\x00" + b"\x00" * width  # filter byte, then one grey byte per pixel
    data = zlib.compress(row * height, 9)

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return (
            struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def test_a_png_bomb_is_refused_from_its_headers_before_anything_is_decoded():
    # the repro: a 0.8 MB request of blank 4096² PNGs took the server from 0.6 to 4.2 GB
    bomb = b64(bare_png(4096, 4096))
    body = json.dumps({"images": [bomb] * 16, "prompts": ["p"] * 16}).encode()
    assert len(body) < 1 << 20
    with real_server(max_pixels=1 << 24) as (url, _, _):  # 16 Mpx a request: one 4096² image
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        status, answer = post(url, body)
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024  # MB (Linux: KB)
        assert status == 413 and f"more than {1 << 24} pixels" in answer["error"], answer
        assert grown < 200, grown  # 16 decoded 4096² RGB images would be 800 MB, their floats 3.2 GB
        status, answer = post(
            url, json.dumps({"images": [b64(bare_png(4097, 2))], "prompts": ["p"]}).encode()
        )
        assert status == 400 and "larger than 4096 px" in answer["error"]
        assert still_serving(url)


def test_64_clients_at_once_are_all_answered():
    # the repro: 64 concurrent clients, 41 of 320 requests reset with the listen queue of 5
    with real_server() as (url, _, _):
        body = score_body(2)
        start = threading.Barrier(64)

        def client(_: int) -> list[int]:
            start.wait()
            return [post(url, body, timeout=60)[0] for _ in range(5)]

        with ThreadPoolExecutor(64) as pool:
            statuses = [s for batch in pool.map(client, range(64)) for s in batch]
        assert statuses == [200] * 320


def test_the_grid_cache_is_bounded():
    with real_server("shapeworld") as (url, service, _):
        for rows in range(1, 3 * server_mod.GRIDS):
            status, _ = post(url, score_body(1, context={"grid": [rows, 4]}))
            assert status == 200
        assert len(service.rewards) == server_mod.GRIDS  # the last ones used, the default kept apart
        assert list(service.rewards)[-1] == (3 * server_mod.GRIDS - 1, 4)
        assert service.default is not None and still_serving(url)


DEEP = b'{"images": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
MALFORMED = {
    "deep JSON": (DEEP, 400, "nested too deeply"),
    "JSON 65 levels deep in metadata": (
        json.dumps(
            {"images": [b64(png())], "prompts": ["p"], "metadata": [json.loads("[" * 64 + "]" * 64)]}
        ).encode(),
        400,
        "nested too deeply",
    ),
    "not UTF-8": (b'{"images": "\xff"}', 400, "not UTF-8"),
    "a list body": (b"[1, 2]", 400, "must be a JSON object"),
    "images of numbers": (json.dumps({"images": [1], "prompts": ["p"]}).encode(), 400, "'images' must be"),
    "prompts of numbers": (
        json.dumps({"images": [b64(png())], "prompts": [1]}).encode(),
        400,
        "'prompts' must be",
    ),
    "a boolean grid": (score_body(1, context={"grid": [True, 4]}), 400, "'context.grid'"),
    "a context list": (score_body(1, context=[1]), 400, "'context' must be an object"),
    "metadata of strings": (score_body(1, metadata=["x"]), 400, "'metadata' must be a list of objects"),
    "no images": (json.dumps({"images": [], "prompts": []}).encode(), 400, "no images"),
    "a PNG of 0 pixels": (
        json.dumps({"images": [b64(bare_png(0, 0))], "prompts": ["p"]}).encode(),
        400,
        "or empty",
    ),
    "a PNG whose header lies": (
        json.dumps(
            {
                "images": [b64(bare_png(16, 16)[:16] + struct.pack(">II", 8, 8) + bare_png(16, 16)[24:])],
                "prompts": ["p"],
            }
        ).encode(),
        400,
        "image 0 is not a readable PNG",
    ),
}


@pytest.mark.parametrize("what", list(MALFORMED))
def test_every_malformed_body_is_a_4xx_that_names_what_is_wrong(what, capsys):
    body, status, needle = MALFORMED[what]
    with real_server() as (url, _, _):
        got, answer = post(url, body)
        assert got == status and needle in answer["error"], (what, got, answer)
        assert "\n" not in answer["error"] and len(answer["error"]) < 300
        assert still_serving(url)
    assert "Traceback" not in capsys.readouterr().err


def test_chunked_bodies_and_bad_lengths_are_refused():
    with real_server() as (url, _, _):
        status, answer = post(url, None, {"Transfer-Encoding": "chunked"})
        assert status == 411 and "Content-Length" in answer["error"]
        sock = raw_client(url)
        sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n")
        closed, got = closed_within(sock, 3.0)
        assert closed and b" 400 " in got.split(b"\r\n")[0]  # uvicorn refuses it: one line in the log
        sock.close()
        assert post(url, b"{}", path="/nothing")[0] == 404
        assert still_serving(url)


def test_the_bodies_held_in_memory_are_bounded_as_they_arrive():
    with real_server(max_bytes=1 << 20, pending_bytes=100_000) as (url, _, _):
        holding = raw_client(url)
        holding.sendall(head(500_000) + b"{" * 90_000)  # 90 kB of a body that is not finished
        time.sleep(0.3)
        status, answer = post(url, b" " * 50_000)
        assert status == 503 and "send again shortly" in answer["error"]
        holding.close()  # it hangs up: what it held is released
        time.sleep(0.3)
        assert still_serving(url)


def test_clients_that_hang_up_leave_one_line_and_no_traceback(capsys):
    with real_server() as (url, _, _):
        for cut in (head(10_000) + b'{"images": [', score_body(4)):  # mid-body, and after a whole request
            sock = raw_client(url)
            sock.sendall(cut if cut.startswith(b"POST") else head(len(cut)) + cut)
            sock.close()
            time.sleep(0.3)
        assert still_serving(url)
        time.sleep(0.2)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "hung up" in err, err
    assert all(len(line) < 400 for line in err.splitlines())
