"""Read HF safetensors checkpoints: one `model.safetensors` or shards listed in `model.safetensors.index.json`;
8-bit weights come with their scales (infer/loader/hf_quant.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from infer.loader.cuts import CutFor, cut_tensor, cut_w8, pad_tensor, read_cut
from infer.loader.hf_quant import W8_DTYPES, CheckpointQuant, W8Tensor, check_scales_used, is_auxiliary, pair_scales
from infer.models.shard import ELSEWHERE

SINGLE = "model.safetensors"
W8_NAMES = ("I8", "F8_E4M3")  # safetensors' names of the 8-bit weight dtypes
INDEX = "model.safetensors.index.json"


def safetensors_files(model_dir: Path) -> list[Path]:
    """The checkpoint's files, checking that every shard the index names exists."""
    index = model_dir / INDEX
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: no 'weight_map' entries")
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise FileNotFoundError(f"{index} lists shards that do not exist: {', '.join(missing)}")
        return files
    if (model_dir / SINGLE).exists():
        return [model_dir / SINGLE]
    found = sorted(model_dir.glob("*.safetensors"))
    if not found:
        raise FileNotFoundError(f"no safetensors weights in {model_dir} (expected {SINGLE} or {INDEX})")
    return found


def iter_safetensors(model_dir: Path, dtype: torch.dtype, quant: CheckpointQuant | None = None, keep_w8: bool = False,
                     cut: CutFor | None = None) -> Iterator[tuple[str, torch.Tensor | W8Tensor]]:
    """Yield (name, tensor cast to dtype) for every tensor of every shard, with a progress bar. In a checkpoint
    stored 8-bit (`quant`), each 8-bit weight comes with its scales, as a W8Tensor with keep_w8, else dequantized.
    With `cut` (tensor parallelism), a tensor it names is read as that slice only (loader/cuts.py), and one another
    rank holds whole is skipped."""
    files = safetensors_files(model_dir)
    with ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f), framework="pt")) for f in files]
        where = {key: handle for handle in handles for key in handle.keys()}

        def get(key: str) -> torch.Tensor | None:
            return where[key].get_tensor(key) if key in where else None

        paired: set[str] = set()
        with tqdm(total=len(where), desc=f"Loading {model_dir.name}", unit="tensor", leave=False) as bar:
            for key, handle in where.items():
                bar.update()
                if quant is not None and is_auxiliary(key, quant):
                    continue
                part = cut(key) if cut is not None else None
                if part is ELSEWHERE:  # another rank's expert: not read (its scales count as paired)
                    paired.add(key)
                    continue
                # read whole: no cut, or an 8-bit weight that is dequantized (and then cut)
                dequantized_w8 = quant is not None and not keep_w8
                if part is None or (dequantized_w8 and handle.get_slice(key).get_dtype() in W8_NAMES):
                    tensor, sliced = handle.get_tensor(key), None
                else:  # the slice alone; an 8-bit weight's scales are checked against its whole shape (on meta)
                    piece = handle.get_slice(key)
                    shape, sliced = piece.get_shape(), read_cut(piece, piece.get_shape(), part)
                    tensor = torch.empty(shape, dtype=sliced.dtype, device="meta")
                if quant is not None and tensor.dtype in W8_DTYPES:
                    w8 = pair_scales(key, tensor, quant, get)
                    paired.add(key)
                    if keep_w8:
                        yield key, w8 if part is None else cut_w8(key, w8, part, weight=sliced)
                    else:
                        yield key, w8.dequantize(dtype) if part is None else cut_tensor(w8.dequantize(dtype), part)
                else:
                    yield key, tensor.to(dtype) if sliced is None else pad_tensor(sliced.to(dtype), part)
        if quant is not None:
            check_scales_used(where, paired, quant)
