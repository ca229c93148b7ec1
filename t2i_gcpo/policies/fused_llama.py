"""A plain-tensor KV-cache decoder over the weights of a transformers ``LlamaModel`` (gpt-fast style).

The ShapeWorld AR prior is small (3.3 M matmul weights), so its sampler is bound by per-step
overhead, not FLOPs: each of the 64 steps calls transformers' layers (mask construction, cache
update, three q/k/v and two gate/up projections per layer). This decoder runs the same maths on the
same weights with one fused q|k|v and one fused gate|up matmul per layer, rotary tables computed once,
q and k rotated together, and one preallocated KV tensor per layer ([2, rows, kv_heads, max_len, head_dim]:
keys, values) written by one in-place copy per step: 1.3–1.4× the rollout rate of transformers'
StaticCache loop on 2 CPU threads (benchmarks `samplers`). One tensor per layer, not one for the whole
cache, so that `torch.compile` writes each step's slot in place (a write into a view of one big cache tensor
made inductor copy and write back the whole cache every step).

Only plain Llama configurations are supported (`supports`: model_type llama, no attention / MLP bias,
default rotary embedding, SiLU; grouped-query attention is), with or without peft LoRA adapters on its
linear layers (`supports_model`): the AR prior's, Janus-Pro's language model, and the arithmetic world's
causal LM. The fused weights are copies (LoRA deltas merged into them, W + s·B·A) taken at construction. A
decoder kept for a whole run (policies/decode_loop.DecodeSession, ``owned``) holds its own copy of every
weight its `step` reads — none aliases a parameter, whose storage a strategy may free and move (FSDP2 gathers
each step's weights into new storage under the same parameter objects and version counters) — and `refresh`
copies the current weights into them in place when they changed: the same addresses, which is what a
captured CUDA graph needs. A decoder built for one pass (the eager loop) reads the parameters themselves.

Built under ``torch.autocast`` (``SamplingParams.autocast="bf16"``), the copies and the KV cache are
taken in the autocast dtype: the matmuls and the cache reads run in bf16, while the residual stream, the
norms, the rotary embedding and the softmax stay float32. The attention's scores q·kᵀ are float32 also from
bf16 inputs, as the update's attention forms them: through ``scaled_dot_product_attention`` (one kernel on
CUDA), or in the eager loop on the CPU, one query a row, through plain matmuls of the keys in float32 (the
CPU's SDPA kernel is 1.5–5× slower there).

`step` is the same single-token forward in static shapes, what a CUDA graph can capture once and replay
(policies/decode_loop.py): the cache slot, the rotary positions and the additive mask of filled slots are
tensors, not Python ints, and the query attends over a fixed span of the cache (the filled slots unmasked)
rather than over a slice that grows by one each step. `forward` takes token ids or, for Janus's image
tokens, input embeddings.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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


def lora_layers(module: nn.Module) -> list[nn.Module]:
    """The peft LoRA layers inside `module` (a layer with a `base_layer` and `lora_A` / `lora_B`)."""
    return [m for m in module.modules() if hasattr(m, "base_layer") and hasattr(m, "lora_A")]


def supports_model(llama: nn.Module) -> bool:
    """`supports` for the config, and any peft adapters on the model plain LoRA on linear layers (no DoRA,
    no other tuner), which the decoder merges into its weight copies."""
    if not supports(llama.config):
        return False
    for m in lora_layers(llama):
        dora = any(getattr(m, "use_dora", {}).get(a, False) for a in getattr(m, "active_adapters", []))
        if dora or not isinstance(m.base_layer, nn.Linear):
            return False
    return True


def effective_weight(linear: nn.Module) -> Tensor:
    """The weight a linear layer multiplies by: its own, or with peft LoRA, the base weight plus the active
    adapters' deltas s·B·A (float32 maths, as merging does; dropout is off when sampling)."""
    if not hasattr(linear, "base_layer"):
        return linear.weight
    weight = linear.base_layer.weight
    if getattr(linear, "merged", False) or getattr(linear, "disable_adapters", False):
        return weight
    with torch.autocast(weight.device.type, enabled=False):
        for name in linear.active_adapters:
            if name in linear.lora_A:
                weight = weight + linear.get_delta_weight(name).to(weight.dtype)
    return weight


