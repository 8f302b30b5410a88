"""Micro-benchmarks behind hermeneut's design choices (``python -m bench.codec``)."""
