"""Any local transformers causal LM (``AutoModelForCausalLM`` + ``AutoTokenizer``) as a text `Policy`.

Contexts: the prompt through the tokenizer's chat template (c⁺) and GCPO's negative context c⁻
(``empty``, ``wrong_answer`` or a ``{question}`` template; docs/concepts/credit.md#gcpo). Sampling is one
static-KV-cache loop over left-padded prompts, each sample drawn from its prompt's own generator;
without guidance the negative context is scored afterwards in one teacher-forced pass, and only when
a credit scheme reads it.
Details: docs/concepts/adapters.md#text.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from t2i_gcpo.errors import UserError, shorten
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
from t2i_gcpo.policies.branching import assemble, branched, continuation_uniforms, passes
from t2i_gcpo.policies.decode_loop import (
    DecodeSession,
    StaticDecodeLoop,
    bucket,
    continuation_mode,
    pad_rows,
    resolve_mode,
)
from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder, supports_model
from t2i_gcpo.policies.sampling import (
    GUIDANCE,
    ChunkedDists,
    chunked_logprobs,
    eval_mode,
    group_uniforms,
    sample_step,
)

NEGATIVE_MODES = ("empty", "wrong_answer")
WRONG_ANSWER_INSTRUCTION = "Note: Intentionally generate an incorrect answer."
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
Features = Literal["hidden", "embedding"]


def _is_template(spec: str) -> bool:
    return "{question}" in spec


def _check_template(spec: str) -> None:
    try:
        spec.format(question="")
    except (KeyError, IndexError, ValueError) as e:
        raise UserError(
            f"negative template {spec!r} does not format with only {{question}} "
            f"({type(e).__name__}: {e}); write literal braces as {{{{ and }}}}"
        ) from None


@contextlib.contextmanager
def quiet_hub_bars() -> Iterator[None]:
    """Silence transformers' per-load progress bars ("Loading weights", "Writing model shards"): a
    tiny model loads in milliseconds, and the bars would interleave with the training bar."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


