"""Without a model: every JSONSchemaBench schema llguidance compiles accepts each valid instance and
rejects each invalid one, fed token by token through the SmolLM2 tokenizer; the others fail to compile
with llguidance's reason (the server's 400 path)."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import pytest

from infer.loader.gguf_file import bundled_smollm2
from infer.loader.tokenizer import Tokenizer
from infer.structured import Constraint, ConstraintError, GrammarCompiler

SCHEMAS = sorted((Path(__file__).parents[2] / "fixtures" / "jsonschema").glob("*.json"))
VOCAB = 49152


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(Tokenizer.from_path(bundled_smollm2()), VOCAB)


def _accepts(compiler: GrammarCompiler, constraint: Constraint, text: str) -> bool:
    matcher = compiler.matcher(constraint)
    for token in compiler._tokenizer.encode(text, add_special_tokens=False):
        if not matcher.consume_token(token):
            return False
    return matcher.is_accepting()


def test_the_set_is_all_there():
    assert len(SCHEMAS) == 100


@pytest.mark.parametrize("path", SCHEMAS, ids=[p.stem for p in SCHEMAS])
def test_schema_accepts_valid_and_rejects_invalid_instances(compiler, path):
    data = json.loads(path.read_text())
    constraint = Constraint.json_schema(data["schema"])
    try:
        compiler.compile(constraint)
    except ConstraintError as exc:
        assert str(exc)  # llguidance says which keyword or format it lacks
        pytest.skip(f"llguidance cannot compile it: {exc}")
    for case in data["tests"]:
        text = json.dumps(case["data"], separators=(",", ":"), ensure_ascii=False)  # JSON is compact by default
        assert _accepts(compiler, constraint, text) == case["valid"], text[:200]


def test_regex_choice_and_grammar(compiler):
    phone = Constraint("regex", r"\d{3}-\d{4}")
    assert _accepts(compiler, phone, "555-1234") and not _accepts(compiler, phone, "555-12a4")
    yes_no = Constraint.choice(["yes", "no"])
    assert _accepts(compiler, yes_no, "no") and not _accepts(compiler, yes_no, "maybe")
    lark = Constraint("grammar", 'start: NUM ("," NUM)*\nNUM: /[0-9]+/')
    assert _accepts(compiler, lark, "1,22,333") and not _accepts(compiler, lark, "1,,2")
    gbnf = Constraint("grammar", 'root ::= "a" [0-9]+')
    assert _accepts(compiler, gbnf, "a42") and not _accepts(compiler, gbnf, "b42")


def test_whitespace_is_bounded_unless_a_pattern_allows_it(compiler):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert _accepts(compiler, Constraint.json_schema(schema), '{"a":1}')
    assert not _accepts(compiler, Constraint.json_schema(schema), '{"a": 1}')
    assert _accepts(compiler, Constraint.json_schema(schema, whitespace_pattern=r"[ ]?"), '{"a": 1}')


@pytest.mark.parametrize("constraint", [
    Constraint("regex", "(["),
    Constraint.json_schema({"type": "object", "not": {}}),
    Constraint("grammar", "start: undefined_rule"),
])
def test_what_cannot_compile_is_a_constraint_error(compiler, constraint):
    with pytest.raises(ConstraintError):
        compiler.compile(constraint)


def test_each_request_gets_its_own_matcher_from_one_compile(compiler, monkeypatch):
    compiler.compile(Constraint("regex", "[a-z]{3}"))
    built = []
    monkeypatch.setattr(llguidance, "LLMatcher", lambda *a: built.append(a))  # a second build would show here
    first, second = compiler.matcher(Constraint("regex", "[a-z]{3}")), compiler.matcher(Constraint("regex", "[a-z]{3}"))
    assert not built and first is not second
    (token,) = compiler.ll_tokenizer.tokenize_str("a")[:1]
    assert first.consume_token(token)
    abc = compiler.ll_tokenizer.tokenize_str("abc")
    assert second.validate_tokens(abc) == len(abc)  # untouched by the first: still at the start
    assert first.validate_tokens(abc) < len(abc)  # "a" + "abc" is one letter too many
