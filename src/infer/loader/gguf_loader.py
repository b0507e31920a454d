"""Read a GGUF checkpoint as an HF-style config dict and HF-named float32 tensors, undoing llama.cpp's transforms."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from infer.loader.cuts import CutFor, cut_gguf_raw, cut_tensor, pad_value
from infer.families.catalog import GGUF_ARCHITECTURES, Family, family
from infer.loader.gguf_file import gguf_value, open_gguf
from infer.loader.gguf_quant import GROUP, INT4_TYPES, Int4Groups, read_int4, read_q8_0
from infer.loader.hf_quant import W8Tensor
from infer.models.shard import ELSEWHERE
from tqdm.auto import tqdm


_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Tensors llama.cpp derives from the config (llama3 rope factors, LongRoPE's); read into the config, not yielded.
_LONGROPE_TENSORS = ("rope_factors_short.weight", "rope_factors_long.weight")
_CONFIG_TENSORS = frozenset({"rope_freqs.weight", *_LONGROPE_TENSORS})
_TENSOR_NAME = re.compile(r"(?:blk\.(?P<layer>\d+)\.)?(?P<base>\w+)\.(?P<kind>weight|bias)")

# llama.cpp hard-codes these for Gemma 3 instead of storing them in the GGUF.
_GEMMA3_LOCAL_ROPE_THETA = 10000.0
_GEMMA3_SLIDING_WINDOW_PATTERN = 6
_GEMMA3_27B_LAYERS = 62


def _architecture(reader: GGUFReader) -> str:
    arch = gguf_value(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(sorted(GGUF_ARCHITECTURES))})"
        )
    return arch


def _llama3_rope_factors(theta: float, dim: int, scaling: dict[str, Any]) -> np.ndarray:
    """The per-frequency divisors llama.cpp's converter writes as `rope_freqs.weight` for llama3 rope scaling."""
    inv_freq = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * np.pi / inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    smooth = (orig / wavelen - low) / (high - low)
    ramp = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor, ramp))


def _llama3_scaling(factors: np.ndarray, theta: float, dim: int, orig: int) -> dict[str, Any] | None:
    """Recover llama3 rope-scaling parameters from `rope_freqs.weight`, which is all llama.cpp stores of them.

    Between the two cut-off wavelengths the smoothing term is linear in 1/wavelen with slope
    orig/(high-low) and intercept -low/(high-low); fitting it gives the frequency factors back.
    """
    factor = float(factors.max())
    if factor == 1.0:
        return None
    inv_wavelen = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim) / (2 * np.pi)
    ramp = (factors > 1.0) & (factors < factor)
    if ramp.sum() < 2:
        raise ValueError("rope_freqs.weight has fewer than two ramp frequencies; llama3 scaling is ambiguous")
    smooth = (1.0 / factors[ramp] - 1.0 / factor) / (1.0 - 1.0 / factor)
    slope, intercept = np.polyfit(inv_wavelen[ramp], smooth, 1)
    low = -intercept * orig / slope
    scaling = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": round(float(low), 3),
        "high_freq_factor": round(float(low + orig / slope), 3),
        "original_max_position_embeddings": orig,
    }
    if not np.allclose(_llama3_rope_factors(theta, dim, scaling), factors, rtol=1e-4):
        raise ValueError("rope_freqs.weight does not follow llama3 rope scaling")
    return scaling


def _rope_scaling(reader: GGUFReader, arch: str, theta: float, rope_dim: int) -> dict[str, Any] | None:
    """HF `rope_scaling` from GGUF metadata (linear, yarn, ...), from LongRoPE's short and long factor tensors, or
    from a llama3 `rope_freqs.weight` tensor."""
    orig = gguf_value(reader, f"{arch}.rope.scaling.original_context_length")
    kind = gguf_value(reader, f"{arch}.rope.scaling.type", "none")
    if kind != "none":
        scaling = {"rope_type": kind, "factor": float(gguf_value(reader, f"{arch}.rope.scaling.factor"))}
        return scaling | ({"original_max_position_embeddings": int(orig)} if orig else {})
    tensors = {t.name: t for t in reader.tensors}
    if all(name in tensors for name in _LONGROPE_TENSORS):
        short, long = (dequantize(tensors[name].data, tensors[name].tensor_type).tolist() for name in _LONGROPE_TENSORS)
        scaling = {"rope_type": "longrope", "short_factor": short, "long_factor": long,
                   "original_max_position_embeddings": int(orig)}
        attention = gguf_value(reader, f"{arch}.rope.scaling.attn_factor")
        return scaling if attention is None else scaling | {"attention_factor": float(attention)}
    freqs = tensors.get("rope_freqs.weight")
    if freqs is None:
        return None
    factors = dequantize(freqs.data, freqs.tensor_type).astype(np.float64)
    return _llama3_scaling(factors, theta, rope_dim, int(orig or 8192))


