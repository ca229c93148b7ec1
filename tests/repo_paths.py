"""Where the tests live and the repository they test, for test files at any depth of tests/."""

from pathlib import Path

TESTS = (
    Path(__file__).resolve().parent
)  # tests/: the shared helper modules (subprocesses put it on PYTHONPATH)
REPO = TESTS.parent  # the repository root: t2i_gcpo/, docs/, benchmarks/, configs
