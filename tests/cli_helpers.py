"""Running `t2i-gcpo` in the test process, as the console script runs it, and reading its one error line."""

from __future__ import annotations

from t2i_gcpo.cli import main


def cli(capsys, *args) -> tuple[int, str, str]:
    """`t2i-gcpo ARGS` in process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def error_line(err: str, ignore: str | None = None) -> str:
    """The one `error: …` line of `err` (lines holding `ignore`, e.g. a progress bar, left
    out); no traceback."""
    lines = [ln for ln in err.splitlines() if ln.strip() and (ignore is None or ignore not in ln)]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]
