"""Run a function on a module right after it is first imported, in whichever process imports it: how a benchmark
patches or probes the engine in processes it does not start itself (`infer serve`'s cores), from a sitecustomize
that must stay cheap for every other process (it imports nothing until the module is).

    after_import("infer.runners.prefill_graphs", lambda m: setattr(m, "MAX_PREFILL_GRAPH_TOKENS", 4096))
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then(module: ModuleType) -> None:
            exec_module(module)
            self.then(module)

        spec.loader.exec_module = exec_then  # type: ignore[method-assign]
        return spec


def after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """`then(module)` once `name` is imported (at once if it already is)."""
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))
