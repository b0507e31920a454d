"""Our own C kernels for float32 on the CPU, compiled on first use for the machine they run on (build.py) and called
through ctypes: the 4-bit and int8-block linears that read GGUF's blocks in place (quant_linear.c), paged attention
for every step kind (attention.c), RMSNorm (norm.c), RoPE (rope.c), the KV store (kv_cache.c) and the gated
activations (activation.c); specs.py registers them."""
