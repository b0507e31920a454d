"""Tensor-parallel sharding: which part of each weight a rank holds, and the per-rank shapes that follow.

Attention is split by heads (the fused QKV's rows, o_proj's columns), the MLP by its intermediate dimension (gate/up
rows, down columns), the embedding and LM head by vocabulary rows (padded to a multiple of the rank count); norms and
rotary tables are replicated. KV heads split when the rank count divides them; with more ranks than KV heads each
rank keeps the one KV head its query heads read (replicated). A mixture of experts' experts split by their intermediate
dimension, or with expert parallelism whole experts go to ranks (E / ranks each; the router is replicated). One rule,
`Shard.cut`, serves the model's shapes and the loaders' slices, so they cannot disagree (docs/distributed.md has the
table).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, NamedTuple

from infer.families.config import ModelConfig


class ShardError(ValueError):
    """A model (or a checkpoint tensor) that cannot be split over the asked number of ranks; names the numbers."""


class Cut(NamedTuple):
    """The part of a checkpoint tensor one rank reads: [start, stop) along `dim`, zero-padded to `size` there."""

    dim: int
    start: int
    stop: int
    size: int


_HEAD_ROWS = re.compile(r"\.self_attn\.(q|k|v)_proj\.(weight|bias)$")
_MLP_ROWS = re.compile(r"\.mlp\.(gate|up)_proj\.weight$")
_VOCAB_ROWS = ("model.embed_tokens.weight", "lm_head.weight")
# an expert's projection, as Qwen 3 MoE (gate_proj, up_proj, down_proj) and Mixtral (w1, w3, w2) name them
_EXPERT = re.compile(r"\.experts\.(?P<e>\d+)\.(?:gate_proj|up_proj|(?P<down>down_proj)|w1|w3|(?P<w2>w2))\.weight$")
# the cut of a tensor another rank holds whole (an expert of another rank under expert parallelism): not read here
ELSEWHERE = Cut(-1, 0, 0, 0)


class Shard(NamedTuple):
    """This process's place in its tensor-parallel group (`group`: the torch.distributed process group)."""

    rank: int = 0
    size: int = 1
    group: Any = None
    expert_parallel: bool = False  # whole experts on ranks instead of every expert's slice of its intermediate dim

    @property
    def parallel(self) -> bool:
        return self.size > 1

    def check(self, cfg: ModelConfig) -> None:
        """ShardError unless the model splits evenly over `size` ranks."""
        tp, heads, kv = self.size, cfg.num_attention_heads, cfg.num_key_value_heads
        field = f"tensor_parallel_size={tp}"
        if heads % tp:
            raise ShardError(f"{field}: the model's {heads} attention heads do not split evenly over {tp} ranks")
        if kv % tp and tp % kv:
            raise ShardError(f"{field}: the model's {kv} KV heads neither split over {tp} ranks nor replicate evenly "
                             f"({tp} is not a multiple of {kv})")
        if self.expert_parallel:
            if not cfg.num_experts:
                raise ShardError(f"enable_expert_parallel: {cfg.model_type} has no experts to place on ranks")
            if cfg.num_experts % tp:
                raise ShardError(f"{field} with enable_expert_parallel: the model's {cfg.num_experts} experts do not "
                                 f"split evenly over {tp} ranks")
        elif cfg.moe_intermediate_size % tp:
            raise ShardError(f"{field}: the experts' intermediate size {cfg.moe_intermediate_size} does not split "
                             f"evenly over {tp} ranks")
        if cfg.intermediate_size % tp:
            raise ShardError(f"{field}: the model's intermediate_size={cfg.intermediate_size} does not split evenly "
                             f"over {tp} ranks")

    def kv_heads(self, cfg: ModelConfig) -> tuple[int, int]:
        """(the first KV head this rank holds, how many)."""
        kv = cfg.num_key_value_heads
        if kv >= self.size:
            return self.rank * (kv // self.size), kv // self.size
        return self.rank * kv // self.size, 1

    def experts(self, cfg: ModelConfig) -> range:
        """The experts this rank holds: a contiguous E / size of them with expert parallelism, else all (sliced)."""
        if not self.expert_parallel or not self.parallel:
            return range(cfg.num_experts)
        count = cfg.num_experts // self.size
        return range(self.rank * count, (self.rank + 1) * count)

    def local_config(self, cfg: ModelConfig) -> ModelConfig:
        """The shapes one rank's blocks are built with (heads and intermediate sizes divided; with expert
        parallelism the experts keep theirs, `experts` says which this rank holds)."""
        if not self.parallel:
            return cfg
        inner = cfg.moe_intermediate_size if self.expert_parallel else cfg.moe_intermediate_size // self.size
        return replace(cfg, num_attention_heads=cfg.num_attention_heads // self.size,
                       num_key_value_heads=self.kv_heads(cfg)[1], intermediate_size=cfg.intermediate_size // self.size,
                       moe_intermediate_size=inner)

    def vocab_rows(self, vocab_size: int) -> int:
        """Rows of the embedding / LM head each rank holds (the vocabulary padded to a multiple of `size`)."""
        return -(-vocab_size // self.size)

    def cut(self, name: str, cfg: ModelConfig) -> Cut | None:
        """The slice of HF tensor `name` this rank holds: None when it holds all of it, ELSEWHERE when none."""
        if not self.parallel:
            return None
        d = cfg.head_dim
        q_rows = cfg.num_attention_heads // self.size * d
        if (m := _HEAD_ROWS.search(name)) is not None:
            if m[1] == "q":
                return Cut(0, self.rank * q_rows, (self.rank + 1) * q_rows, q_rows)
            first, count = self.kv_heads(cfg)
            return Cut(0, first * d, (first + count) * d, count * d)
        if name.endswith(".self_attn.o_proj.weight"):
            return Cut(1, self.rank * q_rows, (self.rank + 1) * q_rows, q_rows)
        if (m := _EXPERT.search(name)) is not None and self.expert_parallel:  # whole experts, this rank's only
            return None if int(m["e"]) in self.experts(cfg) else ELSEWHERE
        if m is not None:  # every expert's slice of its intermediate dimension
            inner = cfg.moe_intermediate_size // self.size
            columns = m["down"] is not None or m["w2"] is not None  # the down projection is cut along its input
            return Cut(int(columns), self.rank * inner, (self.rank + 1) * inner, inner)
        inter = cfg.intermediate_size // self.size
        if _MLP_ROWS.search(name):
            return Cut(0, self.rank * inter, (self.rank + 1) * inter, inter)
        if name.endswith(".mlp.down_proj.weight"):
            return Cut(1, self.rank * inter, (self.rank + 1) * inter, inter)
        if name in _VOCAB_ROWS:
            rows = self.vocab_rows(cfg.vocab_size)
            start = self.rank * rows  # a tiny vocabulary may leave the last ranks padding only: [start, start)
            return Cut(0, start, max(start, min(start + rows, cfg.vocab_size)), rows)
        return None
