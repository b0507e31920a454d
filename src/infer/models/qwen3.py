"""Qwen 3: the Llama block plus RMSNorm on each query and key head before rope (QK-norm)."""

from infer.models.base import CausalLM
from infer.models.llama import LlamaBlock


class Qwen3Block(LlamaBlock):
    qk_norm = True


class Qwen3ForCausalLM(CausalLM):
    block_cls = Qwen3Block
