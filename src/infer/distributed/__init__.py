"""Tensor parallelism: process groups, the step message rank 0 sends its workers, the workers' replay loop
(docs/distributed.md)."""
