"""Real model shapes (their HF config.json, bf16) and synthetic model directories for random-weight benchmarks.

    from model_shapes import write_model_dir, model_config, weight_bytes
    path = write_model_dir("llama-3.2-1b", Path("/tmp/models"))  # config.json + a WordLevel tokenizer
    LLM(str(path), load_format="dummy", dtype="bfloat16")

The tokenizer has exactly vocab_size tokens "t0".."t{N-1}" (whitespace-split words), so any id is valid
and nothing needs the hub. `weight_bytes` and `flops_per_token` give the batch-1 roofline inputs; for a mixture of
experts `weight_bytes` counts every expert and `active_weight_bytes` only the experts a decode step reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infer.families.catalog import family
from infer.families.config import ModelConfig, config_from_hf

if TYPE_CHECKING:
    from transformers import PretrainedConfig

_LLAMA_COMMON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}

LLAMA_3_2_1B: dict[str, Any] = _LLAMA_COMMON | {
    "head_dim": 64,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True,
    "transformers_version": "4.45.0.dev0",
}

LLAMA_3_1_8B: dict[str, Any] = _LLAMA_COMMON | {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False,
    "transformers_version": "4.43.0.dev0",
}

QWEN3_1_7B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

GEMMA_3_1B: dict[str, Any] = {  # google/gemma-3-1b-it; ties embeddings by the config class's default
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": [1, 106],
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "initializer_range": 0.02,
    "intermediate_size": 6912,
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 26,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "use_cache": True,
    "vocab_size": 262144,
}

QWEN3_30B_A3B: dict[str, Any] = {  # Qwen/Qwen3-30B-A3B: 48 sparse layers, 128 experts, top 8 (30.5B weights, 3.3B used)
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

TINY_QWEN3_MOE: dict[str, Any] = QWEN3_30B_A3B | {  # CPU smoke only: 8 experts, top 2, layer 1 dense, q 2x hidden
    "bos_token_id": 0,
    "eos_token_id": 1,
    "head_dim": 32,
    "hidden_size": 64,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "max_window_layers": 3,
    "mlp_only_layers": [1],
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "torch_dtype": "float32",
    "vocab_size": 512,
}

TINY_LLAMA: dict[str, Any] = LLAMA_3_2_1B | {  # CPU smoke runs only
    "bos_token_id": 0,
    "eos_token_id": 1,
    "head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rope_scaling": LLAMA_3_2_1B["rope_scaling"] | {"original_max_position_embeddings": 1024},
    "torch_dtype": "float32",
    "vocab_size": 512,
}

SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": LLAMA_3_2_1B,
    "qwen3-1.7b": QWEN3_1_7B,
    "gemma-3-1b": GEMMA_3_1B,
    "llama-3.1-8b": LLAMA_3_1_8B,
    "tiny-llama": TINY_LLAMA,
    "qwen3-30b-a3b": QWEN3_30B_A3B,  # not in GPU_SHAPES: ~61 GB of bf16 weights, benchmarks/moe_decode.py alone
    "tiny-qwen3-moe": TINY_QWEN3_MOE,
}
GPU_SHAPES = ("llama-3.2-1b", "llama-3.1-8b", "qwen3-1.7b", "gemma-3-1b")  # the target shapes first


def model_config(name: str) -> ModelConfig:
    """Our typed config of a named shape (through the same parser the loader uses)."""
    return config_from_hf(SHAPES[name])


def _special_ids(d: dict[str, Any]) -> tuple[int, int]:
    """(bos, first eos) ids of a config dict."""
    eos = d["eos_token_id"]
    return int(d["bos_token_id"]), int(eos[0] if isinstance(eos, list) else eos)


def write_tokenizer(vocab_size: int, bos: int, eos: int, path: Path) -> None:
    """A WordLevel tokenizer over "t0".."t{vocab_size-1}" saved as tokenizer.json + tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # single_word: "t1" must not match inside "t17"
    tok.add_special_tokens([AddedToken(f"t{i}", special=True, single_word=True) for i in (bos, eos)])
    tok.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": f"t{bos}", "eos_token": f"t{eos}",
              "unk_token": "t0", "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False}
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_model_dir(name: str, root: Path) -> Path:
    """root/name with config.json, generation_config.json (every EOS id) and the synthetic tokenizer."""
    d = SHAPES[name]
    path = Path(root) / name
    path.mkdir(parents=True, exist_ok=True)
    config_text = json.dumps(d, indent=2) + "\n"
    config_file = path / "config.json"
    if config_file.exists() and config_file.read_text() == config_text and (path / "tokenizer.json").exists():
        return path  # already written: the 262k-token tokenizer takes a moment to build
    write_tokenizer(int(d["vocab_size"]), *_special_ids(d), path)
    generation = {k: d[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in d}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    config_file.write_text(config_text)
    return path


def hf_config(name: str) -> PretrainedConfig:
    """transformers' config object for a shape (the class its model_type maps to)."""
    from transformers import AutoConfig

    d = dict(SHAPES[name])
    return AutoConfig.for_model(d.pop("model_type"), **d)


def _layer_params(cfg: ModelConfig, layer: int = 0, experts: int | None = None) -> int:
    """Weights of one transformer block (matrices, bias, norms); a sparse block counts its router and `experts` experts
    (None: all of them)."""
    fam = family(cfg.model_type)
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    attn = cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size + (q + 2 * kv if cfg.attention_bias else 0)
    if cfg.is_moe(layer):
        n = cfg.num_experts if experts is None else experts
        mlp = cfg.num_experts * cfg.hidden_size + n * 3 * cfg.hidden_size * cfg.moe_intermediate_size
    else:
        mlp = 3 * cfg.hidden_size * cfg.intermediate_size
    qk_norm = 2 * cfg.head_dim if fam.qk_norm else 0
    norms = (4 if fam.sandwich_norms else 2) * cfg.hidden_size
    return attn + mlp + qk_norm + norms


def _blocks_params(cfg: ModelConfig, experts: float | None = None) -> int:
    """Weights of every block, each sparse one counting `experts` of its experts (None: all; may be fractional, an
    expected count)."""
    if experts is None or not cfg.num_experts:
        return sum(_layer_params(cfg, i) for i in range(cfg.num_hidden_layers))
    expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    return round(sum(_layer_params(cfg, i, 0) + (experts * expert if cfg.is_moe(i) else 0)
                     for i in range(cfg.num_hidden_layers)))


def weight_bytes(cfg: ModelConfig, dtype_bytes: int = 2) -> int:
    """Bytes read per decode token at batch 1 of a dense model: every block once (every expert of a sparse one),
    final norm, LM head, one embedding row."""
    return _read_bytes(cfg, None, dtype_bytes)


def active_weight_bytes(cfg: ModelConfig, experts_read: float, dtype_bytes: int = 2) -> int:
    """Bytes of weights one decode step reads when `experts_read` distinct experts of each sparse layer are read:
    attention, router and norms of every block, those experts' three projections, final norm, LM head and one
    embedding row (batch 1: experts_read = num_experts_per_tok; a dense model: weight_bytes)."""
    return _read_bytes(cfg, experts_read, dtype_bytes)


def _read_bytes(cfg: ModelConfig, experts: float | None, dtype_bytes: int) -> int:
    params = _blocks_params(cfg, experts) + cfg.hidden_size  # blocks + final norm
    params += cfg.vocab_size * cfg.hidden_size + cfg.hidden_size  # LM head + the looked-up row (tied or not)
    return params * dtype_bytes


def expected_experts(cfg: ModelConfig, batch: int) -> float:
    """Distinct experts a sparse layer reads in one decode step of `batch` tokens under uniform routing:
    E * (1 - (1 - k/E)^batch) (each expert is missed by one token with probability 1 - k/E)."""
    e, k = cfg.num_experts, cfg.num_experts_per_tok
    return e * (1 - (1 - k / e) ** batch) if e else 0.0


def visible_tokens(cfg: ModelConfig, context_len: int) -> int:
    """Keys attended by one new token, summed over layers (sliding layers see at most their window)."""
    return sum(min(context_len, cfg.window(i) or context_len) for i in range(cfg.num_hidden_layers))


def kv_read_bytes(cfg: ModelConfig, context_len: int, dtype_bytes: int = 2) -> int:
    """K and V bytes one decode token reads from the cache at this context length."""
    return 2 * visible_tokens(cfg, context_len) * cfg.num_key_value_heads * cfg.head_dim * dtype_bytes


def flops_per_token(cfg: ModelConfig, context_len: int) -> int:
    """Matmul FLOPs of one token: 2 per weight of every projection it uses (its k experts of a sparse layer, and the
    router) and the LM head, plus QK^T and PV."""
    matmul = _blocks_params(cfg, cfg.num_experts_per_tok) + cfg.vocab_size * cfg.hidden_size
    attention = 4 * visible_tokens(cfg, context_len) * cfg.num_attention_heads * cfg.head_dim
    return 2 * matmul + attention


def _causal_pairs(tokens: int, window: int | None) -> int:
    """(query, key) pairs of a causal prompt of `tokens`, each query seeing at most `window` keys."""
    w = min(window or tokens, tokens)
    return w * (w + 1) // 2 + (tokens - w) * w


def prefill_flops(cfg: ModelConfig, tokens: int) -> int:
    """Matmul FLOPs of a one-sequence prefill: every token's projections (its k experts of a sparse layer), causal
    attention, one LM-head row."""
    blocks = _blocks_params(cfg, cfg.num_experts_per_tok)
    pairs = sum(_causal_pairs(tokens, cfg.window(i)) for i in range(cfg.num_hidden_layers))
    attention = 4 * pairs * cfg.num_attention_heads * cfg.head_dim
    return 2 * tokens * blocks + attention + 2 * cfg.vocab_size * cfg.hidden_size
