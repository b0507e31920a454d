"""Checkpoint loading: GGUF config and weights, tokenizers, incremental detokenization."""
