"""Offline benchmarks and simulators (no MLX needed)."""
