"""The native paged attention for float32 queries on the CPU over float32 or bf16 KV caches: decode rows, in decode
and in prefill (mixed) steps alike, and short prefill chunks through one C function that computes each query row the
same way, so a request's decoded tokens do not depend on what shares its step; long prefill chunks through SDPA
(`LONG_CHUNK`), in bf16 over a bf16 cache where the CPU multiplies bf16."""

from __future__ import annotations

import ctypes

import torch

from layerzero.kernels.native.build import kernel
from layerzero.kernels.onednn import bf16_gemm
from layerzero.kernels.reference import attention as attn_ref

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
ARGS = (_P, _I64, _P, _P, _P, _I64, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _I64, ctypes.c_float, _I64, _I64,
        _P, ctypes.c_int)
_ERRORS = {-1: MemoryError, -2: ValueError}
LONG_CHUNK = 64  # new tokens of one sequence above which a prefill chunk goes through SDPA


def _int32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int32).contiguous()


def rows_of_heads(x: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] with each token's heads side by side (any row stride: often a view into qkv), else a contiguous
    copy: the layout C reads with one row stride."""
    return x if x.stride(2) == 1 and x.stride(1) == x.shape[2] else x.contiguous()


def check_caches(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    """C indexes the caches as dense [blocks, block_size, Hkv, D] arrays, float32 or bf16."""
    if key_cache.dtype not in (torch.float32, torch.bfloat16) or value_cache.dtype != key_cache.dtype:
        raise ValueError(f"native kernels need float32 or bf16 KV caches of one dtype, got {key_cache.dtype} / "
                         f"{value_cache.dtype}")
    if not (key_cache.is_contiguous() and value_cache.is_contiguous() and key_cache.shape == value_cache.shape):
        raise ValueError(f"native kernels need equal contiguous KV caches, got {tuple(key_cache.shape)} / "
                         f"{tuple(value_cache.shape)} with strides {key_cache.stride()} / {value_cache.stride()}")


def _run(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
         cu_seqlens_q: torch.Tensor | None, context_lens: torch.Tensor, scale: float, sliding_window: int | None,
         max_context_len: int, max_q_len: int = 0, extra: tuple[str, ...] = ()) -> torch.Tensor:
    q = rows_of_heads(q)
    out = torch.empty(q.shape, dtype=q.dtype)
    tables, lens = _int32(block_tables), _int32(context_lens)
    cu = None if cu_seqlens_q is None else _int32(cu_seqlens_q)
    check_caches(key_cache, value_cache)
    blocks, block_size, kv_heads, dim = key_cache.shape
    name = "paged_attention_bf16" if key_cache.dtype == torch.bfloat16 else "paged_attention"
    status = kernel("attention", name, ARGS, ctypes.c_int, extra)(
        q.data_ptr(), q.stride(0), key_cache.data_ptr(), value_cache.data_ptr(), tables.data_ptr(), tables.shape[1],
        None if cu is None else cu.data_ptr(), lens.data_ptr(), lens.shape[0], q.shape[1], kv_heads, dim,
        block_size, blocks, max_context_len, scale, sliding_window or 0, max_q_len, out.data_ptr(), torch.get_num_threads(),
    )
    if status:
        raise _ERRORS.get(status, RuntimeError)(
            "native paged attention: a context length exceeds max_context_len or its block table, or a table names "
            f"a block past the cache's {blocks}" if status == -2 else "native paged attention: out of memory"
        )
    return out


def paged_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, *, block_tables: torch.Tensor,
                    context_lens: torch.Tensor, scale: float, sliding_window: int | None,
                    max_context_len: int, _extra: tuple[str, ...] = ()) -> torch.Tensor:
    """q [B, H, D], one token per sequence, over caches [blocks, block_size, Hkv, D]. `_extra`: compiler flags of
    another build (tests: the AVX2 and plain-C forms on any x86 machine)."""
    return _run(q, key_cache, value_cache, block_tables, None, context_lens, scale, sliding_window, max_context_len,
                extra=_extra)


def paged_prefill_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, *,
                            block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor,
                            max_seqlen_q: int, max_context_len: int, scale: float, sliding_window: int | None,
                            cu_seqlens_q_host: list[int] | None, context_lens_host: list[int] | None,
                            _extra: tuple[str, ...] = ()) -> torch.Tensor:
    """Packed q [T, H, D] by cu_seqlens_q: each sequence's new tokens are the last of its context_lens.

    Sequences of up to LONG_CHUNK new tokens (decode rows of a mixed step, short prompts) go through the C kernel,
    the same arithmetic as a decode step; longer chunks through the reference's SDPA, which is blocked like a flash
    kernel where the C kernel takes one query row at a time (1.4x faster on a 1,131-token prompt)."""
    bounds = cu_seqlens_q.tolist() if cu_seqlens_q_host is None else cu_seqlens_q_host
    lens = context_lens.tolist() if context_lens_host is None else context_lens_host
    if any(end - start <= LONG_CHUNK for start, end in zip(bounds[:-1], bounds[1:])):
        out = _run(q, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens, scale, sliding_window,
                   max_context_len, LONG_CHUNK, _extra)
    else:  # only long chunks (a prompt's prefill): no C call, whose threads would wake to skip every row
        out = torch.empty(q.shape, dtype=q.dtype)
    # over a bf16 cache (a CPU bf16 model's, whose attention output is rounded to bf16 for its o projection anyway)
    # SDPA runs in bf16 where the CPU multiplies bf16 (half its float32 time on a 128-token prompt); without bf16
    # products (AVX2) the o projection takes float32 rows and bf16 SDPA is the slower one
    bf16 = key_cache.dtype == torch.bfloat16 and bf16_gemm()
    sdpa_dtype = torch.bfloat16 if bf16 else q.dtype
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end - start > LONG_CHUNK:
            rows = attn_ref.paged_prefill_attention(q[start:end].to(sdpa_dtype), key_cache, value_cache,
                                                    block_tables[i : i + 1], [0, end - start], [lens[i]], scale,
                                                    sliding_window)
            out[start:end] = rows
    return out
