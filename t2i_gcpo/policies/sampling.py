"""Pieces every adapter shares: guidance formulas, the one sample step, per-group noise, and
log-probs computed in chunks over T.

- `GUIDANCE`: the named formulas that combine positive (c) and negative (u) logits with scale s. Each
  adapter names its own: diffusers / aMUSEd / Meissonic / LlamaGen / Janus ``u + s(c − u)``; Muse / Show-o /
  MMaDA ``(1 + s)c − s·u`` (docs/concepts/generation.md).
- `sample_step`: guided logits → one token per row by inverse CDF with a pre-drawn uniform per row,
  and the token's log-prob under pos, neg and guided at temperature T (top-k / top-p shape only what
  is sampled; the recorded log-probs are of the untruncated distributions, the quantity a
  teacher-forced pass recomputes).
- `group_uniforms`: the uniforms of a rollout, drawn per prompt from that prompt's generator, so a
  sample depends on its own generator only (not on its batch-mates, chunking or process count).
- `resolve_guidance_scale`: the guidance scale asked for, else the model's recommended one.
- `eval_mode`: an adapter in eval mode while it samples, its training flag restored after.
- `chunked_logprobs` / `ChunkedDists`: log π(y_t) with gradient without a [B, T, V] tensor: the head
  runs on chunks of T, each under activation checkpointing when there is more than one chunk.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
from torch.utils.checkpoint import checkpoint

from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import Policy, PromptRecord, SamplingParams

GUIDANCE: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "u + s(c − u)": lambda c, u, s: u + s * (c - u),
    "(1 + s)c − s·u": lambda c, u, s: (1 + s) * c - s * u,
}
LOGIT_BUDGET = 1 << 24  # elements of one logits chunk [B, t, V] (64 MB in fp32)


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """`module` in eval mode for the block (dropout off; gradient checkpointing would otherwise turn a
    decoder's KV cache off), its training flag restored after."""
    was = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was)


def resolve_guidance_scale(policy: Policy, asked: float | None) -> float:
    """The guidance scale s a run samples with: the one asked for (``--cfg``, rollout.cfg_scale, an
    API's ``cfg_scale``), else the model's recommended one (`default_sampling`: a ShapeWorld
    checkpoint's ``default_cfg_scale``, an adapter's pipeline default)."""
    return float(policy.default_sampling().guidance_scale if asked is None else asked)


def check_records(
    prompts: Sequence[PromptRecord], generators: Sequence[torch.Generator], adapter: str
) -> None:
    """One generator per prompt; no per-prompt negative context for adapters whose negative context is
    their own null prompt (the CFG unconditional branch)."""
    if len(generators) != len(prompts):
        raise ValueError(f"need one generator per prompt, got {len(generators)} for {len(prompts)}")
    if any(p.negative is not None for p in prompts):
        raise UserError(
            f"{adapter}: the negative context is the model's own null prompt (its CFG unconditional "
            "branch); per-prompt negative prompts are not supported"
        )


