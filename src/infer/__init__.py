"""infer: an LLM inference runtime."""
