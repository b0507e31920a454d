"""The device mask equals llguidance's own CPU kernel on fresh random bitmasks, and the step mask is
all-ones for rows without an open grammar; advancing reads each grammar's error and end."""

from __future__ import annotations

import llguidance.torch
import pytest
import torch

from infer.sampling.token_mask import apply_token_bitmask
from infer.structured.masks import BitmaskFiller, Grammar, advance, has_open


@pytest.mark.parametrize(("vocab", "padded"), [(100, 100), (100, 130), (4096, 4096)])
def test_matches_llguidance_kernel(vocab, padded):
    g = torch.Generator().manual_seed(vocab + padded)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, words), generator=g, dtype=torch.int64).to(torch.int32)
    logits = torch.randn(3, padded, generator=g)
    want = logits.clone()
    llguidance.torch.apply_token_bitmask_inplace(want[:, :vocab], bitmask)
    want[:, vocab:] = float("-inf")  # ids past the tokenizer's vocabulary are never allowed
    got = logits.clone()
    apply_token_bitmask(got, bitmask)
    if padded == vocab:
        torch.testing.assert_close(got, want)
    else:
        torch.testing.assert_close(got[:, :vocab], want[:, :vocab])
        assert torch.isneginf(got[:, 32 * words:]).all()


def test_fill_bitmask_rows():
    from infer.loader.gguf_file import bundled_smollm2
    from infer.loader.tokenizer import Tokenizer
    from infer.structured import Constraint, GrammarCompiler

    compiler = GrammarCompiler(Tokenizer.from_path(bundled_smollm2()), 49152)
    grammar, ended = Grammar(compiler.matcher(Constraint.choice(["yes"]))), Grammar(compiler.matcher(Constraint.choice(["no"])))
    ended.complete = True
    assert not has_open([None, ended]) and has_open([None, grammar])
    filler = BitmaskFiller(max_rows=4, vocab_size=49152)
    mask = filler.fill([None, grammar, ended]).result().clone()
    assert mask.shape == (3, 1536) and (mask[0] == -1).all() and (mask[2] == -1).all()
    filler.fill([grammar]).result()  # the other buffer
    again = filler.fill([None, None, grammar]).result()  # back to the first: refilled, not left over
    assert (again[:2] == -1).all() and torch.equal(again[2], mask[1])
    allowed = ((mask[1].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten().nonzero().flatten()
    assert 0 < len(allowed) < 100  # only the tokens that start "yes"


def test_advance_reads_error_and_end():
    from infer.loader.gguf_file import bundled_smollm2
    from infer.loader.tokenizer import Tokenizer
    from infer.structured import Constraint, GrammarCompiler

    tokenizer = Tokenizer.from_path(bundled_smollm2())
    compiler = GrammarCompiler(tokenizer, 49152)
    yes, no = (Grammar(compiler.matcher(Constraint.choice([c]))) for c in ("yes", "no"))
    (token,) = tokenizer.encode("yes", add_special_tokens=False)
    advance([(yes, token), (no, token)])  # in parallel: several rows
    assert yes.error is None and no.error and not yes.open and not no.open
    assert yes.complete  # "yes" is the whole grammar: the matcher stops without waiting for EOS
