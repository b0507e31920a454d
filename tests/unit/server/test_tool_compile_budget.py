"""A tool's schema or the tool-call grammar compiles on the API server's compile pool under the same budget as
response_format: past --structured-compile-timeout-s the request is a 400 naming the field, and the compile runs on."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from infer.server.errors import APIError
from infer.server.tools.grammar import compile_constraint
from infer.server.workers import CompileBudget, Workers
from infer.structured import Constraint


class SlowGrammars:
    """A compiler whose compile takes longer than the budget."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def is_cached(self, constraint: Constraint) -> bool:
        return self.done.is_set()

    def compile(self, constraint: Constraint) -> None:
        threading.Event().wait(0.5)
        self.done.set()


def test_a_tool_schema_past_the_compile_budget_is_a_400_naming_the_field() -> None:
    workers = Workers(compile_timeout_s=0.05)
    state = SimpleNamespace(workers=workers, grammars=SlowGrammars())
    schema = Constraint.json_schema({"type": "object"})
    try:
        with pytest.raises(APIError) as caught:
            asyncio.run(compile_constraint(state, schema, "tools[0] (wide): its parameters",
                                           "tools.0.function.parameters"))
        err = caught.value
        assert err.status == 400 and err.param == "tools.0.function.parameters"
        assert "tools[0] (wide)" in err.message and "--structured-compile-timeout-s" in err.message
        assert state.grammars.done.wait(5)  # the late compile finished in the background (and would be cached)
        asyncio.run(compile_constraint(state, schema, "tools[0] (wide): its parameters", "tools.0.function.parameters"))
    finally:
        workers.close()


def test_a_requests_compiles_share_one_budget() -> None:
    """The budget a request's tools share: a compile started after it is spent waits for nothing."""
    workers = Workers(compile_timeout_s=10.0)
    state = SimpleNamespace(workers=workers, grammars=SlowGrammars())

    async def late() -> None:
        spent = CompileBudget(0.0)  # the request's earlier compiles used it all
        await compile_constraint(state, Constraint.json_schema({"type": "object"}), "tools: the tool-call grammar",
                                 "tools", spent)

    try:
        with pytest.raises(APIError) as caught:
            asyncio.run(late())
        assert caught.value.param == "tools" and "--structured-compile-timeout-s" in caught.value.message
        assert not state.grammars.done.is_set()  # refused before the compile (0.5 s) could end
    finally:
        workers.close()
