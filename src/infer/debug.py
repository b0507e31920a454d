"""Layer-by-layer activation diff of our model against transformers, for parity work.

    python -m infer.debug MODEL_PATH "some prompt"   # prints one row per hook point
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from torch import nn

from infer.models.base import CausalLM
from infer.models.forward_batch import ForwardBatch


@dataclass
class LayerDiff:
    name: str
    max_abs: float
    mean_abs: float
    ref_max: float


def _first(output: object) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output  # type: ignore[index,return-value]


def _capture(modules: dict[str, nn.Module]) -> tuple[dict[str, torch.Tensor], list]:
    store: dict[str, torch.Tensor] = {}
    handles = [
        m.register_forward_hook(lambda _m, _i, out, name=name: store.__setitem__(name, _first(out).detach()))
        for name, m in modules.items()
    ]
    return store, handles


def hook_points(model: CausalLM) -> dict[str, nn.Module]:
    """Our named hook points: every block's residual stream output and the final norm."""
    points = {f"blocks.{i}.resid_post": b.resid_post for i, b in enumerate(model.blocks)}
    return points | {"final_norm": model.final_norm}


def _hf_points(hf_model: nn.Module) -> dict[str, nn.Module]:
    inner = hf_model.model
    points = {f"blocks.{i}.resid_post": layer for i, layer in enumerate(inner.layers)}
    return points | {"final_norm": inner.norm}


@torch.no_grad()
def activation_diff(model: CausalLM, hf_model: nn.Module, input_ids: list[int]) -> list[LayerDiff]:
    """Run one prompt through both models and compare every hook point and the logits."""
    ours, our_handles = _capture(hook_points(model))
    ref, ref_handles = _capture(_hf_points(hf_model))
    try:
        ids = torch.tensor(input_ids, device=model.embed.device)
        our_logits = model.compute_logits(model(ids, ForwardBatch.for_prompts([len(input_ids)], ids.device)))
        ref_logits = hf_model(ids.unsqueeze(0)).logits[0].float()
    finally:
        for h in our_handles + ref_handles:
            h.remove()
    ours["logits"], ref["logits"] = our_logits, ref_logits
    rows = []
    for name in [*hook_points(model), "logits"]:
        a, b = ours[name].float().reshape(-1), ref[name].float().reshape(-1)
        diff = (a - b).abs()
        rows.append(LayerDiff(name, diff.max().item(), diff.mean().item(), b.abs().max().item()))
    return rows


def format_diff(rows: list[LayerDiff]) -> str:
    lines = [f"{'hook point':<24} {'max |diff|':>12} {'mean |diff|':>12} {'max |ref|':>12}"]
    lines += [f"{r.name:<24} {r.max_abs:>12.3e} {r.mean_abs:>12.3e} {r.ref_max:>12.3e}" for r in rows]
    return "\n".join(lines)


def main() -> None:
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from infer.loader.model_loader import is_gguf, load_model
    from infer.loader.tokenizer import Tokenizer

    parser = argparse.ArgumentParser(description="Diff our activations against transformers, layer by layer.")
    parser.add_argument("model", help="HF model directory or .gguf file")
    parser.add_argument("prompt", help="text to run through both models")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    path = Path(args.model)
    ours = load_model(path, dtype).model
    if is_gguf(path):
        hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    else:
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    ids = Tokenizer.from_path(path).encode(args.prompt)
    print(format_diff(activation_diff(ours, hf.eval(), ids)))


if __name__ == "__main__":
    main()
