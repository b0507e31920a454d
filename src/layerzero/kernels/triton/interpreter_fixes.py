"""Fixes for triton 3.6's interpreter (TRITON_INTERPRET=1), active only during interpreted launches.

- Scalars are 1-element arrays, and `range(tensor)` converts them with `int(array)`, which numpy 2.4
  rejects for arrays of one dimension.
- `tl.sum`, `tl.max`, `tl.cdiv`... are `@triton.jit` functions, decided when triton was imported;
  imported without TRITON_INTERPRET they cannot be called from interpreted code.
- bfloat16 is kept as raw uint16 bits: casts from float32 truncate instead of rounding to nearest
  even, and `tl.dot` multiplies the bit patterns as integers.
The patches join the interpreter's own patch scope, undone when each launch ends, so compiled
kernels in the same process are untouched. A `@triton.jit` helper the kernels share (`await_inputs`,
`rope_angles`), decorated without the interpreter, runs interpreted through `_interpreted_call`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton.language as tl
from triton.runtime import interpreter
from triton.runtime.jit import JITFunction

_Handle = interpreter.TensorHandle
_Builder = type(interpreter.interpreter_builder)
_original_cast = _Builder.cast_impl
_original_dot = _Builder.create_dot
_device_fns: dict[int, interpreter.InterpretedFunction] = {}


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(values: np.ndarray) -> np.ndarray:
    values = values.astype(np.float32)
    bits = values.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def _cast(self: Any, src: _Handle, dst_type: Any) -> _Handle:
    src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
    if src_ty == tl.bfloat16 and dst_ty != tl.bfloat16:
        as_f32 = _Handle(_bf16_to_f32(src.data), tl.float32)
        return as_f32 if dst_ty == tl.float32 else _original_cast(self, as_f32, dst_type)
    if dst_ty == tl.bfloat16 and src_ty != tl.bfloat16:
        return _Handle(_f32_to_bf16(src.data), tl.bfloat16)
    return _original_cast(self, src, dst_type)


def _dot(self: Any, a: _Handle, b: _Handle, d: _Handle, input_precision: Any, max_num_imprecise_acc: Any) -> _Handle:
    a, b = (_Handle(_bf16_to_f32(t.data), tl.float32) if t.dtype.scalar == tl.bfloat16 else t for t in (a, b))
    return _original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)


def _interpreted_call(self: JITFunction, *args: Any, **kwargs: Any) -> Any:
    # The launch's scope has already patched the language; keyed by id because hashing a JITFunction
    # computes its cache key, which fails under the patched language.
    fn = _device_fns.get(id(self))
    if fn is None:
        fn = _device_fns[id(self)] = interpreter.InterpretedFunction(self.fn)
    return fn.rewrite()(*args, **kwargs)


def install() -> None:
    """Wrap the interpreter's per-launch language patching with the fixes (idempotent)."""
    original = interpreter._patch_lang
    if getattr(original, "layerzero_fixes", False):
        return

    def patch_lang(fn: Any) -> Any:
        scope = original(fn)
        # triton.language.standard (tl.sum, tl.max...) calls triton.language.core: patch it like tl.
        interpreter._patch_builtin(tl.core, interpreter.interpreter_builder, scope)
        interpreter._patch_lang_core(tl.core, scope)
        scope.set_attr(tl.tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
        scope.set_attr(JITFunction, "__call__", _interpreted_call)
        scope.set_attr(_Builder, "cast_impl", _cast)
        scope.set_attr(_Builder, "create_dot", _dot)
        return scope

    patch_lang.layerzero_fixes = True
    interpreter._patch_lang = patch_lang
