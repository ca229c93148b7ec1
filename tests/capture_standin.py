"""A stand-in for torch.cuda's streams and CUDA graphs on the CPU, for the tests of the decode loop's capture
bookkeeping (tests/policies/test_decode_loop_regressions.py, tests/policies/test_decode_session.py) and the GPU check's dry run
(benchmarks/gpu_check.py --tiny). It behaves as a capture does: the captured body runs nothing (the stand-in
runs it, then puts every buffer of the loop and its decoder back as they were), and a replay runs the captured
step. The capture of the `fail_at`-th span raises at its end and, as in the torch versions seen, leaves the
capture stream current."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class StandInCuda:
    class Stream:
        def wait_stream(self, other) -> None:
            pass

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at, self.captures = fail_at, 0
        self.default = self.Stream()
        self.current = self.default
        self.loop = self.step = self.span = None

    def patches(self, span: int = 4) -> list[tuple[object, str, object]]:
        """(owner, name, value) to set: torch.cuda's API, the decode loop capturing on the CPU with spans of
        `span` slots, and a spy that tells the stand-in which step a capture records."""
        from t2i_gcpo.policies import decode_loop
        from t2i_gcpo.policies.decode_loop import StaticDecodeLoop

        real, fake = StaticDecodeLoop.capture, self

        def spy(loop, step, span_):  # what the stand-in graph replays: the step the loop captures
            fake.loop, fake.step, fake.span = loop, step, span_
            return real(loop, step, span_)

        names = ("Stream", "current_stream", "stream", "set_stream", "graph_pool_handle", "CUDAGraph", "graph",
                 "synchronize", "empty_cache")  # fmt: skip
        return [(torch.cuda, n, getattr(self, n)) for n in names] + [
            (decode_loop, "CAPTURE_DEVICES", ("cpu",)),
            (decode_loop, "SPAN", span),
            (StaticDecodeLoop, "capture", spy),
        ]

    @contextlib.contextmanager
    def installed(self, span: int = 4) -> Iterator[StandInCuda]:
        """The patches for the duration of a block."""
        patches = self.patches(span)
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
        try:
            for owner, name, value in patches:
                setattr(owner, name, value)
            yield self
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)

    # ---- torch.cuda's API, as the loop calls it ---------------------------------------------------
    def current_stream(self, device=None):
        return self.current

    @contextlib.contextmanager
    def stream(self, s):
        before, self.current = self.current, s
        try:
            yield
        finally:
            self.current = before

    def set_stream(self, s) -> None:
        self.current = s

    def graph_pool_handle(self):
        return object()

    def CUDAGraph(self, *args, **kwargs):  # noqa: N802 (torch's name)
        class Graph:
            def replay(self) -> None:
                self.step(self.span)

        return Graph()

    @contextlib.contextmanager
    def graph(self, g, pool=None, stream=None, capture_error_mode="global"):
        before = self.current
        self.current = self.Stream()  # the capture stream
        saved = [(t, t.clone()) for t in self._tensors()]
        index, self.captures = self.captures, self.captures + 1
        try:
            yield
        except Exception:  # run for real, the body may index past the cache (the step after a pass's last):
            pass  # a capture, which runs nothing, raises no such error
        for t, copy in saved:  # a capture runs nothing
            t.copy_(copy)
        if index == self.fail_at:
            raise RuntimeError("stand-in: operation not permitted when stream is capturing")
        g.step, g.span = self.step, self.span
        self.current = before

    def synchronize(self, *args) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def _tensors(self) -> list[torch.Tensor]:
        out = []
        for obj in (self.loop, self.loop.decoder):
            for v in vars(obj).values():
                if torch.is_tensor(v):
                    out.append(v)
                elif isinstance(v, (list, tuple)):
                    out += [x for x in v if torch.is_tensor(x)]
        return out
