"""lz.lora_shrink and lz.lora_expand against their float64 definition on fresh random inputs: rows without an adapter,
several adapters in one batch, every row on one adapter, slots nobody uses; the reference and the CPU's grouped path
alike; the argument checks."""

from __future__ import annotations

import pytest
import torch

import layerzero as lz
from layerzero.kernels.reference import lora as ref


def _case(rows: int, seed: int, pattern: str):
    gen = torch.Generator().manual_seed(seed)
    slots, rank, k, n = 4, 24, 40, 36
    x = torch.randn(rows, k, generator=gen)
    a = torch.randn(slots, rank, k, generator=gen)
    b = torch.randn(slots, n, rank, generator=gen)
    y = torch.randn(rows, n, generator=gen)
    if pattern == "same":
        ids = torch.full((rows,), 2, dtype=torch.int32)
    elif pattern == "none":
        ids = torch.full((rows,), -1, dtype=torch.int32)
    else:  # the last slot is never used
        ids = torch.randint(-1, slots - 1, (rows,), generator=gen, dtype=torch.int32)
    return x, a, b, y, ids


def _definition(x, a, b, y, ids):
    h = torch.zeros(x.shape[0], a.shape[1], dtype=torch.float64)
    out = y.double().clone()
    for t, slot in enumerate(ids.tolist()):
        if slot >= 0:
            h[t] = a[slot].double() @ x[t].double()
            out[t] += b[slot].double() @ h[t]
    return h, out


@pytest.mark.parametrize("rows", [0, 1, 7, 50])
@pytest.mark.parametrize("pattern", ["mixed", "same", "none"])
@pytest.mark.parametrize("impl", ["dispatched", "reference"])
def test_shrink_and_expand_match_the_definition(rows, pattern, impl):
    x, a, b, y, ids = _case(rows, seed=rows + 7, pattern=pattern)
    want_h, want_y = _definition(x, a, b, y, ids)
    shrink, expand = (lz.lora_shrink, lz.lora_expand) if impl == "dispatched" else (ref.lora_shrink, ref.lora_expand)
    h = shrink(x, a, ids)
    assert h.dtype == torch.float32 and h.shape == (rows, a.shape[1])
    torch.testing.assert_close(h.double(), want_h, atol=1e-4, rtol=1e-5)
    out = y.clone()
    assert expand(out, h, b, ids) is out  # in place
    torch.testing.assert_close(out.double(), want_y, atol=1e-3, rtol=1e-5)


def test_the_cpu_takes_the_grouped_path():
    x, a, b, y, ids = _case(5, seed=1, pattern="mixed")
    assert lz.which("lora_shrink", x, a, ids)["kernel_id"] == "torch.lora_shrink_grouped"
    assert lz.which("lora_expand", y, torch.zeros(5, a.shape[1]), b, ids)["kernel_id"] == "torch.lora_expand_grouped"


def test_int64_ids_work_too():
    x, a, b, y, ids = _case(6, seed=3, pattern="mixed")
    torch.testing.assert_close(lz.lora_shrink(x, a, ids.long()), lz.lora_shrink(x, a, ids))


@pytest.mark.parametrize("call", [
    lambda x, a, b, y, ids: lz.lora_shrink(x, a[:, :, :-1], ids),
    lambda x, a, b, y, ids: lz.lora_shrink(x, a, ids[:-1]),
    lambda x, a, b, y, ids: lz.lora_shrink(x, a, ids.float()),
    lambda x, a, b, y, ids: lz.lora_expand(y, torch.zeros(len(ids), a.shape[1] + 1), b, ids),
    lambda x, a, b, y, ids: lz.lora_expand(y[:, :-1], torch.zeros(len(ids), a.shape[1]), b, ids),
])
def test_shapes_that_do_not_fit_are_refused(call):
    with pytest.raises(ValueError, match="lora_"):
        call(*_case(4, seed=2, pattern="mixed"))
