"""A plain-tensor KV-cache decoder over the weights of a transformers ``LlamaModel`` (gpt-fast style).

The ShapeWorld AR prior is small (3.3 M matmul weights), so its sampler is bound by per-step
overhead, not FLOPs: each of the 64 steps calls transformers' layers (mask construction, cache
update, three q/k/v and two gate/up projections per layer). This decoder runs the same maths on the
same weights with one fused q|k|v and one fused gate|up matmul per layer, rotary tables computed once
and a preallocated KV tensor sliced to the filled length (so single-token steps need no mask): 1.3–1.4×
the rollout rate of transformers' StaticCache loop on 2 CPU threads (benchmarks `samplers`).

Only the configuration the AR prior builds is supported (`supports`): no attention / MLP bias, as many
key-value heads as query heads, default rotary embedding. The fused weights are copies taken at
construction: build one decoder per rollout (one concatenation of 3.3 M weights) so that it samples
from the current weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def supports(config) -> bool:
    """Whether `FusedLlamaDecoder` reproduces a LlamaModel of this config."""
    heads = config.num_attention_heads
    return (
        not getattr(config, "attention_bias", False)
        and not getattr(config, "mlp_bias", False)
        and (config.num_key_value_heads or heads) == heads
        and getattr(config, "head_dim", None) in (None, config.hidden_size // heads)
        and (getattr(config, "rope_scaling", None) or {}).get("rope_type", "default") == "default"
        and config.hidden_act == "silu"
    )


class FusedLlamaDecoder:
    """forward(ids [N, n], start) → final-norm hidden state of the last position [N, D], continuing the
    KV cache of the N rows from position `start` (prefill: start 0, n = prefix length; then n = 1)."""

    def __init__(self, llama, rows: int, max_len: int) -> None:
        c = llama.config
        if not supports(c):
            raise ValueError("FusedLlamaDecoder: unsupported Llama configuration")
        self.heads, self.eps = c.num_attention_heads, c.rms_norm_eps
        self.head_dim = c.hidden_size // self.heads
        self.embed = llama.embed_tokens.weight
        self.final_norm = llama.norm.weight
        self.layers = [
            (
                layer.input_layernorm.weight,
                torch.cat([getattr(layer.self_attn, f"{x}_proj").weight for x in "qkv"]),
                layer.self_attn.o_proj.weight,
                layer.post_attention_layernorm.weight,
                torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]),
                layer.mlp.down_proj.weight,
            )
            for layer in llama.layers
        ]
        device, dtype = self.embed.device, self.embed.dtype
        positions = torch.arange(max_len, device=device)[None]
        cos, sin = llama.rotary_emb(torch.zeros((), device=device, dtype=dtype), positions)
        self.cos, self.sin = cos[0], sin[0]  # [max_len, head_dim]
        shape = (len(self.layers), rows, self.heads, max_len, self.head_dim)
        self.keys = torch.empty(shape, device=device, dtype=dtype)
        self.values = torch.empty(shape, device=device, dtype=dtype)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        rows, n = ids.shape
        if n > 1 and start != 0:
            raise ValueError("a multi-token forward (prefill) must start at position 0")
        end = start + n
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos[start:end], self.sin[start:end]
        for i, (norm1, qkv, out, norm2, gate_up, down) in enumerate(self.layers):
            q, k, v = (self._rms(x, norm1) @ qkv.T).view(rows, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            self.keys[i, :, :, start:end] = self._rotate(k, cos, sin)
            self.values[i, :, :, start:end] = v
            keys, values = self.keys[i, :, :, :end], self.values[i, :, :, :end]
            q = self._rotate(q, cos, sin)
            if n == 1:  # one query: every cached position is visible, no mask
                attn = ((q @ keys.transpose(-1, -2)) * self.head_dim**-0.5).softmax(-1) @ values
            else:  # prefill from position 0: causal
                attn = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
            x = x + attn.transpose(1, 2).reshape(rows, n, -1) @ out.T
            gate, up = (self._rms(x, norm2) @ gate_up.T).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ down.T
        return self._rms(x[:, -1], self.final_norm)
