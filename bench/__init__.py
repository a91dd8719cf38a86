"""Benchmarks of keyload. Commands, not tests: run them with `python -m bench.<name>`."""
