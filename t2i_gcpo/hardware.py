"""What the hardware here does natively: whether bf16 matmuls are worth using (training's autocast
defaults, pretraining, the benchmarks).

``T2I_GCPO_NATIVE_BF16=1`` (or ``0``) overrides the CPU's answer: the test suite sets it so that what
``auto`` resolves to does not depend on the machine the tests run on (tests/conftest.py), and the
precision-dependent tests run both ways. It forces only the decision; a CPU without native bf16 then
emulates it (correct, much slower). CUDA devices are asked directly and never overridden.
"""

from __future__ import annotations

import os

BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})  # CPU features that multiply bf16 natively
FORCE_ENV = "T2I_GCPO_NATIVE_BF16"  # "1" / "0": what `native_bf16("cpu")` answers, whatever the CPU


def local_device() -> str:
    """This process's device (accelerate sets LOCAL_RANK per process on multi-GPU launches)."""
    import torch

    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def forced_native_bf16() -> bool | None:
    """The override `FORCE_ENV` sets for CPUs (True / False), or None where it is unset."""
    value = os.environ.get(FORCE_ENV, "").strip()
    if value in ("", "auto"):
        return None
    if value not in ("0", "1"):
        raise ValueError(f"{FORCE_ENV} must be 0, 1 or auto, got {value!r}")
    return value == "1"


def native_bf16(device_type: str) -> bool:
    """Whether bf16 matmuls run natively on this device: a CUDA GPU that supports them (Ampere on), a CPU
    with avx512_bf16 or AMX (or what `FORCE_ENV` says). Elsewhere torch emulates them, ~40–100× slower
    than fp32 (measured: a 1216×256×704 matmul takes 6 ms in fp32 and 230 ms in bf16 on an EPYC without
    avx512)."""
    if device_type == "cuda":
        import torch

        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    forced = forced_native_bf16()
    if forced is not None:
        return forced
    return bool(BF16_CPU_FLAGS & cpu_flags())


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity; the machine's count where that cannot be read)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_threads(threads: int, flag: str = "--threads") -> None:
    """A thread count within the CPUs this process may use, else a one-line UserError (100,000 torch threads
    ran out of memory starting them; more threads than CPUs only slow torch down)."""
    from t2i_gcpo.errors import UserError

    cpus = usable_cpus()
    if threads > cpus:
        raise UserError(
            f"{flag} {threads:,}: this process may use {cpus} CPU{'s' if cpus > 1 else ''}, so at most "
            f"{flag} {cpus} (more threads than CPUs only slow torch down)"
        )


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _status_bytes(key: str) -> int | None:
    """A ``/proc/self/status`` size (VmSize, VmRSS …) in bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def free_memory(device: str) -> tuple[int | None, str]:
    """(bytes this process can still take on `device`, what bounds it), read now. CUDA: the device's free
    memory plus what torch's cache holds unused. CPU: the least of the machine's available memory
    (MemAvailable), the room left under this process's memory cgroup (v2 memory.max, v1 limit_in_bytes) and
    under its address-space limit (RLIMIT_AS, against its current virtual size); None where none can be
    read."""
    if device.startswith("cuda"):
        import torch

        index = torch.device(device).index or 0
        free, _ = torch.cuda.mem_get_info(index)
        return free + torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(
            index
        ), f"{device}'s free memory"
    bounds: list[tuple[int, str]] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    bounds.append((int(line.split()[1]) * 1024, "the machine's available memory"))
    except (OSError, ValueError, IndexError):
        pass
    cgroup = None
    try:
        with open("/proc/self/cgroup") as f:
            cgroup = f.read().splitlines()
    except OSError:
        pass
    for line in cgroup or []:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0":  # v2
            base = "/sys/fs/cgroup" + parts[2]
            limit, used = _read_int(base + "/memory.max"), _read_int(base + "/memory.current")
        elif "memory" in parts[1].split(","):
            base = "/sys/fs/cgroup/memory" + parts[2]
            limit, used = (
                _read_int(base + "/memory.limit_in_bytes"),
                _read_int(base + "/memory.usage_in_bytes"),
            )
        else:
            continue
        if limit is not None and used is not None and limit < 1 << 60:
            bounds.append((max(limit - used, 0), "the room under this process's memory cgroup"))
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        size = _status_bytes("VmSize")
        if soft != resource.RLIM_INFINITY and size is not None:
            bounds.append(
                (max(soft - size, 0), "the room under this process's address-space limit (ulimit -v)")
            )
    except (ImportError, ValueError, OSError):
        pass
    if not bounds:
        return None, "unknown"
    return min(bounds)
