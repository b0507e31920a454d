"""Performance data: the PerfDB of measured timings, measurement, `lz.tune`, and solved dispatch tables."""
