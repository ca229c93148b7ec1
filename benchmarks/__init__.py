"""Benchmarks of t2i_gcpo. ``python -m benchmarks`` runs the suite (benchmarks/suite/) and writes
benchmarks/results/suite.json and docs/performance.md; the bench_*.py scripts each answer one question
and also run on their own (``python benchmarks/bench_sampler.py``)."""
