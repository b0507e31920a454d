"""KV-cache block accounting: which physical blocks each request owns. The tensors live in the runner."""
