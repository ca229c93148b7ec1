"""A plain-tensor KV-cache decoder over the weights of a transformers ``LlamaModel`` (gpt-fast style).

The ShapeWorld AR prior is small (3.3 M matmul weights), so its sampler is bound by per-step
overhead, not FLOPs: each of the 64 steps calls transformers' layers (mask construction, cache
update, three q/k/v and two gate/up projections per layer). This decoder runs the same maths on the
same weights with one fused q|k|v and one fused gate|up matmul per layer, rotary tables computed once
and a preallocated KV tensor sliced to the filled length (so single-token steps need no mask): 1.3–1.4×
the rollout rate of transformers' StaticCache loop on 2 CPU threads (benchmarks `samplers`).

Only plain Llama configurations are supported (`supports`: model_type llama, no attention / MLP bias,
default rotary embedding, SiLU; grouped-query attention is): the AR prior's, and the
arithmetic world's causal LM, which the text adapter then samples through it too. The fused weights are copies taken at
construction: build one decoder per rollout (one concatenation of 3.3 M weights) so that it samples
from the current weights.

Built under ``torch.autocast`` (``SamplingParams.autocast="bf16"``), the copies and the KV cache are
taken in the autocast dtype: the matmuls and the cache reads (the one-query attention is bound by
them) run in bf16, while the residual stream, the norms and the softmax stay float32. On a CPU with
native bf16 this samples the ShapeWorld prior ≈ 1.5× faster at one thread (benchmarks `samplers`).

`step` is the same single-token forward in static shapes, what a CUDA graph can capture once and replay
(policies/decode_loop.py): the cache slot, the rotary positions and the mask of filled slots are tensors,
not Python ints, and the query attends over a fixed span of the cache (the filled slots unmasked) rather
than over a slice that grows by one each step. `forward` takes token ids or, for Janus's image tokens,
input embeddings.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F


def supports(config) -> bool:
    """Whether `FusedLlamaDecoder` reproduces a LlamaModel of this config."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return (
        config.model_type == "llama"
        and not getattr(config, "attention_bias", False)
        and not getattr(config, "mlp_bias", False)
        and rope.get("rope_type", "default") == "default"
        and config.hidden_act == "silu"
    )


