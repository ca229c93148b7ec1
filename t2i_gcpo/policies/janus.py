"""Janus / Janus-Pro adapter over transformers' `JanusForConditionalGeneration`.

transformers' image `generate` runs without gradient and returns only the last step's scores, so this
adapter adds a batched KV-cache CFG sampler over one doubled batch [cond; null] that records each
token's conditional, unconditional and guided log-probs, and a teacher-forced `logprobs` with gradient.
The null branch (GCPO's c⁻) is built exactly as transformers' CFG path builds it
(docs/concepts/credit.md#gcpo).
Details: docs/concepts/adapters.md#janus.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
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
from t2i_gcpo.policies.branching import CONTEXTS, assemble, branched, continuation_uniforms, passes
from t2i_gcpo.policies.decode_loop import (
    DecodeSession,
    StaticDecodeLoop,
    bucket,
    continuation_mode,
    pad_rows,
    resolve_mode,
)
from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder, supports_model
from t2i_gcpo.policies.lora import add_lora_option, merged_state_dict
from t2i_gcpo.policies.sampling import (
    GUIDANCE,
    ChunkedDists,
    check_records,
    chunked_logprobs,
    eval_mode,
    group_uniforms,
    sample_step,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FREEZE_GROUPS = ("vision", "vq", "language", "generation")
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
FALLBACK_TEMPLATE = "<|User|>: {prompt}\n\n<|Assistant|>:"  # Janus-Pro's T2I format, if no chat template


def _read_config(path: Path) -> dict:
    """config.json of `path`, with a UserError for anything that is not a Janus checkpoint."""
    if not path.exists():
        raise UserError(f"Janus checkpoint '{path}' does not exist")
    cfg_file = path / "config.json"
    if not path.is_dir() or not cfg_file.is_file():
        raise UserError(f"'{path}' is not a Janus checkpoint: no config.json found")
    from t2i_gcpo.outdir import read_json

    try:
        cfg = read_json(cfg_file, follow=True)  # a model cache links its files
    except UserError as e:
        raise UserError(f"'{path}' is not a Janus checkpoint: config.json unreadable ({e})") from None
    if not isinstance(cfg, dict):
        raise UserError(f"'{path}' is not a Janus checkpoint: config.json holds a {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    if model_type != "janus":
        hint = ""
        if model_type == "multi_modality":
            hint = (
                " — this is DeepSeek's original format; convert it with transformers' "
                "models/janus/convert_janus_weights_to_hf.py or use the deepseek-community/Janus-Pro-* "
                "checkpoints"
            )
        raise UserError(
            f"'{path}' is not a Janus checkpoint: config.json has model_type {model_type!r} "
            f"(expected 'janus'){hint}"
        )
    return cfg


class JanusPolicy(LogprobsForward, nn.Module):
    """Policy protocol (t2i_gcpo.policies.base) for a local Janus / Janus-Pro checkpoint.

    ``forward`` is ``logprobs`` so that DDP/accelerate wrapping synchronises gradients.
    """

    output = "image"
    default_task = "geneval"
    guidance = "u + s(c − u)"  # transformers' Janus CFG: uncond + s·(cond − uncond)
    DEFAULT_GUIDANCE_SCALE = 5.0  # Janus-Pro paper and the GCPO recipe

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        chat_template: str | None = None,
        processor: Any = None,
        max_rollout_batch: int | None = None,
        decode_batch: int = 16,
        fused_sampler: bool = True,
    ):
        super().__init__()
        self.model = model  # JanusForConditionalGeneration
        self.tokenizer = tokenizer
        self.processor = processor
        self.chat_template = chat_template
        self.max_rollout_batch = max_rollout_batch  # rows (incl. group copies) per sampling pass; None = all
        self.decode_batch = decode_batch
        # False: sample through transformers' layers and StaticCache even for a plain Llama language model
        self.fused_sampler = fused_sampler
        self.lora_adapter: str | None = None
        self.decode_session = DecodeSession()  # the static decode loop, kept between passes

        gc = model.generation_config
        self.bos_id = gc.bos_token_id if gc.bos_token_id is not None else tokenizer.bos_token_id
        self.pad_id = gc.pad_token_id if gc.pad_token_id is not None else tokenizer.pad_token_id
        boi = (getattr(gc, "generation_kwargs", None) or {}).get("boi_token_id")
        self.boi_token = getattr(tokenizer, "boi_token", None) or "<begin_of_image>"
        if boi is None:
            boi = tokenizer.convert_tokens_to_ids(self.boi_token)
            if boi == tokenizer.unk_token_id:
                boi = None
        self.boi_id = boi
        for name, value in (("pad", self.pad_id), ("BOS", self.bos_id), ("begin-of-image", self.boi_id)):
            if value is None:
                raise UserError(
                    f"the Janus checkpoint defines no {name} token id (generation_config.json or tokenizer)"
                )

        side = model.config.vq_config.num_patches  # VQ grid side: 24 for Janus-Pro (384 px / 16)
        self.grid_shape: tuple[int, int] = (side, side)
        self.layout = TokenLayout.image(side, side)
        self.num_image_tokens = side * side
        self.codebook_size = model.config.vq_config.num_embeddings

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        freeze: Sequence[str] = ("vision", "vq"),
        lora: dict | None = None,
        max_rollout_batch: int | None = None,
    ) -> JanusPolicy:
        """Load a transformers-format Janus checkpoint from a LOCAL directory.

        freeze: parameter groups kept fixed — ``vision`` (SigLIP encoder + understanding aligner),
        ``vq`` (VQ-VAE), ``language`` (the Llama model and text embeddings), ``generation``
        (generation embeddings, aligner and head). Default: vision and vq, i.e. full fine-tuning of
        everything that image generation uses (as GCPO does).
        lora: ``{"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": [...]}`` — LoRA (peft) on
        the language model's attention projections; the base language model is then frozen, the
        generation modules stay trainable unless ``generation`` is in `freeze`.
        """
        path = Path(path).expanduser()
        _read_config(path)
        if dtype not in DTYPES:
            raise UserError(f"unknown dtype '{dtype}' for Janus: use one of {', '.join(DTYPES)}")
        unknown = [g for g in freeze if g not in FREEZE_GROUPS]
        if unknown:
            raise UserError(f"unknown freeze group(s) {unknown}: use any of {', '.join(FREEZE_GROUPS)}")

        from transformers import AutoTokenizer, JanusForConditionalGeneration, JanusProcessor

        from t2i_gcpo.weights import check_weight_files, custom_code_refusal

        processor, tokenizer, template = None, None, None
        try:
            processor = JanusProcessor.from_pretrained(path, trust_remote_code=False)  # its code never runs
            tokenizer = processor.tokenizer
            template = processor.chat_template
        except Exception:  # no processor files: fall back to the bare tokenizer
            try:
                tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
            except Exception as e:
                raise custom_code_refusal(path, e) or UserError(
                    f"no tokenizer found in Janus checkpoint '{path}' ({type(e).__name__})"
                ) from None
        template = template or getattr(tokenizer, "chat_template", None)

        check_weight_files(path)  # the loading check of every family: readable, number dtypes, finite
        model = JanusForConditionalGeneration.from_pretrained(path, dtype=DTYPES[dtype], use_safetensors=True)
        policy = cls(
            model, tokenizer, chat_template=template, processor=processor, max_rollout_batch=max_rollout_batch
        )
        policy._set_trainable(tuple(freeze), lora)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return policy

    def _groups(self) -> dict[str, list[nn.Module]]:
        m = self.model.model
        return {
            "vision": [m.vision_model, m.aligner],
            "vq": [m.vqmodel],
            "language": [m.language_model],
            "generation": [m.generation_embeddings, m.generation_aligner, m.generation_head],
        }

    def _set_trainable(self, freeze: tuple[str, ...], lora: dict | None) -> None:
        groups = self._groups()
        for name, modules in groups.items():
            for mod in modules:
                mod.requires_grad_(name not in freeze)
        # lm_head only produces text. If it is not tied to the (used) text embeddings it would get
        # no gradient, which DDP rejects: freeze it.
        lm_head = self.model.lm_head.weight
        if lm_head is not self.model.get_input_embeddings().weight:
            lm_head.requires_grad_(False)
        if lora:
            self._add_lora(lora)

    def _add_lora(self, lora: dict) -> None:
        self.lora_adapter = add_lora_option(self.model.model.language_model, lora, DEFAULT_LORA_TARGETS)

    # ------------------------------------------------------------------ prompts
    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    def format_prompt(self, prompt: str) -> str:
        """Janus-Pro's text-to-image prompt: chat template with the generation prompt, + <begin_of_image>.

        Same string as ``processor(text=processor.apply_chat_template(msgs, add_generation_prompt=True),
        generation_mode="image")`` tokenises (the processor appends the begin-of-image token).
        """
        if self.chat_template:
            messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
            if self.processor is not None:
                text = self.processor.apply_chat_template(messages, add_generation_prompt=True)
            else:
                text = self.tokenizer.apply_chat_template(
                    messages, chat_template=self.chat_template, add_generation_prompt=True, tokenize=False
                )
        else:
            text = FALLBACK_TEMPLATE.format(prompt=prompt.strip())
        return text + self.boi_token

    def prompt_ids(self, prompts: list[str]) -> list[list[int]]:
        """Token ids of each formatted prompt (BOS … <begin_of_image>), unpadded."""
        out = []
        for p in prompts:
            ids = list(self.tokenizer(self.format_prompt(p))["input_ids"])
            if not ids or ids[-1] != self.boi_id:
                raise UserError(
                    f"the Janus tokenizer does not end the prompt with the begin-of-image token "
                    f"(id {self.boi_id}); got ids ending {ids[-3:]}"
                )
            out.append(ids)
        return out

    def pad_left(self, ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-pad with the pad id → (ids [B, L] long, attention mask [B, L] long)."""
        width = max(len(x) for x in ids)
        tok = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, x in enumerate(ids):
            tok[i, width - len(x) :] = torch.tensor(x, dtype=torch.long)
            mask[i, width - len(x) :] = 1
        return tok.to(self.device), mask.to(self.device)

    def null_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """CFG null branch: every token that is neither BOS nor BOI → pad id (mask unchanged). [B, L]"""
        keep = (ids == self.bos_id) | (ids == self.boi_id)
        return torch.where(keep, ids, torch.full_like(ids, self.pad_id))

    def default_sampling(self) -> SamplingParams:
        return SamplingParams(guidance_scale=self.DEFAULT_GUIDANCE_SCALE)

    def check_prompts(self, prompts: list[str]) -> None:
        bad = [p for p in prompts if not isinstance(p, str) or not p.strip()]
        if bad:
            raise UserError(f"Janus prompts must be non-empty strings, got {bad[:3]!r}")
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if unk is None:
            return
        unknown = set()
        batch = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"] if prompts else []
        for p, ids in zip(prompts, batch):
            if unk not in ids:  # byte-level BPE (Janus-Pro) never yields <unk>: one batched pass
                continue
            for word in p.split():
                if unk in self.tokenizer(word, add_special_tokens=False)["input_ids"]:
                    unknown.add(word)
        if unknown:
            raise UserError(f"words unknown to the Janus tokenizer: {', '.join(sorted(unknown))}")

    # ------------------------------------------------------------------ model pieces
    def _lm(
        self, embeds: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any = None
    ) -> torch.Tensor:
        """Language model hidden states [N, S, D] (KV cache `cache` filled in place if given)."""
        out = self.model.model.language_model(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=cache,
            use_cache=cache is not None,
        )
        return out.last_hidden_state

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Generation head → image-token logits, in float32. [..., D] → [..., K]"""
        return self.model.model.generation_head(hidden).float()

    def _image_embeds(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens → LM input embeddings (generation embeddings + aligner). [N, t] → [N, t, D]"""
        return self.model.prepare_embeddings_for_image_generation(tokens)

    # ------------------------------------------------------------------ sampling (gpt-fast style)
    @property
    def samples_fused(self) -> bool:
        """Whether rollouts run through our fused Llama decoder (policies/fused_llama.py; its static step
        can be captured in CUDA graphs): asked for, and a plain Llama language model, LoRA adapters included
        (merged into the decoder's weight copies); else transformers' layers and StaticCache."""
        return self.fused_sampler and supports_model(self.model.model.language_model)

    @property
    def capabilities(self) -> PolicyCapabilities:
        """bf16 sampling (rollout.autocast='auto' where native) through the fused decoder only:
        transformers' StaticCache under autocast fails (cache float32, keys bf16)."""
        return PolicyCapabilities(bf16_sampling=self.samples_fused, branching=True)

    def new_cache(self, rows: int, max_len: int) -> Any:
        """The sampler's KV cache: our fused decoder (`samples_fused`), else transformers' StaticCache."""
        if self.samples_fused:
            return FusedLlamaDecoder(self.model.model.language_model, rows, max_len)
        from transformers import StaticCache

        return StaticCache(config=self.model.config.text_config, max_cache_len=max_len)

    def _prefill(self, ids2: torch.Tensor, mask2: torch.Tensor, cache: Any) -> torch.Tensor:
        """Run the doubled prompt batch [cond; null] through the LM; logits of the first
        image token. [2N, K]"""
        pos = (mask2.cumsum(-1) - 1).clamp(min=0)  # [2N, L]
        embeds = self.model.get_input_embeddings()(ids2)  # [2N, L, D]
        if isinstance(cache, FusedLlamaDecoder):
            return self._head(cache.forward(embeds, 0, positions=pos, key_mask=mask2.bool()))
        return self._head(self._lm(embeds, mask2, pos, cache)[:, -1])

    def _feed_embeds(self, tok: torch.Tensor) -> torch.Tensor:
        """Sampled image tokens [N] → the LM input both CFG halves are fed [2N, D]."""
        return self._image_embeds(tok.repeat(2)[:, None])[:, 0]

    def _decode_one_token(
        self, tok2: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Feed one image token per row (doubled batch) at positions `pos` [2N] (mask: every key so far);
        logits of the next token. [2N] → [2N, K]"""
        embeds = self._image_embeds(tok2[:, None])  # [2N, 1, D]
        if isinstance(cache, FusedLlamaDecoder):
            slot = mask.shape[1] - 1
            return self._head(cache.forward(embeds, slot, positions=pos[:, None], key_mask=mask.bool()))
        return self._head(self._lm(embeds, mask, pos[:, None], cache)[:, -1])

    def _decode_n_tokens(
        self, ids: torch.Tensor, mask: torch.Tensor, sampling: SamplingParams, uniforms: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Sample T image tokens for N prompt rows (uniforms [N, T] drive the draws), through the decode
        loop `sampling.decode` resolves to (policies/decode_loop.py).

        Returns tokens, logp_cond, logp_uncond, logp_cfg, each [N, T].
        """
        n, length = ids.shape
        steps = self.num_image_tokens
        mode = resolve_mode(
            sampling.decode, ids.device, self.samples_fused, "not a plain Llama language model"
        )
        if mode != "eager":
            return self._decode_static(ids, mask, sampling, uniforms, mode)
        ids2 = torch.cat([ids, self.null_ids(ids)])  # [2N, L] — rows N.. are the null branch
        mask2 = mask.repeat(2, 1)  # mask copied unchanged (pads stay visible)
        # KV cache allocated once at full size; attention mask preallocated and sliced per step
        cache = self.new_cache(2 * n, length + steps)
        full_mask = torch.cat([mask2, mask2.new_ones(2 * n, steps)], dim=1)  # [2N, L + T]
        next_pos = mask2.sum(-1)  # [2N] position of the first image token
        logits2 = self._prefill(ids2, mask2, cache)
        out = torch.empty((4, n, steps), dtype=torch.float32, device=ids.device)  # tokens, cond, uncond, cfg
        for t in range(steps):
            cond, uncond = logits2.chunk(2)
            tok, lp = sample_step(cond, uncond, sampling, uniforms[:, t], self.guidance)
            out[0, :, t], out[1, :, t], out[2, :, t], out[3, :, t] = (
                tok.float(),
                lp["pos"],
                lp["neg"],
                lp["guided"],
            )
            if t + 1 < steps:
                logits2 = self._decode_one_token(
                    torch.cat([tok, tok]), full_mask[:, : length + t + 1], next_pos + t, cache
                )
        return out[0].long(), out[1], out[2], out[3]

    def _decode_static(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        sampling: SamplingParams,
        uniforms: torch.Tensor,
        mode: str,
    ) -> tuple[torch.Tensor, ...]:
        """`_decode_n_tokens` through the run's static decode loop (policies/decode_loop.py; mode static,
        graph or compile): the N prompt rows padded to the loop's rows, prefilled into its decoder."""
        n, length = ids.shape
        loop = self.decode_session.loop(
            self.model.model.language_model,
            self._feed_embeds,
            self._head,
            self.guidance,
            rows=n,
            length=length + self.num_image_tokens,
            steps=self.num_image_tokens,
            cfg=True,
        )
        ids, mask = pad_rows(ids, loop.n), pad_rows(mask, loop.n)
        ids2, mask2 = torch.cat([ids, self.null_ids(ids)]), mask.repeat(2, 1)  # rows loop.n.. the null branch
        logits2 = self._prefill(ids2, mask2, loop.decoder)
        loop.begin(sampling, pad_rows(uniforms, loop.n), mask2.sum(-1), mask2.bool(), length, rows=n)
        tokens, _, logps = loop.run(logits2, mode)
        self.last_decode = loop.stats  # what ran: captures, replays (benchmarks, checks)
        return tokens, logps[0], logps[1], logps[2]

    @torch.no_grad()
    def rollout(
        self,
        prompts: Sequence[PromptRecord],
        group_size: int,
        sampling: SamplingParams,
        generators: Sequence[torch.Generator],
    ) -> Rollout:
        """Sample `group_size` images per prompt with CFG (rows grouped: prompt 0's G samples first).

        Prompt i's uniforms come from generators[i] alone, so the same seeds give the same samples
        whatever ``max_rollout_batch`` or the batch is. Token ids: ``rollout.state["prompt_ids"]``
        (list of unpadded id lists, one per row), used by ``logprobs`` to rebuild both branches.
        """
        check_records(prompts, generators, "Janus")
        texts = [p.text for p in prompts]
        self.check_prompts(texts)
        if not sampling.temperature > 0:
            raise UserError(f"temperature must be > 0, got {sampling.temperature}")
        rows = [p for p in prompts for _ in range(group_size)]  # [B = P·G]
        row_ids = [ids for ids in self.prompt_ids(texts) for _ in range(group_size)]
        uniforms = group_uniforms(generators, group_size, (self.num_image_tokens,), self.device)  # [B, T]
        chunk = self.max_rollout_batch or len(rows)
        parts = []
        with eval_mode(self):
            for s in range(0, len(rows), chunk):
                ids, mask = self.pad_left(row_ids[s : s + chunk])
                parts.append(self._decode_n_tokens(ids, mask, sampling, uniforms[s : s + chunk]))
        tokens, lc, lu, lg = (torch.cat(x) for x in zip(*parts))
        return Rollout(
            tokens=tokens,
            mask=torch.ones_like(lc),
            step=torch.arange(self.num_image_tokens, device=tokens.device).expand(len(rows), -1),
            logp={"pos": lc, "neg": lu, "guided": lg},
            prompts=rows,
            group_size=group_size,
            sampling=sampling,
            state={"prompt_ids": row_ids},
        )

    # ------------------------------------------------------------------ branched rollouts
    def branch(
        self, rollout: Rollout, points: torch.Tensor, n: int, generators: Sequence[torch.Generator]
    ) -> Branches:
        """`n` continuations of every image from each of its branch points (token positions;
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
        """One prefill of [prompt; root tokens < t] per (root, point), its cache rows repeated across the n
        continuations, then the rollout's static loop from token t (policies/decode_loop.py), in the
        rollout's precision; in passes of at most `max_rollout_batch` rows. A language model the fused
        decoder does not reproduce continues through transformers' layers (`_continue_transformers`)."""
        sampling, dev, T = rollout.sampling, self.device, self.num_image_tokens
        uniforms = continuation_uniforms(generators, (T,), dev)
        N = len(root)
        tokens = torch.zeros(N, T, dtype=torch.long, device=dev)
        logps = torch.zeros(3, N, T, device=dev)
        lm = self.model.model.language_model
        fused = supports_model(lm)
        mode = continuation_mode(resolve_mode(sampling.decode, dev, fused))
        with eval_mode(self):
            for t, rows in passes(point, self.max_rollout_batch, n):
                heads = rows[::n]  # one per (root, point): rows come in runs of n
                ids, mask = self.pad_left([rollout.state["prompt_ids"][b] for b in root[heads].tolist()])
                if not fused:
                    self._continue_transformers(rollout, root, ids, mask, t, rows, n, uniforms, tokens, logps)
                    continue
                m, L = ids.shape
                ids2, mask2 = torch.cat([ids, self.null_ids(ids)]), mask.repeat(2, 1)
                embeds = self.model.get_input_embeddings()(ids2)
                if t:
                    prefix_tok = rollout.tokens.to(dev)[root[heads].to(dev), :t].repeat(2, 1)
                    embeds = torch.cat([embeds, self._image_embeds(prefix_tok)], dim=1)
                filled = torch.cat([mask2, mask2.new_ones(2 * m, t)], dim=1).bool()  # [2m, L + t]
                pos = (filled.long().cumsum(-1) - 1).clamp(min=0)
                decoder = FusedLlamaDecoder(lm, 2 * m, bucket(L + T))  # the rollout's spans
                logits = self._head(decoder.forward(embeds, 0, positions=pos, key_mask=filled))
                # [cond; null] rows, each head's n times in a row
                each = torch.arange(m, device=dev).repeat_interleave(n)
                idx = torch.cat([each, each + m])
                loop = StaticDecodeLoop(
                    decoder.fork(idx), self._feed_embeds, self._head, self.guidance, T, cfg=True
                )
                rd = rows.to(dev)
                loop.begin(sampling, uniforms[rd], filled.sum(-1)[idx], filled[idx], L + t, start=t)
                got, _, lp = loop.run(logits[idx], mode)
                tokens[rd, t:], logps[:, rd, t:] = got[:, t:], lp[:, :, t:]
        new = dict(zip(CONTEXTS, logps))
        return assemble(rollout, root, point, new, tokens, torch.ones(N, T, device=dev))

    def _continue_transformers(
        self,
        rollout: Rollout,
        root: torch.Tensor,
        ids: torch.Tensor,
        mask: torch.Tensor,
        t: int,
        rows: torch.Tensor,
        n: int,
        uniforms: torch.Tensor,
        tokens: torch.Tensor,
        logps: torch.Tensor,
    ) -> None:
        """`_continue`'s pass for a language model the fused decoder does not reproduce: a StaticCache prefill
        of [prompt; root tokens < t] per head, repeated n times, then transformers' layers token by token (the
        rollout's loop; such a model samples in float32, as its rollouts do)."""
        from transformers import StaticCache

        sampling, dev, T = rollout.sampling, self.device, self.num_image_tokens
        heads = rows[::n]
        m, L = ids.shape
        ids2, mask2 = torch.cat([ids, self.null_ids(ids)]), mask.repeat(2, 1)
        prefix_tok = rollout.tokens.to(dev)[root[heads].to(dev), :t].repeat(2, 1)
        embeds = self.model.get_input_embeddings()(ids2)
        if t:
            embeds = torch.cat([embeds, self._image_embeds(prefix_tok)], dim=1)
        full_mask = torch.cat([mask2, mask2.new_ones(2 * m, T)], dim=1)
        pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
        cache = StaticCache(config=self.model.config.text_config, max_cache_len=L + T)
        hidden = self._lm(embeds, full_mask[:, : L + t], pos[:, : L + t], cache)[:, -1]
        repeat_cache_rows(cache, n)  # [cond roots; null roots] → each root's row n times
        logits = self._head(hidden).repeat_interleave(n, dim=0)
        full_mask, pos = full_mask.repeat_interleave(n, dim=0), pos.repeat_interleave(n, dim=0)
        rd = rows.to(dev)
        for j in range(t, T):
            cond, uncond = logits.chunk(2)
            tj, lp = sample_step(cond, uncond, sampling, uniforms[rd, j], self.guidance)
            tokens[rd, j] = tj
            logps[:, rd, j] = torch.stack([lp["pos"], lp["neg"], lp["guided"]])
            if j + 1 < T:
                logits = self._decode_one_token(
                    torch.cat([tj, tj]), full_mask[:, : L + j + 1], pos[:, L + j], cache
                )

    # ------------------------------------------------------------------ teacher forcing
    def _context_hidden(self, ids: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """LM hidden states at the T image positions given prompt rows `ids` and image tokens
        [N, T]. → [N, T, D]"""
        length, steps = ids.shape[1], tokens.shape[1]
        embeds = torch.cat(
            [self.model.get_input_embeddings()(ids), self._image_embeds(tokens[:, :-1])], dim=1
        )  # [N, L + T − 1, D] — the last image token is never fed
        full_mask = torch.cat([mask, mask.new_ones(mask.shape[0], steps - 1)], dim=1)
        pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self._lm(embeds, full_mask, pos)  # [N, L + T − 1, D]
        return hidden[:, length - 1 :]  # position L−1+t predicts token t

    def _context_logits(self, ids: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Logits at the T image positions given prompt rows `ids` and image tokens [N, T]. → [N, T, K]"""
        return self._head(self._context_hidden(ids, mask, tokens))

    def logprobs(self, rollout: Rollout, context: Context = "pos") -> torch.Tensor:
        """Teacher-forced log π(y_t | context, y_<t) at temperature T, with gradient, in chunks over T. [B, T]

        context: ``pos`` (prompt), ``neg`` (null branch) or ``guided`` (log_softmax of the
        CFG-combined logits, both branches in one doubled batch)."""
        return self.logprobs_and_dists(rollout, context)[0]

    def logprobs_and_dists(
        self, rollout: Rollout, context: Context = "pos"
    ) -> tuple[torch.Tensor, ChunkedDists]:
        """`logprobs` and the full distributions of that forward (`ChunkedDists`: temperature-scaled
        logits, no gradient)."""
        if context not in ("pos", "neg", "guided"):
            raise ValueError(f"context must be pos, neg or guided, got {context!r}")
        tokens = rollout.tokens.to(self.device)  # [B, T]
        ids, mask = self.pad_left(rollout.state["prompt_ids"])  # [B, L]
        temperature, scale = rollout.sampling.temperature, rollout.sampling.guidance_scale
        if context == "guided":
            both = self._context_hidden(
                torch.cat([ids, self.null_ids(ids)]), mask.repeat(2, 1), tokens.repeat(2, 1)
            )
            hidden = torch.stack(both.chunk(2), dim=2)  # [B, T, 2, D]: cond, null

            def to_logits(h: torch.Tensor) -> torch.Tensor:
                return (
                    GUIDANCE[self.guidance](self._head(h[:, :, 0]), self._head(h[:, :, 1]), scale)
                    / temperature
                )
        else:
            hidden = self._context_hidden(ids if context == "pos" else self.null_ids(ids), mask, tokens)

            def to_logits(h: torch.Tensor) -> torch.Tensor:
                return self._head(h) / temperature

        logp = chunked_logprobs(hidden, to_logits, tokens, self.codebook_size)
        return logp, ChunkedDists(hidden, to_logits, self.codebook_size)

    # ------------------------------------------------------------------ images and codes
    @torch.no_grad()
    def decode(self, rollout: Rollout) -> torch.Tensor:
        """Images [B, 3, H, W] in [0, 1] through the Janus VQ decoder (384 px for Janus-Pro)."""
        vq = self.model.model.vqmodel
        tokens = rollout.tokens.to(self.device)
        images = [
            vq.decode(tokens[s : s + self.decode_batch]) for s in range(0, len(tokens), self.decode_batch)
        ]
        return ((torch.cat(images).float() + 1) / 2).clamp(0, 1)  # VQ output is in [−1, 1]

    @torch.no_grad()
    def token_features(self, rollout: Rollout) -> torch.Tensor:
        """VQ codebook entries of the rollout's tokens, L2-normalised as the decoder uses them. [B, T, D]"""
        table = self.model.model.vqmodel.quantize.embedding
        return F.normalize(table(rollout.tokens.to(self.device)).float(), dim=-1)

    # ------------------------------------------------------------------ saving

    def keep_reveal_order(self, order: str) -> None:
        raise ValueError("Janus has no reveal order")

    def keep_full_precision(self) -> None:
        """Nothing to do: the weights are saved in their own dtype."""

    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's state dict with any LoRA deltas folded into the base weights (no mutation)."""
        return merged_state_dict(self.model, self.lora_adapter)

    def save_pretrained(self, path: str | Path) -> None:
        """Save a plain transformers Janus checkpoint (LoRA merged) + processor/tokenizer.

        Reloads with ``JanusForConditionalGeneration.from_pretrained(path)`` or ``janus:PATH``.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path, state_dict=self.merged_state_dict())
        (self.processor or self.tokenizer).save_pretrained(path)


def repeat_cache_rows(cache, n: int) -> None:
    """Each row of a filled transformers StaticCache n times in a row (transformers 5's StaticLayer has
    no batch_repeat_interleave of its own; its write position is one counter for all rows)."""
    for layer in cache.layers:
        layer.keys = layer.keys.repeat_interleave(n, dim=0)
        layer.values = layer.values.repeat_interleave(n, dim=0)
        layer.batch_size = layer.keys.shape[0]
