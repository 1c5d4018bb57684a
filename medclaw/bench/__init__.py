"""Benchmark drivers behind `medclaw bench` (decode, kv, e2e). Each prints one JSON result; the
thin scripts in `benchmarks/` call the same code."""
