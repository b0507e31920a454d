"""layerzero's own Triton kernels: norms, RoPE, gated activations, 8-bit and 4-bit-weight linears, KV-cache store,
attention and the greedy argmax.

Each family lives in its own module; `specs.kernel_specs()` describes them to the selection engine.
Kernels compile for CUDA tensors, and run on CPU tensors through the Triton interpreter when the
module was imported with TRITON_INTERPRET=1.
"""
