"""Tiny random Llama 3 / Qwen 3 / Gemma 3 / Mistral / Phi-3 / Qwen 3 MoE / Mixtral checkpoints built with transformers' own config classes,
and the same written as 8-bit HF checkpoints or as a GGUF (quantized, or float32 as llama.cpp converts them)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig, MixtralConfig, Phi3Config,
                          Qwen3Config, Qwen3MoeConfig)

FAMILIES = ("llama", "qwen3", "gemma3")
PHI3_ORIGINAL_CONTEXT = 32  # the tiny Phi-3's original_max_position_embeddings: LongRoPE's long factors start past it


def longrope(rotary_dim: int, **extra: object) -> dict:
    """Phi-3 `rope_parameters` with LongRoPE over `rotary_dim` rotated dims: distinct short and long divisors."""
    half = rotary_dim // 2
    return {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": PHI3_ORIGINAL_CONTEXT,
            "short_factor": [1.0 + 0.25 * i for i in range(half)], "long_factor": [2.0 + 1.5 * i for i in range(half)],
            **extra}


# the Mistral and Phi-3 checkpoints the parity tests build: name -> (family, config overrides). Mistral with a window
# shorter than the long prompts and without one; Phi-3 with LongRoPE, with it on half of each head and a window, and
# with plain rope
VARIANTS = {
    "mistral-window": ("mistral", {}),
    "mistral-full": ("mistral", {"sliding_window": None}),
    "phi3-longrope": ("phi3", {}),
    "phi3-partial-window": ("phi3", {"rope_parameters": longrope(8, partial_rotary_factor=0.5), "sliding_window": 7}),
    "phi3-plain": ("phi3", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                "partial_rotary_factor": 1.0}}),
}


def tiny_config(family: str, **overrides):
    common = dict(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, max_position_embeddings=512, rms_norm_eps=1e-6,
    )
    if family == "llama":
        cfg = LlamaConfig(
            **common, num_key_value_heads=2, tie_word_embeddings=False,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            rope_theta=500000.0,
        )
    elif family == "qwen3":
        cfg = Qwen3Config(**common, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True)
    elif family == "gemma3":
        cfg = Gemma3TextConfig(
            **common, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=24, sliding_window=6,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}},
        )
    elif family == "mistral":  # a window shorter than the long test prompts
        cfg = MistralConfig(**common, num_key_value_heads=2, sliding_window=5, tie_word_embeddings=False)
    elif family == "phi3":  # LongRoPE: a 4x context over an original one the long test prompts outgrow
        cfg = Phi3Config(**common | {"max_position_embeddings": 4 * PHI3_ORIGINAL_CONTEXT}, num_key_value_heads=2,
                         original_max_position_embeddings=PHI3_ORIGINAL_CONTEXT, rope_parameters=longrope(16),
                         pad_token_id=None, eos_token_id=None)
    elif family == "qwen3_moe":  # 6 experts, top 2; layer 1 dense (mlp_only_layers), the others sparse
        cfg = Qwen3MoeConfig(**common, num_key_value_heads=2, head_dim=16, num_experts=6, num_experts_per_tok=2,
                             moe_intermediate_size=24, decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=True,
                             tie_word_embeddings=False)
    elif family == "mixtral":  # 4 experts, top 2, every layer sparse, a window shorter than the long prompts
        cfg = MixtralConfig(**common | {"intermediate_size": 48}, num_key_value_heads=2, num_local_experts=4,
                            num_experts_per_tok=2, sliding_window=5, tie_word_embeddings=False)
    else:
        raise ValueError(family)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def tiny_hf_model(family: str, seed: int = 0, **overrides):
    """A float32 transformers model with weights large enough that logits are O(1), not ~0."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) * 0.5 + (0.0 if family == "gemma3" else 0.75))
            else:
                p.normal_(0.0, 0.3 if "embed" in name else 0.08)
    return model.eval()


def save_tiny(family: str, path: Path, sharded: bool = False, seed: int = 0, **overrides) -> Path:
    model = tiny_hf_model(family, seed, **overrides)
    model.save_pretrained(path, max_shard_size="60KB" if sharded else "1GB", safe_serialization=True)
    return path


