"""Phi-3 (and Phi-4-mini): the Llama block read from a checkpoint that stores q/k/v as one `qkv_proj` and gate/up as
one `gate_up_proj` (the same row order as ours); LongRoPE and partial rope come with the rope config."""

from infer.models.base import CausalLM
from infer.models.layers import WeightMap, WeightSlot
from infer.models.llama import LlamaBlock


class Phi3Block(LlamaBlock):
    def weight_map(self) -> WeightMap:
        """The fused checkpoint tensors straight onto the fused parameters."""
        return {
            "input_layernorm.weight": WeightSlot("input_norm.weight"),
            "post_attention_layernorm.weight": WeightSlot("mlp_norm.weight"),
            "self_attn.qkv_proj.weight": WeightSlot("attn.qkv_proj"),
            "self_attn.o_proj.weight": WeightSlot("attn.o_proj"),
            "mlp.gate_up_proj.weight": WeightSlot("mlp.gate_up_proj"),
            "mlp.down_proj.weight": WeightSlot("mlp.down_proj"),
        }


class Phi3ForCausalLM(CausalLM):
    block_cls = Phi3Block
