"""Token sampling: per-request parameters (`params`, torch-free), the batched sampler, its counter-based noise,
logprobs, stop strings."""
