"""Build a model from an HF directory (config.json + safetensors) or a GGUF file, on a device and dtype."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

import layerzero as lz
from infer.loader.gguf_loader import gguf_head_q8_0, iter_gguf_tensors, read_gguf_config
from infer.loader.gguf_file import open_gguf
from infer.loader.cuts import CutFor
from infer.loader.gguf_quant import GROUP, Int4Groups
from infer.loader.hf_quant import CheckpointQuant, W8Tensor, parse_quant_config
from infer.loader.safetensors_loader import iter_safetensors
from infer.loader.weights import load_weights
from infer.models.base import CausalLM
from infer.families.config import ModelConfig, config_from_hf
from infer.models.layers import params_on_meta
from infer.models.moe import SparseMLP
from infer.models.quant import W8Weight, hold_linears_in, quantize_linears, replace_weight

from infer.models.shard import Shard

AT_LOAD = ("int4", "int8", "fp8")  # quantization values that quantize a float checkpoint's linear weights at load


@dataclass
class LoadedModel:
    model: CausalLM
    config: ModelConfig
    source: Path


def is_gguf(path: Path) -> bool:
    return path.suffix == ".gguf"


def read_config(path: Path) -> ModelConfig:
    """The typed config of an HF directory or a GGUF file."""
    if is_gguf(path):
        return config_from_hf(read_gguf_config(path))
    config_file = path / "config.json"
    if not config_file.exists():
        raise FileNotFoundError(f"{path} is neither a .gguf file nor a directory with config.json")
    raw = json.loads(config_file.read_text())
    checkpoint_quant(path, raw)  # an unsupported quantization_config fails here, naming the field
    return config_from_hf(raw)


def checkpoint_quant(path: Path, raw: dict | None = None) -> CheckpointQuant | None:
    """How an HF checkpoint stores 8-bit weights (its config.json quantization_config), None if it does not."""
    if is_gguf(path):
        return None
    raw = raw if raw is not None else json.loads((path / "config.json").read_text())
    qc = raw.get("quantization_config")
    return None if qc is None else parse_quant_config(qc, str(path))


def checkpoint_tensors(path: Path, dtype: torch.dtype, keep_int4: bool = False, quant: CheckpointQuant | None = None,
                       keep_w8: bool = False, cut: CutFor | None = None
                       ) -> Iterator[tuple[str, torch.Tensor | Int4Groups | W8Tensor]]:
    """The checkpoint's tensors in `dtype`; with keep_int4, a GGUF's 4-bit tensors as their groups; with keep_w8, a
    GGUF's Q8_0 tensors, or an 8-bit HF checkpoint's (`quant`) weights, as int8 / fp8 with their scales; with `cut`,
    one tensor-parallel rank's slices."""
    if is_gguf(path):
        return ((name, t if isinstance(t, (Int4Groups, W8Tensor)) else t.to(dtype))
                for name, t in iter_gguf_tensors(path, keep_int4, keep_w8, cut))
    return iter_safetensors(path, dtype, quant, keep_w8, cut)


def _kept_kernel(fmt: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `device` has a kernel for a GGUF's kept `fmt` ("int4": groups of 32; "q8_0": int8 blocks of 32) other
    than the reference, which would dequantize every weight on every call: without one, those weights are dequantized
    at load instead."""
    x = torch.zeros(1, 2 * GROUP, dtype=dtype, device=device)
    if fmt == "int4":
        q, sz = torch.zeros(16, GROUP, dtype=torch.uint8, device=device), torch.ones(2, 16, 2, device=device)
        kernel = lz.which("linear_int4", x, q, sz, None, group_size=GROUP)["kernel_id"]
    else:
        w, scale = torch.zeros(16, 2 * GROUP, dtype=torch.int8, device=device), torch.ones(16, 2, device=device)
        kernel = lz.which("linear_w8", x, w, scale, None, block_size=(1, GROUP))["kernel_id"]
    return not kernel.startswith("reference.")


def _kept_experts_kernel(device: torch.device, dtype: torch.dtype, quant: CheckpointQuant | None) -> bool:
    """Whether `device` has a fused MoE kernel other than the reference for experts stored quantized: a GGUF's
    4-bit or Q8_0 ones (`quant` None), an 8-bit HF checkpoint's in scale blocks. Without one, experts are dequantized
    as they load (holding them quantized first would raise the peak); `SparseMLP.settle_experts` decides per layer."""
    x, one = torch.zeros(1, 4 * GROUP, dtype=dtype, device=device), torch.zeros(1, 1, device=device)
    ids = torch.zeros(1, 1, dtype=torch.int64, device=device)
    kernels = []
    if quant is None:
        q = torch.zeros(2, 4 * GROUP, 2 * GROUP, dtype=torch.uint8, device=device)
        s = torch.ones(2, 2, 4 * GROUP, 4, device=device)
        kernels.append(lz.which("fused_moe_int4", x, q, s, q, s, one, ids, group_size=GROUP)["kernel_id"])
        blocks = [(torch.int8, (1, GROUP))]
    else:
        blocks = [(w8, quant.block) for w8 in lz.W8_DTYPES] if quant.strategy == "block" else []
    for w8, (bn, bk) in blocks:
        w = torch.zeros(2, 4 * GROUP, 4 * GROUP, device=device).to(w8)
        scale = torch.ones(2, -(-4 * GROUP // bn), -(-4 * GROUP // bk), device=device)
        kernels.append(lz.which("fused_moe_w8", x, w, scale, w, scale, one, ids, block_size=(bn, bk))["kernel_id"])
    return any(not k.startswith("reference.") for k in kernels)


def build_model(cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str, max_positions: int,
                deferred: bool = False, shard: Shard = Shard()) -> CausalLM:
    """An uninitialised model of cfg.model_type's family (one tensor-parallel rank's part with `shard`); `deferred`:
    its parameters on the meta device until a checkpoint fills them (load_weights allocates each on `device` then)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), params_on_meta() if deferred else nullcontext():
            model = CausalLM(cfg, max_positions, shard)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def init_dummy_weights(model: CausalLM, seed: int = 0) -> None:
    """Random weights in place of a checkpoint (load_format="dummy"): N(0, 0.02), norms near 1, seeded (per
    tensor-parallel rank: a rank's shard is random, not a slice of the TP=1 model's)."""
    gen = torch.Generator(device=model.embed.device).manual_seed(seed + model.shard.rank)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0 - model.norm_offset)
            else:
                param.normal_(0.0, 0.02, generator=gen)


