"""A toy model family defined outside the package, as a user would add one (docs/guides/new_family.md).

`ToyPolicy` is the smallest honest `Policy`: 4 image tokens (a 2×2 grid) over 8 codes, each drawn from
softmax((c + W[previous token] + P[position]) / T), where c is a linear map of the prompt's letter
counts (the positive context) or a learned null vector (the negative one), guided as u + s(c − u).
`register()` adds the family ``toy`` (``toy:PATH``, or a folder holding ``toy.json``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from t2i_gcpo.policies.base import (
    Context,
    PolicyCapabilities,
    PromptRecord,
    Rollout,
    SamplingParams,
    TokenDists,
    TokenLayout,
)
from t2i_gcpo.policies.registry import Family, register_family, unregister_family

CODES, TOKENS, LETTERS = 8, 4, 26


class ToyPolicy(nn.Module):
    output = "image"
    layout = TokenLayout.image(2, 2)
    default_task = "shapeworld"
    guidance = "u + s(c − u)"
    capabilities = PolicyCapabilities(full_dists=True)
    tokenizer = None  # prompts are read letter by letter

    def __init__(self) -> None:
        super().__init__()
        self.prompt = nn.Linear(LETTERS, CODES)
        self.null = nn.Parameter(torch.zeros(CODES))
        self.previous = nn.Embedding(CODES + 1, CODES)  # row CODES: the start of the sequence
        self.position = nn.Parameter(torch.randn(TOKENS, CODES))

    @property
    def device(self) -> torch.device:
        return self.null.device

    def default_sampling(self) -> SamplingParams:
        return SamplingParams(guidance_scale=2.0)

    def branch(self, rollout, points, n, generators):
        raise TypeError("the toy family has no branched rollouts")

    def keep_reveal_order(self, order: str) -> None:
        raise ValueError("the toy family has no reveal order")

    def keep_full_precision(self) -> None:
        pass  # always float32

    def check_prompts(self, prompts: list[str]) -> None:
        pass  # any text has letter counts

    def _letters(self, texts: Sequence[str]) -> torch.Tensor:
        counts = torch.zeros(len(texts), LETTERS)
        for i, text in enumerate(texts):
            for ch in text.lower():
                if "a" <= ch <= "z":
                    counts[i, ord(ch) - ord("a")] += 1
        return counts / counts.sum(1, keepdim=True).clamp(min=1)

    def _logits(self, texts: Sequence[str], tokens: torch.Tensor, context: Context, s: float) -> torch.Tensor:
        """Logits [B, T, CODES] of every position given the tokens before it (teacher forcing)."""
        start = torch.full_like(tokens[:, :1], CODES)
        shared = self.previous(torch.cat([start, tokens[:, :-1]], 1)) + self.position[: tokens.shape[1]]
        c = shared + self.prompt(self._letters(texts))[:, None]
        u = shared + self.null
        return {"pos": c, "neg": u, "guided": u + s * (c - u)}[context]

    def rollout(
        self,
        prompts: Sequence[PromptRecord],
        group_size: int,
        sampling: SamplingParams,
        generators: Sequence[torch.Generator],
    ) -> Rollout:
        if len(generators) != len(prompts):
            raise ValueError("one generator per prompt")
        records = [p for p in prompts for _ in range(group_size)]
        texts = [p.text for p in records]
        tokens = torch.zeros(len(records), TOKENS, dtype=torch.long)
        draws = torch.cat([torch.rand(group_size, TOKENS, generator=g) for g in generators])
        with torch.no_grad():
            for t in range(TOKENS):  # position t's logits depend on tokens < t only
                logits = self._logits(texts, tokens, "guided", sampling.guidance_scale)[:, t]
                cdf = (logits / sampling.temperature).softmax(-1).cumsum(-1)
                tokens[:, t] = (
                    torch.searchsorted(cdf, draws[:, t : t + 1].contiguous()).squeeze(1).clamp(max=CODES - 1)
                )
        ro = Rollout(
            tokens=tokens,
            mask=torch.ones(len(records), TOKENS),
            step=torch.arange(TOKENS).expand(len(records), -1),
            logp={},
            prompts=records,
            group_size=group_size,
            sampling=sampling,
        )
        with torch.no_grad():
            ro.logp = {ctx: self.logprobs(ro, ctx) for ctx in ("pos", "neg", "guided")}
        return ro

    def logprobs_and_dists(
        self, rollout: Rollout, context: Context = "pos"
    ) -> tuple[torch.Tensor, TokenDists]:
        s = rollout.sampling
        logits = self._logits(rollout.texts, rollout.tokens, context, s.guidance_scale) / s.temperature
        logp = logits.log_softmax(-1).gather(-1, rollout.tokens[..., None]).squeeze(-1)
        return logp, [(slice(0, TOKENS), logits.detach())]

    def logprobs(self, rollout: Rollout, context: Context = "pos") -> torch.Tensor:
        return self.logprobs_and_dists(rollout, context)[0]

    def forward(self, rollout: Rollout, context: Context = "pos", dists: bool = False):
        return self.logprobs_and_dists(rollout, context) if dists else self.logprobs(rollout, context)

    def token_features(self, rollout: Rollout) -> torch.Tensor:
        return self.previous.weight[rollout.tokens]

    def decode(self, rollout: Rollout) -> torch.Tensor:
        grey = rollout.tokens.float().view(-1, 1, 2, 2) / (CODES - 1)
        return grey.expand(-1, 3, -1, -1).clone()

    def save_pretrained(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), Path(path) / "toy.pt")
        (Path(path) / "toy.json").write_text(json.dumps({"family": "toy"}))

    @classmethod
    def from_pretrained(cls, path: str) -> ToyPolicy:
        policy = cls()
        policy.load_state_dict(torch.load(Path(path) / "toy.pt", weights_only=True))
        return policy.eval()


def make_family() -> Family:
    return Family(
        name="toy",
        load=lambda target, options: ToyPolicy.from_pretrained(target),
        detect=lambda path: (path / "toy.json").is_file(),
    )


def register() -> Family:
    return register_family(make_family())


def unregister() -> None:
    unregister_family("toy")


def build_tiny_toy(root: Path) -> str:
    torch.manual_seed(0)
    ToyPolicy().save_pretrained(str(root / "toy"))
    return f"toy:{root / 'toy'}"
