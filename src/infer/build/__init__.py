"""The composition root: assembling an engine (weights, tokenizer, KV cache, runner) in this process or in an
engine-core process, and starting those processes."""
