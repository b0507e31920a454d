"""The 8-bit-weight linear compiled on CUDA at Llama-3.1-8B / 3.2-1B shapes: the GEMV and the tl.dot tiles match the
float32 reference, layerzero selects them, they replay in a CUDA graph with new inputs, and an FP8 / INT8 checkpoint
built here serves on the GPU with the logits of its dequantized self. docs/quantization.md."""

from __future__ import annotations

import pytest
import torch

import layerzero as lz
from layerzero.kernels.reference.quantize import linear_w8 as reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
pytest.importorskip("triton")
from layerzero.kernels.triton.linear_w8 import linear_w8  # noqa: E402

FP8 = torch.float8_e4m3fn
# (N, K): 8B's fused qkv, gate_up, down; 1B's o_proj; a ragged shape with partial tiles everywhere
SHAPES = [(6144, 4096), (28672, 4096), (4096, 14336), (2048, 2048), (1000, 1000)]


def _inputs(n: int, k: int, fmt: str, block: tuple[int, int], gen: torch.Generator):
    w = torch.randn(n, k, generator=gen, device="cuda")
    if fmt == "int8":
        q = (w * 40).round().clamp(-127, 127).to(torch.int8)
    else:
        q = (w * 100).clamp(-448, 448).to(FP8)
    s = torch.rand(-(-n // block[0]), -(-k // block[1]), generator=gen, device="cuda") * 1e-2 + 1e-4
    return q, s


def _supports_fp8() -> bool:
    return torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.parametrize("rows", [1, 3, 16, 64, 300])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize(("fmt", "block"), [("fp8", (128, 128)), ("int8", None), ("fp8", None)])
def test_kernels_match_the_reference(rows, n, k, fmt, block):
    if fmt == "fp8" and not _supports_fp8():
        pytest.skip("float8_e4m3fn needs SM89+")
    block = block or (1, k)
    gen = torch.Generator(device="cuda").manual_seed(rows * 7 + n)
    q, s = _inputs(n, k, fmt, block, gen)
    x = torch.randn(rows, k, generator=gen, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, generator=gen, device="cuda", dtype=torch.bfloat16)
    got = linear_w8(x, q, s, bias, block_size=block)
    want = reference(x.float(), q, s, bias.float(), block_size=block)
    assert got.dtype == torch.bfloat16
    # float32 accumulation, one bf16 rounding of the output
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


def test_selection_takes_the_triton_kernel_on_cuda():
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, s = _inputs(256, 512, "int8", (1, 512), gen)
    x = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
    assert lz.which("linear_w8", x, q, s, None, block_size=(1, 512))["kernel_id"] == "triton.linear_w8"


@pytest.mark.parametrize("rows", [1, 64])
def test_replays_in_a_cuda_graph_with_new_inputs(rows):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    q, s = _inputs(4096, 4096, "int8", (1, 4096), gen)
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    linear_w8(x, q, s, None, block_size=(1, 4096))  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linear_w8(x, q, s, None, block_size=(1, 4096))
    x.copy_(torch.randn(rows, 4096, generator=gen, device="cuda"))
    graph.replay()
    want = reference(x.float(), q, s, None, block_size=(1, 4096))
    torch.testing.assert_close(out.float(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


@pytest.mark.parametrize("fmt", ["fp8_block", "int8_channel"])
def test_a_quantized_checkpoint_serves_on_cuda(fmt, tmp_path):
    if fmt.startswith("fp8") and not _supports_fp8():
        pytest.skip("float8_e4m3fn needs SM89+")
    from checkpoints import quantize_checkpoint, save_tiny_with_tokenizer
    from infer import LLM, SamplingParams
    from infer.models.forward_batch import ForwardBatch
    from infer.models.quant import W8Weight

    path = quantize_checkpoint(save_tiny_with_tokenizer("llama", tmp_path / "m"), tmp_path / "q", fmt, (32, 32))
    kept = LLM(str(path), device="cuda", dtype="bfloat16", max_seq_len=128, kv_cache_memory_gb=1)
    none = LLM(str(path), device="cuda", dtype="bfloat16", max_seq_len=128, kv_cache_memory_gb=1, quantization="none",
               use_cuda_graphs=False)
    model = kept.engine.runner.model
    assert any(isinstance(m, W8Weight) for m in model.modules())
    ids = torch.tensor([(13 * i + 5) % 300 + 1 for i in range(40)], device="cuda")
    with torch.no_grad():
        got = model.compute_logits(model(ids, ForwardBatch.for_prompts([40], "cuda")))
        dense = none.engine.runner.model
        want = dense.compute_logits(dense(ids, ForwardBatch.for_prompts([40], "cuda")))
    assert (got - want).abs().max().item() <= 0.05 * want.abs().max().item()  # both bf16 activations
    outs = kept.generate_ids([[5, 6, 7, 8]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert len(outs[0].token_ids) == 8
