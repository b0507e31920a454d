"""The 4-bit linear compiled on CUDA at Llama-3.1-8B / 3.2-1B shapes: the GEMV and the tl.dot tiles match the float32
reference, layerzero selects them, they replay in a CUDA graph with new inputs, and a GGUF written here with Q4_0,
Q4_1 and Q8_0 projections loads kept quantized on the GPU with the hidden states of the same file dequantized.
docs/quantization.md."""

from __future__ import annotations

import pytest
import torch

import layerzero as lz
from layerzero.kernels.reference.quantize import linear_int4 as reference, pack_int4

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
pytest.importorskip("triton")
from layerzero.kernels.triton.linear_int4 import linear_int4  # noqa: E402

# (N, K): 8B's fused qkv, gate_up, down; 1B's o_proj; a ragged N with a K of whole groups but a partial tile
SHAPES = [(6144, 4096), (28672, 4096), (4096, 14336), (2048, 2048), (1000, 992)]


def _inputs(n: int, k: int, group: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    q = pack_int4(torch.randint(0, 16, (n, k), generator=gen, device="cuda"))
    sz = torch.randn(k // group, n, 2, generator=gen, device="cuda") * 1e-2
    return q, sz


@pytest.mark.parametrize("rows", [1, 3, 16, 64, 300])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("group", [32, 128])
def test_kernels_match_the_reference(rows, n, k, group):
    if k % group:
        pytest.skip(f"{k} columns do not split into groups of {group}")
    gen = torch.Generator(device="cuda").manual_seed(rows * 7 + n)
    q, sz = _inputs(n, k, group, gen)
    x = torch.randn(rows, k, generator=gen, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, generator=gen, device="cuda", dtype=torch.bfloat16)
    got = linear_int4(x, q, sz, bias, group_size=group)
    want = reference(x.float(), q, sz, bias.float(), group_size=group)
    assert got.dtype == torch.bfloat16
    # float32 sums; the tl.dot tiles round the dequantized weight to bf16, and the output is rounded once
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


def test_float32_rows_match_closely():
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, sz = _inputs(2048, 2048, 32, gen)
    for rows in (1, 300):
        x = torch.randn(rows, 2048, generator=gen, device="cuda")
        want = reference(x, q, sz, None, group_size=32)
        got = linear_int4(x, q, sz, None, group_size=32)
        assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()


def test_selection_takes_the_triton_kernel_on_cuda():
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, sz = _inputs(256, 512, 32, gen)
    x = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
    assert lz.which("linear_int4", x, q, sz, None, group_size=32)["kernel_id"] == "triton.linear_int4"


@pytest.mark.parametrize("rows", [1, 64])
def test_replays_in_a_cuda_graph_with_new_inputs(rows):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    q, sz = _inputs(4096, 4096, 32, gen)
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    linear_int4(x, q, sz, None, group_size=32)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linear_int4(x, q, sz, None, group_size=32)
    x.copy_(torch.randn(rows, 4096, generator=gen, device="cuda"))
    graph.replay()
    want = reference(x.float(), q, sz, None, group_size=32)
    torch.testing.assert_close(out.float(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_gguf_stays_quantized_on_cuda(dtype, tmp_path):
    from gguf import GGMLQuantizationType as T

    from checkpoints import write_llama_gguf
    from infer.loader.model_loader import load_model
    from infer.models.forward_batch import ForwardBatch
    from infer.models.quant import Int4Weight, W8Weight

    kinds = {"attn_q": T.Q4_0, "attn_k": T.Q4_0, "attn_v": T.Q4_0, "attn_output": T.Q8_0, "ffn_gate": T.Q4_1,
             "ffn_up": T.Q4_1, "ffn_down": T.Q4_1}
    path, _ = write_llama_gguf(tmp_path / "tiny.gguf", kinds=kinds)
    kept = load_model(path, dtype=dtype, device="cuda", quantization="auto").model
    dense = load_model(path, dtype=dtype, device="cuda", quantization="none").model
    block = kept.blocks[0]
    assert isinstance(block.attn.qkv_proj, Int4Weight) and block.attn.qkv_proj.qweight.is_cuda
    assert isinstance(block.mlp.down_proj, Int4Weight) and isinstance(block.attn.o_proj, W8Weight)
    for rows in (1, 40):  # the GEMV and the tl.dot tiles
        ids = torch.tensor([(13 * i + 5) % 300 + 1 for i in range(rows)], device="cuda")
        with torch.no_grad():
            got = kept(ids, ForwardBatch.for_prompts([rows], "cuda"))
            want = dense(ids, ForwardBatch.for_prompts([rows], "cuda"))
        # the same weights summed in another order, in float32 or with bf16 activations
        rtol = 1e-4 if dtype == torch.float32 else 0.05
        assert (got.float() - want.float()).abs().max().item() <= rtol * want.float().abs().max().item(), rows
