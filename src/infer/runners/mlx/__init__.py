"""The MLX execution engine (Apple silicon through Metal; MLX's CPU backend on Linux for tests).

Importing this package does not import MLX: `mlx_available()` and `apple_metal()` let the engine config pick a
runner without the optional dependency installed.
"""

from __future__ import annotations

import importlib.util
import platform
import sys


def mlx_available() -> bool:
    """Whether the optional `mlx` extra is installed (pip install -e '.[mlx]')."""
    return importlib.util.find_spec("mlx") is not None


def apple_metal() -> bool:
    """Apple silicon with MLX's Metal backend: where runner="auto" picks the MLX runner."""
    if sys.platform != "darwin" or platform.machine() != "arm64" or not mlx_available():
        return False
    import mlx.core as mx

    return bool(mx.metal.is_available())