def group_uniforms(
    generators: Sequence[torch.Generator],
    group_size: int,
    shape: tuple[int, ...],
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """U(0, 1) noise [P·G, *shape]: prompt i's G rows drawn from generators[i] (on the CPU, so a seed
    gives the same samples on every device), then moved to `device`."""
    parts = [torch.rand((group_size, *shape), generator=g) for g in generators]
    return torch.cat(parts).to(device) if parts else torch.empty((0, *shape), device=device)


def filter_logits(
    z: torch.Tensor, top_k: int = 0, top_p: float | torch.Tensor = 1.0, nucleus: bool | None = None
) -> torch.Tensor:
    """Top-k then top-p (nucleus) truncation of logits [N, V]: the rest set to −inf. `top_p` may be a
    tensor (the static decode loop's), with `nucleus` saying whether it truncates (no host sync)."""
    if top_k and top_k < z.shape[-1]:
        kth = z.topk(top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if (top_p < 1.0) if nucleus is None else nucleus:
        sorted_z, order = z.sort(dim=-1, descending=True)
        probs = sorted_z.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        z = z.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return z


def sample_step(
    pos: torch.Tensor,
    neg: torch.Tensor | None,
    sampling: SamplingParams,
    uniforms: torch.Tensor,
    guidance: str = "u + s(c − u)",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Positive logits [N, V] (and negative ones, or None without guidance) → tokens [N] and their
    log-probs {pos, neg, guided} [N] at temperature T. `uniforms` [N] drive the draws."""
    pos = pos.float()
    if neg is None:
        guided = pos
    else:
        neg = neg.float()
        guided = GUIDANCE[guidance](pos, neg, sampling.guidance_scale)
    z = guided / sampling.temperature
    probs = filter_logits(z, sampling.top_k, sampling.top_p).softmax(-1)
    cdf = probs.cumsum(-1)  # [N, V]
    tok = torch.searchsorted(cdf, (uniforms.to(cdf.device) * cdf[:, -1])[:, None], right=True)
    tok = tok.clamp(max=z.shape[-1] - 1)  # [N, 1]

    def lp(x: torch.Tensor) -> torch.Tensor:
        return (x / sampling.temperature).log_softmax(-1).gather(-1, tok).squeeze(-1)

    out = {"guided": lp(guided)}
    out["pos"] = out["guided"] if neg is None else lp(pos)  # unguided: the same distribution
    if neg is not None:
        out["neg"] = lp(neg)
    return tok.squeeze(-1), out


def chunk_size(batch: int, vocab: int, length: int) -> int:
    return max(1, min(length, LOGIT_BUDGET // max(batch * vocab, 1)))


def _token_logprobs(
    to_logits: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, tokens: torch.Tensor
) -> torch.Tensor:
    z = to_logits(hidden)  # [B, t, V], temperature-scaled
    return z.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)


def chunked_logprobs(
    hidden: torch.Tensor, to_logits: Callable[[torch.Tensor], torch.Tensor], tokens: torch.Tensor, vocab: int
) -> torch.Tensor:
    """log softmax(to_logits(h))[y] for hidden states [B, T, …] and tokens [B, T] → [B, T].

    With one chunk this is a plain forward; with several, each chunk's logits are recomputed in the
    backward pass (checkpointing) so that at most one [B, t, V] block is alive at a time."""
    B, T = tokens.shape
    step = chunk_size(B, vocab, T)
    if step >= T:
        return _token_logprobs(to_logits, hidden, tokens)
    parts = []
    for s in range(0, T, step):
        h, y = hidden[:, s : s + step], tokens[:, s : s + step]
        if torch.is_grad_enabled() and h.requires_grad:
            parts.append(checkpoint(_token_logprobs, to_logits, h, y, use_reentrant=False))
        else:
            parts.append(_token_logprobs(to_logits, h, y))
    return torch.cat(parts, dim=1)


class ChunkedDists:
    """Full distributions from (detached) hidden states, chunk by chunk and without gradient:
    iterating yields (slice over T, temperature-scaled logits [B, t, V])."""

    def __init__(self, hidden: torch.Tensor, to_logits: Callable[[torch.Tensor], torch.Tensor], vocab: int):
        self.hidden, self.to_logits, self.vocab = hidden.detach(), to_logits, vocab

    def __iter__(self) -> Iterator[tuple[slice, torch.Tensor]]:
        B, T = self.hidden.shape[:2]
        step = chunk_size(B, self.vocab, T)
        with torch.no_grad():
            for s in range(0, T, step):
                yield slice(s, min(s + step, T)), self.to_logits(self.hidden[:, s : s + step]).float()

    def full(self) -> torch.Tensor:
        """All chunks joined: [B, T, V] (small vocabularies and tests only)."""
        return torch.cat([z for _, z in self], dim=1)
