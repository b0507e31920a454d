"""GrammarCompiler.prepare: the llguidance tokenizer is built when a server starts, so the first constrained
request does not build it (the build holds the GIL: in the engine core it would pause every stream)."""

from __future__ import annotations

from infer.loader.gguf_file import bundled_smollm2
from infer.loader.tokenizer import Tokenizer
from infer.structured import Constraint, GrammarCompiler


def test_prepare_builds_the_llguidance_tokenizer_once() -> None:
    compiler = GrammarCompiler(Tokenizer.from_path(bundled_smollm2()), 49152)
    assert compiler._ll is None  # nothing built until asked
    compiler.prepare()
    built = compiler._ll
    assert built is not None
    compiler.prepare()
    compiler.compile(Constraint.choice(["yes", "no"]))
    assert compiler.ll_tokenizer is built  # the one prepared, not another