class FusedLlamaDecoder:
    """forward(ids [N, n], start) → final-norm hidden state of the last position [N, D], continuing the
    KV cache of the N rows from cache slot `start` (prefill: start 0, n = context width; then n = 1).
    `ids` may instead be input embeddings [N, n, D] (float).

    Left-padded rows (the text adapter, Janus) pass `positions` [N, n] (each row's rotary positions) and
    `key_mask` [N, start + n] (False at padding slots, which no query attends to)."""

    def __init__(self, llama, rows: int, max_len: int) -> None:
        c = llama.config
        if not supports(c):
            raise ValueError(f"FusedLlamaDecoder: unsupported configuration ({c.model_type})")
        self.heads, self.eps = c.num_attention_heads, c.rms_norm_eps
        self.kv_heads = c.num_key_value_heads or self.heads  # grouped-query attention when fewer
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // self.heads
        self.embed = llama.embed_tokens.weight
        self.final_norm = llama.norm.weight
        device, dtype = self.embed.device, self.embed.dtype
        # the matmuls' dtype: the weights', or the autocast dtype when built under torch.autocast
        low = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else dtype
        self.compute_dtype = low
        self.layers = [
            (
                layer.input_layernorm.weight,
                torch.cat([getattr(layer.self_attn, f"{x}_proj").weight for x in "qkv"]).to(low),
                layer.self_attn.o_proj.weight.to(low),
                layer.post_attention_layernorm.weight,
                torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]).to(low),
                layer.mlp.down_proj.weight.to(low),
            )
            for layer in llama.layers
        ]
        positions = torch.arange(max_len, device=device)[None]
        cos, sin = llama.rotary_emb(torch.zeros((), device=device, dtype=dtype), positions)
        self.cos, self.sin = cos[0], sin[0]  # [max_len, head_dim]
        shape = (len(self.layers), rows, self.kv_heads, max_len, self.head_dim)
        self.max_len = max_len
        # zeros, not empty: `step` attends over unfilled slots too (masked, weight 0), and 0 × a NaN left in
        # recycled memory would be NaN
        self.keys = torch.zeros(shape, device=device, dtype=low)
        self.values = torch.zeros(shape, device=device, dtype=low)

    def fork(self, rows: torch.Tensor) -> FusedLlamaDecoder:
        """A decoder sharing these weights whose cache rows are copies of `rows` of this cache (branched
        rollouts: continuations start from a root's filled prefix)."""
        fork = copy.copy(self)
        fork.keys, fork.values = self.keys[:, rows], self.values[:, rows]  # advanced indexing copies
        return fork

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def _attention_mask(self, n: int, end: int, key_mask: torch.Tensor | None) -> torch.Tensor | None:
        """Boolean [N, 1, n, end] (True: attend) or None when every key is visible to every query."""
        if key_mask is None:
            return None  # n = 1: no mask; prefill: sdpa's is_causal
        if n == 1:
            return key_mask[:, None, None, :end]
        causal = torch.ones(n, n, dtype=torch.bool, device=key_mask.device).tril()
        # a padding query sees itself too: no row is fully masked (softmax of all −inf is NaN)
        eye = torch.eye(n, dtype=torch.bool, device=key_mask.device)
        return (causal & key_mask[:, None, None, :end]) | eye

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (long) → embeddings; input embeddings (float) pass in the residual stream's dtype."""
        return x.to(self.embed.dtype) if x.is_floating_point() else F.embedding(x, self.embed)

    def _one_query_attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                             mask: torch.Tensor | None, residual: torch.dtype) -> torch.Tensor:  # fmt: skip
        """One query per row: q [N, heads, 1, hd] over keys / values [N, kv_heads, S, hd] (mask [N, 1, 1, S],
        True: attend) → [N, 1, heads·hd]. Plain matmuls, the query heads grouped by key-value head."""
        rows, low = q.shape[0], self.compute_dtype
        grouped = q.reshape(rows, self.kv_heads, -1, self.head_dim)
        if low == residual:
            scores = (grouped @ keys.transpose(-1, -2)) * self.head_dim**-0.5  # [N, kv_heads, g, S]
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            return (scores.softmax(-1) @ values).reshape(rows, 1, -1)
        # the same in bf16 as k·qᵀ: a bf16 q·kᵀ first copies the transposed key slice
        scores = (keys @ grouped.transpose(-1, -2)) * self.head_dim**-0.5  # [N, kv_heads, S, g]
        if mask is not None:
            scores = scores.masked_fill(~mask.transpose(-1, -2), float("-inf"))
        weights = scores.softmax(-2, dtype=torch.float32).to(low).transpose(-1, -2)
        return (weights @ values).reshape(rows, 1, -1)

    def _mlp(
        self, x: torch.Tensor, norm2: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
    ) -> torch.Tensor:
        gate, up = (self._rms(x, norm2).to(self.compute_dtype) @ gate_up.T).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ down.T

    def forward(
        self,
        ids: torch.Tensor,
        start: int,
        positions: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        rows, n = ids.shape[:2]
        if n > 1 and start != 0:
            raise ValueError("a multi-token forward (prefill) must start at position 0")
        end = start + n
        x = self._input(ids)
        if positions is None:
            cos, sin = self.cos[start:end], self.sin[start:end]  # [n, head_dim]
        else:
            cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [N, 1, n, head_dim]
        mask = self._attention_mask(n, end, key_mask)
        split, low = (self.heads, self.kv_heads, self.kv_heads), self.compute_dtype
        for i, (norm1, qkv, out, norm2, gate_up, down) in enumerate(self.layers):
            h = self._rms(x, norm1).to(low) @ qkv.T
            q, k, v = h.view(rows, n, -1, self.head_dim).split(split, dim=2)
            q = self._rotate(q.transpose(1, 2), cos, sin).to(low)  # [N, heads, n, head_dim]
            self.keys[i, :, :, start:end] = self._rotate(k.transpose(1, 2), cos, sin)
            self.values[i, :, :, start:end] = v.transpose(1, 2)
            keys, values = self.keys[i, :, :, :end], self.values[i, :, :, :end]  # [N, kv_heads, end, hd]
            if n == 1:
                attn = self._one_query_attention(q, keys, values, mask, x.dtype)
            else:
                gqa = self.kv_heads != self.heads
                attn = F.scaled_dot_product_attention(
                    q, keys, values, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa
                )
                attn = attn.transpose(1, 2).reshape(rows, n, -1)
            x = self._mlp(x + attn @ out.T, norm2, gate_up, down)
        return self._rms(x[:, -1], self.final_norm)

    def step(self, x: torch.Tensor, slot: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor,
             span: int | None = None) -> torch.Tensor:  # fmt: skip
        """`forward` of one token per row in static shapes: ids [N] (or embeddings [N, D]) written to cache
        slot `slot` ([1] long tensor), at rotary `positions` [N] (long tensor), attending over the first
        `span` slots (default: all) where `key_mask` [N, max_len] (bool, this slot included) is True →
        final-norm hidden state [N, D]. Nothing in it depends on a Python value that changes between
        steps, so one capture of it serves every step whose filled slots lie within `span`."""
        rows, span = x.shape[0], span or self.max_len
        x = self._input(x)[:, None]  # [N, 1, D]
        cos, sin = self.cos[positions][:, None, None], self.sin[positions][:, None, None]  # [N, 1, 1, hd]
        mask = key_mask[:, None, None, :span]
        split, low = (self.heads, self.kv_heads, self.kv_heads), self.compute_dtype
        for i, (norm1, qkv, out, norm2, gate_up, down) in enumerate(self.layers):
            h = self._rms(x, norm1).to(low) @ qkv.T
            q, k, v = h.view(rows, 1, -1, self.head_dim).split(split, dim=2)
            q = self._rotate(q.transpose(1, 2), cos, sin).to(low)  # [N, heads, 1, head_dim]
            keys, values = self.keys[i], self.values[i]  # [N, kv_heads, max_len, hd]
            keys.index_copy_(2, slot, self._rotate(k.transpose(1, 2), cos, sin).to(low))  # [N, kv, 1, hd]
            values.index_copy_(2, slot, v.transpose(1, 2).to(low))
            attn = self._one_query_attention(q, keys[:, :, :span], values[:, :, :span], mask, x.dtype)
            x = self._mlp(x + attn @ out.T, norm2, gate_up, down)
        return self._rms(x[:, -1], self.final_norm)
