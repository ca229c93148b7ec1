"""What does Show-o cost at its released shape? Random weights, built in memory (no checkpoint needed).

The backbone is phi-1_5's architecture (d 2048, 24 layers, 32 heads, MLP 8192, partial rotary 0.5) with
Show-o's sequence (129 text positions + <|soi|> + T image tokens + <|eoi|>: L = 387 at 256 px, 1155 at 512
px), the MAGVIT-v2 decoder at its released widths. One difference from the release: the text vocabulary is
a tiny BPE's (tests/showo_fixtures.py), so the embedding and lm_head hold 8470 rows instead of 58498 — the
computation is the same (the head scores the 8192 code rows only), the weights are 0.9 GB smaller in float32.

Rows, for one sample (its CFG pair: 2 rows through Phi), per resolution:

- ``reveal step``: one decoding step of the sampler (`ShowoPolicy.rollout` with S = 2, divided by 2);
- ``log-probs fwd+bwd``: the trajectory estimator's teacher-forced log-probs of that sample (S = 2 forwards
  with gradient) and their backward, without and with gradient checkpointing, and the peak memory growth
  (benchmarks/suite/common.py `PeakMemory`: resident set on the CPU, max_memory_allocated on CUDA);
- ``decode``: MAGVIT-v2 decoding one image.

A step of S reveal steps costs S× the first row; an update S× the second (per sample). GFLOP/s from the
analytic count 2·N·L + 4·layers·d·L² per row and forward (×3 for forward + backward).

    flock /work/heavy.lock python benchmarks/bench_showo_scale.py [--sizes 256,512] [--device cuda]

Prints a table and writes benchmarks/results/showo_scale.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.suite.common import PeakMemory, linear_params, machine  # noqa: E402

PHI_1_5 = {  # microsoft/phi-1_5 config.json (the values the architecture depends on)
    "model_type": "phi",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "partial_rotary_factor": 0.5,
    "max_position_embeddings": 2048,
    "layer_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "gelu_new",
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attention_dropout": 0.0,
    "qk_layernorm": False,
    "tie_word_embeddings": False,
    "vocab_size": 51200,
}


def build(side: int, device: str):
    """A `ShowoPolicy` at the released shape for a side × side token grid, random weights."""
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))
    from transformers import PhiConfig, PhiForCausalLM

    from t2i_gcpo.policies.showo import NEW_TOKENS, ShowoPolicy, load_tokenizer
    from t2i_gcpo.tokenizers.magvitv2 import MagvitV2

    from showo_fixtures import write_phi_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        llm = write_phi_tokenizer(Path(tmp) / "phi-1_5")
        tokenizer = load_tokenizer(Path(tmp) / "phi-1_5")
    k = 8192
    cfg = {
        "_class_name": "Showo",
        "codebook_size": k,
        "llm_model_path": "microsoft/phi-1_5",
        "llm_vocab_size": llm,
        "num_vq_tokens": side * side,
        "vocab_size": llm + NEW_TOKENS + k + 1,
        "w_clip_vit": False,
    }
    phi_cfg = PhiConfig.from_dict(PHI_1_5)
    phi_cfg.vocab_size, phi_cfg._attn_implementation, phi_cfg.use_cache = cfg["vocab_size"], "sdpa", False
    torch.manual_seed(0)
    phi = PhiForCausalLM(phi_cfg)
    return ShowoPolicy(phi, MagvitV2(), tokenizer, cfg, PHI_1_5).to(device)


def forward_flops(policy, rows: int) -> float:
    """2·N·L + 4·layers·d·L² per row (matmul weights N, every position attending to every key)."""
    n = linear_params(policy.phi.model.layers)
    L, d, layers = policy.seq_len, policy.feature_dim, len(policy.phi.model.layers)
    return rows * (2 * n * L + 4 * layers * d * L * L)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(side: int, device: str) -> list[dict]:
    from t2i_gcpo.policies.base import PromptRecord, SamplingParams
    from t2i_gcpo.policies.showo import enable_checkpointing
    from t2i_gcpo.tasks.loop import group_generators

    policy = build(side, device)
    size = side * policy.vq.config.factor
    sampling = SamplingParams(guidance_scale=5.0, steps=2)
    prompt = [PromptRecord("a photo of a red cat left of a blue dog")]
    gens = group_generators(0, "bench", [0])
    rows = []
    policy.eval()
    sync(device)
    t = time.perf_counter()
    ro = policy.rollout(prompt, 1, sampling, gens)
    sync(device)
    step_s = (time.perf_counter() - t) / 2
    flops = forward_flops(policy, 2)
    rows.append(
        {
            "px": size,
            "L": policy.seq_len,
            "what": "reveal step (2 rows)",
            "seconds": step_s,
            "gflops": flops / step_s / 1e9,
            "peak_mb": None,
        }
    )
    policy.train()
    for ckpt in (False, True):
        if not ckpt and device == "cpu" and policy.seq_len > 600:  # 512 px: ≈ 12 GB of activations a forward
            rows.append(
                {
                    "px": size,
                    "L": policy.seq_len,
                    "what": "log-probs fwd+bwd, 1 sample, S = 2: not run on the CPU (≈ 24 GB of activations)",
                    "seconds": None,
                    "gflops": None,
                    "peak_mb": None,
                }
            )
            continue
        if ckpt:
            enable_checkpointing(policy.phi)
        policy.zero_grad(set_to_none=True)
        meter = PeakMemory(device)
        meter.start()
        t = time.perf_counter()
        policy.logprobs(ro, "pos").sum().backward()
        sync(device)
        s = time.perf_counter() - t
        rows.append(
            {
                "px": size,
                "L": policy.seq_len,
                "s": 2,
                "what": f"log-probs fwd+bwd, 1 sample, S = 2{', checkpointing' if ckpt else ''}",
                "seconds": s,
                "gflops": 3 * forward_flops(policy, 1) * 2 / s / 1e9,
                "peak_mb": meter.stop(),
            }
        )
    policy.zero_grad(set_to_none=True)
    policy.eval()
    t = time.perf_counter()
    img = policy.decode(ro)
    sync(device)
    rows.append(
        {
            "px": size,
            "L": policy.seq_len,
            "what": f"MAGVIT-v2 decode, 1 image → {tuple(img.shape[2:])}",
            "seconds": time.perf_counter() - t,
            "gflops": None,
            "peak_mb": None,
        }
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="256", help="image sizes: 256 (16×16 tokens), 512 (32×32)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "showo_scale.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    info = machine(args.device, args.threads)
    rows = []
    for px in (int(s) for s in args.sizes.split(",")):
        rows += measure(px // 16, args.device)
        print(json.dumps(rows[-4:], indent=1), flush=True)
        result = {"machine": info, "dtype": "float32", "memory": PeakMemory.what(args.device), "rows": rows}
        # written after each size, so that a run stopped by a timeout keeps what it measured
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("| px | L | what | s | GFLOP/s | peak MB |\n|---|---|---|---|---|---|")
    for r in rows:
        g = "—" if r["gflops"] is None else f"{r['gflops']:.0f}"
        m = "—" if r["peak_mb"] is None else f"{r['peak_mb']:,.0f}"
        sec = "—" if r["seconds"] is None else f"{r['seconds']:.2f}"
        print(f"| {r['px']} | {r['L']} | {r['what']} | {sec} | {g} | {m} |")


if __name__ == "__main__":
    main()
