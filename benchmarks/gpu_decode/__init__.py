"""GPU decode, prefill and start-up of infer on real model shapes: `python3 benchmarks/gpu_decode --help`.

plan.py (what a run measures), baselines.py (copy bandwidth, GEMM rate, transformers' decode), engine.py (infer's
decode, prefill and time to ready), recorder.py (results saved after every item), summary.py and report.py (the
ratios and the markdown report); the other GPU benchmarks reuse these parts.
"""
