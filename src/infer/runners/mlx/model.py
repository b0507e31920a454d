"""Llama 3, Mistral, Qwen 3, Gemma 3 and Phi-3 in MLX, built from the torch model infer's loaders filled (the same
ModelConfig and weight-name maps) and the family's declaration (families/catalog.py): the families differ exactly
where the torch blocks do.

Llama 3: pre-norm blocks, SwiGLU, rope with the checkpoint's scaling. Mistral: the same, every layer sliding when the
config sets a window. Phi-3: the same, with LongRoPE and partial rope. Qwen 3: the Llama block plus RMSNorm on each
query and key head (QK-norm). Gemma 3: (1 + w) norms, sandwich norms around attention and the MLP, QK-norm, GeGLU
(tanh GELU), sliding-window layers with their own rope, query_pre_attn_scalar scaling, sqrt(hidden) embedding scale
and final logit softcapping. Norms run through `mx.fast.rms_norm`, rope through `mx.fast.rope` with the frequencies
`rope_inv_freq` gives the torch model (Llama 3's banded scaling, linear scaling, LongRoPE's short and long factors)
on the leading `rotary_dim` dims, attention through `mx.fast.scaled_dot_product_attention` over the paged cache
(attention.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx

from infer.loader.model_loader import LoadedModel
from infer.families.catalog import family
from infer.families.config import ModelConfig, RopeConfig
from infer.models.layers import rope_inv_freq
from infer.models.moe import SparseMLP
from infer.runners.mlx.attention import StepLayout, paged_attention
from infer.runners.mlx.weights import Linear, linear, lm_head, to_mx

@dataclass
class Experts:
    """A sparse layer's router [E, H] and stacked experts (w13 [E, 2I, H], w2 [E, H, I]), as the torch model holds them."""

    router: mx.array
    w13: mx.array
    w2: mx.array
    top_k: int
    renormalize: bool


@dataclass
class Layer:
    """One block's weights (norm weights with the family's offset folded in)."""

    input_norm: mx.array
    qkv: Linear
    o: Linear
    mlp_norm: mx.array
    gate_up: Linear | None  # None in a sparse layer, which has `experts`
    down: Linear | None
    experts: Experts | None = None
    q_norm: mx.array | None = None
    k_norm: mx.array | None = None
    post_attn_norm: mx.array | None = None  # sandwich norms, where the family has them
    post_mlp_norm: mx.array | None = None
    window: int | None = None
    rope: str = "global"


