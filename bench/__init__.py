"""Benchmarks: programs that print tables comparing this project with its peers (STYLE 11)."""
