"""The autoregressive sampler's decode loop in static shapes, captured once a run and replayed on CUDA
(docs/fast-sampling.md#decode-loop).

A token step of the eager loops (one Python step per token, a KV slice that grows by one slot each step)
launches a few hundred small kernels; at the batches RL samples, a GPU waits on those launches rather
than on its memory or its FLOPs (Janus-Pro-1B shape on an H200: ≈ 20 ms per step at 32 and at 128
rows alike). Here the whole step — feed the last token to both CFG halves, `FusedLlamaDecoder.step`,
the head, guidance, temperature / top-k / top-p, the inverse-CDF draw from the pre-drawn uniforms and
the pos / neg / guided log-probs — reads and writes only preallocated buffers; the step counter, cache
slot, rotary positions and the sampling constants (guidance scale of each token, temperature, top-p) are
tensors the loop fills or advances itself. One capture then serves every step, and every pass.

The query attends over a fixed span of the cache (filled slots unmasked): the span grows in blocks of
`SPAN` slots, one graph per block, so that a step reads about as much of the cache as the eager loop.

A run keeps one loop (`DecodeSession`): the decoder's weight copies, its KV cache and the loop's buffers are
allocated once for the largest pass (rows; the cache length rounded up to a multiple of `SPAN`), a smaller
pass runs in them with padded rows, the weight copies are refreshed in place after each optimizer step, and
the graphs (or the compilation) of the first pass are replayed by every later one. A bigger pass or a longer
cache allocates anew and captures again.

Weights the loop samples from are the weights the optimizer wrote, under every strategy: the decoder owns a
copy of every weight its step reads (none aliases a parameter's storage, which a strategy may free: FSDP2
gathers each step's weights into new storage), refreshed when a parameter's version counter or address
changed, or when the trainer says the weights changed (`weights_changed`, after every optimizer step: FSDP2
may write new values at the same address and keep the version counter). What the embed and head callables
read (the adapter's own modules: a head, an image-token embedding) is read at its address by a captured
graph: where any of those addresses moved since the capture, the graphs are dropped and captured again.

Modes (`SamplingParams.decode`, config ``rollout.decode``):
- ``eager``: the adapter's own loop — the reference and the fallback (continuations: this loop's step over
  exactly the filled slots, uncaptured);
- ``static``: this loop's step run as plain PyTorch, uncaptured (what `graph` replays; any device);
- ``graph``: the step captured in CUDA graphs (one per span, on its first use, after one real step that
  warms it up) and replayed: CUDA only;
- ``compile``: the step through ``torch.compile`` (inductor's fused kernels) over the same spans, then
  captured as ``graph`` on CUDA; on the CPU compiled only. It compiles in the run's first pass only (the
  first span, the spans after it as one graph of symbolic length, the last); a later compilation is counted
  and warned about;
- ``auto``: ``graph`` on CUDA where the adapter's model is one `FusedLlamaDecoder` reproduces, else
  ``eager``.

A capture that fails changes no sample: the step it was warmed up with has run, the capture stream is put
back and the memory pool released (PyTorch's ``capture_end`` throws before it ends the pool's allocation:
`release_failed_capture`, so the allocator is usable again), the rest runs uncaptured, one warning says
why, and the run logs ``rollout/decode_fallback``.

Every mode draws the same tokens from the same uniforms: the static step differs from the eager loop's
only in the order of its floating-point sums (tests/policies/test_decode_loop.py).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from t2i_gcpo.config import DECODE_MODES
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import SamplingParams
from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder
from t2i_gcpo.policies.sampling import GUIDANCE, filter_logits

MODES: tuple[str, ...] = tuple(DECODE_MODES)  # declared once, in config.py
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
        warnings.warn(
            f"rollout.decode={asked}: {why or 'unsupported model'}; sampling with the eager loop",
            stacklevel=3,
        )
        return "eager"
    return asked


def continuation_mode(rollout_mode: str) -> str:
    """How continuations (branched rollouts) run the static loop: over exactly the filled slots where the
    rollout ran eager, else the static step uncaptured (each continuation pass has its own rows and start)."""
    return "eager" if rollout_mode == "eager" else "static"


def bucket(length: int) -> int:
    """A cache length rounded up to a multiple of `SPAN` (one shape for every prompt width of a run)."""
    return -(-length // SPAN) * SPAN


def pad_rows(x: Tensor, rows: int) -> Tensor:
    """`x` [n, …] padded to `rows` rows by repeating its last row (a pass smaller than the loop's buffers)."""
    return x if len(x) == rows else torch.cat([x, x[-1:].expand(rows - len(x), *x.shape[1:])])


@contextlib.contextmanager
def no_autocast_cache(device_type: str) -> Iterator[None]:
    """Autocast without its cache of weight casts: a graph replayed across passes must cast the current
    weights, not read a cached cast from the pass that captured it (freed when that autocast region ended)."""
    if not torch.is_autocast_enabled(device_type):
        yield
        return
    with torch.autocast(device_type, dtype=torch.get_autocast_dtype(device_type), cache_enabled=False):
        yield


class StaticDecodeLoop:
    """Rollout passes of up to N samples of T tokens after an eager prefill, in static shapes.

    decoder: a `FusedLlamaDecoder` of R rows (R = 2N with CFG: rows N.. the negative context), prefilled
    before each pass; embed(tok [N]) → its input for the next step, ids [R] or embeddings [R, D];
    head(h [R, D]) → logits [R, V]. `begin` fills the buffers for a pass: uniforms [N, T] drive the draws,
    positions [R] are the rotary positions and key_mask [R, ≤ max_len] (bool) the filled slots after the
    prefill, whose next free slot is `slot`; a pass may start at token `start` (continuations).
    Text (`eos` given): a row stops at its first EOS token, then holds `pad_id` with mask 0 and
    log-probs 0, as the eager loop records it."""

    def __init__(
        self,
        decoder: FusedLlamaDecoder,
        embed: Callable[[Tensor], Tensor],
        head: Callable[[Tensor], Tensor],
        guidance: str,
        steps: int,
        cfg: bool,
        eos: Tensor | None = None,
        pad_id: int = 0,
        session: DecodeSession | None = None,
    ) -> None:
        rows = decoder.rows
        n = rows // 2 if cfg else rows
        dev = decoder.kv[0].device
        self.decoder, self.embed, self.head, self.session = decoder, embed, head, session
        self.guidance, self.cfg, self.eos, self.pad_id = guidance, cfg, eos, pad_id
        self.n, self.steps = n, steps
        # static buffers: the step reads and advances these in place
        self.uniforms = torch.zeros(n, steps, device=dev)  # [N, T]
        self.positions = torch.zeros(rows, dtype=torch.long, device=dev)  # [R] rotary position fed next
        self.bias = torch.zeros(rows, decoder.max_len, device=dev, dtype=decoder.compute_dtype)  # 0 | −inf
        self.slot = torch.zeros(1, dtype=torch.long, device=dev)  # the cache slot the token fed next goes to
        self.t = torch.zeros(1, dtype=torch.long, device=dev)  # the index of the token sampled next
        self.tok = torch.zeros(n, dtype=torch.long, device=dev)  # the last token sampled, fed next
        self.done = torch.zeros(n, dtype=torch.bool, device=dev)  # text: rows past their EOS
        self.scales = torch.ones(steps, device=dev)  # s_t, the guidance scale of each token (`begin`)
        self.temperature = torch.ones((), device=dev)  # T
        self.top_p = torch.ones((), device=dev)
        self.top_k, self.nucleus = 0, False  # Python: what the step's kernels are (a graph per value)
        # outputs
        self.tokens = torch.full((n, steps), pad_id, dtype=torch.long, device=dev)
        self.valid = torch.zeros(n, steps, device=dev)
        self.logps = torch.zeros(3, n, steps, device=dev)  # pos, neg, guided
        self.graphs: dict[tuple, Callable[[], None]] = {}  # (mode, span, top_k, nucleus) → a graph's replay
        self.addresses = step_addresses(embed, head)  # what the graphs read of embed's and head's modules
        self.compiled: Callable[[int], None] | None = None
        self.fallback = ""  # why a capture failed: this loop then runs uncaptured
        self._pool = None
        self.rows, self.first_slot, self.start = n, 0, 0
        self.compiled_passes = 0  # passes run compiled (compilations after the first are recompilations)
        self.plain = False  # attention through plain matmuls (`FusedLlamaDecoder._attend`)
        self.stats = {"mode": "", "captures": 0, "replays": 0, "steps": 0, "compiles": 0, "fallback": ""}

    # ---- a pass -----------------------------------------------------------------------------------
    def begin(
        self,
        sampling: SamplingParams,
        uniforms: Tensor,
        positions: Tensor,
        key_mask: Tensor,
        slot: int,
        rows: int | None = None,
        start: int = 0,
        scales: Tensor | None = None,
    ) -> None:
        """Fill the buffers for a pass (shapes as the loop's: pad smaller passes with `pad_rows`); `rows` of
        the N are real (the outputs), token `start` is sampled first from the prefill's logits. `scales` [T]:
        the guidance scale of each token (LlamaGen's cfg_interval: 1 after it); default
        `sampling.guidance_scale`."""
        with torch.no_grad():
            self.uniforms.copy_(uniforms)
            self.positions.copy_(positions)
            self.bias.fill_(float("-inf"))
            self.bias[:, : key_mask.shape[1]].masked_fill_(key_mask, 0.0)
            self.slot.fill_(slot)
            self.t.fill_(start)
            self.tok.zero_()
            self.done.zero_()
            self.tokens.fill_(self.pad_id)
            self.valid.zero_()
            self.logps.zero_()
            if scales is None:
                self.scales.fill_(sampling.guidance_scale)
            else:
                self.scales.copy_(scales)
            self.temperature.fill_(sampling.temperature)
            self.top_p.fill_(sampling.top_p)
        self.top_k, self.nucleus = int(sampling.top_k), sampling.top_p < 1.0
        self.rows, self.first_slot, self.start = self.n if rows is None else rows, slot, start
        self.stats = {
            "mode": "",
            "captures": 0,
            "replays": 0,
            "steps": 0,
            "compiles": 0,
            "fallback": self.fallback,
        }

    # ---- the captured unit ----------------------------------------------------------------------
    def _sample(self, logits: Tensor) -> None:
        """Draw token t from `logits` [R, V] with uniforms[:, t]; record it and its log-probs; t += 1. The
        three log-softmaxes are one over the stacked [pos; neg; guided] logits, the draw reuses the guided
        one's where nothing truncates."""
        pos, neg = logits.float().chunk(2) if self.cfg else (logits.float(), None)
        u = self.uniforms.index_select(1, self.t).squeeze(1)  # [N]
        if neg is None:
            z = (pos / self.temperature)[None]  # [1, N, V]
        else:
            scale = self.scales.index_select(0, self.t)  # [1]: s of token t
            z = torch.stack([pos, neg, GUIDANCE[self.guidance](pos, neg, scale)]) / self.temperature
        logp = z.log_softmax(-1)
        if self.top_k or self.nucleus:
            probs = filter_logits(z[-1], self.top_k, self.top_p, self.nucleus).softmax(-1)
        else:
            probs = logp[-1].exp()
        cdf = probs.cumsum(-1)  # [N, V]
        tok = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp_(max=z.shape[-1] - 1)
        lps = logp.gather(-1, tok.expand(len(z), -1, -1)).squeeze(-1)  # [3 or 1, N]
        if neg is None:  # unguided: pos = guided, no neg
            lps = torch.cat([lps, torch.zeros_like(lps), lps])
        tok = tok.squeeze(-1)
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
        self.bias.index_fill_(1, self.slot, 0.0)
        h = self.decoder.step(self.embed(self.tok), self.slot, self.positions, self.bias, span, self.plain)
        self.slot.add_(1)
        self.positions.add_(1)
        self._sample(self.head(h))

    # ---- the loop -------------------------------------------------------------------------------
    def run(self, logits: Tensor, mode: str) -> tuple[Tensor, Tensor, Tensor]:
        """Sample tokens `start` … T − 1 from the prefill's `logits` [R, V] → tokens [n, T], valid [n, T],
        log-probs [3, n, T] (pos, neg — zeros without CFG —, guided) of the pass's n real rows (copies: the
        buffers serve the next pass)."""
        device = self.uniforms.device.type
        capture = device in CAPTURE_DEVICES and mode in ("graph", "compile")
        step = self._compiled() if mode == "compile" else self.step
        span_size = 1 if mode == "eager" else SPAN  # eager (continuations): exactly the filled slots
        self.plain = mode == "eager" and not self.decoder.fused_kernels  # … and the eager loop's attention
        check = STOP_CHECK if capture else 1  # a check syncs: captured steps would wait on it
        self.stats["mode"] = mode
        frames = compiled_frames()
        with torch.no_grad(), no_autocast_cache(device):
            self._sample(logits)  # token `start`, from the prefill
            slot = self.first_slot
            for t in range(self.start + 1, self.steps):
                if self.eos is not None and t % check == 0 and bool(self.done.all()):
                    break
                span = min(self.decoder.max_len, -(-(slot + 1) // span_size) * span_size)
                key = (mode, span, self.top_k, self.nucleus)
                if capture and key in self.graphs:
                    self.graphs[key]()
                    self.stats["replays"] += 1
                elif capture and not self.fallback:
                    replay = self.capture(step, span)  # runs this step, then captures it
                    if replay is not None:
                        self.graphs[key] = replay
                else:
                    step(span)
                slot += 1
                self.stats["steps"] = t - self.start
        if mode == "compile":
            self._count_compiles(compiled_frames() - frames)
            self.compiled_passes += 1
        n = self.rows
        return self.tokens[:n].clone(), self.valid[:n].clone(), self.logps[:, :n].clone()

    def _compiled(self) -> Callable[[int], None]:
        """The step through torch.compile, dynamo's automatic dynamic shapes on: the first span compiles
        static, the spans after it as one graph with the span's length symbolic (and the last, the whole
        cache, as its own): at most three compilations, all in the loop's first pass."""
        if self.compiled is None:
            self.compiled = torch.compile(self.step, dynamic=None)
        return self.compiled

    def _count_compiles(self, new: int) -> None:
        """Count dynamo's compilations of this pass; after the loop's first compiled pass (a loop may run
        static passes before, as the benchmarks do), warn: each costs compile time again, and past dynamo's
        recompile limit it would sample eagerly without a word."""
        if not new:
            return
        self.stats["compiles"] = new
        if self.session is not None:
            self.session.stats["compiles"] += new
        if self.compiled_passes:
            limit = getattr(torch._dynamo.config, "recompile_limit", None)
            warnings.warn(
                f"rollout.decode=compile: the decode step compiled again in compiled pass "
                f"{self.compiled_passes + 1} of its loop ({new} graphs; top_k {self.top_k}, "
                f"top_p {'on' if self.nucleus else 'off'}, {self.n} rows, cache {self.decoder.max_len}); "
                f"dynamo's recompile limit is {limit}",
                stacklevel=3,
            )

    def capture(self, step: Callable[[int], None], span: int) -> Callable[[], None] | None:
        """Run `step(span)` once for real on a side stream (the warm-up a capture needs: lazy
        initialisation, a compilation), then capture it into a CUDA graph (capturing runs nothing) → its
        replay. If the capture fails (None): the warmed-up step has run, the current stream and the memory
        pool are put back, the loop goes on uncaptured, and one warning says why."""
        current = torch.cuda.current_stream()
        stream = torch.cuda.Stream()
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            step(span)
        current.wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                step(span)
        except Exception as e:  # nothing ran during the capture: the buffers are as the warm-up left them
            torch.cuda.set_stream(current)  # a failed capture can leave its stream current
            release_failed_capture(self._pool, self.uniforms.device)
            self._pool = None  # a fresh pool for any later capture (earlier graphs keep theirs)
            del graph
            self.fallback = self.stats["fallback"] = f"{type(e).__name__}: {e}"[:300]
            if self.session is not None:
                self.session.stats["fallbacks"] += 1
            warnings.warn(
                f"CUDA graph capture of the decode step failed ({self.fallback}); sampling "
                "uncaptured from here on (rollout/decode_fallback)",
                stacklevel=3,
            )
            return None
        self.stats["captures"] += 1
        if self.session is not None:
            self.session.stats["captures"] += 1
        return graph.replay

    def drop_graphs(self) -> None:
        """Drop the captured graphs (each releases its share of the pool): the next pass captures again, from
        a fresh pool (a pool every graph of which is gone may not be captured into again)."""
        self.graphs.clear()
        self._pool = None


def release_failed_capture(pool: tuple | None, device: torch.device) -> None:
    """After a capture that raised: end the allocator's allocation to the capture's pool and release the pool,
    where ``capture_end`` threw before doing so (it checks ``cudaStreamEndCapture``'s error first: a capture
    invalidated by an operation CUDA does not allow in it leaves the caching allocator routing to the pool,
    and the next ``torch.cuda.empty_cache()`` fails an internal assert). Where the capture had ended the pool
    (it failed later) ending it again raises, and the graph releases its pool itself: nothing to do."""
    if pool is None:
        return
    from torch.cuda import memory

    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        memory._cuda_endAllocateToPool(index, pool)
    except RuntimeError:  # "not currently recording to mempool_id": capture_end got past it
        return
    memory._cuda_releasePool(index, pool)


def step_addresses(*fns: Callable) -> tuple[int, ...]:
    """The addresses of the parameters and buffers of the modules `fns` are (or are methods of): what a
    captured step reads besides the decoder's own copies and the loop's buffers (the adapter's head and
    embedding modules)."""
    out = []
    for fn in fns:
        owner = getattr(fn, "__self__", fn)
        if isinstance(owner, nn.Module):
            out += [t.data_ptr() for t in (*owner.parameters(), *owner.buffers())]
    return tuple(out)


def weights_changed(policy: object) -> None:
    """Tell `policy`'s decode loop (its `decode_session`, where it has one) that its weights changed: the
    trainer calls it after every optimizer step."""
    session = getattr(policy, "decode_session", None)
    if session is not None:
        session.weights_changed()


def compiled_frames() -> int:
    """Graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class DecodeSession:
    """What a run's static decode loop keeps between rollout passes: one `StaticDecodeLoop` with its
    `FusedLlamaDecoder` (weight copies, KV cache), its buffers and its graphs or compilation. `loop` hands
    it out refreshed for the next pass, or allocates a bigger one (and so captures again) where the pass does
    not fit. `stats` counts over the run: allocations, weight refreshes, captures, compilations, fallbacks
    (failed captures), passes, and recaptures (graphs dropped because what they read moved).

    `generation` counts the trainer's optimizer steps (`weights_changed`): a kept decoder is refreshed when it
    changed, whatever the parameters' version counters and addresses say."""

    def __init__(self) -> None:
        self.current: StaticDecodeLoop | None = None
        self.key: tuple | None = None
        self.generation = 0
        self.stats = {
            "allocations": 0,
            "refreshes": 0,
            "captures": 0,
            "compiles": 0,
            "fallbacks": 0,
            "passes": 0,
            "recaptures": 0,
        }

    def weights_changed(self) -> None:
        """The policy's weights changed (an optimizer step): the next pass refreshes the kept copies."""
        self.generation += 1

    def __deepcopy__(self, memo: dict) -> DecodeSession:
        return DecodeSession()  # a copied policy (a frozen reference) samples with its own

    def loop(
        self,
        llama,
        embed: Callable[[Tensor], Tensor],
        head: Callable[[Tensor], Tensor],
        guidance: str,
        rows: int,
        length: int,
        steps: int,
        cfg: bool,
        eos: Tensor | None = None,
        pad_id: int = 0,
    ) -> StaticDecodeLoop:
        """The loop for a pass of `rows` samples whose cache needs `length` slots (built under the rollout's
        autocast: its weight copies and cache in that dtype)."""
        dev = llama.embed_tokens.weight.device
        low = (
            torch.get_autocast_dtype(dev.type)
            if torch.is_autocast_enabled(dev.type)
            else llama.embed_tokens.weight.dtype
        )
        eos_key = None if eos is None else tuple(eos.tolist())
        key = (
            id(llama),
            id(getattr(embed, "__func__", embed)),
            dev,
            low,
            guidance,
            steps,
            cfg,
            eos_key,
            pad_id,
        )
        length = bucket(length)
        loop = self.current
        self.stats["passes"] += 1
        if loop is not None and key == self.key:
            fits = loop.n >= rows and loop.decoder.max_len >= length
            refreshed = loop.decoder.refresh(self.generation) if fits else None
            if refreshed is not None:
                self.stats["refreshes"] += int(refreshed)
                where = step_addresses(embed, head)
                if where != loop.addresses:  # a graph would read the old addresses: capture again
                    self.stats["recaptures"] += int(bool(loop.graphs))
                    loop.drop_graphs()
                    loop.addresses = where
                return loop
            rows, length = max(rows, loop.n), max(length, loop.decoder.max_len)  # grow, never shrink
        self.current = None  # the old buffers and graphs go before the new ones are allocated
        del loop
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        decoder = FusedLlamaDecoder(llama, 2 * rows if cfg else rows, length, owned=True)
        decoder.generation = self.generation
        self.current = StaticDecodeLoop(decoder, embed, head, guidance, steps, cfg, eos, pad_id, session=self)
        with torch.no_grad():
            if not embed(self.current.tok).is_floating_point():  # the step is fed token ids: its own table
                decoder.own_embedding()
        self.key = key
        self.stats["allocations"] += 1
        return self.current