def _gemma3_fields(hidden: int, heads: int, head_dim: int, n_layers: int, window: int) -> dict[str, Any]:
    pattern = _GEMMA3_SLIDING_WINDOW_PATTERN
    return {
        # llama.cpp scales Gemma 3 27B queries by 1/sqrt(hidden/heads) and every other size by 1/sqrt(head_dim),
        # matching the HF configs; transformers' GGUF path leaves the class default (256) for all sizes.
        "query_pre_attn_scalar": hidden // heads if n_layers == _GEMMA3_27B_LAYERS else head_dim,
        "sliding_window": window,
        "sliding_window_pattern": pattern,
        "layer_types": [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)
        ],
        "rope_local_base_freq": _GEMMA3_LOCAL_ROPE_THETA,
        "hidden_activation": "gelu_pytorch_tanh",
    }


def read_gguf_config(path: str | Path) -> dict[str, Any]:
    """An HF config.json-style dict for `config_from_hf`, from GGUF metadata and tensor presence."""
    reader = open_gguf(path)
    arch = _architecture(reader)

    def meta(key: str, default: Any = None) -> Any:
        return gguf_value(reader, f"{arch}.{key}", default)

    tensors = {t.name: t for t in reader.tensors}
    hidden = int(meta("embedding_length"))
    heads = int(meta("attention.head_count"))
    n_layers = int(meta("block_count"))
    head_dim = int(meta("attention.key_length") or hidden // heads)  # llama.cpp's defaults
    rope_dim = int(meta("rope.dimension_count") or head_dim)
    theta = float(meta("rope.freq_base", 10000.0))
    window = meta("attention.sliding_window")
    model_type = GGUF_ARCHITECTURES[arch]
    if meta("expert_count") and family(model_type).moe is None:  # llama.cpp's "llama" holds Mixtral too
        model_type = family(model_type).gguf_experts_family or model_type
    config: dict[str, Any] = {
        "model_type": model_type,
        "vocab_size": int(tensors["token_embd.weight"].shape[-1]),
        "hidden_size": hidden,
        "intermediate_size": int(meta("feed_forward_length")),
        "num_hidden_layers": n_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon")),
        "rope_theta": theta,
        "max_position_embeddings": int(meta("context_length")),
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": gguf_value(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": gguf_value(reader, "tokenizer.ggml.eos_token_id"),
    }
    scaling = _rope_scaling(reader, arch, theta, rope_dim)
    if scaling is not None:
        config["rope_scaling"] = scaling
    if rope_dim != head_dim:
        config["partial_rotary_factor"] = rope_dim / head_dim
    moe = family(model_type).moe
    if moe is not None:
        config |= {moe.experts_keys[0]: int(meta("expert_count")), "num_experts_per_tok": int(meta("expert_used_count")),
                   moe.inner_key: int(meta("expert_feed_forward_length") or meta("feed_forward_length"))}
        if moe.renormalize_key is not None:  # llama.cpp renormalizes unless the file says otherwise
            config[moe.renormalize_key] = bool(meta("expert_weights_norm", True))
    if arch == "gemma3":
        config |= _gemma3_fields(hidden, heads, head_dim, n_layers, int(window))
    elif window:  # 0: none (llama.cpp's Phi-3 converter writes it so)
        config["sliding_window"] = int(window)
    return config


def _hf_name(fam: Family, gguf_name: str) -> str:
    match = _TENSOR_NAME.fullmatch(gguf_name)
    table = _GLOBAL_TENSORS if match is None or match["layer"] is None else fam.gguf_tensors
    if match is None or match["base"] not in table:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no HF equivalent for architecture {fam.gguf_architecture!r}")
    base = table[match["base"]]
    prefix = "" if match["layer"] is None else f"model.layers.{match['layer']}."
    return f"{prefix}{base}.{match['kind']}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Llama Q/K row permutation (interleaved rotary halves back to HF's split halves)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def iter_gguf_tensors(path: str | Path, keep_int4: bool = False, keep_q8_0: bool = False,
                      cut: CutFor | None = None) -> Iterator[tuple[str, torch.Tensor | Int4Groups | W8Tensor]]:
    """(HF name, float32 tensor in HF layout) for every weight, dequantized, with llama.cpp's transforms undone;
    with keep_int4, Q4_0 / Q4_1 / Q4_K tensors come as their 4-bit groups instead, and with keep_q8_0, Q8_0 ones as
    int8 with their block scales (infer/loader/gguf_quant.py). With `cut` (tensor parallelism), a tensor it names
    is read as that slice of its stored blocks only (loader/cuts.py)."""
    reader = open_gguf(path)
    config = read_gguf_config(path)
    fam = family(config["model_type"])
    qk_heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    for tensor in tqdm(reader.tensors, desc=f"Loading {Path(path).name}", unit="tensor"):
        if tensor.name in _CONFIG_TENSORS:
            continue
        name = _hf_name(fam, tensor.name)
        if "{e}" in name:  # an [E, rows, cols] stack of experts: one HF tensor per expert
            yield from _experts(name, tensor, cut, keep_int4, keep_q8_0)
            continue
        base = tensor.name.split(".")[-2]
        part = cut(name) if cut is not None else None
        data = tensor.data if part is None else cut_gguf_raw(name, tensor.data, tensor.tensor_type, part)
        # a cut of q / k holds whole heads: llama.cpp's permutation is undone per head
        heads = qk_heads.get(base, 0) * data.shape[0] // max(tensor.data.shape[0], 1)
        unpermute = fam.gguf_permuted_qk and base in qk_heads
        # rows move when llama.cpp's permutation is undone; each row keeps its groups or blocks
        rows = (lambda a: _unpermute(a, heads)) if unpermute else None
        value: torch.Tensor | Int4Groups | W8Tensor | None = _kept(data, tensor.tensor_type, keep_int4, keep_q8_0, rows)
        if value is None:
            w = dequantize(data, tensor.tensor_type)
            if unpermute:
                w = _unpermute(w, heads)
            if fam.norm_offset and tensor.name.endswith("norm.weight"):
                w = w - fam.norm_offset  # llama.cpp stores the (offset + weight) RMSNorm scale; HF stores weight
            value = torch.from_numpy(np.require(w, dtype=np.float32, requirements=["C", "W"]))
        yield name, value if part is None else pad_value(name, value, part)


