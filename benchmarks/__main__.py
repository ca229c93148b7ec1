"""``python -m benchmarks [--quick] [--only SECTION[,SECTION]] [--threads N] [--device cpu|cuda]``:
the benchmark suite (benchmarks/suite/runner.py)."""

from benchmarks.suite.runner import main

main()
