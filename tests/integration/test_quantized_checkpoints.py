"""8-bit HF checkpoints on the CPU: tiny Llama / Qwen 3 / Gemma 3 written by the test as FP8-block (Qwen3-8B-FP8's
format) and compressed-tensors int8 / fp8 per-channel checkpoints load kept 8-bit, give the logits of the same
model dequantized, decode greedily with the KV cache as full recomputation does, and a broken checkpoint or an
unsupported quantization_config fails at load naming the tensor or field. docs/quantization.md."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoints import FAMILIES, quantize_checkpoint, save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from infer.loader.model_loader import load_model
from infer.models.forward_batch import ForwardBatch
from infer.models.quant import W8Weight

# (format, block): 128 x 128 blocks as real FP8 checkpoints have them (one block covers a tiny weight), 32 x 32
# blocks (several per weight, row blocks line up across fused q/k/v), 48 x 32 (they do not: scales per row)
CASES = [("fp8_block", (128, 128)), ("fp8_block", (32, 32)), ("fp8_block", (48, 32)), ("int8_channel", None),
         ("fp8_channel", None)]
# fp8 runs the float32 reference on the CPU (exact up to summation order); int8 runs torch's packed kernel with
# two bfloat16 passes of the activations (measured 0.1-0.3% of the largest logit)
RTOL = {"fp8_block": 1e-4, "fp8_channel": 1e-4, "int8_channel": 1e-2}


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), ForwardBatch.for_prompts([len(ids)])))


@pytest.fixture(scope="module", params=FAMILIES)
def float_tiny(request, tmp_path_factory):
    return save_tiny_with_tokenizer(request.param, tmp_path_factory.mktemp(request.param) / "model", seed=7)


@pytest.mark.parametrize(("fmt", "block"), CASES, ids=[f"{f}-{b}" for f, b in CASES])
def test_kept_8bit_logits_equal_the_dequantized_model(float_tiny, tmp_path, fmt, block):
    path = quantize_checkpoint(float_tiny, tmp_path / "q", fmt, block or (128, 128))
    kept = load_model(path, quantization="auto").model  # as stored
    dense = load_model(path, quantization="none").model
    modules, params = dict(kept.named_modules()), dict(dense.named_parameters())
    names = [n for n in dense.linear_weights() if n != "lm_head"]  # the head is left 16/32-bit, as checkpoints do
    assert len(names) >= 12
    for name in names:
        weight = modules[name]
        assert isinstance(weight, W8Weight), name
        assert weight.weight.dtype == (torch.int8 if fmt == "int8_channel" else torch.float8_e4m3fn)
        assert torch.equal(weight.dequantize(), params[name]), name  # "none" is exactly the dequantized weight
    assert not isinstance(modules.get("lm_head"), W8Weight)
    ids = [(13 * i + 5) % 300 + 1 for i in range(40)]
    got, want = _logits(kept, ids), _logits(dense, ids)
    assert (got - want).abs().max().item() <= RTOL[fmt] * want.abs().max().item()


@pytest.mark.parametrize("fmt", ["fp8_block", "int8_channel"])
def test_greedy_with_the_cache_equals_full_recomputation(float_tiny, tmp_path, fmt):
    path = quantize_checkpoint(float_tiny, tmp_path / "q", fmt, (32, 32))
    llm = LLM(str(path), device="cpu", dtype="float32", max_seq_len=128, max_batch_size=4)
    prompts = [[(7 * i + 3 * b) % 300 + 1 for i in range(9 + 5 * b)] for b in range(3)]
    outs = llm.generate_ids(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    model = llm.engine.runner.model
    for prompt, out in zip(prompts, outs):
        full = _logits(model, prompt + out.token_ids[:-1])[len(prompt) - 1 :]
        top2 = full.topk(2, dim=-1).values  # the bf16 passes of the int8 kernel may flip only a near tie
        for j, token in enumerate(out.token_ids):
            assert token == int(full[j].argmax()) or float(top2[j, 0] - top2[j, 1]) < 1e-2 * float(top2[j, 0].abs()), j


@pytest.fixture(scope="module")
def fp8_llama(tmp_path_factory):
    base = save_tiny_with_tokenizer("llama", tmp_path_factory.mktemp("f") / "model")
    return quantize_checkpoint(base, tmp_path_factory.mktemp("q") / "fp8", "fp8_block", (32, 32))


def _edit_tensors(path, edit) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def _edit_config(path, edit) -> None:
    config = json.loads((path / "config.json").read_text())
    edit(config["quantization_config"])
    (path / "config.json").write_text(json.dumps(config))


def test_a_missing_scale_fails_naming_the_tensor(fp8_llama, tmp_path):
    import shutil

    path = shutil.copytree(fp8_llama, tmp_path / "m")
    _edit_tensors(path, lambda t: t.pop("model.layers.1.mlp.down_proj.weight_scale_inv"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.down_proj\.weight_scale_inv.*missing"):
        load_model(path, quantization="auto")


def test_a_misshapen_scale_fails_naming_the_tensor(fp8_llama, tmp_path):
    import shutil

    path = shutil.copytree(fp8_llama, tmp_path / "m")
    name = "model.layers.0.self_attn.q_proj.weight_scale_inv"
    _edit_tensors(path, lambda t: t.__setitem__(name, torch.ones(1, 1)))
    with pytest.raises(ValueError, match=rf"{name.replace('.', '[.]')}.*has shape \(1, 1\), expected \[2, 2\]"):
        load_model(path, quantization="none")


@pytest.mark.parametrize(("edit", "field"), [
    (lambda qc: qc.update(fmt="e5m2"), "quantization_config.fmt"),
    (lambda qc: qc.update(weight_block_size=[128]), "quantization_config.weight_block_size"),
    (lambda qc: qc.update(quant_method="awq"), "quantization_config.quant_method 'awq'"),
])
def test_an_unsupported_config_fails_at_startup_naming_the_field(fp8_llama, tmp_path, edit, field):
    import shutil

    path = shutil.copytree(fp8_llama, tmp_path / "m")
    _edit_config(path, edit)
    with pytest.raises(ValueError, match=field):
        LLM(str(path), device="cpu")


def test_compressed_tensors_group_strategy_is_refused(float_tiny, tmp_path):
    path = quantize_checkpoint(float_tiny, tmp_path / "q", "int8_channel")
    _edit_config(path, lambda qc: qc["config_groups"]["group_0"]["weights"].update(strategy="group", group_size=32))
    with pytest.raises(ValueError, match=r"config_groups\.group_0\.weights\.strategy is 'group'"):
        load_model(path, quantization="auto")


@pytest.mark.parametrize("method", ["int8", "fp8"])
def test_quantization_at_load_keeps_the_model_close(float_tiny, method):
    quantized = load_model(float_tiny, quantization=method).model
    dense = load_model(float_tiny, quantization="none").model
    assert sum(isinstance(m, W8Weight) for m in quantized.modules()) >= 12
    ids = [(11 * i + 2) % 300 + 1 for i in range(32)]
    got, want = _logits(quantized, ids), _logits(dense, ids)
    # 8-bit weights move logits by a few percent of their range on a random model (fp8 keeps 3 mantissa bits)
    assert (got - want).abs().max().item() <= 0.1 * want.abs().max().item()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.8


def test_compressed_tensors_block_scales_and_group_formats_load(float_tiny, tmp_path):
    """compressed-tensors FP8 with `strategy: block` (its scales in `weight_scale`) and the format given per group."""
    from checkpoints import quantize_checkpoint as write

    fp8 = write(float_tiny, tmp_path / "b", "fp8_block", (32, 32))
    tensors = load_file(str(fp8 / "model.safetensors"))
    renamed = {n.replace("weight_scale_inv", "weight_scale"): t for n, t in tensors.items()}
    save_file(renamed, str(fp8 / "model.safetensors"))
    config = json.loads((fp8 / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "format": "float-quantized", "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [32, 32],
                    "symmetric": True}}}}
    (fp8 / "config.json").write_text(json.dumps(config))
    kept = load_model(fp8, quantization="auto").model
    dense = load_model(fp8, quantization="none").model
    assert sum(isinstance(m, W8Weight) for m in kept.modules()) >= 12
    ids = [(13 * i + 5) % 300 + 1 for i in range(24)]
    got, want = _logits(kept, ids), _logits(dense, ids)
    assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()
