"""GrammarCompiler.prepare: the llguidance tokenizer is built on the given pool at start-up, so the first
constrained request does not build it (and the engine core's step loop is not held while it is built)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from infer.loader.gguf_loader import bundled_smollm2
from infer.loader.tokenizer import Tokenizer
from infer.structured import Constraint, GrammarCompiler


def test_prepare_builds_the_llguidance_tokenizer_on_the_pool() -> None:
    compiler = GrammarCompiler(Tokenizer.from_path(bundled_smollm2()), 49152)
    assert compiler._ll is None  # built on first use
    pool = ThreadPoolExecutor(1)
    compiler.prepare(pool)
    pool.shutdown(wait=True)
    built = compiler._ll
    assert built is not None
    compiler.compile(Constraint.choice(["yes", "no"]))
    assert compiler.ll_tokenizer is built  # the one prepared, not another
