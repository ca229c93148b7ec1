"""Section `peak`: this machine's matmul peak, fp32 and bf16.

torch.matmul of two n×n matrices, GFLOP/s = 2n³ / t, best of the repeats after one warm-up call. A
dtype's larger sizes are skipped once one call takes over 2 s (emulated bf16 is ~100× slower). bf16 is
native when the CPU advertises avx512_bf16 or amx_bf16 (on CUDA: ``torch.cuda.is_bf16_supported()``);
the measured bf16/fp32 speed says the same from the other side.
"""

from __future__ import annotations

import torch

from benchmarks.suite.common import SLOW, Context, matmul_seconds, plural
from t2i_gcpo.hardware import BF16_CPU_FLAGS, cpu_flags, native_bf16

TITLE = "Matmul peak (`peak`)"


def run(ctx: Context) -> dict:
    cuda = ctx.device == "cuda"
    sizes = {
        "fp32": ctx.pick([4096], [4096, 8192]) if cuda else ctx.pick([1024], [1024, 2048]),
        "bf16": ctx.pick([4096], [4096, 8192]) if cuda else ctx.pick([256, 512], [512, 1024]),
    }
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    repeats = ctx.pick(3, 5)
    rows = []
    for name, ns in sizes.items():
        for n in ns:
            s = matmul_seconds(n, dtypes[name], ctx.device, repeats)
            rows.append({"dtype": name, "n": n, "seconds": s, "gflops": 2 * n**3 / s / 1e9})
            if s > SLOW:
                break
    fp32 = max(r["gflops"] for r in rows if r["dtype"] == "fp32")
    bf16 = max(r["gflops"] for r in rows if r["dtype"] == "bf16")
    for r in rows:
        r["vs_fp32"] = r["gflops"] / fp32
    flags = sorted(BF16_CPU_FLAGS & cpu_flags())  # named in the reading
    native = native_bf16(ctx.device)
    where = (
        "the GPU"
        if cuda
        else (f"the CPU (flags: {', '.join(flags)})" if flags else "the CPU (no avx512_bf16 / amx_bf16 flag)")
    )
    reading = (
        f"The fp32 peak is {fp32:.0f} GFLOP/s at {plural(ctx.threads, 'thread')}; every FLOP/s "
        f"fraction in the sections below is of this number. bf16 reaches {bf16:.1f} GFLOP/s, "
        f"{bf16 / fp32:.2g}× fp32: bf16 is {'native' if native else 'not native'} on {where}"
        + (
            ""
            if native
            else ", so torch emulates it and bf16 training or autocast would be far slower here than fp32"
        )
        + "."
    )
    return {
        "title": TITLE,
        "timing": (
            f"best of {repeats} calls after one warm-up (a size whose first call exceeds {SLOW:.0f} s is "
            f"timed once and ends its dtype)"
        ),
        "columns": [
            ("dtype", "dtype"),
            ("n", "n"),
            ("seconds", "seconds"),
            ("gflops", "GFLOP/s"),
            ("vs_fp32", "vs fp32 peak"),
        ],
        "rows": rows,
        "summary": {"fp32_gflops": fp32, "bf16_gflops": bf16, "bf16_native": native, "bf16_flags": flags},
        "reading": reading,
    }
