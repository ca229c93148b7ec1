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

    Left-padded rows (the text adapter) pass `positions` [N, n] (each row's rotary positions) and
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
        self.keys = torch.empty(shape, device=device, dtype=low)
        self.values = torch.empty(shape, device=device, dtype=low)

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

    def forward(
        self,
        ids: torch.Tensor,
        start: int,
        positions: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        rows, n = ids.shape
        if n > 1 and start != 0:
            raise ValueError("a multi-token forward (prefill) must start at position 0")
        end = start + n
        x = F.embedding(ids, self.embed)
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
            if n == 1 and low == x.dtype:  # one query: plain matmuls (query heads grouped by key-value head)
                scores = q.reshape(rows, self.kv_heads, -1, self.head_dim) @ keys.transpose(-1, -2)
                scores = scores * self.head_dim**-0.5  # [N, kv_heads, heads / kv_heads, end]
                if mask is not None:
                    scores = scores.masked_fill(~mask, float("-inf"))
                attn = (scores.softmax(-1) @ values).reshape(rows, 1, -1)
            elif n == 1:  # the same in bf16 as k·qᵀ: a bf16 q·kᵀ first copies the transposed key slice
                scores = keys @ q.reshape(rows, self.kv_heads, -1, self.head_dim).transpose(-1, -2)
                scores = scores * self.head_dim**-0.5  # [N, kv_heads, end, heads / kv_heads]
                if mask is not None:
                    scores = scores.masked_fill(~mask.transpose(-1, -2), float("-inf"))
                weights = scores.softmax(-2, dtype=torch.float32).to(low).transpose(-1, -2)
                attn = (weights @ values).reshape(rows, 1, -1)
            else:
                gqa = self.kv_heads != self.heads
                attn = F.scaled_dot_product_attention(
                    q, keys, values, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa
                )
                attn = attn.transpose(1, 2).reshape(rows, n, -1)
            x = x + attn @ out.T
            gate, up = (self._rms(x, norm2).to(low) @ gate_up.T).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ down.T
        return self._rms(x[:, -1], self.final_norm)
