"""The autoregressive sampler's decode loop in static shapes, captured once and replayed on CUDA
(docs/fast-sampling.md#decode-loop).

A token step of the eager loops (one Python step per token, a KV slice that grows by one slot each step)
launches a few hundred small kernels; at the batches RL samples, a GPU waits on those launches rather
than on its memory or its FLOPs (Janus-Pro-1B shape on an H200: ≈ 20 ms per step at 32 and at 128
rows alike). Here the whole step — feed the last token to both CFG halves, `FusedLlamaDecoder.step`,
the head, guidance, temperature / top-k / top-p, the inverse-CDF draw from the pre-drawn uniforms and
the pos / neg / guided log-probs — reads and writes only preallocated buffers, and the step counter,
cache slot and rotary positions are tensors it advances itself. One capture then serves every step.

The query attends over a fixed span of the cache (filled slots unmasked): the span grows in blocks of
`SPAN` slots, one graph per block, so that a step reads about as much of the cache as the eager loop.

Modes (`SamplingParams.decode`, config ``rollout.decode``):
- ``eager``: the adapter's own loop — the reference and the fallback;
- ``static``: this loop's step run as plain PyTorch, uncaptured (what `graph` replays; any device);
- ``graph``: the step captured in CUDA graphs (one per span, each on its first use, after one real step
  that warms it up) and replayed: CUDA only;
- ``compile``: the step through ``torch.compile`` (inductor's fused kernels) over the whole cache, then
  captured as ``graph`` on CUDA; on the CPU compiled only;
- ``auto``: ``graph`` on CUDA where the adapter's model is one `FusedLlamaDecoder` reproduces, else
  ``eager``.

Every mode draws the same tokens from the same uniforms: the static step differs from the eager loop's
only in the order of its floating-point sums (tests/test_decode_graph.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Literal, get_args

import torch
from torch import Tensor

from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import SamplingParams
from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder
from t2i_gcpo.policies.sampling import sample_step

DecodeMode = Literal["auto", "eager", "static", "graph", "compile"]
MODES: tuple[str, ...] = get_args(DecodeMode)
SPAN = 128  # cache slots per captured span: one graph per 128 slots of context
STOP_CHECK = 8  # text, captured: steps between checks that every row has ended (each check syncs)
CAPTURE_DEVICES = (
    "cuda",
)  # where graph / compile capture the step (tests stand a fake capture in on the CPU)


def resolve_mode(asked: str, device: torch.device, supported: bool, why: str = "") -> str:
    """The decode loop a rollout runs: `asked` (``auto`` → ``graph`` on CUDA, else ``eager``), or
    ``eager`` where the model is not `supported` by the static step (`why` says what it lacks)."""
    if asked not in MODES:
        raise UserError(f"rollout.decode must be one of {', '.join(MODES)}, got {asked!r}")
    if asked == "auto":
        return "graph" if device.type == "cuda" and supported else "eager"
    if asked == "graph" and device.type != "cuda":
        raise UserError(
            f"rollout.decode=graph needs a CUDA device (the policy is on {device.type}): "
            "use auto, eager, static or compile"
        )
    if asked != "eager" and not supported:
        warnings.warn(f"rollout.decode={asked}: {why or 'unsupported model'}; sampling with the eager loop",
                      stacklevel=3)  # fmt: skip
        return "eager"
    return asked


class StaticDecodeLoop:
    """One rollout pass of N samples of T tokens after an eager prefill, in static shapes.

    decoder: the prefilled `FusedLlamaDecoder` of R rows (R = 2N with CFG: rows N.. the negative
    context); embed(tok [N]) → its input for the next step, ids [R] or embeddings [R, D]; head(h [R, D])
    → logits [R, V]. uniforms [N, T] drive the draws; positions [R] are the rotary positions and
    key_mask [R, max_len] (bool) the filled slots after the prefill, whose next free slot is `slot`.
    Text (`eos` given): a row stops at its first EOS token, then holds `pad_id` with mask 0 and
    log-probs 0, as the eager loop records it."""

    def __init__(self, decoder: FusedLlamaDecoder, embed: Callable[[Tensor], Tensor],
                 head: Callable[[Tensor], Tensor], sampling: SamplingParams, guidance: str,
                 uniforms: Tensor, positions: Tensor, key_mask: Tensor, slot: int, cfg: bool,
                 eos: Tensor | None = None, pad_id: int = 0) -> None:  # fmt: skip
        n, steps = uniforms.shape
        dev = uniforms.device
        self.decoder, self.embed, self.head = decoder, embed, head
        self.sampling, self.guidance, self.cfg, self.eos, self.pad_id = sampling, guidance, cfg, eos, pad_id
        self.first_slot, self.steps = slot, steps
        # static buffers: the step reads and advances these in place
        self.uniforms = uniforms.contiguous()  # [N, T]
        self.positions = positions.clone()  # [R] rotary position of the token fed next
        self.key_mask = key_mask.clone()  # [R, max_len] True at filled slots
        self.slot = torch.tensor([slot], device=dev)  # the cache slot the token fed next goes to
        self.t = torch.zeros(1, dtype=torch.long, device=dev)  # the index of the token sampled next
        self.tok = torch.zeros(n, dtype=torch.long, device=dev)  # the last token sampled, fed next
        self.done = torch.zeros(n, dtype=torch.bool, device=dev)  # text: rows past their EOS
        # outputs
        self.tokens = torch.full((n, steps), pad_id, dtype=torch.long, device=dev)
        self.valid = torch.zeros(n, steps, device=dev)
        self.logps = torch.zeros(3, n, steps, device=dev)  # pos, neg, guided
        self.stats = {"mode": "", "captures": 0, "replays": 0, "steps": 0, "fallback": ""}
        self._pool = None

    # ---- the captured unit ----------------------------------------------------------------------
    def _sample(self, logits: Tensor) -> None:
        """Draw token t from `logits` [R, V] with uniforms[:, t]; record it and its log-probs; t += 1."""
        pos, neg = logits.chunk(2) if self.cfg else (logits, None)
        u = self.uniforms.index_select(1, self.t).squeeze(1)  # [N]
        tok, lp = sample_step(pos, neg, self.sampling, u, self.guidance)
        lps = torch.stack(
            [lp["pos"], lp["neg"] if "neg" in lp else torch.zeros_like(lp["pos"]), lp["guided"]]
        )
        if self.eos is not None:
            live = ~self.done
            self.valid.index_copy_(1, self.t, live[:, None].float())
            self.done |= (tok[:, None] == self.eos).any(-1)
            tok = torch.where(live, tok, self.pad_id)
            lps = torch.where(live, lps, 0.0)
        else:
            self.valid.index_fill_(1, self.t, 1.0)
        self.tokens.index_copy_(1, self.t, tok[:, None])
        self.logps.index_copy_(2, self.t, lps[:, :, None])
        self.tok.copy_(tok)
        self.t.add_(1)

    def step(self, span: int) -> None:
        """Feed the last token at the next slot, attending over the first `span` slots; sample the next."""
        self.key_mask.index_fill_(1, self.slot, True)
        h = self.decoder.step(self.embed(self.tok), self.slot, self.positions, self.key_mask, span)
        self.slot.add_(1)
        self.positions.add_(1)
        self._sample(self.head(h))

    # ---- the loop -------------------------------------------------------------------------------
    def run(self, logits: Tensor, mode: str) -> tuple[Tensor, Tensor, Tensor]:
        """Sample all T tokens from the prefill's `logits` [R, V] → tokens [N, T], valid [N, T], log-probs
        [3, N, T] (pos, neg — zeros without CFG —, guided)."""
        device = self.uniforms.device.type
        step = torch.compile(self.step, dynamic=False) if mode == "compile" else self.step
        capture = device in CAPTURE_DEVICES and mode in ("graph", "compile")
        span_size = self.decoder.max_len if mode == "compile" else SPAN  # compile: one shape, one compilation
        check = STOP_CHECK if capture else 1  # a check syncs: captured steps would wait on it
        replays: dict[int, Callable[[], None]] = {}
        self.stats["mode"] = mode
        self._sample(logits)  # token 0, from the prefill
        slot = self.first_slot
        for t in range(1, self.steps):
            if self.eos is not None and t % check == 0 and bool(self.done.all()):
                break
            span = min(self.decoder.max_len, -(-(slot + 1) // span_size) * span_size)
            if span in replays:
                replays[span]()
                self.stats["replays"] += 1
            elif capture:
                replays[span] = self.capture(step, span)  # runs this step, then captures it
            else:
                step(span)
            slot += 1
            self.stats["steps"] = t
        return self.tokens, self.valid, self.logps

    def capture(self, step: Callable[[int], None], span: int) -> Callable[[], None]:
        """Run `step(span)` once for real on a side stream (the warm-up a capture needs: lazy
        initialisation, autocast's weight casts), then capture it into a CUDA graph (capturing runs
        nothing) → its replay. If the capture fails, the loop goes on uncaptured, with a warning."""
        if self.stats["fallback"]:
            return lambda: step(span)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step(span)
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                step(span)
        except RuntimeError as e:  # nothing ran during the capture: the buffers are as the warm-up left them
            self.stats["fallback"] = f"{type(e).__name__}: {e}"[:300]
            warnings.warn(f"CUDA graph capture of the decode step failed ({self.stats['fallback']}); "
                          "sampling on uncaptured", stacklevel=2)  # fmt: skip
            return lambda: step(span)
        self.stats["captures"] += 1
        return graph.replay