class MlxModel:
    """Packed tokens of one step -> final hidden states, over the runner's paged cache."""

    def __init__(self, loaded: LoadedModel, dtype: mx.Dtype, quantization: str) -> None:
        cfg = self.config = loaded.config
        torch_model = loaded.model
        self.dtype = dtype
        fam = family(cfg.model_type)
        offset = fam.norm_offset

        def norm(weight) -> mx.array:  # noqa: ANN001 - a torch parameter
            return to_mx(weight.detach().float() + offset, dtype)

        self.embed = to_mx(torch_model.embed, dtype)
        self.final_norm = norm(torch_model.final_norm.weight)
        self.head = lm_head(loaded, dtype, quantization)
        self.layers = [self._layer(block, i, norm) for i, block in enumerate(torch_model.blocks)]
        self.freqs = {"global": self._freqs(cfg.rope)}
        if cfg.rope_local is not None:
            self.freqs["local"] = self._freqs(cfg.rope_local)
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.rotary_dim = cfg.rope.rotary_dim(cfg.head_dim)
        longrope = cfg.rope.rope_type == "longrope"
        self.long_after = cfg.rope.original_max_position_embeddings if longrope else None
        # LongRoPE's attention factor scales the rotated dims only, as transformers scales cos and sin
        gain = [cfg.rope.attention_factor] * self.rotary_dim + [1.0] * (self.head_dim - self.rotary_dim)
        self.rope_gain = mx.array(gain, dtype=dtype) if longrope else None
        self.scale = cfg.attn_scale
        self.embed_scale = math.sqrt(cfg.hidden_size) if fam.embed_scale else None

    def _layer(self, block, i: int, norm) -> Layer:  # noqa: ANN001 - torch modules
        cfg, dtype = self.config, self.dtype
        attn, mlp = block.attn, block.mlp
        sparse = isinstance(mlp, SparseMLP)
        return Layer(
            input_norm=norm(block.input_norm.weight), qkv=linear(attn.qkv_proj, dtype, attn.qkv_bias),
            o=linear(attn.o_proj, dtype), mlp_norm=norm(block.mlp_norm.weight),
            gate_up=None if sparse else linear(mlp.gate_up_proj, dtype),
            down=None if sparse else linear(mlp.down_proj, dtype),
            experts=Experts(to_mx(mlp.router, dtype), to_mx(mlp.w13, dtype), to_mx(mlp.w2, dtype), mlp.top_k,
                            mlp.renormalize) if sparse else None,
            q_norm=None if attn.q_norm is None else norm(attn.q_norm.weight),
            k_norm=None if attn.k_norm is None else norm(attn.k_norm.weight),
            post_attn_norm=None if block.post_attn_norm is None else norm(block.post_attn_norm.weight),
            post_mlp_norm=None if block.post_mlp_norm is None else norm(block.post_mlp_norm.weight),
            window=cfg.window(i), rope=block.rope_kind,
        )

    def _freqs(self, rope: RopeConfig) -> list[mx.array]:
        """mx.fast.rope's per-pair periods: the reciprocals of the torch model's inverse frequencies (LongRoPE: the
        short factors', then the long ones')."""
        kinds = (False, True) if rope.rope_type == "longrope" else (False,)
        return [mx.array((1.0 / rope_inv_freq(rope, self.config.head_dim, long)).numpy()) for long in kinds]

    def parameters(self) -> list[mx.array]:
        """Every weight array (to evaluate them once, at load)."""
        out = [self.embed, self.final_norm, *self.head.arrays(), *(p for kind in self.freqs.values() for p in kind)]
        out += [] if self.rope_gain is None else [self.rope_gain]
        for layer in self.layers:
            for value in vars(layer).values():
                out += value.arrays() if isinstance(value, Linear) else [value] if isinstance(value, mx.array) else []
            if layer.experts is not None:
                out += [layer.experts.router, layer.experts.w13, layer.experts.w2]
        return out

    @property
    def quantized_linears(self) -> int:
        return sum(lin.quantized for layer in self.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)
                   if lin is not None)

    def __call__(self, ids: mx.array, layout: StepLayout, caches: list[list[mx.array]]) -> mx.array:
        """ids [T] -> hidden [T, hidden]; writes the step's keys and values into `caches` on the way."""
        x = self.embed[ids]
        if self.embed_scale is not None:
            x = x * mx.array(self.embed_scale, dtype=self.dtype)
        eps = self.config.rms_norm_eps
        long = None if self.long_after is None else self._long_rows(layout)
        for layer, cache in zip(self.layers, caches):
            attn = self._attention(mx.fast.rms_norm(x, layer.input_norm, eps), layer, layout, cache, long)
            if layer.post_attn_norm is not None:
                attn = mx.fast.rms_norm(attn, layer.post_attn_norm, eps)
            x = x + attn
            mlp = self._mlp(mx.fast.rms_norm(x, layer.mlp_norm, eps), layer)
            if layer.post_mlp_norm is not None:
                mlp = mx.fast.rms_norm(mlp, layer.post_mlp_norm, eps)
            x = x + mlp
        return mx.fast.rms_norm(x, self.final_norm, eps)

    def _long_rows(self, layout: StepLayout) -> mx.array:
        """[T] bool: whether each token's sequence (its context after this step) is longer than LongRoPE's original
        context, as the torch model's `longrope_rows` decides."""
        ends = mx.array(layout.last_rows)
        seq = (mx.arange(layout.positions.shape[0])[:, None] > ends[None, :]).sum(axis=1)
        return layout.context_lens[seq] > self.long_after

    def _attention(self, x: mx.array, layer: Layer, layout: StepLayout, cache: list[mx.array],
                   long: mx.array | None) -> mx.array:
        t, h, kv, d = x.shape[0], self.heads, self.kv_heads, self.head_dim
        qkv = layer.qkv(x)
        q = qkv[:, : h * d].reshape(t, h, d)
        k = qkv[:, h * d : (h + kv) * d].reshape(t, kv, d)
        v = qkv[:, (h + kv) * d :].reshape(t, kv, d)
        if layer.q_norm is not None and layer.k_norm is not None:
            eps = self.config.rms_norm_eps
            q, k = mx.fast.rms_norm(q, layer.q_norm, eps), mx.fast.rms_norm(k, layer.k_norm, eps)
        q, k = self._rope(q, layer.rope, layout, long), self._rope(k, layer.rope, layout, long)
        return layer.o(paged_attention(q, k, v, cache, layout, self.scale, layer.window))

    def _rope(self, x: mx.array, kind: str, layout: StepLayout, long: mx.array | None) -> mx.array:
        """Rotate split halves (not interleaved) of the leading rotary_dim dims at each token's own position: the
        tokens are rope's batch. LongRoPE: each token takes the long factors' rotation where `long` says so."""
        t, h, d = x.shape

        def turn(periods: mx.array) -> mx.array:
            out = mx.fast.rope(x.reshape(t, h, 1, d), self.rotary_dim, traditional=False, base=None, scale=1.0,
                               offset=layout.positions, freqs=periods)
            return out.reshape(t, h, d)

        periods = self.freqs[kind]
        if len(periods) == 1:
            return turn(periods[0])
        return mx.where(long[:, None, None], turn(periods[1]), turn(periods[0])) * self.rope_gain

    def _act(self, gate: mx.array) -> mx.array:
        if self.config.hidden_act == "silu":
            return gate * mx.sigmoid(gate)
        return 0.5 * gate * (1 + mx.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate * gate * gate)))  # tanh GELU

    def _mlp(self, x: mx.array, layer: Layer) -> mx.array:
        if layer.experts is not None:
            return self._experts(x, layer.experts)
        assert layer.gate_up is not None and layer.down is not None
        gate, up = mx.split(layer.gate_up(x), 2, axis=-1)
        return layer.down(self._act(gate) * up)

    def _experts(self, x: mx.array, e: Experts) -> mx.array:
        """layerzero's moe_route then fused_moe: softmax scores in float32, the top k (renormalized where the config
        says), each token's experts applied with `mx.gather_mm` (only the routed experts' weights are read)."""
        scores = mx.softmax((x @ e.router.T).astype(mx.float32), axis=-1)
        ids = mx.argsort(-scores, axis=-1)[:, : e.top_k]
        weights = mx.take_along_axis(scores, ids, axis=-1)
        if e.renormalize:
            weights = weights / mx.sum(weights, axis=-1, keepdims=True)
        ids = ids.astype(mx.uint32)
        gate, up = mx.split(mx.gather_mm(x[:, None, None, :], e.w13.swapaxes(-1, -2), rhs_indices=ids), 2, axis=-1)
        out = mx.gather_mm(self._act(gate) * up, e.w2.swapaxes(-1, -2), rhs_indices=ids)[:, :, 0, :]  # [T, k, H]
        return mx.sum(out.astype(mx.float32) * weights[..., None], axis=1).astype(x.dtype)

    def logits(self, hidden: mx.array) -> mx.array:
        """float32 logits of the given rows, softcapped where the model says."""
        out = self.head(hidden).astype(mx.float32)
        cap = self.config.final_logit_softcapping
        return mx.tanh(out / cap) * cap if cap else out


def cache_arrays(cfg: ModelConfig, num_blocks: int, block_size: int, dtype: mx.Dtype) -> list[list[mx.array]]:
    """The KV cache: one [num_blocks, block_size, kv_heads, head_dim] K and V array per layer."""
    shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
    return [[mx.zeros(shape, dtype=dtype), mx.zeros(shape, dtype=dtype)] for _ in range(cfg.num_hidden_layers)]