def load_model(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    max_positions: int = 8192,
    load_format: str = "auto",
    quantization: str = "none",
    shard: Shard = Shard(),
    matmul_dtype: torch.dtype | None = None,
) -> LoadedModel:
    """Build the model for `path` and fill it from the checkpoint ("auto") or with random weights ("dummy").

    quantization (docs/quantization.md): "none" dequantizes everything to `dtype`; "auto" keeps the linear weights
    of an 8-bit HF checkpoint (FP8 blocks, compressed-tensors int8/fp8) 8-bit, and a GGUF's 4-bit ones 4-bit and
    Q8_0 ones 8-bit wherever a kernel other than the reference takes them (the CPU's native / torch kernels, CUDA's
    Triton ones); "int4", "int8" and "fp8" quantize every linear weight after loading (docs/quantization.md says
    how). With a tensor-parallel `shard`, the model holds that rank's part and reads only its slices. With
    `matmul_dtype` (bfloat16 on the CPU) the model computes in `dtype` and holds its float linear weights and LM head
    in `matmul_dtype` (`HalfWeight`).
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    if quantization in AT_LOAD and load_format != "dummy" and is_gguf(path):
        _refuse_requantizing(path, quantization)  # before minutes of loading
    cfg = read_config(path)
    shard.check(cfg)
    model = build_model(cfg, dtype, device, max_positions, deferred=load_format != "dummy", shard=shard)
    if load_format == "dummy":
        init_dummy_weights(model)
    else:
        where = torch.device(device)
        gguf_kept = quantization == "auto" and is_gguf(path)
        keep_int4 = gguf_kept and _kept_kernel("int4", where, dtype)
        quant = checkpoint_quant(path)
        keep_w8 = quantization == "auto" and quant is not None or gguf_kept and _kept_kernel("q8_0", where, dtype)
        experts = model.expert_weights() if (keep_int4 or keep_w8) and _kept_experts_kernel(where, dtype, quant) else []
        with torch.no_grad():
            cut = (lambda name: shard.cut(name, cfg)) if shard.parallel else None
            load_weights(model, model.weight_map(), checkpoint_tensors(path, dtype, keep_int4, quant, keep_w8, cut),
                         cfg.tie_word_embeddings, where,
                         model.linear_weights() + experts if keep_int4 or keep_w8 else ())
            for block in model.blocks if experts else ():
                if isinstance(block.mlp, SparseMLP):
                    block.mlp.settle_experts(dtype)
        if gguf_kept and where.type == "cpu" and dtype == torch.float32 and isinstance(model.lm_head, torch.Tensor):
            head = gguf_head_q8_0(path) if keep_w8 and not shard.parallel else None
            if head is not None:  # tied to a Q8_0 embedding: its own int8 copy, exact, 1.7 ms a token against 2.2
                replace_weight(model, "lm_head", W8Weight(head.weight, head.scale, head.block_size))
            else:
                # a GGUF head is stored in at most 16 bits (F16, Q6_K, ...): float16 holds it for the CPU's dense
                # half-precision matmul, ~5x faster than float32 on the LM head of a small model
                model.hold_head_in(torch.float16)
    if quantization in AT_LOAD:
        with torch.no_grad():
            quantize_linears(model, model.linear_weights(), quantization)
            for block in model.blocks if quantization == "fp8" else ():
                if isinstance(block.mlp, SparseMLP) and not block.mlp.quantize_experts_fp8(dtype):
                    break  # no kernel for fp8 experts on this device: every layer keeps them as they are
    if matmul_dtype is not None:
        with torch.no_grad():
            tied = model.lm_head is model.embed  # the lookup keeps the float32 embedding, the head its own copy
            hold_linears_in(model, model.linear_weights() + (["lm_head"] if tied else []), matmul_dtype)
    return LoadedModel(model=model, config=cfg, source=path)


def _refuse_requantizing(path: Path, quantization: str) -> None:
    """ValueError for --quantization int4/int8/fp8 on a GGUF whose weights are stored quantized already: they would
    be dequantized and rounded a second time (more error, no memory saved over keeping them), and fp8 on the CPU
    runs a reference path at a few tokens a second."""
    from gguf import GGMLQuantizationType

    floats = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
    stored = sorted({t.tensor_type.name for t in open_gguf(path).tensors if len(t.shape) == 2 and t.tensor_type not in floats})
    if stored:
        raise ValueError(f"quantization={quantization!r}: {path.name} stores its weights quantized already "
                         f"({', '.join(stored)}); quantizing them again adds a second rounding error and saves no "
                         f"memory over keeping them (quantization='auto'), or use 'none' to dequantize to --dtype")
