"""Benchmarks behind `pagedrt bench attention | memory | throughput | latency | serve`."""
