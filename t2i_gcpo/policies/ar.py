"""The built-in autoregressive text-to-image prior (the ShapeWorld default model) as a `Policy`.

A Llama decoder over [<bos>, prompt words, <boi>, image tokens] with a codebook-only head; the null
prompt (words replaced by <pad>) is CFG's unconditional branch and GCPO's c⁻. Sampling is one KV-cache
loop over the doubled batch [cond; null], fused on the model's own weights by default, every token drawn
from the prompt's own generator so a sample never depends on its batch-mates.
Details: docs/concepts/adapters.md#autoregressive-prior.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import (
    Branches,
    Context,
    LogprobsForward,
    PolicyCapabilities,
    PromptRecord,
    Rollout,
    SamplingParams,
    TokenLayout,
)
from t2i_gcpo.policies.branching import CONTEXTS, assemble, branched, continuation_uniforms
from t2i_gcpo.policies.decode_loop import (
    DecodeSession,
    StaticDecodeLoop,
    bucket,
    continuation_mode,
    pad_rows,
    resolve_mode,
)
from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder
from t2i_gcpo.policies.prior_folder import load_prior_folder, save_prior_folder
from t2i_gcpo.policies.prompt_tokenizer import PromptTokenizer
from t2i_gcpo.policies.sampling import (
    GUIDANCE,
    ChunkedDists,
    check_records,
    chunked_logprobs,
    group_uniforms,
    sample_step,
)
from t2i_gcpo.tokenizers.vq import VQTokenizer


@dataclass
class ARConfig:
    prompt_len: int = 12  # L, prompt words (padded) between <bos> and <boi>
    hidden_size: int = 256  # d
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 704  # SwiGLU width (≈ 8/3 d, Llama's ratio)
    default_cfg_scale: float = 3.0  # s used by `sample`/`evaluate` when none is given
    storage_dtype: str = "float16"  # dtype of weights on disk; upcast to fp32 at load
    grid: tuple[int, int] = field(default=(8, 8))  # (rows, cols), copied from the VQ
    codebook_size: int = 256  # K, copied from the VQ


CacheKind = Literal["fused", "static", "dynamic", "none"]


class ARPolicy(LogprobsForward, nn.Module):
    """Text-conditioned Llama-style prior over VQ tokens plus its (frozen) VQ tokenizer."""

    output = "image"
    # rollout.autocast='auto' samples in bf16 where native: checked to train as float32 does (5 seeds)
    capabilities = PolicyCapabilities(bf16_sampling=True, branching=True)
    default_task = "shapeworld"
    guidance = "u + s(c − u)"  # LlamaGen-style CFG on the logits

    def __init__(self, config: ARConfig, tokenizer: PromptTokenizer, vq: VQTokenizer) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaModel

        if tuple(config.grid) != tuple(vq.grid_shape) or config.codebook_size != vq.codebook_size:
            config.grid, config.codebook_size = tuple(vq.grid_shape), vq.codebook_size
        if config.prompt_len != tokenizer.max_len:
            raise ValueError(f"prompt_len {config.prompt_len} != tokenizer.max_len {tokenizer.max_len}")
        self.config = config
        self.tokenizer = tokenizer
        self.grid_shape: tuple[int, int] = tuple(config.grid)
        self.layout = TokenLayout.image(*self.grid_shape)
        self.num_tokens = self.grid_shape[0] * self.grid_shape[1]  # T
        self.prefix_len = config.prompt_len + 2  # P
        self.image_offset = len(tokenizer)  # embedding id of image code 0
        llama_cfg = LlamaConfig(
            vocab_size=len(tokenizer) + config.codebook_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            num_key_value_heads=config.num_heads,
            max_position_embeddings=self.prefix_len + self.num_tokens,
            pad_token_id=None,  # the pad embedding is learned: it *is* the null prompt
            tie_word_embeddings=False,
        )
        llama_cfg._attn_implementation = "sdpa"
        self.llama = LlamaModel(llama_cfg)
        self.head = nn.Linear(config.hidden_size, config.codebook_size, bias=False)  # → K image logits
        self.vq = vq.eval().requires_grad_(False)
        self.kept_caches = KeptCaches()  # rollouts' KV caches, for their continuations (`branch`)
        self.decode_session = DecodeSession()  # the static decode loop, kept between passes

    # ---- sequences ------------------------------------------------------------------------------
    def default_sampling(self) -> SamplingParams:
        return SamplingParams(guidance_scale=float(self.config.default_cfg_scale))

    def check_prompts(self, prompts: list[str]) -> None:
        self.tokenizer.check(prompts)

    def encode_prompts(self, prompts: list[str]) -> torch.Tensor:
        """Prompts → word ids [B, L] (raises UserError on unknown words)."""
        self.check_prompts(prompts)
        return self.tokenizer.encode(prompts).to(self.device)

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def prefix(self, prompt_ids: torch.Tensor, null: torch.Tensor | bool = False) -> torch.Tensor:
        """[B, L] word ids → [B, P] = [<bos>, words, <boi>]; rows where `null` get the null prompt."""
        b = prompt_ids.shape[0]
        ids = prompt_ids.clone()
        null_rows = torch.as_tensor(null, device=ids.device).expand(b)
        ids[null_rows] = self.tokenizer.pad_id
        bos = ids.new_full((b, 1), self.tokenizer.bos_id)
        boi = ids.new_full((b, 1), self.tokenizer.boi_id)
        return torch.cat([bos, ids, boi], dim=1)

    def _logits(self, seq: torch.Tensor, cache=None) -> torch.Tensor:
        """Embedding ids [B, S] → codebook logits [B, S, K] (continuing `cache` if given)."""
        h = self.llama(input_ids=seq, past_key_values=cache, use_cache=cache is not None).last_hidden_state
        return self.head(h)

    def teacher_forced_hidden(
        self, prompt_ids: torch.Tensor, tokens: torch.Tensor, null: torch.Tensor | bool = False
    ) -> torch.Tensor:
        """Hidden states [B, T, D] predicting every image token from its prefix (one forward pass)."""
        seq = torch.cat(
            [self.prefix(prompt_ids, null), tokens[:, :-1] + self.image_offset], dim=1
        )  # [B, P+T-1]
        return self.llama(input_ids=seq).last_hidden_state[:, self.prefix_len - 1 :]

    def teacher_forced_logits(
        self, prompt_ids: torch.Tensor, tokens: torch.Tensor, null: torch.Tensor | bool = False
    ) -> torch.Tensor:
        """Raw logits [B, T, K] predicting every image token from its prefix (one forward pass)."""
        return self.head(self.teacher_forced_hidden(prompt_ids, tokens, null))

    # ---- differentiable log-probs ---------------------------------------------------------------
    def _hidden(self, rollout: Rollout, context: Context) -> torch.Tensor:
        """Hidden states predicting every image token: [B, T, D] (pos / neg) or [B, T, 2, D] (guided)."""
        pid = rollout.state["prompt_ids"].to(self.device)
        tok = rollout.tokens.to(self.device)
        if context in ("pos", "neg"):
            return self.teacher_forced_hidden(pid, tok, null=context == "neg")
        if context != "guided":
            raise ValueError(f"context must be pos, neg or guided, not {context!r}")
        b = tok.shape[0]
        null = torch.arange(2 * b, device=tok.device) >= b
        both = self.teacher_forced_hidden(torch.cat([pid, pid]), torch.cat([tok, tok]), null=null)
        return torch.stack([both[:b], both[b:]], dim=2)  # [B, T, 2, D]: cond, null

    def _to_logits(self, rollout: Rollout, context: Context):
        """Hidden chunk → temperature-scaled logits [B, t, K] of `context`."""
        temperature, scale = rollout.sampling.temperature, rollout.sampling.guidance_scale

        def to_logits(h: torch.Tensor) -> torch.Tensor:
            if context == "guided":
                return (
                    GUIDANCE[self.guidance](self.head(h[:, :, 0]), self.head(h[:, :, 1]), scale) / temperature
                )
            return self.head(h) / temperature

        return to_logits

    def logprobs(self, rollout: Rollout, context: Context = "pos") -> torch.Tensor:
        """log softmax(ℓ/T) at the sampled tokens [B, T], with gradient, in chunks over T."""
        return self.logprobs_and_dists(rollout, context)[0]

    def logprobs_and_dists(
        self, rollout: Rollout, context: Context = "pos"
    ) -> tuple[torch.Tensor, ChunkedDists]:
        """`logprobs` and the full distributions of the same forward (`ChunkedDists`, no gradient)."""
        hidden = self._hidden(rollout, context)
        to_logits = self._to_logits(rollout, context)
        K = self.config.codebook_size
        logp = chunked_logprobs(hidden, to_logits, rollout.tokens.to(hidden.device), K)
        return logp, ChunkedDists(hidden, to_logits, K)

    # ---- sampler (gpt-fast style) ---------------------------------------------------------------
    def prefill(self, prefix: torch.Tensor, cache) -> torch.Tensor:
        """Run the prefix [2B, P] into the cache; logits [2B, K] for the first image token."""
        if isinstance(cache, FusedLlamaDecoder):
            return self.head(cache.forward(prefix, 0))
        return self._logits(prefix, cache)[:, -1]

    def _feed_ids(self, token: torch.Tensor) -> torch.Tensor:
        """Sampled image tokens [B] → the embedding ids both CFG halves are fed [2B]."""
        return (token + self.image_offset).repeat(2)

    def decode_one_token(self, token: torch.Tensor, cache, position: int) -> torch.Tensor:
        """Feed the sampled token [B] at sequence `position` to both halves; logits [2B, K] for the
        next position."""
        x = self._feed_ids(token)[:, None]  # [2B, 1]
        if isinstance(cache, FusedLlamaDecoder):
            return self.head(cache.forward(x, position))
        return self._logits(x, cache)[:, -1]

    def decode_n_tokens(
        self,
        logits: torch.Tensor,
        cache,
        tokens: torch.Tensor,
        logps: torch.Tensor,
        sampling: SamplingParams,
        uniforms: torch.Tensor,
    ) -> None:
        """Fill the preallocated `tokens` [B, T] and `logps` [3, B, T] (pos, neg, guided) step by step."""
        for t in range(tokens.shape[1]):
            lc, lu = logits.chunk(2)
            tokens[:, t], lp = sample_step(lc, lu, sampling, uniforms[:, t], self.guidance)
            logps[:, :, t] = torch.stack([lp["pos"], lp["neg"], lp["guided"]])
            if t + 1 < tokens.shape[1]:
                logits = self.decode_one_token(tokens[:, t], cache, self.prefix_len + t)

    def decode_static(
        self, prompt_ids: torch.Tensor, sampling: SamplingParams, uniforms: torch.Tensor, mode: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`generate` through the run's static decode loop (policies/decode_loop.py; mode static, graph or
        compile): its decoder prefilled with the B prompts padded to the loop's rows → tokens [B, T],
        log-probs [3, B, T]. With `sampling.keep_cache` a copy of the prompts' cache rows is kept."""
        b, P, T = prompt_ids.shape[0], self.prefix_len, self.num_tokens
        loop = self.decode_session.loop(
            self.llama, self._feed_ids, self.head, self.guidance, rows=b, length=P + T - 1, steps=T, cfg=True
        )
        n, dev = loop.n, prompt_ids.device
        pid = pad_rows(prompt_ids, n)
        null = torch.arange(2 * n, device=dev) >= n
        logits = self.prefill(self.prefix(torch.cat([pid, pid]), null), loop.decoder)
        positions = torch.full((2 * n,), P, dtype=torch.long, device=dev)
        loop.begin(
            sampling,
            pad_rows(uniforms, n),
            positions,
            torch.ones(2 * n, P, dtype=torch.bool, device=dev),
            P,
            rows=b,
        )
        tokens, _, logps = loop.run(logits, mode)
        self.last_decode = loop.stats  # what ran: captures, replays (benchmarks, checks)
        if sampling.keep_cache:  # the next pass overwrites the loop's cache: keep the rows as [cond; null]
            mine = torch.arange(b, device=dev)
            self.kept_caches.keep(loop.decoder.fork(torch.cat([mine, mine + n])), self._weights_stamp())
        return tokens, logps

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        sampling: SamplingParams,
        uniforms: torch.Tensor,
        cache: CacheKind = "fused",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample image tokens for word ids [B, L] with uniforms [B, T] → (tokens [B, T], log-probs
        [3, B, T] of pos / neg / guided). ``cache`` picks the loop: "fused" (ours, the default; its decode
        loop eager or static as ``sampling.decode`` says), "static" / "dynamic" (transformers' layers and
        caches), "none" (the whole prefix recomputed each step; benchmarks)."""
        if not sampling.temperature > 0:
            raise UserError(f"temperature must be > 0, got {sampling.temperature}")
        b, t_len = prompt_ids.shape[0], self.num_tokens
        null = torch.arange(2 * b, device=prompt_ids.device) >= b
        prefix = self.prefix(torch.cat([prompt_ids, prompt_ids]), null)  # [2B, P]: cond rows, null rows
        tokens = torch.empty(b, t_len, dtype=torch.long, device=prompt_ids.device)
        logps = torch.empty(3, b, t_len, device=prompt_ids.device)
        uniforms = uniforms.to(prompt_ids.device)
        if cache == "none":
            seq = prefix
            for t in range(t_len):
                lc, lu = self._logits(seq)[:, -1].chunk(2)  # full recompute of [2B, P+t]
                tokens[:, t], lp = sample_step(lc, lu, sampling, uniforms[:, t], self.guidance)
                logps[:, :, t] = torch.stack([lp["pos"], lp["neg"], lp["guided"]])
                seq = torch.cat([seq, (tokens[:, t] + self.image_offset).repeat(2)[:, None]], dim=1)
            return tokens, logps
        mode = resolve_mode(sampling.decode, prompt_ids.device, cache == "fused", f"the {cache} cache")
        if mode != "eager":
            return self.decode_static(prompt_ids, sampling, uniforms, mode)
        from transformers import DynamicCache, StaticCache

        max_len = self.prefix_len + t_len - 1
        if cache == "fused":
            kv = FusedLlamaDecoder(self.llama, 2 * b, max_len)
        elif cache == "static":
            kv = StaticCache(config=self.llama.config, max_cache_len=max_len)
        else:
            kv = DynamicCache(config=self.llama.config)
        logits = self.prefill(prefix, kv)
        self.decode_n_tokens(logits, kv, tokens, logps, sampling, uniforms)
        if sampling.keep_cache and cache == "fused":
            self.kept_caches.keep(kv, self._weights_stamp())
        return tokens, logps

    def rollout(
        self,
        prompts: Sequence[PromptRecord],
        group_size: int,
        sampling: SamplingParams,
        generators: Sequence[torch.Generator],
    ) -> Rollout:
        """`group_size` samples per prompt, prompt i's samples contiguous (rows i·G … i·G+G−1)."""
        check_records(prompts, generators, "the ShapeWorld prior")
        pid = self.encode_prompts([p.text for p in prompts]).repeat_interleave(group_size, dim=0)  # [B·G, L]
        uniforms = group_uniforms(generators, group_size, (self.num_tokens,), self.device)  # [B·G, T]
        tokens, logps = self.generate(pid, sampling, uniforms)
        b = tokens.shape[0]
        state = {"prompt_ids": pid}
        if sampling.keep_cache:  # each row's place in the kept cache (`_continue`)
            state.update(
                cache_key=torch.full((b,), self.kept_caches.latest, dtype=torch.long),
                cache_row=torch.arange(b),
            )
        return Rollout(
            tokens=tokens,
            mask=torch.ones_like(tokens, dtype=torch.float),
            step=torch.arange(self.num_tokens, device=tokens.device).expand(b, -1),
            logp={"pos": logps[0], "neg": logps[1], "guided": logps[2]},
            prompts=[p for p in prompts for _ in range(group_size)],
            group_size=group_size,
            sampling=sampling,
            state=state,
        )

    def _weights_stamp(self) -> tuple[int, ...]:
        """Changes whenever the weights change (an optimizer step — the trainer's count of them, which FSDP2's
        gathers cannot hide —, a load): a kept cache is only valid for the weights that filled it."""
        weights = (self.head.weight, self.llama.embed_tokens.weight)
        return (self.decode_session.generation, *(x for p in weights for x in (p._version, p.data_ptr())))

    # ---- branched rollouts (docs/concepts/tree_credit.md#branched-rollouts) -----------------------
    def branch(
        self, rollout: Rollout, points: torch.Tensor, n: int, generators: Sequence[torch.Generator]
    ) -> Branches:
        """`n` continuations of every row from each of its branch points (token positions)."""
        return branched(rollout, points, n, generators, self._continue)

    def _continue(
        self,
        rollout: Rollout,
        root: torch.Tensor,
        point: torch.Tensor,
        generators: Sequence[torch.Generator],
        n: int,
    ) -> Rollout:
        """The continuations from t copy the first P + t slots of their root's KV cache (both CFG halves)
        and decode T − t tokens through the rollout's static loop (policies/decode_loop.py), in the rollout's
        precision, batched over every (root, c) that branches at the same t. The cache is the rollout's own
        where it was kept (`SamplingParams.keep_cache`, these weights), else one teacher-forced prefill of
        [prefix; root tokens] for all the roots."""
        dev, T, P, sampling = self.device, self.num_tokens, self.prefix_len, rollout.sampling
        roots = root.unique()  # sorted
        tok = rollout.tokens.to(dev)[roots]
        cache, rows = self.kept_caches.find(rollout, roots, self._weights_stamp())
        if cache is None:
            R = len(roots)
            pid = rollout.state["prompt_ids"].to(dev)[roots]
            null = torch.arange(2 * R, device=dev) >= R
            # [2R, P + t_max]: cond rows then null rows, each its prefix and the root's first t_max tokens
            seq = torch.cat(
                [
                    self.prefix(torch.cat([pid, pid]), null),
                    (tok[:, : int(point.max())] + self.image_offset).repeat(2, 1),
                ],
                1,
            )
            cache, rows = FusedLlamaDecoder(self.llama, 2 * R, bucket(P + T - 1)), torch.arange(R, device=dev)
            cache.forward(seq, 0)
        half = cache.rows // 2  # a cache's rows: cond rows, then null rows
        which = torch.searchsorted(roots, root).to(dev)  # continuation → root index in `roots`
        uniforms = continuation_uniforms(generators, (T,), dev)
        mode = continuation_mode(resolve_mode(sampling.decode, dev, True))
        N = len(root)
        tokens = torch.zeros(N, T, dtype=torch.long, device=dev)
        logps = torch.zeros(3, N, T, device=dev)
        boi = torch.full((N,), self.tokenizer.boi_id, dtype=torch.long, device=dev)
        for t in point.unique().tolist():
            pick = (point == t).nonzero(as_tuple=True)[0].to(dev)
            r, m = which[pick], len(pick)
            fork = cache.fork(torch.cat([rows[r], rows[r] + half]))
            # logits of position t: re-feed the prefix's last input (token t − 1, or <boi>) at its own slot
            last = tok[r, t - 1] + self.image_offset if t else boi[:m]
            logits = self.head(fork.forward(last.repeat(2)[:, None], P + t - 1))
            # then the rollout's static loop from token t (slots ≥ P + t masked: the root's later tokens)
            loop = StaticDecodeLoop(fork, self._feed_ids, self.head, self.guidance, T, cfg=True)
            filled = torch.ones(2 * m, P + t, dtype=torch.bool, device=dev)
            loop.begin(
                sampling, uniforms[pick], torch.full((2 * m,), P + t, device=dev), filled, P + t, start=t
            )
            got, _, lp = loop.run(logits, mode)
            tokens[pick, t:], logps[:, pick, t:] = got[:, t:], lp[:, :, t:]
        new = dict(zip(CONTEXTS, logps))
        return assemble(rollout, root, point, new, tokens, torch.ones(N, T, device=dev))

    # ---- images ---------------------------------------------------------------------------------
    def decode(self, rollout: Rollout) -> torch.Tensor:
        """Images [B, 3, H, W] in [0, 1]."""
        return self.vq.decode(rollout.tokens.to(self.device))

    def token_features(self, rollout: Rollout) -> torch.Tensor:
        """VQ codebook vectors of the sampled tokens [B, T, D] (STAGE and critical-token credit)."""
        return self.vq.code_embeddings(rollout.tokens.to(self.device))

    # ---- persistence ----------------------------------------------------------------------------
    def keep_reveal_order(self, order: str) -> None:
        raise ValueError("the autoregressive prior has no reveal order")

    def keep_full_precision(self) -> None:
        """Save weights in float32 from now on (`config.storage_dtype`, float16 for shipping)."""
        self.config.storage_dtype = "float32"

    def save_pretrained(self, path: str) -> None:
        """``path/model_index.json``, ``path/prior/{config.json, model.safetensors, vocab.json}``,
        ``path/vq/{config.json, model.safetensors}``; weights stored in ``config.storage_dtype``."""
        save_prior_folder(self, path, "t2i_gcpo_ar", "ar")

    @classmethod
    def from_pretrained(cls, path: str) -> ARPolicy:
        """Load a `save_pretrained` folder. Every way a file can be missing, misplaced (a folder where a
        file belongs), truncated, malformed or hold NaN/inf weights is a `UserError` naming the file."""
        return load_prior_folder(path, "t2i_gcpo_ar", ARConfig, "an AR policy", cls)


