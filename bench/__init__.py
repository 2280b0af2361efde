"""Benchmarks behind `mqgw bench`."""
