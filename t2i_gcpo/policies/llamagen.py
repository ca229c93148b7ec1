"""LlamaGen-T2I (Sun et al. 2024, arXiv 2406.06525) from its released files, as a `Policy`.

The release is three artifacts (FoundationVision/LlamaGen, FoundationVision/LlamaGen on the Hub,
google/flan-t5-xl): the GPT (``t2i_XL_stage1_256.pt`` / ``t2i_XL_stage2_512.pt``: a torch file holding
``{"model": state_dict, …}``), the VQ tokenizer ``vq_ds16_t2i.pt``, and a FLAN-T5-XL folder whose encoder
gives the caption features. ``llamagen:DIR`` reads them from one folder (or ``llamagen:DIR/t2i_….pt`` names
the GPT file); the model is policies/llamagen_gpt.py, the VQ tokenizers/llamagen_vq.py, the captions
policies/llamagen_t5.py. Details: docs/concepts/adapters.md#llamagen.

Sampling follows the reference's ``autoregressive/models/generate.py`` and ``sample/sample_t2i.py``: one
doubled batch [cond; null] (the null rows take the learned ``uncond_embedding`` as their caption under the
same padding mask), CFG ℓ = ℓ_u + s(ℓ_c − ℓ_u) on every token including the first one, drawn from the prefill;
with ``cfg_interval`` k ≥ 0, tokens after the first k + 2 are drawn from ℓ_c alone (s = 1). Defaults: s = 7.5,
top-k 1000, temperature 1 (sample_t2i.py's). Every token's log-prob under pos, neg and guided is recorded
(policies/sampling.sample_step: the same inverse-CDF draw from the prompt's own uniforms as every adapter),
and ``logprobs`` recomputes them teacher-forced. Without guidance (s = 1) and nothing reading the contrast,
only the conditional rows run (the reference's cfg_scale 1), and the rollout has no "neg".
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

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
from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder
from t2i_gcpo.policies.llamagen_gpt import FusedGPT, LlamaGenGPT, build_gpt, config_from_state
from t2i_gcpo.policies.llamagen_t5 import T5Captions
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
from t2i_gcpo.tokenizers.llamagen_vq import LlamaGenVQ, build_vq

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DEFAULT_LORA_TARGETS = ("wqkv", "wo")  # the attention projections
CONFIG_FILE = "llamagen.json"  # what `save_pretrained` writes beside the weights
GPT_FILE, VQ_FILE, T5_DIR = "gpt.safetensors", "vq.safetensors", "t5"
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")
IMAGE_SIZE_IN_NAME = re.compile(r"_(\d+)$")  # t2i_XL_stage1_256 → 256 px


@dataclass(frozen=True)
class ReleaseFiles:
    """Where one LlamaGen model's parts are, and what the folder says of it."""

    gpt: Path
    vq: Path
    t5: Path
    image_size: int | None  # from the GPT file's name or llamagen.json; None: neither says
    gpt_size: str | None  # from llamagen.json


def _t5_folders(root: Path) -> list[Path]:
    from t2i_gcpo.policies.registry import read_json

    # the folder itself, and the reference's layout (pretrained_models/t5-ckpt/flan-t5-xl)
    places = [root, *(p for p in (root / "t5-ckpt",) if p.is_dir())]
    found = []
    for place in places:
        for sub in sorted(p for p in place.iterdir() if p.is_dir()):
            if read_json(sub / "config.json").get("model_type") == "t5":
                found.append(sub)
    return found