def save_tiny_with_tokenizer(family: str, path: Path, seed: int = 0, **overrides) -> Path:
    """A tiny checkpoint that `LLM(path)` serves: random weights plus a byte-level BPE tokenizer trained here
    on a few sentences (every byte has a token, so any text is spellable), its vocabulary the model's 320."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = ["The cat sat on the mat.", '{"name": "Tom", "age": 3}', "Call 555-1234 today!", "yes no maybe"] * 20
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(corpus, trainer)
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>").save_pretrained(path)
    return save_tiny(family, path, seed=seed, eos_token_id=bpe.token_to_id("</s>"), bos_token_id=None, **overrides)


QWEN3_SPECIAL = ["</s>", "<|im_start|>", "<|im_end|>"]
QWEN3_MARKUP = ["<think>", "</think>", "<tool_call>", "</tool_call>"]  # added, not special: they reach the text
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"]


def _chat_tokenizer(path: Path, special: list[str], markup: list[str], eos: str, bos: str | None = None) -> dict[str, int]:
    """A byte-level BPE tokenizer trained on a few sentences, with a family's turn tokens (special) and markup
    tokens (added, not special), saved to `path`; returns the ids of its special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = ["The cat sat on the mat.", '{"name": "get_weather", "arguments": {"city": "Paris"}}', "yes no"] * 20
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320 - len(markup), special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(corpus, trainer)
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in markup])
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=eos, bos_token=bos, pad_token=special[0]).save_pretrained(path)
    return {t: bpe.token_to_id(t) for t in special}


def save_tiny_qwen3_chat(path: Path, seed: int = 0) -> Path:
    """A tiny Qwen 3 that `infer serve` renders with the Qwen 3 chat template: ChatML's turn tokens (<|im_end|>
    ends a turn) and Qwen 3's <think> / <tool_call> markup as single tokens."""
    ids = _chat_tokenizer(path, QWEN3_SPECIAL, QWEN3_MARKUP, "<|im_end|>")
    return save_tiny("qwen3", path, seed=seed, eos_token_id=ids["<|im_end|>"], bos_token_id=None,
                     max_position_embeddings=2048)


def save_tiny_llama3_chat(path: Path, seed: int = 0) -> Path:
    """A tiny Llama that `infer serve` renders with the Llama 3 chat template (<|eot_id|> ends a turn)."""
    ids = _chat_tokenizer(path, LLAMA3_SPECIAL, [], "<|eot_id|>", "<|begin_of_text|>")
    return save_tiny("llama", path, seed=seed, eos_token_id=ids["<|eot_id|>"], bos_token_id=ids["<|begin_of_text|>"],
                     max_position_embeddings=2048)


