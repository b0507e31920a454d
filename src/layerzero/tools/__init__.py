"""Tooling around selection: `which` / `explain` / `validate` / `list_kernels`, `doctor`, readiness checks."""
