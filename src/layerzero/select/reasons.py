"""Structured reasons: why a kernel was rejected, as a machine-readable code plus a human message.

The codes are the seed spec's, plus the few this implementation adds
(layout/window support, policy blocks, the circuit breaker).
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


# filter: hardware, shapes, types, availability
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

# launch configuration
CUDA_BLOCK_LIMIT_EXCEEDED = "CUDA_BLOCK_LIMIT_EXCEEDED"
CUDA_GRID_DIM_EXCEEDED = "CUDA_GRID_DIM_EXCEEDED"

# quantization formats
QUANT_FORMAT_UNSUPPORTED = "QUANT_FORMAT_UNSUPPORTED"

# KV-cache strategies
KV_STRATEGY_UNSUPPORTED = "KV_STRATEGY_UNSUPPORTED"
DRIVER_VERSION_UNSUPPORTED = "DRIVER_VERSION_UNSUPPORTED"

# added by this implementation
LAYOUT_UNSUPPORTED = "LAYOUT_UNSUPPORTED"  # layout the kernel cannot take (and no adaptation allowed)
SLIDING_WINDOW_UNSUPPORTED = "SLIDING_WINDOW_UNSUPPORTED"
POLICY_BLOCKED = "POLICY_BLOCKED"  # excluded by policy (avoid list, rule, lz.disabled())
CIRCUIT_OPEN = "CIRCUIT_OPEN"  # backend disabled by the circuit breaker after repeated failures
OP_UNSUPPORTED = "OP_UNSUPPORTED"  # a locked kernel that implements another op

ALL_CODES: frozenset[str] = frozenset(
    value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str) and name == value
)
