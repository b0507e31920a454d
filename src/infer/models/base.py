"""The decoder-only model of every family: embed, blocks, final norm, tied or separate LM head, built from the
family's declaration (families/catalog.py)."""

from __future__ import annotations

import torch
from torch import nn

import layerzero as lz
from infer.families.catalog import Family, family
from infer.families.config import ModelConfig
from infer.models.forward_batch import ForwardBatch
from infer.models.layers import (Attention, GatedMLP, HookPoint, RMSNorm, RotaryEmbedding, Unprojected, WeightMap,
                                 WeightSlot, empty_param, prefixed)
from infer.models.moe import SparseMLP
from infer.models.quant import HalfWeight, LinearSite, QuantWeight
from infer.models.shard import Shard

LINEAR_WEIGHTS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # a block's weights that only feed matmuls


class Block(nn.Module):
    """A transformer block as its family declares it (families/catalog.py): pre-norm attention (with QK-norm where
    declared), then a gated MLP (a mixture of experts' sparse one in its sparse layers), each output normed again
    before its add where the family has sandwich norms.
    `rope_kind` picks the global or the local rope.

    The residual stream travels as (x, pending): the stream is x + pending, the block's closing add left undone so
    the next block's input norm does it in the same kernel (fused add + RMSNorm); pending is None when the stream
    is x itself. A block whose `resid_post` is observed (a probe tap, a forward hook) does its add and passes the
    sum through `resid_post`, so whatever reads the residual stream reads it whole.

    Under tensor parallelism (`tp_group`) the attention's and the MLP's outputs are this rank's partial sums, and
    the block owns their sum over ranks: it is done by the add-and-norm that consumes them (one op, one kernel on
    the GPUs' decode steps), so pending is a partial sum too (`pending_group`); with sandwich norms, whose output
    norm needs the whole sum, each output is all-reduced before its norm. On CUDA the O and down projections go into
    that op as well (`Unprojected`: the op projects, and on decode rows sums the projection's split-K slices in its
    own kernel; docs/distributed.md)."""

    def __init__(self, cfg: ModelConfig, layer: int, fam: Family, experts: range | None = None) -> None:
        super().__init__()
        eps, offset, hidden = cfg.rms_norm_eps, fam.norm_offset, cfg.hidden_size
        self.fused_projections = fam.fused_projections
        self.rope_kind = "local" if fam.local_rope and cfg.is_sliding(layer) else "global"
        self.input_norm = RMSNorm(hidden, eps, offset)
        self.attn = Attention(cfg, layer, qk_norm=fam.qk_norm, norm_offset=offset)
        self.post_attn_norm = RMSNorm(hidden, eps, offset) if fam.sandwich_norms else None
        self.mlp_norm = RMSNorm(hidden, eps, offset)
        self.mlp = SparseMLP(cfg, fam.moe, experts) if fam.moe is not None and cfg.is_moe(layer) else GatedMLP(cfg)
        self.mlp_prefix = fam.moe.prefix if isinstance(self.mlp, SparseMLP) and fam.moe is not None else "mlp."
        self.post_mlp_norm = RMSNorm(hidden, eps, offset) if fam.sandwich_norms else None
        self.resid_post = HookPoint()
        self.tp_group: object | None = None  # tensor parallel: the group the outputs are summed over
        self.attn_sum_site, self.mlp_sum_site = lz.bind("all_reduce"), lz.bind("all_reduce")  # one per call site

    @property
    def pending_group(self) -> object | None:
        """The group `pending` (the MLP's output) is a partial sum over, None when it is whole."""
        return self.tp_group if self.post_mlp_norm is None else None

    def summed(self, out: torch.Tensor, site: lz.BoundOp) -> torch.Tensor:
        """An output of the attention or the MLP (`site`: its all-reduce) summed over the ranks (itself without
        tensor parallelism)."""
        return out if self.tp_group is None else site(out, group=self.tp_group)

    def weight_map(self) -> WeightMap:
        """The checkpoint's names (under model.layers.N.) -> this block's."""
        if self.post_attn_norm is not None:
            norms = {"input_layernorm.weight": WeightSlot("input_norm.weight"),
                     "post_attention_layernorm.weight": WeightSlot("post_attn_norm.weight"),
                     "pre_feedforward_layernorm.weight": WeightSlot("mlp_norm.weight"),
                     "post_feedforward_layernorm.weight": WeightSlot("post_mlp_norm.weight")}
        else:
            norms = {"input_layernorm.weight": WeightSlot("input_norm.weight"),
                     "post_attention_layernorm.weight": WeightSlot("mlp_norm.weight")}
        if self.fused_projections:  # the fused checkpoint tensors straight onto the fused parameters (same row order)
            return norms | {"self_attn.qkv_proj.weight": WeightSlot("attn.qkv_proj"),
                            "self_attn.o_proj.weight": WeightSlot("attn.o_proj"),
                            "mlp.gate_up_proj.weight": WeightSlot("mlp.gate_up_proj"),
                            "mlp.down_proj.weight": WeightSlot("mlp.down_proj")}
        return (norms | prefixed(self.attn.weight_map(), "self_attn.", "attn.")
                | prefixed(self.mlp.weight_map(), self.mlp_prefix, "mlp."))

    def forward(self, x: torch.Tensor, pending: torch.Tensor | Unprojected | None, cos: torch.Tensor,
                sin: torch.Tensor, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor | Unprojected | None]:
        h, x = self.enter(x, pending, self.half_rows(x))
        logits = None
        if self.post_attn_norm is None and self.tp_group is None and isinstance(self.mlp, SparseMLP) \
                and self.mlp.routes_logits:  # the O projection (when plain), the norm and the router in one op
            if self.attn.folds_o(h):
                o, proj = self.attn.attend(h, cos, sin, batch), self.attn.o_proj
            else:
                o, proj = self.attn(h, cos, sin, batch), None
            h, x, logits = self.mlp_norm.add_norm_router(o, x, self.mlp.router, proj)
        elif self.post_attn_norm is not None:
            out = self.attn(h, cos, sin, batch)
            h, x = self.mlp_norm.add_and_norm(self.post_attn_norm(self.summed(out, self.attn_sum_site)), x)
        elif self.tp_group is not None and self.attn.folds_o(h):  # the O projection inside the reduce-and-norm
            h, x = self.mlp_norm.add_and_norm(Unprojected(self.attn.attend(h, cos, sin, batch), self.attn.o_proj), x,
                                              self.tp_group)
        else:
            h, x = self.mlp_norm.add_and_norm(self.attn(h, cos, sin, batch), x, self.tp_group)
        out: torch.Tensor | Unprojected
        if not isinstance(self.mlp, GatedMLP):
            out = self.mlp(h, logits)
        elif self.pending_group is not None and self.mlp.folds_down(h):  # left to the next reduce-and-norm
            out = Unprojected(self.mlp.activated(h, batch.lora_ids), self.mlp.down_proj)
        else:
            out = self.mlp(h, batch.lora_ids)
        if self.post_mlp_norm is not None:
            out = self.post_mlp_norm(self.summed(out, self.mlp_sum_site))
        return self.leave(x, out)

    def half_rows(self, x: torch.Tensor) -> torch.dtype | None:
        """The dtype this block's projections take their rows in when it is not the stream's: bfloat16 where the
        projections are `HalfWeight`s and the step has more rows than the exact bf16 GEMV takes (a prefill, a batched
        decode), None otherwise. layerzero's linear rounds such rows to bf16 for its bf16 GEMM (AMX) anyway, so the
        block keeps them in bf16 from its input norm to its last projection (the add-norms write bf16, the gated
        activation reads and writes it) and skips a float32 round trip around every GEMM; the residual stream,
        attention and the KV cache stay float32 (docs/engine.md, "bfloat16 on the CPU"). Not with experts, LoRA or
        tensor parallelism, whose ops take the stream's dtype, nor on a CPU without bf16 products (AVX2), whose
        GEMMs run bf16 weights in float32."""
        if x.shape[0] <= lz.BF16_GEMV_MAX_ROWS or not isinstance(self.mlp, GatedMLP) or not lz.cpu_bf16_gemm():
            return None
        attn, mlp = self.attn, self.mlp
        weights = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if not all(isinstance(w, HalfWeight) for w in weights) or self.tp_group is not None or any(
                stack is not None for stack in (attn.qkv_lora, attn.o_lora, mlp.gate_up_lora, mlp.down_lora)):
            return None
        return attn.qkv_proj.weight.dtype

    def enter(self, x: torch.Tensor, pending: torch.Tensor | Unprojected | None,
              half: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_norm(stream), stream): the previous block's add done inside the norm's kernel; the normed rows in
        `half` when given (`half_rows`), the stream in x's dtype."""
        if pending is None:
            h = self.input_norm(x)
        else:
            if half is None and isinstance(pending, torch.Tensor) and pending.dtype != x.dtype:
                pending = pending.to(x.dtype)  # a bf16 block's output into a float32 one
            h, x = self.input_norm.add_and_norm(pending, x, self.pending_group)
        return (h if half is None or h.dtype == half else h.to(half)), x

    def leave(self, x: torch.Tensor, out: torch.Tensor | Unprojected
              ) -> tuple[torch.Tensor, torch.Tensor | Unprojected | None]:
        """The stream after the block, x + out: left pending for the next block's norm unless it is observed."""
        hook = self.resid_post
        if type(hook) is HookPoint and not (hook._forward_hooks or hook._forward_pre_hooks):
            return x, out
        if isinstance(out, Unprojected):
            out = lz.linear(out.rows, out.proj)
        return self.resid_post(x + (out if self.pending_group is None else self.summed(out, self.mlp_sum_site))), None