class TextPolicy(LogprobsForward, nn.Module):
    """Policy protocol (t2i_gcpo.policies.base) for a local causal language model.

    ``forward`` is ``logprobs`` so that DDP/accelerate wrapping synchronises gradients.
    """

    output = "text"
    guidance = "u + s(c − u)"
    layout = TokenLayout("sequence")

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        negative: str = "empty",
        wrong_answer_instruction: str = WRONG_ANSWER_INSTRUCTION,
        max_new_tokens: int = 256,
        eos_token_ids: Sequence[int] | None = None,
        features: Features = "hidden",
        default_task: str = "arithmetic",
        max_rollout_batch: int | None = None,
        gradient_checkpointing: bool = False,
        disable_dropout: bool = True,
        fused_sampler: bool = True,
    ):
        super().__init__()
        self.model = model  # a *ForCausalLM
        self.tokenizer = tokenizer
        if negative not in NEGATIVE_MODES and not _is_template(negative):
            raise UserError(
                f"negative context {negative!r}: use 'empty', 'wrong_answer' or a user template "
                "containing {question}"
            )
        if _is_template(negative):
            _check_template(negative)
        if features not in ("hidden", "embedding"):
            raise UserError(f"features must be 'hidden' or 'embedding', not {features!r}")
        if max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
        self.negative = negative  # the default negative context (docs/concepts/credit.md#gcpo)
        self.wrong_answer_instruction = wrong_answer_instruction
        self.max_new_tokens = int(max_new_tokens)  # used when SamplingParams.max_new_tokens is None
        # False: sample through transformers' layers even for a plain Llama
        self.fused_sampler = fused_sampler
        self.features = features  # token_features: last hidden state at each token, or its input embedding
        self.default_task = default_task
        self.max_rollout_batch = max_rollout_batch  # rows per sampling pass (None: all at once)
        self.chat_template = getattr(tokenizer, "chat_template", None)
        self.decode_session = DecodeSession()  # the static decode loop, kept between passes

        gc = getattr(model, "generation_config", None)
        eos = eos_token_ids if eos_token_ids is not None else getattr(gc, "eos_token_id", None)
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if tokenizer.eos_token_id is not None and eos_token_ids is None:
            eos.append(tokenizer.eos_token_id)
        self.eos_ids = sorted(set(eos))  # a row stops at the first of these
        pad = (
            tokenizer.pad_token_id
            if tokenizer.pad_token_id is not None
            else getattr(gc, "pad_token_id", None)
        )
        self.pad_id = pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0)  # never attended
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self.start_id = start  # the context of an otherwise empty prompt
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if disable_dropout:  # as TRL's disable_dropout: π_θ = π_old exactly before the first update
            for mod in model.modules():
                if isinstance(mod, nn.Dropout):
                    mod.p = 0.0
        self.train(model.training)  # the wrapper starts in the model's mode (rollout restores it)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device = "cpu",
        **kwargs: Any,
    ) -> TextPolicy:
        """Load a LOCAL transformers causal-LM folder (config.json, weights, tokenizer files).
        `kwargs` go to the constructor (negative, max_new_tokens, gradient_checkpointing, …);
        max_new_tokens defaults to the checkpoint's generation_config.max_new_tokens when it sets one."""
        if isinstance(dtype, str):
            if dtype not in DTYPES:
                raise UserError(f"unknown dtype '{dtype}' for a text model: use one of {', '.join(DTYPES)}")
            dtype = DTYPES[dtype]
        path = Path(path).expanduser()
        if not path.is_dir():
            raise UserError(f"text model '{path}' is not a directory")
        if not (path / "config.json").is_file():
            raise UserError(f"'{path}' is not a transformers checkpoint: no config.json found")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from t2i_gcpo.weights import check_weight_files, custom_code_refusal

        check_weight_files(path)  # the loading check of every family: readable, number dtypes, finite
        try:  # trust_remote_code=False: a checkpoint's own code never runs
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        except Exception as e:  # any failure means: no usable tokenizer there
            raise custom_code_refusal(path, e) or UserError(
                f"no tokenizer found in '{path}' ({type(e).__name__}: {e})"
            ) from None
        try:
            with quiet_hub_bars():
                model = AutoModelForCausalLM.from_pretrained(
                    path, dtype=dtype, trust_remote_code=False, use_safetensors=True
                )
        except (ValueError, OSError, KeyError, RuntimeError) as e:
            msg = " ".join(str(e).split())[:300]
            raise custom_code_refusal(path, e) or UserError(
                f"'{path}' is not a causal language model checkpoint: {msg}"
            ) from None
        limit = getattr(getattr(model, "generation_config", None), "max_new_tokens", None)
        if limit and "max_new_tokens" not in kwargs:  # the checkpoint's own completion limit
            kwargs["max_new_tokens"] = int(limit)
        return cls(model.to(device), tokenizer, **kwargs).eval()

    def keep_reveal_order(self, order: str) -> None:
        raise ValueError("a text model has no reveal order")

    def keep_full_precision(self) -> None:
        """Nothing to do: the weights are saved in their own dtype."""

    def save_pretrained(self, path: str | Path) -> None:
        """The model (config, weights, generation config) and the tokenizer, reloadable with
        ``TextPolicy.from_pretrained(path)`` or ``AutoModelForCausalLM.from_pretrained(path)``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        with quiet_hub_bars():
            self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    @property
    def samples_fused(self) -> bool:
        """Whether rollouts run through our fused Llama loop (asked for, and a plain Llama model)."""
        return self.fused_sampler and supports_model(self.model.base_model)

    @property
    def capabilities(self) -> PolicyCapabilities:
        """bf16 sampling (rollout.autocast='auto' where native) through the fused decoder only:
        transformers' StaticCache under CPU autocast fails on torch 2.15 (cache float32, keys bf16)."""
        return PolicyCapabilities(bf16_sampling=self.samples_fused, branching=True)

    # ------------------------------------------------------------------ contexts
    @property
    def device(self) -> torch.device:
        return self.model.get_output_embeddings().weight.device

    @property
    def vocab_size(self) -> int:
        """V: the width of the logits (may exceed len(tokenizer) when the embedding is padded)."""
        return self.model.get_output_embeddings().weight.shape[0]

    def default_sampling(self) -> SamplingParams:
        """Untruncated sampling at T = 1 (the policy itself), no guidance, the adapter's length limit."""
        return SamplingParams(max_new_tokens=self.max_new_tokens)

    def check_prompts(self, prompts: list[str]) -> None:
        bad = [p for p in prompts if not isinstance(p, str)]
        if bad:
            raise UserError(f"text prompts must be strings, got {bad[:3]!r}")
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if unk is None or not prompts:
            return
        unknown, first = set(), None
        for p, ids in zip(prompts, self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]):
            if unk in ids:  # byte-level BPE never yields <unk>: words are looked at only when needed
                first = first or p
                unknown.update(
                    w for w in p.split() if unk in self.tokenizer(w, add_special_tokens=False)["input_ids"]
                )
        if unknown:
            raise UserError(
                f"the model's tokenizer cannot express {', '.join(sorted(unknown))} "
                f"(first in prompt {shorten(first)!r})"
            )

    def format_prompt(self, user: str) -> str:
        """The text the model is conditioned on for user message `user` (chat template or raw)."""
        if not self.chat_template:
            return user
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], add_generation_prompt=True, tokenize=False
        )

    def context_ids(self, user: str) -> list[int]:
        """Token ids of the context for user message `user`, never empty."""
        text = self.format_prompt(user)
        ids = list(self.tokenizer(text, add_special_tokens=not self.chat_template)["input_ids"])
        if not ids:
            if self.start_id is None:
                raise UserError("the context is empty and the tokenizer has neither a BOS nor an EOS token")
            ids = [self.start_id]
        return ids

    def negative_user(self, prompt: str, spec: str | None = None) -> str:
        """The user message of the negative context for `prompt` under `spec` (default: the
        constructor's): '' (empty), prompt + instruction (wrong_answer), a filled template, or `spec`
        itself (a literal negative message)."""
        spec = self.negative if spec is None else spec
        if spec == "empty":
            return ""
        if spec == "wrong_answer":
            return f"{prompt}\n{self.wrong_answer_instruction}"
        if _is_template(spec):
            _check_template(spec)
            return spec.format(question=prompt)
        return spec

    def negative_ids(self, record: PromptRecord) -> list[int]:
        return self.context_ids(self.negative_user(record.text, record.negative))

    def pad_left(self, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-pad id lists with the pad id → (ids [N, L] long, attention mask [N, L] long)."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = torch.as_tensor(list(r), dtype=torch.long)
            mask[i, width - len(r) :] = 1
        return ids.to(self.device), mask.to(self.device)

    # ------------------------------------------------------------------ model pieces
    def _backbone(
        self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any = None
    ) -> torch.Tensor:
        """Last hidden states [N, S, D] of the decoder (KV cache `cache` filled in place if given)."""
        out = self.model.base_model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=cache,
            use_cache=cache is not None,
        )
        return out.last_hidden_state

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [..., D] → the model's next-token logits [..., V] in float32."""
        z = self.model.get_output_embeddings()(hidden).float()
        scale = getattr(self.model, "logit_scale", None)  # Cohere multiplies the logits by a constant
        if isinstance(scale, (int, float)):
            z = z * scale
        cap = getattr(self.model.config, "final_logit_softcapping", None)  # Gemma 2 / 3
        if cap:
            z = torch.tanh(z / cap) * cap
        return z

    # ------------------------------------------------------------------ sampling (gpt-fast style)
    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, cache: Any) -> torch.Tensor:
        """Run the left-padded contexts [N, L] into the cache; logits [N, V] of the first token."""
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        if isinstance(cache, FusedLlamaDecoder):
            return self._head(cache.forward(ids, 0, positions=pos, key_mask=mask.bool()))
        return self._head(self._backbone(ids, mask, pos, cache)[:, -1])

    def decode_one_token(
        self, tok: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Feed one token per row [N] at positions `pos` [N] (mask: all keys so far); logits [N, V]."""
        if isinstance(cache, FusedLlamaDecoder):
            slot = mask.shape[1] - 1
            return self._head(cache.forward(tok[:, None], slot, positions=pos[:, None], key_mask=mask.bool()))
        return self._head(self._backbone(tok[:, None], mask, pos[:, None], cache)[:, -1])

    def new_cache(self, rows: int, max_len: int) -> Any:
        """The sampler's KV cache: our fused Llama loop where the model is a plain Llama
        (policies/fused_llama.py; the shipped arithmetic LM), else transformers' StaticCache."""
        from transformers import StaticCache

        if self.samples_fused:
            return FusedLlamaDecoder(self.model.base_model, rows, max_len)
        return StaticCache(config=self.model.config, max_cache_len=max_len)

    def decode_n_tokens(
        self,
        rows: Sequence[Sequence[int]],
        sampling: SamplingParams,
        uniforms: torch.Tensor,
        neg_rows: Sequence[Sequence[int]] | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Sample up to n = uniforms.shape[1] tokens for N contexts; with `neg_rows`, guided sampling
        over the doubled batch [c⁺; c⁻]. → tokens [N, n] (pad after EOS), mask [N, n], and the log-probs
        pos, neg (zeros without guidance), guided, each [N, n] (0 at padding)."""
        n_rows, steps = uniforms.shape
        guided = neg_rows is not None
        mode = resolve_mode(sampling.decode, self.device, self.samples_fused, "not a plain Llama model")
        ids, mask = self.pad_left(list(rows) + list(neg_rows) if guided else rows)  # [N or 2N, L]
        if mode != "eager":
            return self._decode_static(ids, mask, sampling, uniforms, guided, mode)
        width = ids.shape[1]
        cache = self.new_cache(ids.shape[0], width + steps)
        full_mask = torch.cat([mask, mask.new_ones(mask.shape[0], steps)], dim=1)  # [N', L + n]
        next_pos = mask.sum(-1)  # [N'] position of the first sampled token
        tokens = torch.full((n_rows, steps), self.pad_id, dtype=torch.long, device=ids.device)
        valid = torch.zeros((n_rows, steps), device=ids.device)
        logps = torch.zeros((3, n_rows, steps), device=ids.device)  # pos, neg, guided
        done = torch.zeros(n_rows, dtype=torch.bool, device=ids.device)
        eos = torch.as_tensor(self.eos_ids, dtype=torch.long, device=ids.device)

        logits = self.prefill(ids, mask, cache)
        for t in range(steps):
            pos_logits, neg_logits = logits.chunk(2) if guided else (logits, None)
            tok, lp = sample_step(pos_logits, neg_logits, sampling, uniforms[:, t], self.guidance)
            live = ~done
            tokens[:, t] = torch.where(live, tok, self.pad_id)
            valid[:, t] = live.float()
            for k, name in enumerate(("pos", "neg", "guided")):
                if name in lp:
                    logps[k, :, t] = torch.where(live, lp[name], 0.0)
            done = done | torch.isin(tok, eos)
            if bool(done.all()) or t + 1 == steps:
                break
            feed = tokens[:, t].repeat(2) if guided else tokens[:, t]
            logits = self.decode_one_token(feed, full_mask[:, : width + t + 1], next_pos + t, cache)
        return tokens, valid, logps[0], logps[1], logps[2]

    def _feed_guided(self, tok: torch.Tensor) -> torch.Tensor:
        """Sampled tokens [N] → what both contexts [c⁺; c⁻] are fed [2N]."""
        return tok.repeat(2)

    def _decode_static(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        sampling: SamplingParams,
        uniforms: torch.Tensor,
        guided: bool,
        mode: str,
    ) -> tuple[torch.Tensor, ...]:
        """`decode_n_tokens` through the run's static decode loop (policies/decode_loop.py; mode static, graph
        or compile), from the left-padded contexts `ids` / `mask` [N', L] (N' = 2N guided: c⁺ rows, c⁻ rows),
        padded to the loop's rows."""
        (n, steps), width = uniforms.shape, ids.shape[1]
        eos = torch.as_tensor(self.eos_ids, dtype=torch.long, device=ids.device)
        feed = self._feed_guided if guided else torch.Tensor.clone
        loop = self.decode_session.loop(
            self.model.base_model,
            feed,
            self._head,
            self.guidance,
            rows=n,
            length=width + steps,
            steps=steps,
            cfg=guided,
            eos=eos,
            pad_id=self.pad_id,
        )
        halves = (ids.chunk(2), mask.chunk(2)) if guided else ((ids,), (mask,))
        ids, mask = (torch.cat([pad_rows(h, loop.n) for h in x]) for x in halves)
        logits = self.prefill(ids, mask, loop.decoder)
        loop.begin(sampling, pad_rows(uniforms, loop.n), mask.sum(-1), mask.bool(), width, rows=n)
        tokens, valid, logps = loop.run(logits, mode)
        self.last_decode = loop.stats  # what ran: captures, replays (benchmarks, checks)
        return tokens, valid, logps[0], logps[1], logps[2]

    @torch.no_grad()
    def rollout(
        self,
        prompts: Sequence[PromptRecord],
        group_size: int,
        sampling: SamplingParams,
        generators: Sequence[torch.Generator],
    ) -> Rollout:
        """`group_size` completions per prompt (rows i·G … i·G+G−1). Prompt i's uniforms come from
        generators[i] alone. ``state``: ``prompt_ids`` / ``negative_ids`` (unpadded id lists per row),
        what `logprobs` rebuilds both contexts from."""
        if len(generators) != len(prompts):
            raise ValueError(f"need one generator per prompt, got {len(generators)} for {len(prompts)}")
        self.check_prompts([p.text for p in prompts])
        if not sampling.temperature > 0:
            raise UserError(f"temperature must be > 0, got {sampling.temperature}")
        steps = sampling.max_new_tokens if sampling.max_new_tokens is not None else self.max_new_tokens
        if steps < 1:
            raise UserError(f"max_new_tokens must be ≥ 1, got {steps}")
        guided = sampling.guidance_scale != 1.0
        rows = [p for p in prompts for _ in range(group_size)]  # [B = P·G]
        pos_ids = [ids for p in prompts for ids in [self.context_ids(p.text)] * group_size]
        neg_ids = [ids for p in prompts for ids in [self.negative_ids(p)] * group_size]
        uniforms = group_uniforms(generators, group_size, (steps,), self.device)  # [B, n]
        chunk = self.max_rollout_batch or max(len(rows), 1)
        parts = []
        with eval_mode(self):
            for s in range(0, len(rows), chunk):
                sl = slice(s, s + chunk)
                parts.append(
                    self.decode_n_tokens(pos_ids[sl], sampling, uniforms[sl], neg_ids[sl] if guided else None)
                )
        tokens, mask, lp_pos, lp_neg, lp_guided = (torch.cat(x) for x in zip(*parts))
        width = int(mask.sum(0).nonzero().max()) + 1  # T_max: the longest completion
        tokens, mask, lp_pos, lp_neg, lp_guided = (
            x[:, :width] for x in (tokens, mask, lp_pos, lp_neg, lp_guided)
        )
        ro = Rollout(
            tokens=tokens,
            mask=mask,
            step=torch.arange(width, device=tokens.device).expand(len(rows), -1),
            # unguided, the sampler's neg row is zeros: c⁻ is only scored, below, where it is asked for
            logp={"pos": lp_pos, "guided": lp_guided, **({"neg": lp_neg} if guided else {})},
            prompts=rows,
            group_size=group_size,
            sampling=sampling,
            max_len=steps,
            state={"prompt_ids": pos_ids, "negative_ids": neg_ids},
        )
        if not guided and sampling.score_negative:  # score the completions under c⁻: one batched forward
            with eval_mode(self):
                ro.logp["neg"] = torch.cat(
                    [
                        self.logprobs(ro.select(range(s, min(s + chunk, len(rows)))), "neg")
                        for s in range(0, len(rows), chunk)
                    ]
                )
        return ro

    # ------------------------------------------------------------------ branched rollouts
    def branch(
        self, rollout: Rollout, points: torch.Tensor, n: int, generators: Sequence[torch.Generator]
    ) -> Branches:
        """`n` continuations of every completion from each of its branch points (token positions;
        docs/concepts/tree_credit.md#branched-rollouts)."""
        return branched(rollout, points, n, generators, self._continue)

    def _continue(
        self,
        rollout: Rollout,
        root: torch.Tensor,
        point: torch.Tensor,
        generators: Sequence[torch.Generator],
        n: int,
    ) -> Rollout:
        """A fused prefill per root shared by its continuations (`_continue_fused`), or (other
        architectures) the prefix re-run for every continuation through `decode_n_tokens`, one batched
        prefill per pass."""
        sampling, steps, dev = rollout.sampling, rollout.max_len, self.device
        guided = sampling.guidance_scale != 1.0
        uniforms = continuation_uniforms(generators, (steps,), dev)
        N = len(root)
        tokens = torch.full((N, steps), self.pad_id, dtype=torch.long, device=dev)
        valid = torch.zeros(N, steps, device=dev)
        logps = torch.zeros(3, N, steps, device=dev)
        pos_ids, neg_ids = rollout.state["prompt_ids"], rollout.state["negative_ids"]
        root_tok = rollout.tokens.to(dev)
        with eval_mode(self):
            if self.samples_fused:
                self._continue_fused(rollout, root, point, uniforms, tokens, valid, logps)
            else:
                for t, rows in passes(point, self.max_rollout_batch):
                    prefix = [list(pos_ids[b]) + root_tok[b, :t].tolist() for b in root[rows].tolist()]
                    neg = [list(neg_ids[b]) + root_tok[b, :t].tolist() for b in root[rows].tolist()]
                    out = self.decode_n_tokens(
                        prefix, sampling, uniforms[rows.to(dev), t:], neg if guided else None
                    )
                    tokens[rows, t:], valid[rows, t:] = out[0], out[1]
                    logps[:, rows, t:] = torch.stack(out[2:])
        new = {"pos": logps[0], "guided": logps[2], **({"neg": logps[1]} if guided else {})}
        ro = assemble(rollout, root, point, new, tokens, valid)
        width = int(ro.mask.sum(0).nonzero().max()) + 1  # the longest continuation, as `rollout` trims
        ro = dataclasses.replace(
            ro,
            tokens=ro.tokens[:, :width],
            mask=ro.mask[:, :width],
            step=ro.step[:, :width],
            logp={c: v[:, :width] for c, v in ro.logp.items()},
        )
        if "neg" in rollout.logp and not guided:  # as the rollout: c⁻ scored by teacher forcing
            with eval_mode(self):
                ro.logp["neg"] = self.logprobs(ro, "neg")
        return ro

    def _continue_fused(
        self,
        rollout: Rollout,
        root: torch.Tensor,
        point: torch.Tensor,
        uniforms: torch.Tensor,
        tokens: torch.Tensor,
        valid: torch.Tensor,
        logps: torch.Tensor,
    ) -> None:
        """Fill tokens / valid / logps [3, N, steps] from positions ≥ point: every root's contexts (c⁺, and c⁻
        when guided) are left-padded to one width W, its tokens follow, so position t sits at cache slot
        W + t in every row and the continuations of one t step together."""
        sampling, steps, dev = rollout.sampling, rollout.max_len, self.device
        guided = sampling.guidance_scale != 1.0
        roots = root.unique()
        R, t_max = len(roots), int(point.max())
        ctx = [list(rollout.state["prompt_ids"][b]) for b in roots.tolist()]
        if guided:
            ctx += [list(rollout.state["negative_ids"][b]) for b in roots.tolist()]
        ids, ctx_mask = self.pad_left(ctx)  # [R', W]
        W = ids.shape[1]
        root_tok = rollout.tokens.to(dev)[roots][:, :t_max]
        root_tok = root_tok.repeat(2, 1) if guided else root_tok
        seq = torch.cat([ids, root_tok], dim=1)  # [R', W + t_max]
        full_mask = torch.cat([ctx_mask, ctx_mask.new_ones(len(ctx), steps)], dim=1).bool()  # [R', W + steps]
        positions = (full_mask.long().cumsum(-1) - 1).clamp(min=0)
        decoder = FusedLlamaDecoder(self.model.base_model, len(ctx), bucket(W + steps))  # the rollout's spans
        decoder.forward(seq, 0, positions=positions[:, : seq.shape[1]], key_mask=full_mask[:, : seq.shape[1]])
        which = torch.searchsorted(roots, root).to(dev)
        eos = torch.as_tensor(self.eos_ids, dtype=torch.long, device=dev)
        feed = self._feed_guided if guided else torch.Tensor.clone
        mode = continuation_mode(resolve_mode(sampling.decode, dev, True))
        for t, rows in passes(point, self.max_rollout_batch):
            rows = rows.to(dev)
            r = which[rows]
            src = torch.cat([r, r + R]) if guided else r
            cache = decoder.fork(src)
            mask, pos = full_mask[src], positions[src]
            slot = W + t - 1  # re-feed the prefix's last input to get position t's logits
            logits = self._head(
                cache.forward(
                    seq[src, slot : slot + 1],
                    slot,
                    positions=pos[:, slot : slot + 1],
                    key_mask=mask[:, : slot + 1],
                )
            )
            # then the rollout's static loop from token t (slots ≥ W + t masked: the root's later tokens)
            loop = StaticDecodeLoop(
                cache, feed, self._head, self.guidance, steps, cfg=guided, eos=eos, pad_id=self.pad_id
            )
            loop.begin(sampling, uniforms[rows], pos[:, W + t], mask[:, : W + t], W + t, start=t)
            got, ok, lp = loop.run(logits, mode)
            tokens[rows, t:], valid[rows, t:], logps[:, rows, t:] = got[:, t:], ok[:, t:], lp[:, :, t:]

    # ------------------------------------------------------------------ teacher forcing
    def _hidden(
        self, rows: Sequence[Sequence[int]], tokens: torch.Tensor, shift: bool = True
    ) -> torch.Tensor:
        """Hidden states [N, T, D] over [context; tokens]: predicting each token (``shift``) or at
        each token itself (``shift=False``). Completion positions are all attended (padding after EOS
        comes after every valid token, so causality keeps it out of their predictions)."""
        ids, mask = self.pad_left(rows)  # [N, L]
        width, steps = ids.shape[1], tokens.shape[1]
        seq = tokens[:, :-1] if shift else tokens
        full_mask = torch.cat([mask, mask.new_ones(mask.shape[0], seq.shape[1])], dim=1)
        pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self._backbone(torch.cat([ids, seq], dim=1), full_mask, pos)
        start = width - 1 if shift else width
        return hidden[:, start : start + steps]

    def _context_rows(self, rollout: Rollout, context: str) -> list[list[int]]:
        return rollout.state["prompt_ids" if context == "pos" else "negative_ids"]

    def logprobs(self, rollout: Rollout, context: Context = "pos") -> torch.Tensor:
        """Teacher-forced log π(y_t | context, y_<t) at temperature T, with gradient, chunked over T;
        0 at padding. [B, T]."""
        return self.logprobs_and_dists(rollout, context)[0]

    def logprobs_and_dists(
        self, rollout: Rollout, context: Context = "pos"
    ) -> tuple[torch.Tensor, ChunkedDists]:
        """`logprobs` and the full distributions of the same forward (`ChunkedDists`:
        temperature-scaled logits [B, t, V] per chunk, no gradient)."""
        if context not in ("pos", "neg", "guided"):
            raise ValueError(f"context must be pos, neg or guided, got {context!r}")
        tokens = rollout.tokens.to(self.device)  # [B, T]
        mask = rollout.mask.to(self.device)
        temperature, scale = rollout.sampling.temperature, rollout.sampling.guidance_scale
        if context == "guided" and scale == 1.0:
            context = "pos"  # u + 1·(c − u) = c
        if context == "guided":
            rows = list(rollout.state["prompt_ids"]) + list(rollout.state["negative_ids"])
            hidden = torch.stack(self._hidden(rows, tokens.repeat(2, 1)).chunk(2), dim=2)  # [B, T, 2, D]

            def to_logits(h: torch.Tensor) -> torch.Tensor:
                return (
                    GUIDANCE[self.guidance](self._head(h[:, :, 0]), self._head(h[:, :, 1]), scale)
                    / temperature
                )
        else:
            hidden = self._hidden(self._context_rows(rollout, context), tokens)  # [B, T, D]

            def to_logits(h: torch.Tensor) -> torch.Tensor:
                return self._head(h) / temperature

        logp = chunked_logprobs(hidden, to_logits, tokens, self.vocab_size).masked_fill(mask == 0, 0.0)
        return logp, ChunkedDists(hidden, to_logits, self.vocab_size)

    # ------------------------------------------------------------------ outputs
    @torch.no_grad()
    def token_features(self, rollout: Rollout) -> torch.Tensor:
        """Per-token features [B, T, D] in float32, 0 at padding, for STAGE / critical credit: the last
        hidden state at each completion token under c⁺ (``features="hidden"``) or its input embedding."""
        tokens = rollout.tokens.to(self.device)
        if self.features == "embedding":
            feats = self.model.get_input_embeddings()(tokens)
        else:
            feats = self._hidden(rollout.state["prompt_ids"], tokens, shift=False)
        return feats.float() * rollout.mask.to(self.device)[..., None]

    def decode(self, rollout: Rollout) -> list[str]:
        """The B completions as strings (valid tokens only, special tokens skipped)."""
        valid = [row[m > 0].tolist() for row, m in zip(rollout.tokens.cpu(), rollout.mask.cpu())]
        return self.tokenizer.batch_decode(valid, skip_special_tokens=True)
