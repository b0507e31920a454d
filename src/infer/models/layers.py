"""Shared transformer layers: RMSNorm, rotary tables, GQA attention over a paged cache, gated MLP."""

from __future__ import annotations

import contextvars
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

import layerzero as lz
from infer.families.config import ModelConfig, RopeConfig
from infer.models.forward_batch import ForwardBatch, KVCache
from infer.models.quant import HalfWeight, LinearSite

if TYPE_CHECKING:
    from infer.lora.stacks import LoRAStack


class WeightSlot(NamedTuple):
    """Where one checkpoint tensor lands: a parameter, optionally one entry of a stacked one (`index`: an expert's)
    and a row range of a fused one."""

    param: str
    start: int = 0
    rows: int | None = None
    index: int | None = None


WeightMap = dict[str, WeightSlot]


_PARAMS_ON_META = contextvars.ContextVar("params_on_meta", default=False)


@contextmanager
def params_on_meta() -> Iterator[None]:
    """Models built inside get their parameters on the meta device (no memory; buffers stay real): the checkpoint
    loader allocates each parameter when it fills it, so a weight kept quantized never exists in dense form."""
    token = _PARAMS_ON_META.set(True)
    try:
        yield
    finally:
        _PARAMS_ON_META.reset(token)


def empty_param(*shape: int) -> nn.Parameter:
    """Uninitialised inference parameter (weights always come from a checkpoint)."""
    return nn.Parameter(torch.empty(*shape, device="meta" if _PARAMS_ON_META.get() else None), requires_grad=False)


def prefixed(weights: WeightMap, hf_prefix: str, our_prefix: str) -> WeightMap:
    return {hf_prefix + k: s._replace(param=our_prefix + s.param) for k, s in weights.items()}


class Unprojected(NamedTuple):
    """A projection's output left undone for the op that reads it: linear(rows, proj). Under tensor parallelism the
    reduce-and-norm after the attention or the MLP takes it, and on a GPU's decode rows sums the projection's
    split-K slices inside its own kernel (one kernel fewer a projection)."""

    rows: torch.Tensor
    proj: torch.Tensor


