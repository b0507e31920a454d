"""omniscience: residual-stream probes."""