def resolve_checkpoint(path: str, name: str | None = None) -> str:
    """`path` if it is a directory (a shipped name is resolved to its folder by the family registration,
    policies/families/ar.py); `name` is what the user wrote, for the error."""
    name = name or path
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"model {name!r}: {path} is a file, expected a checkpoint directory")
    if not os.path.isdir(path):
        raise UserError(f"model {name!r}: no such directory {path}")
    return path


def load_policy(path: str, name: str | None = None) -> ARPolicy:
    """Load an `ARPolicy.save_pretrained` directory (the shipped priors are such directories)."""
    path = resolve_checkpoint(path, name)
    if not os.path.isfile(os.path.join(path, "model_index.json")):
        raise UserError(f"{path} is not a t2i-gcpo checkpoint (no model_index.json)")
    return ARPolicy.from_pretrained(path)


class KeptCaches:
    """The KV caches of the last few rollouts that asked to keep theirs (`SamplingParams.keep_cache`), so
    continuations of their samples skip the prefill (docs/concepts/tree_credit.md#branched-rollouts). A cache
    serves only the weights that filled it; the oldest goes when `KEEP` are held."""

    KEEP = 4  # a step's dynamic-sampling rounds

    def __init__(self) -> None:
        self.caches: dict[int, tuple[FusedLlamaDecoder, tuple]] = {}
        self.latest = -1

    def keep(self, decoder: FusedLlamaDecoder, stamp: tuple) -> int:
        self.caches = {k: v for k, v in self.caches.items() if v[1] == stamp}  # older weights: stale
        self.latest += 1
        self.caches[self.latest] = (decoder, stamp)
        while len(self.caches) > self.KEEP:
            del self.caches[min(self.caches)]
        return self.latest

    def find(
        self, rollout: Rollout, roots: torch.Tensor, stamp: tuple
    ) -> tuple[FusedLlamaDecoder | None, torch.Tensor]:
        """(the kept cache holding every one of `roots`, their rows in it), or (None, None)."""
        keys = rollout.state.get("cache_key")
        if keys is None:
            return None, None
        keys = keys[roots.to(keys.device)]
        entry = self.caches.get(int(keys[0]))
        if entry is None or entry[1] != stamp or not bool((keys == keys[0]).all()):
            return None, None
        decoder = entry[0]
        return decoder, rollout.state["cache_row"][roots.to(keys.device)].to(decoder.kv[0].device)
