"""The hardware switch the suite sets: what `native_bf16` answers for a CPU, forced either way."""

import pytest

from t2i_gcpo import hardware


def test_the_switch_forces_the_cpu_answer_both_ways_and_auto_reads_the_cpu(monkeypatch):
    monkeypatch.setenv(hardware.FORCE_ENV, "1")
    assert hardware.native_bf16("cpu") is True
    monkeypatch.setenv(hardware.FORCE_ENV, "0")
    assert hardware.native_bf16("cpu") is False
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"sse2", "avx512_bf16"})
    for unset in ("auto", ""):
        monkeypatch.setenv(hardware.FORCE_ENV, unset)
        assert hardware.native_bf16("cpu") is True  # the CPU's own flags again
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"sse2", "avx2"})
    assert hardware.native_bf16("cpu") is False
    monkeypatch.setenv(hardware.FORCE_ENV, "yes")
    with pytest.raises(ValueError, match="must be 0, 1 or auto"):
        hardware.native_bf16("cpu")


def test_the_suite_runs_as_on_a_cpu_without_native_bf16_unless_a_test_asks(native_bf16):
    assert hardware.native_bf16("cpu") is native_bf16
