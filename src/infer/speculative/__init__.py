"""Speculative decoding's proposers: where draft tokens come from (verification is in infer.sampling.speculative)."""

from infer.speculative.draft import DraftModelProposer
from infer.speculative.ngram import NgramProposer

__all__ = ["DraftModelProposer", "NgramProposer"]
