import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# 'auto' precision resolves the same on every CPU: float32, as on one without native bf16. Tests of
# precision-dependent behaviour ask for the `native_bf16` fixture and run both ways
# (t2i_gcpo/hardware.py: FORCE_ENV). Subprocesses the tests start inherit it.
os.environ["T2I_GCPO_NATIVE_BF16"] = "0"

# One torch thread per process: the tests' models are tiny (a second thread only waits on the first), and
# on a machine shared with other work two threads that spin-wait for a core the other job holds made
# rollouts 5× slower (measured here). The processes the tests start inherit it; pytest-xdist's workers
# then use one core each.
for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(params=[False, True], ids=["fp32-cpu", "bf16-cpu"])
def native_bf16(request, monkeypatch) -> bool:
    """Run the test as on a CPU without native bf16 and as on one with it (the hardware switch; a CPU
    without it emulates bf16: slower, same results to bf16 rounding)."""
    from t2i_gcpo.hardware import FORCE_ENV

    monkeypatch.setenv(FORCE_ENV, "1" if request.param else "0")
    return request.param


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Give the next test one torch thread again where this one set more (the benchmark runner and pretrain
    set their own): with two, a later test in the same process ran 28× slower beside another worker."""
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