class CausalLM(nn.Module):
    """Runs packed tokens through the blocks; `compute_logits` maps chosen rows to float32 logits (`head_logits`
    to logits in the head's dtype).

    With a tensor-parallel `shard`, the blocks hold this rank's heads and MLP columns (with expert parallelism, its
    whole experts; each block's attention and MLP end in an all-reduce) and the embedding and head this rank's
    vocabulary rows (the lookup ends in an all-reduce, the logits in an all-gather); `config` stays the whole
    model's, `local` is what this rank's blocks are built with.
    """

    def __init__(self, cfg: ModelConfig, max_positions: int, shard: Shard = Shard()) -> None:
        super().__init__()
        self.config, self.shard, self.local = cfg, shard, shard.local_config(cfg)
        self.family = fam = family(cfg.model_type)
        self.norm_offset = fam.norm_offset
        vocab_rows = shard.vocab_rows(cfg.vocab_size)
        self.embed = empty_param(vocab_rows, cfg.hidden_size)
        experts = shard.experts(cfg)
        self.blocks = nn.ModuleList(Block(self.local, i, fam, experts) for i in range(cfg.num_hidden_layers))
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, self.norm_offset)
        self.lm_head = self.embed if cfg.tie_word_embeddings else empty_param(vocab_rows, cfg.hidden_size)
        self.embed_site, self.head_site = lz.bind("embedding"), LinearSite()
        if shard.parallel:
            self.embed_reduce_site, self.gather_site = lz.bind("all_reduce"), lz.bind("all_gather")
            for block in self.blocks:
                block.tp_group = shard.group
        positions = min(cfg.max_position_embeddings, max_positions)
        self.ropes = nn.ModuleDict({"global": RotaryEmbedding(cfg.rope, cfg.head_dim, positions)})
        if cfg.rope_local is not None:
            self.ropes["local"] = RotaryEmbedding(cfg.rope_local, cfg.head_dim, positions)

    def weight_map(self) -> WeightMap:
        """HF checkpoint tensor name -> where it lands in this module."""
        out: WeightMap = {
            "model.embed_tokens.weight": WeightSlot("embed"),
            "model.norm.weight": WeightSlot("final_norm.weight"),
        }
        if not self.config.tie_word_embeddings:
            out["lm_head.weight"] = WeightSlot("lm_head")
        for i, block in enumerate(self.blocks):
            out |= prefixed(block.weight_map(), f"model.layers.{i}.", f"blocks.{i}.")
        return out

    def linear_weights(self) -> list[str]:
        """The parameters that only feed matmuls (may be kept quantized); the embedding, a lookup, never is, nor a
        head tied to it."""
        names = [n for n, _ in self.named_parameters() if n.rsplit(".", 1)[-1] in LINEAR_WEIGHTS]
        return names + ([] if self.config.tie_word_embeddings else ["lm_head"])

    def expert_weights(self) -> list[str]:
        """The stacked experts of sparse layers (may be kept quantized as stored; never quantized at load)."""
        return [n for n, _ in self.named_parameters() if n.rsplit(".", 1)[-1] in ("w13", "w2")]

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self._lookup(input_ids)
        if self.family.embed_scale:
            x = x * torch.tensor(self.config.hidden_size**0.5, dtype=x.dtype)
        return x

    def _lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not self.shard.parallel:
            return self.embed_site(input_ids, self.embed)
        # this rank's vocabulary rows: ids outside them look up row 0 and are zeroed; the sum over ranks is the lookup
        local = input_ids - self.shard.rank * self.embed.shape[0]
        outside = (local < 0) | (local >= self.embed.shape[0])
        x = self.embed_site(local.masked_fill(outside, 0), self.embed).masked_fill(outside[:, None], 0)
        return self.embed_reduce_site(x, group=self.shard.group)

    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """input_ids [T] -> final hidden states [T, hidden]."""
        with lz.plan(batch.signature(input_ids)):  # one check per forward vouches for every bound call site
            x, pending = self.embed_tokens(input_ids), None
            tables = {kind: rope(batch) for kind, rope in self.ropes.items()}
            for block in self.blocks:
                cos, sin = tables[block.rope_kind]
                x, pending = block(x, pending, cos, sin, batch)
            if pending is None:
                return self.final_norm(x)
            # float32 hidden states whatever the last block's rows were: the head's few rows take the exact GEMV
            if isinstance(pending, torch.Tensor) and pending.dtype != x.dtype:
                pending = pending.to(x.dtype)
            return self.final_norm.add_and_norm(pending, x, self.blocks[-1].pending_group)[0]

    def hold_head_in(self, dtype: torch.dtype) -> None:
        """Keep the LM head as its own copy in `dtype` (a tied embedding stays as it is, for the lookup)."""
        self.lm_head = nn.Parameter(self.lm_head.detach().to(dtype), requires_grad=False)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> float32 logits [T, vocab]."""
        return self.head_logits(hidden).float()

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head's logits in its own dtype (float32 once soft-capped): what a step samples from. Widening
        them to float32 changes no order, so greedy rows take their argmax without the float32 copy."""
        head = self.lm_head
        logits = self.head_site(hidden if isinstance(head, QuantWeight) else hidden.to(head.dtype), head)
        if self.shard.parallel:  # every rank's vocabulary rows side by side, the padding rows cut off
            logits = self.gather_site(logits, group=self.shard.group)[:, : self.config.vocab_size]
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits.float() / cap) * cap if cap else logits
