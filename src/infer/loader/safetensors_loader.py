"""Read HF safetensors checkpoints: one `model.safetensors` or shards listed in `model.safetensors.index.json`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

SINGLE = "model.safetensors"
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


def iter_safetensors(model_dir: Path, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor cast to dtype) for every tensor of every shard, with a progress bar."""
    files = safetensors_files(model_dir)
    total = 0
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            total += len(handle.keys())
    with tqdm(total=total, desc=f"Loading {model_dir.name}", unit="tensor", leave=False) as bar:
        for f in files:
            with safe_open(str(f), framework="pt") as handle:
                for key in handle.keys():
                    yield key, handle.get_tensor(key).to(dtype)
                    bar.update()
