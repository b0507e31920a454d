"""Our own C kernels for the CPU, compiled on first use for the machine they run on (build.py) and called
through ctypes: a float32 4-bit group-quantized linear that reads GGUF's nibbles in place (int4_linear.c)."""