def find_files(path: str | Path) -> ReleaseFiles:
    """The GPT checkpoint, VQ tokenizer and T5 folder of ``llamagen:PATH`` (module docstring; layout:
    docs/real_checkpoints.md#llamagen); a one-line UserError for a missing or ambiguous part."""
    from t2i_gcpo.policies.registry import read_json

    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"LlamaGen checkpoint '{path}' does not exist")
    gpt = path if path.is_file() else None
    root = path.parent if gpt is not None else path
    saved = read_json(root / CONFIG_FILE) if gpt is None else {}
    if saved:  # a folder `save_pretrained` wrote
        t5 = root / T5_DIR if (root / T5_DIR).is_dir() else Path(str(saved.get("t5", "")))
        if not t5.is_dir():
            raise UserError(
                f"{root / CONFIG_FILE} names the T5 folder {str(t5)!r}, which does not exist: copy the "
                f"FLAN-T5 folder (google/flan-t5-xl) to {root / T5_DIR}"
            )
        size = saved.get("image_size")
        return ReleaseFiles(
            root / GPT_FILE,
            root / VQ_FILE,
            t5,
            size if isinstance(size, int) else None,
            saved.get("gpt_size") if isinstance(saved.get("gpt_size"), str) else None,
        )
    weights = sorted(p for p in root.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    vqs = [p for p in weights if p.name.lower().startswith("vq")]
    if gpt is None:
        gpts = [p for p in weights if p not in vqs]
        if len(gpts) != 1:
            what = "no GPT checkpoint (t2i_*.pt)" if not gpts else f"{len(gpts)} GPT checkpoints"
            hint = ": name one, e.g. llamagen:" + str(gpts[0]) if gpts else ""
            raise UserError(f"LlamaGen folder {root} holds {what}{hint}")
        gpt = gpts[0]
    if not vqs:
        raise UserError(f"no VQ tokenizer in {root}: put vq_ds16_t2i.pt beside {gpt.name}")
    if len(vqs) > 1:
        raise UserError(f"{root} holds {len(vqs)} VQ tokenizers ({', '.join(p.name for p in vqs)}): keep one")
    t5s = _t5_folders(root)
    if len(t5s) > 1:
        t5s = [p for p in t5s if "flan-t5-xl" in p.name] or t5s
    if not t5s:
        raise UserError(
            f"no FLAN-T5 folder in {root}: put google/flan-t5-xl (config.json, model*.safetensors, tokenizer "
            f"files) in {root / 'flan-t5-xl'}"
        )
    if len(t5s) > 1:
        raise UserError(f"{root} holds {len(t5s)} T5 folders ({', '.join(p.name for p in t5s)}): keep one")
    named = IMAGE_SIZE_IN_NAME.search(gpt.stem)
    return ReleaseFiles(gpt, vqs[0], t5s[0], int(named.group(1)) if named else None, None)


def load_t5(folder: Path, dtype: torch.dtype, caption_len: int, caption_dim: int) -> T5Captions:
    """The T5 encoder (safetensors only, its code never run) and tokenizer of `folder`, checked against the
    GPT's caption width."""
    from t2i_gcpo.policies.registry import read_json
    from t2i_gcpo.weights import check_weight_files, custom_code_refusal

    width = read_json(folder / "config.json").get("d_model")
    if width != caption_dim:
        raise UserError(
            f"the T5 folder {folder} gives features of width {width}, the GPT takes {caption_dim} "
            "(flan-t5-xl: 2048)"
        )
    check_weight_files(folder)  # the loading check of every family: readable, number dtypes, finite
    from transformers import AutoTokenizer, T5EncoderModel
    from transformers.utils import logging as hf_logging

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # a whole T5's decoder weights are unused by its encoder: not news
        try:
            encoder = T5EncoderModel.from_pretrained(folder, dtype=dtype, use_safetensors=True)
        finally:
            hf_logging.set_verbosity(verbosity)
    except Exception as e:
        raise custom_code_refusal(folder, e) or UserError(
            f"cannot load the T5 folder {folder}: {' '.join(str(e).split())[:300]}"
        ) from None
    return T5Captions(encoder, tokenizer, caption_len)


class _Frozen:
    """The frozen T5 encoder and VQ decoder, outside the module tree: never trained, saved by reference (the
    T5) or as loaded (the VQ), and shared by every copy of the policy (the trainer's frozen
    references deep-copy the
    policy: one T5-XL, 4.9 GB in float32, not three)."""

    def __init__(self, captions: T5Captions, vq: LlamaGenVQ, t5_folder: Path) -> None:
        self.captions, self.vq, self.t5_folder = captions, vq, t5_folder

    def __deepcopy__(self, memo: dict) -> _Frozen:
        return self

    def on(self, device: torch.device) -> _Frozen:
        self.captions.to(device)
        if self.vq.post_quant_conv.weight.device != device:
            self.vq.to(device)
        return self


class LlamaGenPolicy(LogprobsForward, nn.Module):
    """Policy protocol (t2i_gcpo.policies.base) for a LlamaGen text-to-image GPT; ``forward`` is ``logprobs``
    so that DDP/accelerate wrapping synchronises gradients."""

    output = "image"
    default_task = "geneval"
    guidance = "u + s(c − u)"  # generate.py: uncond_logits + (cond_logits − uncond_logits)·cfg_scale
    DEFAULT_GUIDANCE_SCALE = 7.5  # sample_t2i.py's --cfg-scale
    DEFAULT_TOP_K = 1000  # sample_t2i.py's --top-k (temperature 1, top-p 1)

    def __init__(
        self,
        gpt: LlamaGenGPT,
        vq: LlamaGenVQ,
        captions: T5Captions,
        t5_folder: Path,
        max_rollout_batch: int | None = None,
        cfg_interval: int = -1,
        decode_batch: int = 16,
    ) -> None:
        super().__init__()
        self.gpt = gpt
        self.frozen = _Frozen(captions, vq, Path(t5_folder))
        self.tokenizer = captions.tokenizer
        self.config = gpt.config
        self.fused = FusedGPT(gpt)  # the GPT as the fused decoder reads it (one: the decode session's key)
        self.max_rollout_batch = max_rollout_batch  # rows (group copies included) a sampling pass; None: all
        self.cfg_interval = cfg_interval  # k: tokens after the first k + 2 unguided; −1: every token guided
        self.decode_batch = decode_batch
        self.lora_adapter: str | None = None
        self.decode_session = DecodeSession()
        side = gpt.config.grid
        self.grid_shape: tuple[int, int] = (side, side)
        self.layout = TokenLayout.image(side, side)
        self.num_image_tokens = side * side
        self.caption_len = gpt.config.caption_len
        self.codebook_size = gpt.config.vocab
        self.image_size = side * vq.config.downsample

    capabilities = PolicyCapabilities(bf16_sampling=True, branching=True)  # fused decoder, as Janus

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        lora: dict | None = None,
        max_rollout_batch: int | None = None,
        gpt_size: str | None = None,
        image_size: int | None = None,
        cfg_interval: int = -1,
    ) -> LlamaGenPolicy:
        """Load ``llamagen:PATH`` (`find_files`). The GPT's size comes from its shapes and the released size
        table (`gpt_size` names it), the image size from the GPT file's name (``…_256.pt``;
        `image_size` names it).
        lora: ``{"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": [...]}`` — peft LoRA on the GPT's
        attention (``wqkv``, ``wo``); the base GPT is then frozen. The T5 encoder and the VQ
        are always frozen."""
        from t2i_gcpo.weights import read_torch_weights

        if dtype not in DTYPES:
            raise UserError(f"unknown dtype '{dtype}' for LlamaGen: use one of {', '.join(DTYPES)}")
        files = find_files(path)
        vq = build_vq(
            read_torch_weights(files.vq, "LlamaGen VQ tokenizer"), f"LlamaGen VQ tokenizer {files.vq}"
        )
        size = image_size or files.image_size
        if size is None:
            raise UserError(
                f"cannot tell the image size of {files.gpt.name} (the released names end in _256 or "
                f"_512): set model_options.image_size (256 for stage 1, 512 for stage 2)"
            )
        step = vq.config.downsample
        if size % step or size < step:
            raise UserError(f"image size {size} is not a multiple of the VQ's {step} pixels per token")
        what = f"LlamaGen GPT checkpoint {files.gpt}"
        state = read_torch_weights(files.gpt, "LlamaGen GPT checkpoint")
        config = config_from_state(state, size // step, gpt_size or files.gpt_size, what)
        if config.vocab != vq.config.codebook_size:
            raise UserError(
                f"{what} predicts {config.vocab} codes, the VQ tokenizer {files.vq.name} has "
                f"{vq.config.codebook_size}"
            )
        captions = load_t5(files.t5, DTYPES[dtype], config.caption_len, config.caption_dim)
        gpt = build_gpt(state, config, DTYPES[dtype])
        del state
        policy = cls(
            gpt,
            vq,
            captions,
            files.t5.resolve(),
            max_rollout_batch=max_rollout_batch,
            cfg_interval=cfg_interval,
        )
        policy.gpt.requires_grad_(True)
        policy.gpt.cls_embedding.uncond_embedding.requires_grad_(False)
        if lora:
            policy._add_lora(lora)
        policy.gpt.gradient_checkpointing = gradient_checkpointing
        return policy

    def _add_lora(self, lora: dict) -> None:
        self.lora_adapter = add_lora_option(self.gpt, lora, DEFAULT_LORA_TARGETS)

    # ------------------------------------------------------------------ prompts and captions
    @property
    def device(self) -> torch.device:
        return self.gpt.output.weight.device

    @property
    def vq(self) -> LlamaGenVQ:
        return self.frozen.on(self.device).vq

    def default_sampling(self) -> SamplingParams:
        return SamplingParams(guidance_scale=self.DEFAULT_GUIDANCE_SCALE, top_k=self.DEFAULT_TOP_K)

    def check_prompts(self, prompts: list[str]) -> None:
        bad = [p for p in prompts if not isinstance(p, str) or not p.strip()]
        if bad:
            raise UserError(f"LlamaGen prompts must be non-empty strings, got {bad[:3]!r}")

    def captions(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        """Left-padded T5 features [N, L, C] and their mask [N, L] (policies/llamagen_t5.py), on
        the GPT's device."""
        return self.frozen.on(self.device).captions.features(texts)

    def uses_cfg(self, sampling: SamplingParams) -> bool:
        """Whether the null rows run: under guidance, or when the contrast is recorded (GCPO's c⁻)."""
        return sampling.guidance_scale != 1 or sampling.score_negative

    def guidance_scales(self, scale: float) -> Tensor:
        """s_t [T] on the device: `scale` for the first cfg_interval + 2 tokens (all with −1), then 1."""
        s = torch.full((self.num_image_tokens,), float(scale), device=self.device)
        if self.cfg_interval >= 0:
            s[self.cfg_interval + 2 :] = 1.0
        return s

    def _prefix(self, feats: Tensor, mask: Tensor, cfg: bool) -> tuple[Tensor, Tensor]:
        """Caption embeddings [R, L, D] and key mask [R, L] of the rows: cond, then (cfg) null
        under the same mask."""
        cond = self.gpt.caption_embeds(feats)
        if not cfg:
            return cond, mask
        return torch.cat([cond, self.gpt.null_embeds(len(feats))]), mask.repeat(2, 1)

    def _head(self, hidden: Tensor) -> Tensor:
        """Final-norm hidden states → codebook logits in float32 (gpt.py: ``self.output(h).float()``)."""
        return self.gpt.output(hidden).float()

    def _feed_pair(self, tok: Tensor) -> Tensor:
        """Sampled tokens [N] → the ids both CFG halves are fed [2N]."""
        return tok.repeat(2)

    def _feed_one(self, tok: Tensor) -> Tensor:
        return tok

    # ------------------------------------------------------------------ sampling (gpt-fast style)
    def _decode(
        self, feats: Tensor, mask: Tensor, sampling: SamplingParams, uniforms: Tensor, cfg: bool
    ) -> tuple[Tensor, Tensor]:
        """T tokens for N caption rows (uniforms [N, T]) through the loop `sampling.decode` resolves to →
        tokens [N, T], log-probs [3, N, T] (pos, neg — zeros without the null rows —, guided)."""
        mode = resolve_mode(sampling.decode, feats.device, True)
        if mode != "eager":
            return self._decode_static(feats, mask, sampling, uniforms, mode, cfg)
        n, L, T = len(feats), self.caption_len, self.num_image_tokens
        embeds, mask2 = self._prefix(feats, mask, cfg)
        rows = len(embeds)
        decoder = FusedLlamaDecoder(self.fused, rows, L + T)
        positions = torch.arange(L, device=feats.device).expand(rows, L)
        logits = self._head(decoder.forward(embeds, 0, positions=positions, key_mask=mask2))
        full = torch.cat([mask2, mask2.new_ones(rows, T)], dim=1)  # [R, L + T]
        scales = self.guidance_scales(sampling.guidance_scale).tolist()
        tokens = torch.empty(n, T, dtype=torch.long, device=feats.device)
        logps = torch.zeros(3, n, T, device=feats.device)
        for t in range(T):
            cond, uncond = logits.chunk(2) if cfg else (logits, None)
            step = dataclasses.replace(sampling, guidance_scale=scales[t])
            tokens[:, t], lp = sample_step(cond, uncond, step, uniforms[:, t], self.guidance)
            logps[0, :, t], logps[2, :, t] = lp["pos"], lp["guided"]
            if cfg:
                logps[1, :, t] = lp["neg"]
            if t + 1 < T:
                slot = L + t  # token t is fed at position L + t (its grid cell's angles)
                ids = self._feed_pair(tokens[:, t]) if cfg else tokens[:, t]
                pos = torch.full((rows, 1), slot, device=feats.device)
                logits = self._head(
                    decoder.forward(ids[:, None], slot, positions=pos, key_mask=full[:, : slot + 1])
                )
        return tokens, logps

    def _decode_static(
        self, feats: Tensor, mask: Tensor, sampling: SamplingParams, uniforms: Tensor, mode: str, cfg: bool
    ) -> tuple[Tensor, Tensor]:
        """`_decode` through the run's static decode loop (policies/decode_loop.py; static, graph or compile):
        the rows padded to the loop's, prefilled into its decoder."""
        n, L, T = len(feats), self.caption_len, self.num_image_tokens
        feed = self._feed_pair if cfg else self._feed_one
        loop = self.decode_session.loop(
            self.fused, feed, self._head, self.guidance, rows=n, length=L + T, steps=T, cfg=cfg
        )
        embeds, mask2 = self._prefix(pad_rows(feats, loop.n), pad_rows(mask, loop.n), cfg)
        rows = len(embeds)
        positions = torch.arange(L, device=feats.device).expand(rows, L)
        logits = self._head(loop.decoder.forward(embeds, 0, positions=positions, key_mask=mask2))
        loop.begin(
            sampling,
            pad_rows(uniforms, loop.n),
            torch.full((rows,), L, device=feats.device),
            mask2,
            L,
            rows=n,
            scales=self.guidance_scales(sampling.guidance_scale),
        )
        tokens, _, logps = loop.run(logits, mode)
        self.last_decode = loop.stats  # what ran: captures, replays (benchmarks, checks)
        return tokens, logps

    @torch.no_grad()
    def rollout(
        self,
        prompts: Sequence[PromptRecord],
        group_size: int,
        sampling: SamplingParams,
        generators: Sequence[torch.Generator],
    ) -> Rollout:
        """Sample `group_size` images per prompt (prompt 0's G samples first); prompt i's uniforms come from
        generators[i] alone, so a sample does not depend on ``max_rollout_batch`` or its batch-mates."""
        check_records(prompts, generators, "LlamaGen")
        texts = [p.text for p in prompts]
        self.check_prompts(texts)
        if not sampling.temperature > 0:
            raise UserError(f"temperature must be > 0, got {sampling.temperature}")
        rows = [p for p in prompts for _ in range(group_size)]  # [B = P·G]
        uniforms = group_uniforms(generators, group_size, (self.num_image_tokens,), self.device)  # [B, T]
        feats, mask = self.captions(texts)
        feats, mask = feats.repeat_interleave(group_size, 0), mask.repeat_interleave(group_size, 0)
        cfg = self.uses_cfg(sampling)
        chunk = self.max_rollout_batch or len(rows)
        parts = []
        with eval_mode(self):
            for s in range(0, len(rows), chunk):
                parts.append(
                    self._decode(
                        feats[s : s + chunk], mask[s : s + chunk], sampling, uniforms[s : s + chunk], cfg
                    )
                )
        tokens, logps = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts], dim=1)
        logp = {"pos": logps[0], "guided": logps[2], **({"neg": logps[1]} if cfg else {})}
        return Rollout(
            tokens=tokens,
            mask=torch.ones_like(logps[0]),
            step=torch.arange(self.num_image_tokens, device=tokens.device).expand(len(rows), -1),
            logp=logp,
            prompts=rows,
            group_size=group_size,
            sampling=sampling,
        )

    # ------------------------------------------------------------------ branched rollouts
    def branch(
        self, rollout: Rollout, points: Tensor, n: int, generators: Sequence[torch.Generator]
    ) -> Branches:
        """`n` continuations of every image from each of its branch points (token positions;
        docs/concepts/tree_credit.md#branched-rollouts)."""
        return branched(rollout, points, n, generators, self._continue)

    def _continue(
        self, rollout: Rollout, root: Tensor, point: Tensor, generators: Sequence[torch.Generator], n: int
    ) -> Rollout:
        """One prefill of [caption; root tokens < t] per (root, point) (both halves when the rollout ran
        them), its cache rows repeated across the n continuations, then the static loop from token t
        (policies/decode_loop.py), in the rollout's precision; in passes of at most
        `max_rollout_batch` rows."""
        sampling, dev, T, L = rollout.sampling, self.device, self.num_image_tokens, self.caption_len
        cfg = "neg" in rollout.logp
        uniforms = continuation_uniforms(generators, (T,), dev)
        N = len(root)
        tokens = torch.zeros(N, T, dtype=torch.long, device=dev)
        logps = torch.zeros(3, N, T, device=dev)
        mode = continuation_mode(resolve_mode(sampling.decode, dev, True))
        scales = self.guidance_scales(sampling.guidance_scale)
        with eval_mode(self):
            for t, rows in passes(point, self.max_rollout_batch, n):
                heads = root[rows[::n]].tolist()  # one per (root, point): rows come in runs of n
                feats, mask = self.captions([rollout.prompts[b].text for b in heads])
                m = len(heads)
                embeds, mask2 = self._prefix(feats, mask, cfg)
                if t:
                    prefix = rollout.tokens.to(dev)[torch.tensor(heads, device=dev), :t]
                    prefix = prefix.repeat(2, 1) if cfg else prefix
                    embeds = torch.cat([embeds, self.gpt.tok_embeddings(prefix)], dim=1)
                filled = torch.cat([mask2, mask2.new_ones(len(mask2), t)], dim=1)  # [R, L + t]
                positions = torch.arange(L + t, device=dev).expand(len(filled), -1)
                decoder = FusedLlamaDecoder(self.fused, len(filled), bucket(L + T))
                logits = self._head(decoder.forward(embeds, 0, positions=positions, key_mask=filled))
                each = torch.arange(m, device=dev).repeat_interleave(n)
                idx = torch.cat([each, each + m]) if cfg else each
                loop = StaticDecodeLoop(
                    decoder.fork(idx),
                    self._feed_pair if cfg else self._feed_one,
                    self._head,
                    self.guidance,
                    T,
                    cfg=cfg,
                )
                rd = rows.to(dev)
                loop.begin(
                    sampling,
                    uniforms[rd],
                    torch.full((len(idx),), L + t, device=dev),
                    filled[idx],
                    L + t,
                    start=t,
                    scales=scales,
                )
                got, _, lp = loop.run(logits[idx], mode)
                tokens[rd, t:], logps[:, rd, t:] = got[:, t:], lp[:, :, t:]
        new = dict(zip(CONTEXTS, logps))
        if not cfg:
            new.pop("neg")
        return assemble(rollout, root, point, new, tokens, torch.ones(N, T, device=dev))

    # ------------------------------------------------------------------ teacher forcing
    def _context_hidden(self, caption: Tensor, mask: Tensor, tokens: Tensor) -> Tensor:
        """Final-norm hidden states at the T image positions [N, T, D]: [caption embeddings [N, L, D] under
        the key mask [N, L]; tokens 0 … T − 2] through the GPT, read from position L − 1 (which
        predicts token 0) on."""
        x = torch.cat([caption, self.gpt.tok_embeddings(tokens[:, :-1])], dim=1)  # [N, L + T − 1, D]
        key_mask = torch.cat([mask, mask.new_ones(len(tokens), tokens.shape[1] - 1)], dim=1)
        return self.gpt(x, key_mask)[:, self.caption_len - 1 :]

    def logprobs(self, rollout: Rollout, context: Context = "pos") -> Tensor:
        """Teacher-forced log π(y_t | context, y_<t) at temperature T, with gradient, in chunks over T. [B, T]

        context: ``pos`` (the caption), ``neg`` (the null caption) or ``guided`` (log_softmax of the guided
        logits at each token's scale s_t, both contexts in one doubled batch)."""
        return self.logprobs_and_dists(rollout, context)[0]

    def logprobs_and_dists(self, rollout: Rollout, context: Context = "pos") -> tuple[Tensor, ChunkedDists]:
        """`logprobs` and the full distributions of that forward (`ChunkedDists`: temperature-scaled logits,
        no gradient)."""
        if context not in ("pos", "neg", "guided"):
            raise ValueError(f"context must be pos, neg or guided, got {context!r}")
        tokens = rollout.tokens.to(self.device)  # [B, T]
        feats, mask = self.captions(rollout.texts)
        temperature = rollout.sampling.temperature
        if context == "guided":
            caption, mask2 = self._prefix(feats, mask, cfg=True)  # [cond; null] in one doubled batch
            both = self._context_hidden(caption, mask2, tokens.repeat(2, 1))
            hidden = torch.stack(both.chunk(2), dim=2)  # [B, T, 2, D]: cond, null
            scale = float(rollout.sampling.guidance_scale)
            if self.cfg_interval >= 0:  # a flag channel (exact in any dtype): whether token t is guided
                on = self.guidance_scales(2.0)[None, :, None, None].expand(len(tokens), -1, 2, 1) != 1
                hidden = torch.cat([hidden, on.to(hidden.dtype)], dim=-1)

            def to_logits(h: Tensor) -> Tensor:
                s: float | Tensor = scale
                if self.cfg_interval >= 0:
                    s = torch.where(h[:, :, 0, -1:] > 0, scale, 1.0).float()
                    h = h[..., :-1]
                return (
                    GUIDANCE[self.guidance](self._head(h[:, :, 0]), self._head(h[:, :, 1]), s) / temperature
                )
        else:
            caption = (
                self.gpt.null_embeds(len(tokens)) if context == "neg" else self.gpt.caption_embeds(feats)
            )
            hidden = self._context_hidden(caption, mask, tokens)

            def to_logits(h: Tensor) -> Tensor:
                return self._head(h) / temperature

        logp = chunked_logprobs(hidden, to_logits, tokens, self.codebook_size)
        return logp, ChunkedDists(hidden, to_logits, self.codebook_size)

    # ------------------------------------------------------------------ images and codes
    @torch.no_grad()
    def decode(self, rollout: Rollout) -> Tensor:
        """Images [B, 3, H, W] in [0, 1] through the VQ decoder (256 or 512 px), float32."""
        vq, tokens = self.vq, rollout.tokens.to(self.device)
        with torch.autocast(self.device.type, enabled=False):
            images = [
                vq.decode_code(tokens[s : s + self.decode_batch], self.grid_shape)
                for s in range(0, len(tokens), self.decode_batch)
            ]
        return ((torch.cat(images).float() + 1) / 2).clamp(0, 1)  # the decoder's output is in [−1, 1]

    @torch.no_grad()
    def token_features(self, rollout: Rollout) -> Tensor:
        """The l2-normalised VQ code vectors of the rollout's tokens, as the decoder reads them. [B, T, C]"""
        return self.vq.quantize.codes(rollout.tokens.to(self.device)).float()

    # ------------------------------------------------------------------ saving
    def keep_reveal_order(self, order: str) -> None:
        raise ValueError("LlamaGen has no reveal order")

    def keep_full_precision(self) -> None:
        """Nothing to do: the weights are saved in their own dtype."""

    def merged_state_dict(self) -> dict[str, Tensor]:
        """The GPT's state dict under the released names, any LoRA deltas folded into the base weights (no
        mutation)."""
        return merged_state_dict(self.gpt, self.lora_adapter)

    def save_pretrained(self, path: str | Path) -> None:
        """``gpt.safetensors`` (the GPT under its released key names, LoRA merged, in its dtype),
        ``vq.safetensors`` (the VQ decoder as loaded) and ``llamagen.json`` (the size, the image size and the
        T5 folder, which is referred to, not copied: a T5-XL is 4.9 GB; a ``t5/`` folder beside them is used
        first). Reloads with ``llamagen:PATH`` or the path alone; ``torch.save({"model":
        safetensors.torch.load_file(".../gpt.safetensors")}, "t2i.pt")`` gives a file the reference's
        sample_t2i.py loads."""
        from safetensors.torch import save

        from t2i_gcpo.outdir import write_file

        path = Path(path)
        gpt = {k: v.detach().contiguous() for k, v in self.merged_state_dict().items()}
        vq = {k: v.detach().contiguous() for k, v in self.frozen.vq.state_dict().items()}
        write_file(path / GPT_FILE, save(gpt))
        write_file(path / VQ_FILE, save(vq), within=path)
        meta = {
            "format": "t2i-gcpo llamagen",
            "gpt_size": self.config.size,
            "image_size": self.image_size,
            "t5": str(self.frozen.t5_folder),
        }
        write_file(path / CONFIG_FILE, json.dumps(meta, indent=2), within=path)
