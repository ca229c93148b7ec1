"""A stand-in for torch.cuda's streams and CUDA graphs on the CPU, for the tests of the decode loop's capture
bookkeeping (tests/policies/test_decode_loop_regressions.py, tests/policies/test_decode_session.py) and the
GPU check's dry run (benchmarks/gpu_check.py --tiny). It behaves as a capture does: the captured body runs
nothing (the stand-in runs it, then puts every buffer of the loop and its decoder back as they were), and a
replay runs the captured step. The capture of the `fail_at`-th span raises at its end the way PyTorch's
``capture_end`` does when CUDA invalidated the capture: it leaves the capture stream current, and the caching
allocator still allocating to the capture's pool (``cudaStreamEndCapture``'s error is thrown before
``endAllocateToPool``), so that `empty_cache` then fails as the real one's internal assert does until the pool
is ended and released (`_cuda_endAllocateToPool`, `_cuda_releasePool`, which torch.cuda.memory exports).

`addresses`: a capture also records the address of every tensor the step reads that it did not create (as a
CUDA graph bakes them in), and a replay fails where one of those tensors has moved since (a weight whose
storage a strategy freed and gathered again elsewhere: FSDP2)."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class ReadAddresses(TorchDispatchMode):
    """Records (tensor, address) of every tensor an operation reads that no operation under the mode made."""

    def __init__(self) -> None:
        super().__init__()
        self.made: set[int] = set()
        self.reads: list[tuple[weakref.ref, int]] = []
        self.seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tree_flatten((args, kwargs))[0]:
            if torch.is_tensor(t) and id(t) not in self.made and id(t) not in self.seen and t.numel() > 1:
                self.seen.add(id(t))
                self.reads.append((weakref.ref(t), t.data_ptr()))
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if torch.is_tensor(t):
                self.made.add(id(t))
        return out


class StandInCuda:
    class Stream:
        def wait_stream(self, other) -> None:
            pass

    def __init__(self, fail_at: int | None = None, addresses: bool = False) -> None:
        self.fail_at, self.captures, self.addresses = fail_at, 0, addresses
        self.default = self.Stream()
        self.current = self.default
        self.loop = self.step = self.span = None
        self.routed: list[tuple] = []  # pools the allocator allocates to (captures under way)
        self.released: list[tuple] = []  # pools released by `_cuda_releasePool`
        self.pools = 0

    def patches(self, span: int = 4) -> list[tuple[object, str, object]]:
        """(owner, name, value) to set: torch.cuda's API, the decode loop capturing on the CPU with spans of
        `span` slots, and a spy that tells the stand-in which step a capture records."""
        from t2i_gcpo.policies import decode_loop
        from t2i_gcpo.policies.decode_loop import StaticDecodeLoop

        real, fake = StaticDecodeLoop.capture, self

        def spy(loop, step, span_):  # what the stand-in graph replays: the step the loop captures
            fake.loop, fake.step, fake.span = loop, step, span_
            return real(loop, step, span_)

        names = (
            "Stream",
            "current_stream",
            "stream",
            "set_stream",
            "graph_pool_handle",
            "CUDAGraph",
            "graph",
            "synchronize",
            "empty_cache",
            "current_device",
        )
        allocator = ("_cuda_endAllocateToPool", "_cuda_releasePool")
        return [(torch.cuda, n, getattr(self, n)) for n in names] + [
            *[(torch.cuda.memory, n, getattr(self, n)) for n in allocator],
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

    def current_device(self) -> int:
        return 0

    def graph_pool_handle(self):
        self.pools += 1
        return (0, self.pools)

    def CUDAGraph(self, *args, **kwargs):  # noqa: N802 (torch's name)
        class Graph:
            reads: list[tuple[weakref.ref, int]] = []

            def replay(self) -> None:
                for ref, address in self.reads:
                    t = ref()
                    if t is not None and t.data_ptr() != address:
                        raise AssertionError(
                            f"stand-in: the replay reads a tensor {tuple(t.shape)} at the address "
                            "it had at the capture, which it has left (freed memory)"
                        )
                self.step(self.span)

        return Graph()

    @contextlib.contextmanager
    def graph(self, g, pool=None, stream=None, capture_error_mode="global"):
        before = self.current
        self.current = self.Stream()  # the capture stream
        pool = pool if pool is not None else self.graph_pool_handle()
        self.routed.append(pool)  # capture_begin: the allocator allocates to the pool
        saved = [(t, t.clone()) for t in self._tensors()]
        index, self.captures = self.captures, self.captures + 1
        recorder = ReadAddresses() if self.addresses else contextlib.nullcontext()
        try:
            with recorder:
                yield
        except Exception:  # run for real, the body may index past the cache (the step after a pass's last):
            pass  # a capture, which runs nothing, raises no such error
        for t, copy in saved:  # a capture runs nothing
            t.copy_(copy)
        if index == self.fail_at:  # cudaStreamEndCapture's error, thrown before endAllocateToPool
            raise RuntimeError("stand-in: operation not permitted when stream is capturing")
        self.routed.remove(pool)
        g.step, g.span = self.step, self.span
        g.reads = recorder.reads if self.addresses else []
        self.current = before

    def synchronize(self, *args) -> None:
        pass

    def empty_cache(self) -> None:
        if self.routed:
            raise RuntimeError(
                "stand-in: INTERNAL ASSERT FAILED in CUDACachingAllocator: a capture is under way "
                f"(allocating to pools {self.routed})"
            )

    def _cuda_endAllocateToPool(self, device: int, pool: tuple) -> None:  # noqa: N802 (torch's name)
        if pool not in self.routed:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        self.routed.remove(pool)

    def _cuda_releasePool(self, device: int, pool: tuple) -> None:  # noqa: N802 (torch's name)
        self.released.append(pool)

    def _tensors(self) -> list[torch.Tensor]:
        out = []
        for obj in (self.loop, self.loop.decoder):
            for v in vars(obj).values():
                if torch.is_tensor(v):
                    out.append(v)
                elif isinstance(v, (list, tuple)):
                    out += [x for x in v if torch.is_tensor(x)]
        return out