# quantized checkpoint formats the tests write: (weight dtype, scale strategy)
W8_FORMATS = {"fp8_block": (torch.float8_e4m3fn, "block"), "int8_channel": (torch.int8, "channel"),
              "fp8_channel": (torch.float8_e4m3fn, "channel")}
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _quantize_8bit(w: torch.Tensor, dtype: torch.dtype, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric 8-bit values and their scales [ceil(N/bn), ceil(K/bk)], block by block (written out in full here so
    the tests do not build their checkpoints with the code they test)."""
    n, k = w.shape
    bn, bk = block
    qmax = 127.0 if dtype == torch.int8 else 448.0
    scale = torch.empty(-(-n // bn), -(-k // bk))
    q = torch.empty(n, k, dtype=dtype)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            tile = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].float()
            scale[i, j] = max(tile.abs().max().item() / qmax, 1e-12)
            v = (tile / scale[i, j]).clamp(-qmax, qmax)
            q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = (v.round() if dtype == torch.int8 else v).to(dtype)
    return q, scale


def quantize_checkpoint(src: Path, dst: Path, fmt: str, block: tuple[int, int] = (128, 128)) -> Path:
    """`src` (a float checkpoint, with its tokenizer files) rewritten as an 8-bit checkpoint in one of W8_FORMATS,
    with the quantization_config and tensor names the real formats use (Qwen3-8B-FP8: `quant_method: fp8` and
    `weight_scale_inv`; compressed-tensors w8a8 / FP8-dynamic: `weight_scale` [N, 1]). Norms, embeddings and the LM
    head stay as they were."""
    import shutil

    from safetensors.torch import load_file, save_file

    dtype, strategy = W8_FORMATS[fmt]
    shutil.copytree(src, dst)
    tensors = {}
    for f in sorted(dst.glob("*.safetensors")):
        tensors |= load_file(str(f))
        f.unlink()
    (dst / "model.safetensors.index.json").unlink(missing_ok=True)
    out = {}
    for name, t in tensors.items():
        if name.endswith(".weight") and name.rsplit(".", 2)[-2] in _LINEARS:
            q, scale = _quantize_8bit(t, dtype, block if strategy == "block" else (1, t.shape[1]))
            out[name] = q
            out[name.removesuffix("weight") + ("weight_scale_inv" if strategy == "block" else "weight_scale")] = scale
        else:
            out[name] = t
    save_file(out, str(dst / "model.safetensors"))
    config = json.loads((dst / "config.json").read_text())
    if strategy == "block":
        config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                         "weight_block_size": list(block)}
    else:
        kind = "int" if dtype == torch.int8 else "float"
        config["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": f"{kind}-quantized", "ignore": ["lm_head"],
            "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": kind, "strategy": "channel", "symmetric": True, "dynamic": False},
                "input_activations": {"num_bits": 8, "type": kind, "strategy": "token", "symmetric": True,
                                      "dynamic": True},
            }},
        }
    (dst / "config.json").write_text(json.dumps(config))
    return dst


GGUF_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row permutation (HF's split rotary halves to interleaved), as its converter applies it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_writer(path: Path, arch: str, cfg, rope_base: float, rope_dims: int) -> GGUFWriter:
    """A GGUF writer holding a decoder's shape metadata as llama.cpp's converter writes it."""
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(rope_base)
    writer.add_rope_dimension_count(rope_dims)
    return writer


def _gguf_outer_tensors(writer: GGUFWriter, state: dict[str, np.ndarray]) -> None:
    """The embedding, the final norm and the LM head."""
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])


def _gguf_finish(writer: GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_llama_gguf(path: Path, seed: int = 4, kinds: dict[str, GGMLQuantizationType] | None = None,
                     ) -> tuple[Path, dict[str, np.ndarray]]:
    """A tiny Llama as llama.cpp would write it, each projection in its `kinds` entry (by GGUF name, e.g. "attn_q";
    Q8_0 where none is given), quantized by gguf-py; returns the file and each projection's raw blocks."""
    model = tiny_hf_model("llama", seed)  # its llama3 rope scaling is left out of the file: both loads share that
    cfg, state = model.config, {k: v.numpy() for k, v in model.state_dict().items()}
    writer = _gguf_writer(path, "llama", cfg, 500000.0, cfg.hidden_size // cfg.num_attention_heads)
    _gguf_outer_tensors(writer, state)
    raw = {}
    for i in range(cfg.num_hidden_layers):
        for hf, ours in GGUF_LAYER.items():
            w = state[f"model.layers.{i}.{hf}.weight"]
            name = f"blk.{i}.{ours}.weight"
            if w.ndim == 1:
                writer.add_tensor(name, w)
                continue
            if ours in ("attn_q", "attn_k"):
                w = _permute(w, cfg.num_attention_heads if ours == "attn_q" else cfg.num_key_value_heads)
            kind = (kinds or {}).get(ours, GGMLQuantizationType.Q8_0)
            raw[name] = quantize(w, kind)
            writer.add_tensor(name, raw[name], raw_dtype=kind)
    _gguf_finish(writer)
    return path, raw


PHI3_GGUF_LAYER = {"input_layernorm": "attn_norm", "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
                   "post_attention_layernorm": "ffn_norm", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _gguf_tokenizer(writer: GGUFWriter, tokenizer_dir: Path) -> None:
    """A byte-level BPE tokenizer.json (save_tiny_with_tokenizer's) as llama.cpp's "gpt2" vocabulary in the GGUF."""
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"] | {t["content"]: t["id"] for t in spec["added_tokens"]}
    tokens = sorted(vocab, key=vocab.get)
    special = {t["content"] for t in spec["added_tokens"] if t.get("special")}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL if t in special else TokenType.NORMAL for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    writer.add_eos_token_id(vocab["</s>"])


def write_moe_gguf(model, path: Path, tokenizer_dir: Path | None = None,
                   expert_kinds: dict[str, GGMLQuantizationType] | None = None) -> Path:
    """A tiny transformers Qwen 3 MoE ("qwen3moe") or Mixtral ("llama" with experts, q/k rows permuted) in float32 as
    llama.cpp's converter writes it: the router as ffn_gate_inp, each projection's experts stacked [E, rows, cols];
    with `tokenizer_dir`, that directory's byte-level vocabulary embedded (so `infer serve` can serve the file); with
    `expert_kinds`, each stacked projection ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps") it names quantized by gguf-py
    (the attention and the router stay float32)."""
    cfg, state = model.config, {k: v.numpy() for k, v in model.state_dict().items()}
    qwen = cfg.model_type == "qwen3_moe"
    experts = cfg.num_experts if qwen else cfg.num_local_experts
    inner = cfg.moe_intermediate_size if qwen else cfg.intermediate_size
    writer = _gguf_writer(path, "qwen3moe" if qwen else "llama", cfg, cfg.rope_parameters["rope_theta"],
                          cfg.head_dim if qwen else cfg.hidden_size // cfg.num_attention_heads)
    writer.add_expert_count(experts)
    writer.add_expert_used_count(cfg.num_experts_per_tok)
    if qwen:
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
        writer.add_expert_feed_forward_length(inner)
    if tokenizer_dir is not None:
        _gguf_tokenizer(writer, tokenizer_dir)
    _gguf_outer_tensors(writer, state)
    layer_names = GGUF_LAYER | ({"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"} if qwen else {})
    for i in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{i}."
        for hf, ours in layer_names.items():
            if f"{prefix}{hf}.weight" not in state:
                continue  # the dense MLP's projections, in a sparse layer
            w = state[f"{prefix}{hf}.weight"]
            if not qwen and ours in ("attn_q", "attn_k"):
                w = _permute(w, cfg.num_attention_heads if ours == "attn_q" else cfg.num_key_value_heads)
            writer.add_tensor(f"blk.{i}.{ours}.weight", np.ascontiguousarray(w))
        if f"{prefix}mlp.experts.gate_up_proj" in state:  # transformers holds the experts stacked, gate rows first
            gate_up, down = state[f"{prefix}mlp.experts.gate_up_proj"], state[f"{prefix}mlp.experts.down_proj"]
            writer.add_tensor(f"blk.{i}.ffn_gate_inp.weight", state[f"{prefix}mlp.gate.weight"])
            stacks = {"ffn_gate_exps": gate_up[:, :inner], "ffn_up_exps": gate_up[:, inner:], "ffn_down_exps": down}
            for ours, w in stacks.items():
                kind = (expert_kinds or {}).get(ours)
                w = np.ascontiguousarray(w)
                if kind is None:
                    writer.add_tensor(f"blk.{i}.{ours}.weight", w)
                else:
                    writer.add_tensor(f"blk.{i}.{ours}.weight", quantize(w, kind), raw_dtype=kind)
    _gguf_finish(writer)
    return path


def write_f32_gguf(model, path: Path) -> Path:
    """A tiny transformers Mistral or Phi-3 in float32 as llama.cpp's converter writes it: Mistral as architecture
    "llama" (q/k rows permuted, no sliding window kept), Phi-3 as "phi3" (fused attn_qkv, ffn_up holding gate and up,
    the rotated dims as the rope dimension count, LongRoPE's factors as tensors, the window as metadata, 0 for none)."""
    cfg, state = model.config, {k: v.numpy() for k, v in model.state_dict().items()}
    phi3, rope = cfg.model_type == "phi3", cfg.rope_parameters
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    writer = _gguf_writer(path, "phi3" if phi3 else "llama", cfg, rope["rope_theta"],
                          int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    if phi3:
        original = cfg.original_max_position_embeddings
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_sliding_window(cfg.sliding_window or 0)
        if rope["rope_type"] == "longrope":
            scale = cfg.max_position_embeddings / original
            writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
            writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
            writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    _gguf_outer_tensors(writer, state)
    for i in range(cfg.num_hidden_layers):
        for hf, ours in (PHI3_GGUF_LAYER if phi3 else GGUF_LAYER).items():
            w = state[f"model.layers.{i}.{hf}.weight"]
            if ours in ("attn_q", "attn_k"):
                w = _permute(w, cfg.num_attention_heads if ours == "attn_q" else cfg.num_key_value_heads)
            writer.add_tensor(f"blk.{i}.{ours}.weight", np.ascontiguousarray(w))
    _gguf_finish(writer)
    return path
