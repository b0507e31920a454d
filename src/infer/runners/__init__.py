"""Execution engines (the data plane): own device buffers, run one step, return sampled tokens."""