class HookPoint(nn.Module):
    """Identity whose module name (e.g. `blocks.3.resid_post`) marks where probes and hooks attach."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, weight_offset: float = 0.0) -> None:
        super().__init__()
        self.weight = empty_param(dim)
        self.eps = float(eps)
        self.weight_offset = float(weight_offset)
        self.norm_site, self.add_norm_site = lz.bind("rms_norm"), lz.bind("fused_add_rms_norm")
        self.reduce_norm_site = lz.bind("all_reduce_add_rms_norm")
        self.norm_router_site = lz.bind("fused_add_rms_norm_router")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm_site(x, self.weight, eps=self.eps, weight_offset=self.weight_offset)

    def add_and_norm(self, x: torch.Tensor | Unprojected, residual: torch.Tensor,
                     group: object | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual); with a tensor-parallel `group`, x is this rank's partial sum and is
        summed over the group's ranks first, in the same op (one kernel on the GPUs' decode steps), and may be left
        `Unprojected` for that op to project."""
        if group is None:
            if isinstance(x, Unprojected):
                raise ValueError("an unprojected output is only summed over a tensor-parallel group")
            return self.add_norm_site(x, residual, self.weight, eps=self.eps, weight_offset=self.weight_offset)
        rows, proj = x if isinstance(x, Unprojected) else (x, None)
        return self.reduce_norm_site(rows, residual, self.weight, proj, eps=self.eps, weight_offset=self.weight_offset,
                                     group=group)

    def add_norm_router(self, x: torch.Tensor, residual: torch.Tensor, router: torch.Tensor,
                        proj: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual, the float32 logits of `router` [E, H] over the normed rows) in one op:
        the experts that follow route from the logits themselves (one kernel fewer a layer on a GPU's decode). With
        `proj` (the attention's O weight), x is its input and the op projects it too (no sum kernel between)."""
        return self.norm_router_site(x, residual, self.weight, router, proj, eps=self.eps,
                                     weight_offset=self.weight_offset)


def rope_inv_freq(cfg: RopeConfig, head_dim: int, long: bool = False) -> torch.Tensor:
    """Inverse frequencies of the rotated dims with the checkpoint's scaling (default, linear, Llama 3's banded rule,
    or LongRoPE's per-frequency divisors: its short ones, or with `long` those for sequences past the original
    context)."""
    dim = cfg.rotary_dim(head_dim)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    if cfg.rope_type == "longrope":
        factors = torch.tensor(cfg.long_factor if long else cfg.short_factor, dtype=torch.float32)
        return 1.0 / (factors * cfg.theta**exponents)
    inv_freq = 1.0 / cfg.theta**exponents
    if cfg.rope_type == "linear":
        return inv_freq / cfg.factor
    if cfg.rope_type != "llama3":
        return inv_freq
    old_ctx = cfg.original_max_position_embeddings
    low_wavelen = old_ctx / cfg.low_freq_factor
    high_wavelen = old_ctx / cfg.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / cfg.factor, inv_freq)
    smooth = (old_ctx / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor)
    smoothed = (1 - smooth) * scaled / cfg.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def longrope_rows(batch: ForwardBatch, original: int) -> torch.Tensor:
    """[T] bool: whether each token's sequence (its context after this step) is longer than `original`, the context
    LongRoPE's short factors serve; computed on the device, so a captured graph replays it."""
    bounds = batch.cu_seqlens_q[1:]
    tokens = torch.arange(batch.positions.shape[0], dtype=bounds.dtype, device=bounds.device)
    seq = torch.searchsorted(bounds, tokens, right=True).clamp_(max=batch.num_seqs - 1)
    return batch.context_lens[seq] > original


class RotaryEmbedding(nn.Module):
    """Precomputed float32 cos/sin tables [max_positions, rotary_dim/2], gathered per token once per step. LongRoPE
    stacks the long factors' tables under the short ones (its attention factor folded into both), and a token reads
    the long rows when its sequence is longer than the original context, as transformers recomputes it."""

    def __init__(self, cfg: RopeConfig, head_dim: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.long_after = cfg.original_max_position_embeddings if cfg.rope_type == "longrope" else None
        positions = torch.arange(max_positions, dtype=torch.float32)
        kinds = (False,) if self.long_after is None else (False, True)
        freqs = torch.cat([torch.outer(positions, rope_inv_freq(cfg, head_dim, long)) for long in kinds])
        self.register_buffer("cos", freqs.cos() * cfg.attention_factor, persistent=False)
        self.register_buffer("sin", freqs.sin() * cfg.attention_factor, persistent=False)

    def forward(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        rows = batch.positions
        if self.long_after is not None:
            rows = rows + self.max_positions * longrope_rows(batch, self.long_after)
        return self.cos[rows], self.sin[rows]


class Attention(nn.Module):
    """GQA self-attention with a fused QKV projection, optional QK-norm, rope on all or the leading dims of each head,
    paged KV cache. Under tensor parallelism it returns this rank's partial sum (its heads through its o_proj
    columns); the block sums it over the ranks."""

    def __init__(self, cfg: ModelConfig, layer: int, qk_norm: bool, norm_offset: float = 0.0) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.rotary_dim = cfg.rope.rotary_dim(cfg.head_dim)
        if qk_norm and self.rotary_dim < self.head_dim:
            raise ValueError("partial rotary embeddings with QK-norm are not supported")
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.scale = cfg.attn_scale
        self.window = cfg.window(layer)
        self.qkv_proj = empty_param(self.q_size + 2 * self.kv_size, cfg.hidden_size)
        self.qkv_bias = empty_param(self.q_size + 2 * self.kv_size) if cfg.attention_bias else None
        self.o_proj = empty_param(cfg.hidden_size, self.q_size)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, norm_offset) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, norm_offset) if qk_norm else None
        # one bound kernel per call site (layerzero.dispatch.bound): chosen on the first call, then called directly
        self.qkv_site, self.o_site = LinearSite(), LinearSite()
        self.rope_q_site, self.rope_k_site = lz.bind("rope"), lz.bind("rope")  # the cache-free path
        self.rope_store_site = lz.bind("rope_store_kv")  # with a KV cache: QK-norm, rope and the K/V store in one op
        self.store_site = lz.bind("store_kv_cache")  # with a KV cache and partial rope: the store after it
        self.prefill_site, self.varlen_site = lz.bind("paged_prefill_attention"), lz.bind("varlen_attention")
        self.decode_site = lz.bind("paged_attention")
        self.qkv_lora: LoRAStack | None = None  # with LoRA adapters (infer/lora/stacks.py)
        self.o_lora: LoRAStack | None = None

    def weight_map(self) -> WeightMap:
        q, kv = self.q_size, self.kv_size
        out = {
            "q_proj.weight": WeightSlot("qkv_proj", 0, q),
            "k_proj.weight": WeightSlot("qkv_proj", q, kv),
            "v_proj.weight": WeightSlot("qkv_proj", q + kv, kv),
            "o_proj.weight": WeightSlot("o_proj"),
        }
        if self.qkv_bias is not None:
            out |= {
                "q_proj.bias": WeightSlot("qkv_bias", 0, q),
                "k_proj.bias": WeightSlot("qkv_bias", q, kv),
                "v_proj.bias": WeightSlot("qkv_bias", q + kv, kv),
            }
        if self.q_norm is not None:
            out |= {"q_norm.weight": WeightSlot("q_norm.weight"), "k_norm.weight": WeightSlot("k_norm.weight")}
        return out

    def folds_o(self, x: torch.Tensor) -> bool:
        """Whether the op after the attention may take o_proj with `attend`'s output: a float weight with no adapter,
        on CUDA (whose decode kernels sum the projection's split-K slices where they read them; elsewhere the op
        would only project first). The block then calls `attend`, not the module, so forward hooks on the attention
        do not run (probes read `resid_post`)."""
        return x.is_cuda and self.o_lora is None and isinstance(self.o_proj, torch.Tensor)

    def _folds_qkv(self, x: torch.Tensor, batch: ForwardBatch) -> bool:
        """Whether the attention prologue op takes qkv_proj with x (as `folds_o`): a bias-free float weight with no
        adapter, a KV cache and a full rope."""
        return (x.is_cuda and batch.kv_caches is not None and self.qkv_lora is None and self.qkv_bias is None
                and isinstance(self.qkv_proj, torch.Tensor) and self.rotary_dim == self.head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        o = self.attend(x, cos, sin, batch)
        out = self.o_site(o.to(x.dtype), self.o_proj)  # the output in x's dtype
        if self.o_lora is not None:
            out = self.o_lora(o, out, batch.lora_ids)
        return out

    def attend(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """The heads' outputs before the O projection, o [T, H * D]: in x's dtype, or float32 where x holds a
        HalfWeight model's bf16 rows (the cache and attention take the model's float32)."""
        tokens, heads, kv_heads, dim = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        if self._folds_qkv(x, batch):  # the projection inside the prologue op
            o = self._attend_cached(x, cos, sin, batch.kv_caches[self.layer], batch, proj=self.qkv_proj)
            return o.reshape(tokens, self.q_size)
        qkv = self.qkv_site(x, self.qkv_proj, self.qkv_bias)
        if self.qkv_lora is not None:
            qkv = self.qkv_lora(x, qkv, batch.lora_ids)
        # bf16 rows of a HalfWeight model (Block.half_rows): rope, the KV cache and attention take the model's float32
        half = isinstance(self.qkv_proj, HalfWeight) and x.dtype == self.qkv_proj.weight.dtype
        if half:
            qkv = qkv.float()
        if batch.kv_caches is not None:
            qkv_heads = qkv.view(tokens, heads + 2 * kv_heads, dim)
            o = self._attend_cached(qkv_heads, cos, sin, batch.kv_caches[self.layer], batch)
        else:
            o = self._attend_uncached(qkv, cos, sin, batch)
        return o.reshape(tokens, self.q_size)

    def _attend_cached(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache,
                       batch: ForwardBatch, proj: torch.Tensor | None = None) -> torch.Tensor:
        """qkv [T, H + 2*Hkv, D] (with `proj`, x [T, hidden] the prologue op projects): norm, rope and store in one
        op (a partial rope: rope, then the store), then attention reads K/V from the paged cache."""
        if self.q_norm is not None and self.k_norm is not None:
            norms, eps, offset = (self.q_norm.weight, self.k_norm.weight), self.q_norm.eps, self.q_norm.weight_offset
        else:
            norms, eps, offset = (None, None), 1e-6, 0.0
        heads, kv_heads = self.num_heads, self.num_kv_heads
        if self.rotary_dim < self.head_dim:
            self._rope_leading_dims(qkv[:, : heads + kv_heads], cos, sin)
            self.store_site(qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :], cache[0], cache[1],
                            batch.slot_mapping)
            q = qkv[:, :heads].contiguous()
        else:
            q = self.rope_store_site(qkv, cos, sin, cache[0], cache[1], batch.slot_mapping, *norms, proj,
                                     num_heads=heads, eps=eps, weight_offset=offset, interleaved=False)
        if batch.is_prefill:
            host = batch.context_lens_host is not None
            return self.prefill_site(
                q, cache[0], cache[1], block_tables=batch.block_tables, cu_seqlens_q=batch.cu_seqlens_q,
                context_lens=batch.context_lens, max_seqlen_q=batch.max_seqlen_q, max_context_len=batch.max_context_len,
                scale=self.scale, sliding_window=self.window, cu_seqlens_q_host=batch.cu_seqlens_q_host if host else None,
                context_lens_host=batch.context_lens_host,
            )
        return self.decode_site(
            q, cache[0], cache[1], block_tables=batch.block_tables, context_lens=batch.context_lens,
            scale=self.scale, sliding_window=self.window, max_context_len=batch.max_context_len,
        )

    def _attend_uncached(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         batch: ForwardBatch) -> torch.Tensor:
        """A forward without a KV cache (a prefill only): separate norm and rope ops, varlen attention over k and v."""
        tokens, heads, kv_heads, dim = qkv.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        if not batch.is_prefill:
            raise ValueError("a decode step needs the KV cache (ForwardBatch.kv_caches is None)")
        v = qkv[:, self.q_size + self.kv_size :].view(tokens, kv_heads, dim)
        if self.q_norm is None or self.k_norm is None:  # q and k heads are adjacent in qkv: one rope rotates both
            qk = qkv[:, : self.q_size + self.kv_size].view(tokens, heads + kv_heads, dim)
            if self.rotary_dim < dim:
                self._rope_leading_dims(qk, cos, sin)
            else:
                qk = self.rope_q_site(qk, cos, sin, interleaved=False)
            q, k = qk[:, :heads], qk[:, heads:]
        else:
            q = self.q_norm(qkv[:, : self.q_size].view(tokens, heads, dim))
            k = self.k_norm(qkv[:, self.q_size : self.q_size + self.kv_size].view(tokens, kv_heads, dim))
            q, k = self.rope_q_site(q, cos, sin, interleaved=False), self.rope_k_site(k, cos, sin, interleaved=False)
        cu, host = batch.cu_seqlens_q, batch.cu_seqlens_q_host
        return self.varlen_site(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=batch.max_seqlen_q, max_seqlen_k=batch.max_seqlen_q,
            causal=True, scale=self.scale, sliding_window=self.window, cu_seqlens_host=(host, host),
        )

    def _rope_leading_dims(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotate the first rotary_dim dims of every head of `qk` [T, heads, D] in place (a partial rope: the rope
        kernels pair dim i with i + width/2 of what they are given, as transformers pairs the rotated dims)."""
        part = qk[..., : self.rotary_dim]
        part.copy_(self.rope_q_site(part, cos, sin, interleaved=False))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up fused into one projection (under tensor parallelism this rank's
    partial sum, through its down_proj columns; the block sums it)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.intermediate = cfg.intermediate_size
        self.gate_up_proj = empty_param(2 * cfg.intermediate_size, cfg.hidden_size)
        self.down_proj = empty_param(cfg.hidden_size, cfg.intermediate_size)
        self.act = cfg.hidden_act
        self.gate_up_site, self.down_site = LinearSite(), LinearSite()
        self.act_site = lz.bind("silu_and_mul" if self.act == "silu" else "gelu_and_mul")
        self.gate_up_lora: LoRAStack | None = None  # with LoRA adapters (infer/lora/stacks.py)
        self.down_lora: LoRAStack | None = None

    def weight_map(self) -> WeightMap:
        i = self.intermediate
        return {
            "gate_proj.weight": WeightSlot("gate_up_proj", 0, i),
            "up_proj.weight": WeightSlot("gate_up_proj", i, i),
            "down_proj.weight": WeightSlot("down_proj"),
        }

    def folds_down(self, x: torch.Tensor) -> bool:
        """Whether the op after the MLP may take down_proj with `activated`'s output (as Attention.folds_o)."""
        return x.is_cuda and self.down_lora is None and isinstance(self.down_proj, torch.Tensor)

    def activated(self, x: torch.Tensor, lora_ids: torch.Tensor | None = None) -> torch.Tensor:
        """act(gate) * up: the down projection's input."""
        gate_up = self.gate_up_site(x, self.gate_up_proj)
        if self.gate_up_lora is not None:
            gate_up = self.gate_up_lora(x, gate_up, lora_ids)
        return self.act_site(gate_up) if self.act == "silu" else self.act_site(gate_up, approximate="tanh")

    def forward(self, x: torch.Tensor, lora_ids: torch.Tensor | None = None) -> torch.Tensor:
        h = self.activated(x, lora_ids)
        out = self.down_site(h, self.down_proj)
        if self.down_lora is not None:
            out = self.down_lora(h, out, lora_ids)
        return out
