"""Structured reasons: why a kernel was rejected, as a machine-readable code plus a human message.

The codes are those of spec §5.5 and appendices I/J, plus the few this implementation adds
(layout/window support, policy blocks, the circuit breaker, the memory headroom).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Reason:
    """One rejection cause: `code` is one of the constants below, `message` says what was required."""

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


# spec §5.5
PLATFORM_MISMATCH = "PLATFORM_MISMATCH"
SM_TOO_OLD = "SM_TOO_OLD"
SM_TOO_NEW = "SM_TOO_NEW"
DTYPE_UNSUPPORTED = "DTYPE_UNSUPPORTED"
HEAD_DIM_INVALID = "HEAD_DIM_INVALID"
HEAD_DIM_ALIGNMENT = "HEAD_DIM_ALIGNMENT"
SEQ_TOO_LONG = "SEQ_TOO_LONG"
GQA_UNSUPPORTED = "GQA_UNSUPPORTED"
CUDA_GRAPH_UNSAFE = "CUDA_GRAPH_UNSAFE"
ATTN_MASK_UNSUPPORTED = "ATTN_MASK_UNSUPPORTED"
STRIDE_LAST_DIM = "STRIDE_LAST_DIM"
KV_CACHE_LAYOUT_MISMATCH = "KV_CACHE_LAYOUT_MISMATCH"
KV_CACHE_DTYPE_MISMATCH = "KV_CACHE_DTYPE_MISMATCH"
PACKED_WEIGHTS_REQUIRED = "PACKED_WEIGHTS_REQUIRED"
CAPABILITIES_SCHEMA_MISMATCH = "CAPABILITIES_SCHEMA_MISMATCH"
NON_DETERMINISTIC = "NON_DETERMINISTIC"
NOT_INSTALLED = "NOT_INSTALLED"
BACKEND_IMPORT_FAILED = "BACKEND_IMPORT_FAILED"
CONSTRAINT_FAILED = "CONSTRAINT_FAILED"

# appendix I.2 (launch configuration)
CUDA_BLOCK_LIMIT_EXCEEDED = "CUDA_BLOCK_LIMIT_EXCEEDED"
CUDA_GRID_DIM_EXCEEDED = "CUDA_GRID_DIM_EXCEEDED"

# appendix J.1 (GPU generations)
GPU_GENERATION_UNSUPPORTED = "GPU_GENERATION_UNSUPPORTED"
TENSOR_CORE_GEN_UNSUPPORTED = "TENSOR_CORE_GEN_UNSUPPORTED"
INSTRUCTION_SET_MISMATCH = "INSTRUCTION_SET_MISMATCH"

# appendix J.2 (quantization formats)
QUANT_FORMAT_UNSUPPORTED = "QUANT_FORMAT_UNSUPPORTED"
QUANT_ACCURACY_THRESHOLD_EXCEEDED = "QUANT_ACCURACY_THRESHOLD_EXCEEDED"
REQUANTIZATION_REQUIRED = "REQUANTIZATION_REQUIRED"

# appendix J.3 (tensor-parallel determinism)
TP_INVARIANCE_REQUIRED = "TP_INVARIANCE_REQUIRED"
TP_SIZE_EXCEEDED = "TP_SIZE_EXCEEDED"
REDUCTION_ORDER_MISMATCH = "REDUCTION_ORDER_MISMATCH"

# appendix J.4 (KV-cache strategies)
KV_STRATEGY_UNSUPPORTED = "KV_STRATEGY_UNSUPPORTED"
DRIVER_VERSION_UNSUPPORTED = "DRIVER_VERSION_UNSUPPORTED"
VIRTUAL_MEMORY_EXHAUSTED = "VIRTUAL_MEMORY_EXHAUSTED"

# appendix J.5 (speculative decoding)
SPEC_DECODE_PP_INCOMPATIBLE = "SPEC_DECODE_PP_INCOMPATIBLE"
SPEC_DECODE_DRAFT_TP_CONSTRAINT = "SPEC_DECODE_DRAFT_TP_CONSTRAINT"
SPEC_DECODE_KV_INCOMPATIBLE = "SPEC_DECODE_KV_INCOMPATIBLE"
SPEC_DECODE_ALGORITHM_UNSUPPORTED = "SPEC_DECODE_ALGORITHM_UNSUPPORTED"

# added by this implementation
LAYOUT_UNSUPPORTED = "LAYOUT_UNSUPPORTED"  # layout the kernel cannot take (and no adaptation allowed)
SLIDING_WINDOW_UNSUPPORTED = "SLIDING_WINDOW_UNSUPPORTED"
MEMORY_HEADROOM_EXCEEDED = "MEMORY_HEADROOM_EXCEEDED"  # appendix I.9: workspace above free memory
POLICY_BLOCKED = "POLICY_BLOCKED"  # excluded by policy (avoid list, rule, lz.disabled())
CIRCUIT_OPEN = "CIRCUIT_OPEN"  # backend disabled by the circuit breaker after repeated failures
OP_UNSUPPORTED = "OP_UNSUPPORTED"  # a locked kernel that implements another op

ALL_CODES: frozenset[str] = frozenset(
    value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str) and name == value
)
