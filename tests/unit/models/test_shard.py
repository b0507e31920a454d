"""Shard.cut: the ranks' slices of every split weight tile it exactly; replicated KV heads are the ones each rank's
query heads read; configurations that cannot split are refused naming the numbers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer.families.config import ModelConfig, RopeConfig
from infer.models.shard import Shard, ShardError

BASE = ModelConfig(model_type="llama", vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=8, rms_norm_eps=1e-6,
                   rope=RopeConfig(theta=10000.0))
L = "model.layers.0."


@given(tp=st.sampled_from([1, 2, 4, 8]), kv=st.sampled_from([1, 2, 4, 8]), vocab=st.integers(1, 300))
def test_cuts_tile_each_split_weight(tp, kv, vocab):
    cfg = replace(BASE, num_key_value_heads=kv, vocab_size=vocab)
    shards = [Shard(r, tp) for r in range(tp)]
    for s in shards:
        s.check(cfg)
    full = {"self_attn.q_proj.weight": (0, 64), "self_attn.o_proj.weight": (1, 64), "mlp.gate_proj.weight": (0, 96),
            "mlp.down_proj.weight": (1, 96)}
    for name, (dim, length) in full.items():
        cuts = [s.cut(L + name, cfg) for s in shards]
        if tp == 1:
            assert cuts == [None]
            continue
        assert all(c.dim == dim for c in cuts)
        assert [(c.start, c.stop) for c in cuts] == [(i * length // tp, (i + 1) * length // tp) for i in range(tp)]
    if tp > 1:
        rows = [s.cut("model.embed_tokens.weight", cfg) for s in shards]
        assert rows[0].start == 0 and all(a.start + a.size == b.start for a, b in zip(rows, rows[1:]))
        assert max(c.stop for c in rows) <= max(vocab, rows[-1].start) and sum(c.stop - c.start for c in rows) == vocab
        for s in shards:  # the KV head(s) a rank holds are those its query heads read (group = heads / kv)
            k = s.cut(L + "self_attn.k_proj.weight", cfg)
            q = s.cut(L + "self_attn.q_proj.weight", cfg)
            group = 8 // kv
            assert {h // group for h in range(q.start // 8, q.stop // 8)} == set(range(k.start // 8, k.stop // 8))
    assert Shard(0, tp).cut(L + "input_layernorm.weight", cfg) is None


def test_refusals_name_the_numbers():
    with pytest.raises(ShardError, match="tensor_parallel_size=3: the model's 8 attention heads"):
        Shard(0, 3).check(BASE)
    with pytest.raises(ShardError, match="6 KV heads neither split over 4 ranks"):
        Shard(0, 4).check(replace(BASE, num_attention_heads=24, num_key_value_heads=6))
    with pytest.raises(ShardError, match="intermediate_size=90"):
        Shard(0, 4).check(replace(BASE, intermediate_size=90))


def test_local_config_divides_heads_and_mlp():
    local = Shard(1, 4).local_config(BASE)
    assert (local.num_attention_heads, local.num_key_value_heads, local.intermediate_size) == (2, 1, 24)
    assert local.head_dim == BASE.head_dim and local.hidden_size == BASE.hidden_size
    assert Shard(0, 8).local_config(replace(BASE, num_key_value_heads=2)).num_key_value_heads == 1  # replicated


MOE = replace(BASE, model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)


def test_expert_parallel_places_whole_experts_and_skips_the_others():
    """Each of 4 ranks holds 2 whole experts (their intermediate dimension uncut), reads their tensors whole and
    skips the other ranks' (ELSEWHERE); the router stays whole. Without the flag every expert is cut instead."""
    from infer.models.shard import ELSEWHERE

    names = [f"{L}mlp.experts.{e}.{p}.weight" for e in range(8) for p in ("gate_proj", "up_proj", "down_proj")]
    for rank in range(4):
        shard = Shard(rank, 4, expert_parallel=True)
        shard.check(MOE)
        assert shard.experts(MOE) == range(2 * rank, 2 * rank + 2)
        assert shard.local_config(MOE).moe_intermediate_size == 32 and shard.local_config(MOE).num_experts == 8
        held = [n for n in names if shard.cut(n, MOE) is None]
        assert held == [n for n in names if int(n.split(".experts.")[1].split(".")[0]) in shard.experts(MOE)]
        assert all(shard.cut(n, MOE) is ELSEWHERE for n in names if n not in held)
        assert shard.cut(f"{L}mlp.gate.weight", MOE) is None
    sliced = Shard(1, 4)
    assert sliced.experts(MOE) == range(8) and sliced.local_config(MOE).moe_intermediate_size == 8
    assert sliced.cut(f"{L}mlp.experts.5.down_proj.weight", MOE) == (1, 8, 16, 8)
    assert Shard(0, 1, expert_parallel=True).experts(MOE) == range(8)  # one rank holds them all


def test_expert_parallel_refusals_name_the_numbers():
    with pytest.raises(ShardError, match="enable_expert_parallel: the model's 8 experts do not split evenly over 3"):
        Shard(0, 3, expert_parallel=True).check(replace(MOE, num_attention_heads=6, num_key_value_heads=3,
                                                        intermediate_size=96))
    with pytest.raises(ShardError, match="enable_expert_parallel: llama has no experts"):
        Shard(0, 2, expert_parallel=True).check(BASE)
    Shard(0, 2, expert_parallel=True).check(replace(MOE, moe_intermediate_size=33))  # whole experts: no split of 33
