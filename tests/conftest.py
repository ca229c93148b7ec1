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


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory) -> str:
    """A tiny random Llama over the arithmetic tokenizer, saved as a transformers folder (the text-path
    training tests of tests/train, tests/core and tests/viz share it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from t2i_gcpo.worlds.arithmetic import build_tokenizer

    torch.manual_seed(0)
    tok = build_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    path = str(tmp_path_factory.mktemp("text_train") / "lm")
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # an EOS likely enough that completion lengths differ within a group
        model.lm_head.weight[tok.eos_token_id] += 0.5
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
