"""Analytic FLOP counts of the transformer forwards that the suite times.

A forward over S positions of a decoder with N matmul weights (every nn.Linear: attention
projections, MLP, output head; embedding lookups, norms, activations, softmax and rotary embeddings
are not counted), L layers, attention width d (heads × head dim), where position i attends to c_i keys:

    F = 2·N·S + 4·L·d·Σ_i c_i

2·N per position is one multiply-add per weight; 4·L·d·c per position is Q·Kᵀ and A·V, 2·d·c each,
per layer. Classifier-free guidance runs two rows per image (cond and null), so sampling costs 2F.

- AR sampling with a KV cache: the prefix (P positions) and the T − 1 fed image tokens are
  S = P + T − 1 positions; position i (0-based) attends to i + 1 keys: Σ c = S(S + 1)/2.
- masked (MaskGIT) sampling: each of the `steps` steps is a bidirectional forward of the whole
  sequence, S = P + T positions each attending to S keys: Σ c = S².
- a teacher-forced forward (the update's log-probs) is the AR case run in parallel: S = P + T − 1,
  Σ c = S(S + 1)/2, one row per sample (two for the guided context); forward + backward ≈ 3 forwards.

These are the useful FLOPs: the head run at prefix positions whose logits are dropped and the
checkpointed recomputation of the log-prob chunks do work that is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """What the FLOP count of a decoder needs."""

    params: int  # N: matmul weights
    layers: int  # L
    width: int  # d: attention width (heads × head dim)


def forward_flops(shape: Shape, positions: int, keys: int) -> float:
    """F = 2·N·positions + 4·L·d·keys, with keys = Σ over positions of the keys each attends to."""
    return 2.0 * shape.params * positions + 4.0 * shape.layers * shape.width * keys


def causal_keys(positions: int) -> int:
    """Σ_{i=1}^{S} i: position i of a causal sequence of S attends to i keys."""
    return positions * (positions + 1) // 2


def ar_sampling_flops(shape: Shape, prefix: int, tokens: int, images: int, cfg: bool = True) -> float:
    """One KV-cache rollout of `images` images of `tokens` tokens after a `prefix`-token prompt."""
    s = prefix + tokens - 1
    return (2 if cfg else 1) * images * forward_flops(shape, s, causal_keys(s))


def masked_sampling_flops(
    shape: Shape, prefix: int, tokens: int, steps: int, images: int, cfg: bool = True
) -> float:
    """One MaskGIT rollout: `steps` bidirectional forwards of P + T positions."""
    s = prefix + tokens
    return (2 if cfg else 1) * images * steps * forward_flops(shape, s, s * s)


def teacher_forced_flops(shape: Shape, prefix: int, tokens: int, rows: int) -> float:
    """One parallel forward scoring `tokens` tokens after a `prefix`-token prompt, for `rows` rows."""
    s = prefix + tokens - 1
    return rows * forward_flops(shape, s, causal_keys(s))
