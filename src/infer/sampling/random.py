"""Counter-based uniform noise: a pure hash of (seed, step, column), so each row is reproducible on its own.

No torch.Generator state, no host sync: the same int64 tensor ops give bit-identical values on CPU and
CUDA and can be captured in a CUDA graph. Every intermediate is kept below 2**32 and every multiplier
is an odd constant below 2**31, so no product reaches 2**63 and signed int64 never overflows.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
# Chris Wellons' "lowbias32" mixer (hash-prospector); both multipliers happen to be below 2**31.
_MUL_A = 0x21F0AAAD
_MUL_B = 0x735A2D97
# Salts that separate the roles of the words fed into the row key.
_SALT_KEY = 0x2545F491
_SALT_STEP = 0x3C6EF372
_SALT_COL = 0x1B873593
_TWO_POW_M24 = 2.0**-24
_TWO_POW_M25 = 2.0**-25


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """Bijective avalanche mix, in place, of int64 values holding 32-bit words; pass only fresh tensors."""
    x ^= x >> 16
    x.mul_(_MUL_A).bitwise_and_(_MASK32)
    x ^= x >> 15
    x.mul_(_MUL_B).bitwise_and_(_MASK32)
    x ^= x >> 15
    return x


def _row_keys(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per row from the 64-bit seed and step; rows never look at each other."""
    if seeds.shape != steps.shape or seeds.dim() != 1:
        raise ValueError(f"seeds {tuple(seeds.shape)} and steps {tuple(steps.shape)} must be equal 1-D shapes")
    seeds, steps = seeds.to(torch.int64), steps.to(torch.int64)
    key = _mix32_((steps >> 32) ^ _SALT_STEP)
    key = _mix32_(key ^ (steps & _MASK32))
    key = _mix32_(key ^ (seeds >> 32) ^ _SALT_KEY)
    return _mix32_(key ^ (seeds & _MASK32))


def uniform(seeds: torch.Tensor, steps: torch.Tensor, n: int) -> torch.Tensor:
    """Float32 [B, n] in (0, 1) exclusive; row b is a function of (seeds[b], steps[b]) alone.

    Column j of a row is the same whatever n is, so callers can index noise by vocabulary id. The top
    24 bits of a 32-bit hash pick one of 2**24 equally likely cells [k, k+1) * 2**-24, represented by
    k * 2**-24 except cell 0, represented by its midpoint 2**-25: every value is exact in float32 and
    neither 0 nor 1 can occur.
    """
    keys = _row_keys(seeds, steps)
    cols = _mix32_(torch.arange(n, device=seeds.device, dtype=torch.int64) ^ _SALT_COL)
    cells = (_mix32_(keys[:, None] ^ cols[None, :]) >> 8).to(torch.float32)
    return cells.mul_(_TWO_POW_M24).clamp_(min=_TWO_POW_M25)


_SALT_ACCEPT = (0x6A09E667, 0x510E527F)  # the two words of a row's float64 draw


def uniform64(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Float64 [B] in (0, 1) exclusive, one per row, independent of `uniform`'s columns for the same (seed, step).

    53 bits from two 32-bit hashes of the row key (26 + 27 bits); the value is (k + 0.5) * 2**-53, exact in
    float64. Speculative decoding compares it with an acceptance ratio computed in float64.
    """
    keys = _row_keys(seeds, steps)
    # mixed twice, salted: a stream apart from the single-mix column words of `uniform`
    high = _mix32_(_mix32_(keys ^ _SALT_ACCEPT[0]) ^ _SALT_ACCEPT[1]) >> 6  # 26 bits
    low = _mix32_(_mix32_(keys ^ _SALT_ACCEPT[1]) ^ _SALT_ACCEPT[0]) >> 5  # 27 bits
    return ((high << 27) | low).to(torch.float64).add_(0.5).mul_(2.0**-53)
