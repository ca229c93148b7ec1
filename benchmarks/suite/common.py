"""What every section shares: the run context, timing, peak memory of a code region, the machine."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Context:
    """One run of the suite: its options, what earlier runs left in the JSON, and what this run measured."""

    quick: bool = False
    threads: int = 2
    device: str = "cpu"
    run: str | None = None  # --progress-run: a training run's directory (section progress)
    compare_dir: str | None = None  # --compare-dir: a finished `t2i-gcpo compare` output (compare_cost)
    compare_reference: str | None = None  # --compare-reference: the same comparison run another way
    previous: dict[str, Any] = field(default_factory=dict)  # sections of the existing JSON
    results: dict[str, Any] = field(default_factory=dict)  # sections measured in this run
    _peak: float | None = None

    def pick(self, quick: Any, full: Any) -> Any:
        """The `--quick` value or the full one."""
        return quick if self.quick else full

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def fp32_peak(self) -> float:
        """This machine's fp32 matmul GFLOP/s: from the `peak` section of this run, else from the JSON
        when it was measured with the same threads and device, else measured now (n = 1024, best of 3)."""
        if self._peak is None:
            for source in (self.results, self.previous):
                sec = source.get("peak")
                if sec and sec["run"]["threads"] == self.threads and sec["run"]["device"] == self.device:
                    self._peak = sec["summary"]["fp32_gflops"]
                    break
            else:
                n = 4096 if self.device == "cuda" else 1024
                self._peak = 2 * n**3 / matmul_seconds(n, torch.float32, self.device, 3) / 1e9
        return self._peak


SLOW = 2.0  # s: a call this slow stops a dtype's larger sizes


def matmul_seconds(n: int, dtype: torch.dtype, device: str, repeats: int) -> float:
    """Best-of-`repeats` seconds of one n×n @ n×n matmul (one warm-up call first)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for i in range(repeats + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        tic = time.perf_counter()
        torch.matmul(a, b)
        if device == "cuda":
            torch.cuda.synchronize()
        if i:  # call 0 is the warm-up
            best = min(best, time.perf_counter() - tic)
        elif time.perf_counter() - tic > SLOW:
            return time.perf_counter() - tic  # too slow to repeat: one call says enough
    return best


def plural(n: int, word: str) -> str:
    """'1 step', '3 steps'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def timed(fn: Callable[[], Any], ctx: Context) -> tuple[float, Any]:
    """(seconds, result) of one call, the device synchronised before the clock stops."""
    ctx.sync()
    tic = time.perf_counter()
    out = fn()
    ctx.sync()
    return time.perf_counter() - tic, out


def race(
    ours: Callable[[int], Any],
    generate: Callable[[int], Any],
    repeats: int,
    ctx: Context,
    **variants: Callable[[int], Any],
) -> dict[str, float]:
    """Best-of-`repeats` seconds of our sampler and of transformers' `generate` (and of any named
    `variants` of ours), after one warm-up call each, all interleaved (a slow spell of the machine hits
    every one); each call gets its repeat index as its seed."""
    runners = {"ours": ours, "generate": generate, **variants}
    best = dict.fromkeys(runners, float("inf"))
    for r in range(repeats + 1):  # r = 0: warm-up
        for name, fn in runners.items():
            s, _ = timed(lambda fn=fn, r=r: fn(r), ctx)
            if r:
                best[name] = min(best[name], s)
    return best


def race_row(batch: int, best: dict[str, float], units: float, rate: str) -> dict[str, float]:
    """One row of a `race`: seconds and `units` per second (column `ours_<rate>` / `generate_<rate>`)
    of each side, and our speed relative to `generate`'s."""
    return {
        "batch": batch,
        "ours_s": best["ours"],
        "generate_s": best["generate"],
        f"ours_{rate}": units / best["ours"],
        f"generate_{rate}": units / best["generate"],
        "speed_ratio": best["generate"] / best["ours"],
    }


