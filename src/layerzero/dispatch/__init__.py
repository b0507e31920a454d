"""The per-call hot path: `dispatch` (call cache, run, runtime fallback) and bound call sites (`bound`)."""
