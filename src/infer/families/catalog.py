"""What each model family is, declared once: read by the config parser (families/config.py), the GGUF loader, the
chat-template choice, the torch model (models/base.py builds every family's blocks from it) and the MLX model.
Torch-free: the API server reads it to pick a chat template. A family that fits these switches is one entry here
(docs/models.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# llama.cpp's per-layer tensor names -> the HF checkpoint's (under model.layers.N.)
LLAMA_TENSORS = MappingProxyType({
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
})
QK_NORM_TENSORS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}


def expert_tensors(prefix: str, gate: str, up: str, down: str) -> dict[str, str]:
    """llama.cpp's router and stacked experts (one [E, rows, cols] tensor per projection) -> the HF names, `{e}` where
    the loader splits a stacked tensor into its experts."""
    return {"ffn_gate_inp": f"{prefix}gate", "ffn_gate_exps": f"{prefix}experts.{{e}}.{gate}",
            "ffn_up_exps": f"{prefix}experts.{{e}}.{up}", "ffn_down_exps": f"{prefix}experts.{{e}}.{down}"}


@dataclass(frozen=True)
class MoE:
    """How a mixture-of-experts family's config and checkpoint name its sparse MLP layers (which layers are sparse:
    every one, but those in the config's mlp_only_layers and those off its decoder_sparse_step)."""

    experts_keys: tuple[str, ...]  # the config's number of experts, under the first of these keys it has
    inner_key: str  # the config's intermediate size of one expert
    renormalize_key: str | None  # the config's switch for dividing the top-k weights by their sum (None: always)
    prefix: str  # the sparse MLP's module under model.layers.N. (router `gate`, experts under `experts.{e}.`)
    projections: tuple[str, str, str]  # the experts' gate, up and down projections under experts.{e}.


@dataclass(frozen=True)
class Family:
    """One `model_type` of an HF config.json: its block structure, rope kinds, config defaults, GGUF names and chat
    templates. The block is pre-norm attention then a gated MLP; the switches below are where families differ."""

    model_type: str
    # (template name, a special token whose presence in the vocabulary selects it), in order; the template names
    # the tool-call format too (server/tools/formats.py)
    chat_templates: tuple[tuple[str, str], ...]
    qk_norm: bool = False  # RMSNorm on each query and key head before rope
    sandwich_norms: bool = False  # a norm on the attention's and on the MLP's output too, before each add
    norm_offset: float = 0.0  # norms scale by (offset + weight)
    embed_scale: bool = False  # embeddings times sqrt(hidden_size)
    activation: str = "silu"  # the gated MLP's, when the config names none
    fused_projections: bool = False  # the checkpoint stores q/k/v as one qkv_proj and gate/up as one gate_up_proj
    # sliding layers (the config's layer_types or sliding_window_pattern) with their own rope (rope_local_base_freq),
    # and the attention scale from query_pre_attn_scalar
    local_rope: bool = False
    sliding_every_layer: bool = False  # the config's sliding_window, when set, covers every layer
    tied_embeddings: bool = False  # tie_word_embeddings when the config does not say
    gguf_architecture: str | None = None  # llama.cpp's `general.architecture`, where it writes this family
    gguf_tensors: Mapping[str, str] = field(default_factory=lambda: LLAMA_TENSORS)  # per layer: llama.cpp -> HF
    gguf_permuted_qk: bool = False  # llama.cpp's converter interleaves the rotary halves of q and k rows
    moe: MoE | None = None  # a mixture of experts: its sparse layers replace the gated MLP
    gguf_experts_family: str | None = None  # the family llama.cpp writes under this architecture when it has experts


# Mistral's [INST] format where the vocabulary has the token, else Llama's; llama.cpp writes Mistral as "llama"
LLAMA_TEMPLATES = (("mistral", "[INST]"), ("llama3", "<|eot_id|>"), ("chatml", "<|im_start|>"))

FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("llama", LLAMA_TEMPLATES, gguf_architecture="llama", gguf_permuted_qk=True, gguf_experts_family="mixtral"),
    Family("mistral", LLAMA_TEMPLATES, sliding_every_layer=True),
    Family("qwen3", (("qwen3", "<|im_start|>"),), qk_norm=True, gguf_architecture="qwen3",
           gguf_tensors=MappingProxyType(LLAMA_TENSORS | QK_NORM_TENSORS)),
    Family("gemma3_text", (("gemma3", "<start_of_turn>"),), qk_norm=True, sandwich_norms=True, norm_offset=1.0,
           embed_scale=True, activation="gelu_pytorch_tanh", local_rope=True, tied_embeddings=True,
           gguf_architecture="gemma3", gguf_tensors=MappingProxyType(LLAMA_TENSORS | QK_NORM_TENSORS | {
               "ffn_norm": "pre_feedforward_layernorm",
               "post_attention_norm": "post_attention_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm",
           })),
    Family("qwen3_moe", (("qwen3", "<|im_start|>"),), qk_norm=True,
           moe=MoE(("num_experts", "num_local_experts"), "moe_intermediate_size", "norm_topk_prob", "mlp.",
                   ("gate_proj", "up_proj", "down_proj")),
           gguf_architecture="qwen3moe", gguf_tensors=MappingProxyType(
               LLAMA_TENSORS | QK_NORM_TENSORS | expert_tensors("mlp.", "gate_proj", "up_proj", "down_proj"))),
    Family("mixtral", LLAMA_TEMPLATES, sliding_every_layer=True,  # llama.cpp writes it as "llama" with experts
           moe=MoE(("num_local_experts",), "intermediate_size", None, "block_sparse_moe.", ("w1", "w3", "w2")),
           gguf_tensors=MappingProxyType(LLAMA_TENSORS | expert_tensors("block_sparse_moe.", "w1", "w3", "w2")),
           gguf_permuted_qk=True),
    Family("phi3", (("phi3", "<|assistant|>"),), fused_projections=True, sliding_every_layer=True,
           gguf_architecture="phi3", gguf_tensors=MappingProxyType({  # ffn_up holds gate and up, in that order
               "attn_norm": "input_layernorm",
               "attn_qkv": "self_attn.qkv_proj",
               "attn_output": "self_attn.o_proj",
               "ffn_norm": "post_attention_layernorm",
               "ffn_up": "mlp.gate_up_proj",
               "ffn_down": "mlp.down_proj",
           })),
)}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
GGUF_ARCHITECTURES = {f.gguf_architecture: f.model_type for f in FAMILIES.values() if f.gguf_architecture}


def family(model_type: str) -> Family:
    """The declared family; ValueError naming the supported ones."""
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not supported (supported: {', '.join(FAMILIES)})")
    return FAMILIES[model_type]