def weights_stamp(llama: nn.Module) -> tuple[tuple[int, int], ...]:
    """Each parameter's version counter and address: changes when a weight is written in place (an optimizer
    step, a load) or its storage moves (FSDP2's gather, which keeps the version counter). Not a proof that
    nothing changed (a strategy may write new values at the same address without a version bump): a kept
    decoder is also refreshed when the trainer says its weights changed (`refresh`'s `generation`)."""
    return tuple((p._version, p.data_ptr()) for p in llama.parameters())


def _own(t: Tensor, params: set[int]) -> Tensor:
    """`t`, or a copy of it where it shares storage with one of `params` (their storages' addresses)."""
    return t.clone() if t.untyped_storage().data_ptr() in params else t


class FusedLlamaDecoder:
    """forward(ids [N, n], start) → final-norm hidden state of the last position [N, D], continuing the
    KV cache of the N rows from cache slot `start` (prefill: start 0, n = context width; then n = 1).
    `ids` may instead be input embeddings [N, n, D] (float).

    Left-padded rows (the text adapter, Janus) pass `positions` [N, n] (each row's rotary positions) and
    `key_mask` [N, start + n] (False at padding slots, which no query attends to).

    `owned`: every weight `step` reads is a copy held here (a decoder kept across optimizer steps, `refresh`);
    the token embedding too once `own_embedding` is called (a loop fed token ids; the prefill reads the live
    one until then)."""

    def __init__(self, llama, rows: int, max_len: int, owned: bool = False) -> None:
        c = llama.config
        if not supports_model(llama):
            raise ValueError(f"FusedLlamaDecoder: unsupported configuration ({c.model_type})")
        self.llama = llama  # the source of the weight copies (`refresh`)
        self.heads, self.eps = c.num_attention_heads, c.rms_norm_eps
        self.kv_heads = c.num_key_value_heads or self.heads  # grouped-query attention when fewer
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // self.heads
        self.owned = owned
        self.embed: Tensor | None = None if owned else llama.embed_tokens.weight  # owned: `own_embedding`
        weight = llama.embed_tokens.weight
        device, dtype = weight.device, weight.dtype
        # the matmuls' dtype: the weights', or the autocast dtype when built under torch.autocast
        low = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else dtype
        self.compute_dtype = low
        # CUDA: F.rms_norm and scaled_dot_product_attention, one kernel each. On the CPU F.rms_norm is a
        # composite of more ops, and for one query SDPA's kernel is slower than plain matmuls (1.5–5× at 20–80
        # slots): the eager loop's one-token forward uses them there (`step` keeps SDPA: what CUDA runs, and
        # what inductor compiles best)
        self.fused_kernels = device.type == "cuda"
        # owned: the storages of the parameters, which the decoder copies rather than keeps (`_held`)
        self._storages = {p.untyped_storage().data_ptr() for p in llama.parameters()} if owned else set()
        with torch.no_grad():
            self.layers = [self._copies(layer) for layer in llama.layers]
            self.final_norm = self._held(llama.norm.weight)
        self.stamp, self.generation = weights_stamp(llama), 0
        positions = torch.arange(max_len, device=device)[None]
        cos, sin = llama.rotary_emb(torch.zeros((), device=device, dtype=dtype), positions)
        half = self.head_dim // 2
        self.cos = cos[0]  # [max_len, head_dim]
        # rotate_half(x)·sin = roll(x, half)·(−sin | sin): the sign folded into the table
        self.sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)
        self.rows, self.max_len = rows, max_len
        # one tensor per layer, keys and values: [2, N, kv_heads, max_len, head_dim]. Zeros, not empty:
        # `step` attends over unfilled slots too (masked, weight 0), and 0 × a NaN left in recycled memory
        # would be NaN
        self.kv = [
            torch.zeros(2, rows, self.kv_heads, max_len, self.head_dim, device=device, dtype=low)
            for _ in self.layers
        ]

    # ---- weights ----------------------------------------------------------------------------------
    def _held(self, w: Tensor) -> Tensor:
        """What the decoder keeps of weight `w`: `w` itself, or (`owned`) a copy where `w` is a parameter's
        storage."""
        return _own(w, self._storages) if self.owned else w

    def _fused(self, linears: Sequence[nn.Module]) -> Tensor:
        """The linears' effective weights stacked along the output dimension, in the compute dtype (the
        weight itself where that is one plain weight already in it: no copy)."""
        weights = [effective_weight(m) for m in linears]
        w = weights[0] if len(weights) == 1 else torch.cat(weights)
        return w.to(self.compute_dtype)

    def _copies(self, layer, hold: bool = True) -> tuple[Tensor, ...]:
        """A layer's weights as `step` reads them (`hold`: as the decoder keeps them, `_held`)."""
        attn, mlp = layer.self_attn, layer.mlp
        weights = (
            layer.input_layernorm.weight,
            self._fused([attn.q_proj, attn.k_proj, attn.v_proj]),
            self._fused([attn.o_proj]),
            layer.post_attention_layernorm.weight,
            self._fused([mlp.gate_proj, mlp.up_proj]),
            self._fused([mlp.down_proj]),
        )
        return tuple(self._held(w) for w in weights) if hold else weights

    @torch.no_grad()
    def own_embedding(self) -> None:
        """An owned decoder whose `step` is fed token ids: its own copy of the token embedding (refreshed with
        the other weights)."""
        if self.owned and self.embed is None:
            self.embed = self.llama.embed_tokens.weight.clone()

    @torch.no_grad()
    def refresh(self, generation: int = 0) -> bool | None:
        """An owned decoder: copy the current weights into its copies in place (the same tensors, so a
        captured graph or a compiled step reads the new values) if they changed since the last copy — by
        `weights_stamp`, or by `generation`, a counter the trainer bumps after every optimizer step
        (`DecodeSession.generation`) → whether they had; None where they cannot be copied in place (a weight
        of another shape or dtype) — then build a new decoder."""
        if not self.owned:
            raise ValueError("only a decoder that owns its weight copies (owned=True) is refreshed")
        stamp = weights_stamp(self.llama)
        if stamp == self.stamp and generation == self.generation:
            return False
        pairs = [(self.final_norm, self.llama.norm.weight)]
        if self.embed is not None:
            pairs.append((self.embed, self.llama.embed_tokens.weight))
        if any(m.shape != w.shape or m.dtype != w.dtype for m, w in pairs):
            return None
        for held, layer in zip(self.layers, self.llama.layers):  # a layer at a time: one layer's temporaries
            new = self._copies(layer, hold=False)
            if any(m.shape != w.shape or m.dtype != w.dtype for m, w in zip(held, new)):
                return None
            for mine, w in zip(held, new):
                mine.copy_(w)
        for mine, w in pairs:
            mine.copy_(w)
        self.stamp, self.generation = stamp, generation
        return True

    def fork(self, rows: Tensor) -> FusedLlamaDecoder:
        """A decoder sharing these weights whose cache rows are copies of `rows` of this cache (branched
        rollouts: continuations start from a root's filled prefix; a kept cache outlives the next pass)."""
        fork = copy.copy(self)
        fork.kv = [kv[:, rows] for kv in self.kv]  # advanced indexing copies
        fork.rows = len(rows)
        return fork

    # ---- pieces -----------------------------------------------------------------------------------
    def _rms(self, x: Tensor, weight: Tensor) -> Tensor:
        if self.fused_kernels:
            return F.rms_norm(x, weight.shape, weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    @staticmethod
    def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x·cos + rotate_half(x)·sin, with `sin` signed (`__init__`): rotate_half(x) =
        roll(x, half)·(−1 | 1)."""
        return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin)

    def _input(self, x: Tensor) -> Tensor:
        """Token ids (long) → embeddings; input embeddings (float) pass in the residual stream's dtype."""
        embed = self.embed if self.embed is not None else self.llama.embed_tokens.weight
        return x.to(embed.dtype) if x.is_floating_point() else F.embedding(x, embed)

    def _qkv(self, x: Tensor, norm: Tensor, qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """x [N, n, D] → q [N, heads, n, hd] (compute dtype) and the new keys | values [2, N, kv, n, hd]; q
        and k rotated together, in float32."""
        rows, n = x.shape[:2]
        h = self._rms(x, norm).to(self.compute_dtype) @ qkv.T
        h = h.view(rows, n, -1, self.head_dim).transpose(1, 2)  # [N, heads + 2 kv, n, hd]
        qk = self._rotate(h[:, : self.heads + self.kv_heads], cos, sin).to(self.compute_dtype)
        q, k = qk.split((self.heads, self.kv_heads), dim=1)
        return q, torch.stack([k, h[:, self.heads + self.kv_heads :]])

    def _attend(
        self, q: Tensor, kv: Tensor, mask: Tensor | None, causal: bool = False, plain: bool = False
    ) -> Tensor:
        """q [N, heads, n, hd] over keys / values kv [2, N, kv_heads, S, hd] (mask: boolean, True: attend, or
        additive) → [N, n, heads·hd], through SDPA or (`plain`, one query) plain matmuls of the keys in
        float32. The scores q·kᵀ are float32 either way, also from bf16 inputs (SDPA's kernels
        accumulate them so)."""
        rows, n = q.shape[0], q.shape[2]
        if plain and n == 1:
            grouped = q.reshape(rows, self.kv_heads, -1, self.head_dim).float()  # [N, kv_heads, g, hd]
            scores = (grouped @ kv[0].float().transpose(-1, -2)) * self.head_dim**-0.5  # [N, kv_heads, g, S]
            if mask is not None:
                scores = (
                    scores + mask if mask.is_floating_point() else scores.masked_fill(~mask, float("-inf"))
                )
            return (scores.softmax(-1).to(kv.dtype) @ kv[1]).reshape(rows, 1, -1)
        out = F.scaled_dot_product_attention(
            q, kv[0], kv[1], attn_mask=mask, is_causal=causal, enable_gqa=self.kv_heads != self.heads
        )
        return out.transpose(1, 2).reshape(rows, n, -1)

    def _mlp(self, x: Tensor, norm2: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
        gate, up = (self._rms(x, norm2).to(self.compute_dtype) @ gate_up.T).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ down.T

    def _attention_mask(self, n: int, end: int, key_mask: Tensor | None) -> Tensor | None:
        """Boolean [N, 1, n, end] (True: attend) or None when every key is visible to every query."""
        if key_mask is None:
            return None  # n = 1: no mask; prefill: sdpa's is_causal
        if n == 1:
            return key_mask[:, None, None, :end]
        causal = torch.ones(n, n, dtype=torch.bool, device=key_mask.device).tril()
        # a padding query sees itself too: no row is fully masked (softmax of all −inf is NaN)
        eye = torch.eye(n, dtype=torch.bool, device=key_mask.device)
        return (causal & key_mask[:, None, None, :end]) | eye

    # ---- the forwards -----------------------------------------------------------------------------
    def forward(
        self, ids: Tensor, start: int, positions: Tensor | None = None, key_mask: Tensor | None = None
    ) -> Tensor:
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
        for i, (norm1, qkv, out, norm2, gate_up, down) in enumerate(self.layers):
            q, new = self._qkv(x, norm1, qkv, cos, sin)
            self.kv[i][:, :, :, start:end] = new
            attn = self._attend(
                q,
                self.kv[i][:, :, :, :end],
                mask,
                causal=n > 1 and mask is None,
                plain=not self.fused_kernels,
            )
            x = self._mlp(x + attn @ out.T, norm2, gate_up, down)
        return self._rms(x[:, -1], self.final_norm)

    def step(
        self,
        x: Tensor,
        slot: Tensor,
        positions: Tensor,
        bias: Tensor,
        span: int | None = None,
        plain: bool = False,
    ) -> Tensor:
        """`forward` of one token per row in static shapes: ids [N] (or embeddings [N, D]) written to cache
        slot `slot` ([1] long tensor), at rotary `positions` [N] (long tensor), attending over the first
        `span` slots (default: all) with the additive mask `bias` [N, max_len] (0 at filled slots, this one
        included, −inf elsewhere; the compute dtype) → final-norm hidden state [N, D]. Nothing in it depends
        on a Python value that changes between steps, so one capture of it serves every step whose filled
        slots lie within `span`. `plain`: the attention through plain matmuls (`_attend`), where a CPU runs
        the step uncaptured over exactly the filled slots (continuations of an eager rollout)."""
        span = span or self.max_len
        x = self._input(x)[:, None]  # [N, 1, D]
        cos, sin = self.cos[positions][:, None, None], self.sin[positions][:, None, None]  # [N, 1, 1, hd]
        mask = bias[:, None, None, :span]
        for i, (norm1, qkv, out, norm2, gate_up, down) in enumerate(self.layers):
            q, new = self._qkv(x, norm1, qkv, cos, sin)
            kv = self.kv[i]
            kv.index_copy_(3, slot, new)  # one in-place write of the layer's keys and values
            attn = self._attend(q, kv[:, :, :, :span], mask, plain=plain)
            x = self._mlp(x + attn @ out.T, norm2, gate_up, down)
        return self._rms(x[:, -1], self.final_norm)