def _experts(name: str, tensor: Any, cut: CutFor | None, keep_int4: bool, keep_q8_0: bool
             ) -> Iterator[tuple[str, torch.Tensor | Int4Groups | W8Tensor]]:
    """A stacked expert tensor as each expert's HF tensor (its tensor-parallel slice with `cut`, only this rank's
    experts with expert parallelism): dequantized, or kept as 4-bit groups / Q8_0 blocks as `iter_gguf_tensors`
    keeps a dense weight."""
    kind = tensor.tensor_type
    kept = keep_int4 and kind in INT4_TYPES or keep_q8_0 and kind == GGMLQuantizationType.Q8_0
    stack = tensor.data if kept else dequantize(tensor.data, kind)
    for e in range(stack.shape[0]):
        expert = name.format(e=e)
        part = cut(expert) if cut is not None else None
        if part is ELSEWHERE:  # another rank's expert (expert parallelism)
            continue
        if kept:
            data = stack[e] if part is None else cut_gguf_raw(expert, stack[e], kind, part)
            value = _kept(data, kind, keep_int4, keep_q8_0)
            yield expert, value if part is None else pad_value(expert, value, part)
        else:
            w = torch.from_numpy(np.require(stack[e], dtype=np.float32, requirements=["C", "W"]))
            yield expert, w if part is None else cut_tensor(w, part)


def _kept(data: np.ndarray, kind: GGMLQuantizationType, keep_int4: bool, keep_q8_0: bool,
          rows: Callable[[np.ndarray], np.ndarray] | None = None) -> Int4Groups | W8Tensor | None:
    """A tensor's raw blocks (`data` [N, bytes per row]) kept as stored: Q4_0 / Q4_1 / Q4_K as 4-bit groups with
    keep_int4, Q8_0 as int8 blocks with keep_q8_0, `rows` applied to each array's rows; None when it is dequantized."""
    move = rows or (lambda a: a)
    if keep_int4 and kind in INT4_TYPES:
        return Int4Groups(*(np.ascontiguousarray(move(a)) for a in read_int4(data, kind)))
    if keep_q8_0 and kind == GGMLQuantizationType.Q8_0:
        return _q8_0_tensor(*(move(a) for a in read_q8_0(data)))
    return None


def gguf_head_q8_0(path: str | Path) -> W8Tensor | None:
    """The LM head (`output`, else the tied `token_embd`) as int8 with its block scales, if the file stores it Q8_0."""
    tensors = {t.name: t for t in open_gguf(path).tensors}
    head = tensors.get("output.weight", tensors.get("token_embd.weight"))
    if head is None or head.tensor_type != GGMLQuantizationType.Q8_0:
        return None
    return _q8_0_tensor(*read_q8_0(head.data))


def _q8_0_tensor(q: np.ndarray, scale: np.ndarray) -> W8Tensor:
    """Q8_0 values and scales as the int8 weight `lz.linear_w8` takes, blocks (1, 32)."""
    return W8Tensor(*(torch.from_numpy(np.ascontiguousarray(a)) for a in (q, scale)), (1, GROUP))