def race_section(
    title: str,
    rows: list[dict],
    repeats: int,
    batch_label: str,
    rate: str,
    rate_label: str,
    reading: str,
    **summary: Any,
) -> dict[str, Any]:
    """The section a `race` over batch sizes reports: its table, and each batch's speed ratio."""
    return {
        "title": title,
        "timing": f"best of {repeats} after one warm-up each, ours and generate interleaved",
        "columns": [
            ("batch", batch_label),
            ("ours_s", "ours s"),
            ("generate_s", "generate s"),
            (f"ours_{rate}", f"ours {rate_label}"),
            (f"generate_{rate}", f"generate {rate_label}"),
            ("speed_ratio", "ours speed / generate"),
        ],
        "rows": rows,
        "summary": {"speed_ratio": {str(r["batch"]): r["speed_ratio"] for r in rows}, **summary},
        "reading": reading,
    }


def best_and_median(seconds: list[float]) -> dict[str, float]:
    return {"best_s": min(seconds), "median_s": statistics.median(seconds)}


def linear_params(*modules: torch.nn.Module) -> int:
    """Weights of every nn.Linear in `modules`: the parameters a forward multiplies (embedding lookups,
    norms and biases excluded)."""
    return sum(m.weight.numel() for mod in modules for m in mod.modules() if isinstance(m, torch.nn.Linear))


# ---------------------------------------------------------------------------- peak memory
def _proc_status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _trim() -> None:
    """Hand the C allocator's free memory back to the OS (glibc ``malloc_trim``), so that memory freed
    earlier but still resident does not hide what a region needs."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_hwm() -> bool:
    _trim()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux: reset the peak resident set size (VmHWM) to the current one
        return True
    except OSError:
        return False


class PeakMemory:
    """Peak memory growth of a code region, in MB.

    CPU: at the start the allocator's free memory is returned to the OS (glibc ``malloc_trim``) and the
    process's resident-set high-water mark (VmHWM) is reset by writing 5 to /proc/self/clear_refs; the
    result is VmHWM at the end minus the resident set (VmRSS) at the start: the most the region added
    at any moment, including memory it freed before the end. CUDA: ``max_memory_allocated`` minus
    ``memory_allocated`` at the start (peak stats reset at the start). ``None`` where neither works."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.base: float | None = None

    def start(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated() / 2**20
        else:
            self.base = _proc_status_kb("VmRSS") / 1024 if _reset_hwm() else None

    def stop(self) -> float | None:
        if self.base is None:
            return None
        if self.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**20 - self.base
        return _proc_status_kb("VmHWM") / 1024 - self.base

    @staticmethod
    def what(device: str) -> str:
        if device == "cuda":
            return "peak CUDA memory allocated above the phase's start (torch.cuda.max_memory_allocated)"
        return (
            "peak resident-set growth above the phase's start (free memory trimmed, VmHWM reset via "
            "/proc/self/clear_refs)"
        )


class PhaseMemory:
    """Consecutive phases of a step: `enter(name)` closes the open phase (recording its peak growth)
    and opens `name`; `enter(None)` only closes. `take()` returns and clears the step's records."""

    def __init__(self, device: str) -> None:
        self.meter, self.open, self.records = PeakMemory(device), None, {}

    def enter(self, name: str | None) -> None:
        if self.open is not None:
            self.records[self.open] = self.meter.stop()
        self.open = name
        if name is not None:
            self.meter.start()

    def take(self) -> dict[str, float | None]:
        self.enter(None)
        out, self.records = self.records, {}
        return out


# ---------------------------------------------------------------------------- machine
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str, threads: int) -> dict[str, Any]:
    import transformers

    info = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": threads,
        "device": device,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


BUSY = 0.5  # 1-min load average above which a section says that the CPU was shared


def shared_cpu_note(load: float | None) -> str:
    """A sentence for a section's reading when the 1-min load average at its start (`load`) says other
    processes were using the CPU: its timings are then upper bounds of a quiet machine's."""
    if load is None or load <= BUSY:
        return ""
    return (
        f" Measured on a shared machine (1-min load average {load:.2f} at the section's start, "
        f"{os.cpu_count()} cores): other processes used the CPU, so the seconds are those of a busy machine; "
        f"the ratios compare calls measured side by side."
    )


def load_average() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None
