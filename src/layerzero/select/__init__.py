"""Selection: what a call is (context, signatures, layout), what a kernel offers (KernelSpec), the filter with
reasons, the registry, the selection engine and its caches, the circuit breaker and CUDA-graph safety."""
