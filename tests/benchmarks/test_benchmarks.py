"""Pure helpers of the benchmark suite (benchmarks/suite/): FLOP counts, the markdown writer, and the
`--only` merge. No timing is tested."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from repo_paths import REPO

sys.path.insert(0, str(REPO))  # the repository root holds benchmarks/

from benchmarks.suite import SECTIONS, report  # noqa: E402
from benchmarks.suite.common import linear_params  # noqa: E402
from benchmarks.suite.flops import (  # noqa: E402
    Shape,
    ar_sampling_flops,
    causal_keys,
    forward_flops,
    masked_sampling_flops,
    teacher_forced_flops,
)
from benchmarks.suite.runner import parse_only  # noqa: E402

SHAPE = Shape(params=10, layers=2, width=4)


def test_forward_flops_by_hand():
    # 3 causal positions attend to 1 + 2 + 3 = 6 keys: 2·10·3 + 4·2·4·6 = 60 + 192
    assert causal_keys(3) == 6
    assert forward_flops(SHAPE, 3, causal_keys(3)) == 252


def test_sampling_and_update_flops_by_hand():
    # AR: prefix 2 + 2 tokens → S = 3 fed positions, 2 CFG rows × 5 images
    assert ar_sampling_flops(SHAPE, prefix=2, tokens=2, images=5) == 2 * 5 * 252
    assert ar_sampling_flops(SHAPE, prefix=2, tokens=2, images=5, cfg=False) == 5 * 252
    # masked: S = 4 positions, each attending to 4 keys, per step: 2·10·4 + 4·2·4·16 = 80 + 512
    assert masked_sampling_flops(SHAPE, prefix=2, tokens=2, steps=3, images=1) == 2 * 3 * 592
    assert teacher_forced_flops(SHAPE, prefix=2, tokens=2, rows=7) == 7 * 252


def test_linear_params_counts_matmul_weights_only():
    net = torch.nn.Sequential(
        torch.nn.Embedding(100, 8),
        torch.nn.Linear(8, 16),
        torch.nn.LayerNorm(16),
        torch.nn.Linear(16, 4, bias=False),
    )
    assert linear_params(net) == 8 * 16 + 16 * 4


def test_fmt_and_markdown_table():
    assert [report.fmt(v) for v in (1234.56, 12.345, 1.2345, 0.012345, 0.0, None, True, "x")] == [
        "1,235",
        "12.3",
        "1.23",
        "0.0123",
        "0",
        "—",
        "yes",
        "x",
    ]
    rows = [{"algo": "dapo", "step_s": 3.5}, {"algo": "gcpo", "step_s": 3.25, "extra": 1}]
    table = report.markdown_table(rows, [("algo", "algo"), ("step_s", "step s"), ("extra", "extra")])
    assert table.splitlines() == [
        "| algo | step s | extra |",
        "|---|---|---|",
        "| dapo | 3.50 | — |",
        "| gcpo | 3.25 | 1 |",
    ]


def section(value: float, command: str) -> dict:
    return {
        "title": "T",
        "timing": "best of 1",
        "columns": [["x", "x"]],
        "rows": [{"x": value}],
        "reading": "r",
        "summary": {},
        "run": {
            "command": command,
            "quick": True,
            "threads": 2,
            "device": "cpu",
            "date": "d",
            "seconds": 1.0,
        },
    }


def test_only_merges_into_the_existing_results(tmp_path):
    old = {
        "meta": {"command": "full"},
        "sections": {"scaling": section(1.0, "full"), "peak": section(2.0, "full")},
    }
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(old))
    merged = report.merge(
        report.load(path),
        {"samplers": section(3.0, "only"), "peak": section(4.0, "only")},
        {"command": "only"},
        SECTIONS,
    )
    assert list(merged["sections"]) == ["peak", "samplers", "scaling"]  # suite order
    assert merged["sections"]["peak"]["rows"] == [{"x": 4.0}]  # re-measured
    assert merged["sections"]["scaling"]["rows"] == [{"x": 1.0}]  # kept
    assert merged["meta"] == {"command": "only"}
    page = report.render(merged)
    assert page.startswith("# Performance") and page.count("\n## ") == 3 and "`only`" in page


def test_load_missing_or_broken_json(tmp_path):
    assert report.load(tmp_path / "none.json") == {"meta": {}, "sections": {}}
    (tmp_path / "bad.json").write_text("{")
    assert report.load(tmp_path / "bad.json")["sections"] == {}


def test_parse_only():
    assert parse_only(None) == SECTIONS
    assert parse_only("scaling, peak") == ["peak", "scaling"]
    with pytest.raises(SystemExit, match="unknown section"):
        parse_only("peak,nope")


def test_gradient_snr_oracle_weights_preserve_mass_and_skip_padding():
    from benchmarks.bench_gradient_snr import oracle_weights

    target = torch.tensor(
        [[True, False, True, False], [False, False, False, False], [True, True, True, True]]
    )
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    w = oracle_weights(target, mask)
    # row 0: 3 valid tokens, all on the two targets (1.5 each); row 1: no target, no credit; row 2: the
    # target on padding gets nothing, the 2 valid tokens keep their 2 units
    assert torch.allclose(w, torch.tensor([[1.5, 0, 1.5, 0], [0, 0, 0, 0], [1, 1, 0, 0]]))


def test_gradient_snr_arithmetic_oracle_is_the_first_wrong_step_and_uniform_when_correct():
    from types import SimpleNamespace

    from benchmarks.bench_gradient_snr import oracle_target
    from t2i_gcpo.rewards.registry import build_reward
    from t2i_gcpo.tasks.arithmetic import ArithmeticTask
    from t2i_gcpo.worlds.arithmetic import build_tokenizer

    tok = build_tokenizer()
    texts = ["3*4=12\n2+12=15\n#### 15", "3*4=12\n2+12=14\n#### 14"]  # wrong (step 2), correct
    ids = torch.tensor([tok(t, add_special_tokens=False)["input_ids"] for t in texts])
    ro = SimpleNamespace(tokens=ids, mask=torch.ones(ids.shape))
    meta = ArithmeticTask().parse("2+3*4=?").meta
    details = build_reward("arithmetic")(texts, ["2+3*4=?"] * 2, [meta] * 2).details
    target = oracle_target(SimpleNamespace(name="arithmetic", tokenizer=tok), ro, details)
    assert target[0].nonzero().flatten().tolist() == list(range(7, 14))  # "2+12=15", one token a character
    assert target[1].all()  # a correct solution: uniform


def test_gradient_snr_vine_trains_only_its_branched_rows_and_tempo_returns_token_advantages():
    from types import SimpleNamespace

    from benchmarks.bench_gradient_snr import token_credit
    from t2i_gcpo.config import load_config
    from t2i_gcpo.core.tree import Tree
    from t2i_gcpo.policies.base import PromptRecord, Rollout
    from t2i_gcpo.train.branches import Grown
    from t2i_gcpo.train.credit import compute_weights

    B, T, G = 4, 6, 2
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 0, 0, 0], [1, 2, 4, 4, 5, 6], [1, 5, 3, 4, 5, 6]])
    ro = Rollout(
        tokens, torch.ones(B, T), torch.arange(T).expand(B, T).clone(), {}, [PromptRecord("p")] * B, G
    )
    policy = SimpleNamespace(layout=SimpleNamespace(grid=(2, 3)))
    # group 0 has no signal: the train step neither branches nor trains it under vine
    scores = torch.tensor([0.5, 0.5, 1.0, 0.0])
    adv = torch.tensor([0.0, 0.0, 1.0, -1.0])
    rows = torch.tensor([2, 3])  # one point at step 3, 2 continuations each
    tree = Tree(torch.tensor([[3], [3]]), torch.tensor([[[1.0, 0.0]], [[1.0, 1.0]]], dtype=torch.float64))
    vine = load_config("vine")
    a, w = token_credit(vine, ro, adv, scores, policy, None, "pos", None, (rows, Grown(tree, 4, 12)))
    assert w is None and a.shape == (B, T)
    assert (a[:2] == 0).all()  # rows outside the branched groups: no credit at all
    sub = compute_weights(
        vine.credit, ro.select(rows), adv[rows], policy, None, "pos", rewards=scores[rows], tree=tree
    )
    assert torch.equal(a[2:], sub.float()) and (a[2:] != 0).any()
    # tempo: token advantages, whose sequence term is the group advantage where the prefixes never branch
    a, w = token_credit(load_config("tempo"), ro, adv, scores, policy, None, "pos", None, None)
    assert w is None and a.shape == (B, T) and (a[:2] == 0).all()
    assert torch.allclose(a[2:, 3:], adv[2:, None].expand(2, 3).float())


def _fake_comparison(root: Path, finals: dict[str, dict[int, float]], start: float, autocast: str) -> None:
    """A finished `compare` output: per run config.yaml (written at `start` + 100·k s), 3 steps of 10 s
    each in metrics.jsonl, eval.json with the final score (written 60 s after its config.yaml)."""
    import os

    import yaml

    k = 0
    for algo, seeds in finals.items():
        for seed, score in seeds.items():
            run = root / algo / f"seed{seed}"
            run.mkdir(parents=True)
            cfg = {"rollout": {"autocast": autocast}, "optim": {"autocast": autocast}}
            (run / "config.yaml").write_text(yaml.safe_dump(cfg))
            rows = [{"step": 0, "eval/strict/overall": 0.5}] + [
                {"step": s, "time/step": 10.0} for s in (1, 2, 3)
            ]
            (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
            (run / "eval.json").write_text(json.dumps({"eval/strict/overall": score}))
            os.utime(run / "config.yaml", (start + 100 * k, start + 100 * k))
            os.utime(run / "eval.json", (start + 100 * k + 60, start + 100 * k + 60))
            k += 1


def test_compare_cost_reads_times_and_pairs_final_scores_by_seed(tmp_path):
    from benchmarks.suite import compare_cost
    from benchmarks.suite.common import Context

    fast = {"dapo": {0: 0.70, 1: 0.72, 2: 0.74}, "gcpo": {0: 0.71, 1: 0.70, 2: 0.75}}
    ref = {"dapo": {0: 0.69, 1: 0.70, 2: 0.72}, "gcpo": {0: 0.72, 1: 0.69, 2: 0.74}}
    _fake_comparison(tmp_path / "fast", fast, 1000.0, "bf16")
    _fake_comparison(tmp_path / "ref", ref, 0.0, "none")
    ctx = Context(compare_dir=str(tmp_path / "fast"), compare_reference=str(tmp_path / "ref"))
    out = compare_cost.run(ctx)
    by = {r["algo"]: r for r in out["rows"]}
    assert by["dapo"]["runs"] == 3 and by["dapo"]["train_min"] == pytest.approx(0.5)  # 3 × 10 s
    assert by["dapo"]["wall_min"] == pytest.approx(1.0)  # 60 s from config.yaml to eval.json
    assert out["summary"]["total_min"] == pytest.approx((500 + 60) / 60)  # 6 runs, 100 s apart, last + 60 s
    assert by["dapo"]["paired_diff"] == pytest.approx(0.05 / 3)  # (0.01 + 0.02 + 0.02) / 3
    assert by["gcpo"]["paired_diff"] == pytest.approx(0.01 / 3)  # (−0.01 + 0.01 + 0.01) / 3
    assert by["dapo"]["ci_low"] < by["dapo"]["paired_diff"] < by["dapo"]["ci_high"]
    assert "met" in out["reading"] and "rollout.autocast bf16" in out["reading"]
    assert compare_cost.run(Context()) is None  # nothing given: the earlier result is kept
    with pytest.raises(SystemExit, match="no finished runs"):
        compare_cost.run(Context(compare_dir=str(tmp_path / "empty")))


def test_branch_cost_points_are_fractions_of_each_root_inside_its_decisions():
    from types import SimpleNamespace

    from benchmarks.suite.branch_cost import points_at

    mask = torch.zeros(3, 40)
    for row, length in enumerate((40, 12, 2)):  # text roots of their own lengths
        mask[row, :length] = 1
    ro = SimpleNamespace(mask=mask, step=torch.arange(40).expand(3, -1), state={})
    assert points_at(ro, 0.25, masked=False, steps=None)[:, 0].tolist() == [10, 3, 1]
    assert points_at(ro, 0.75, masked=False, steps=None)[:, 0].tolist() == [30, 9, 1]  # < 2 for the shortest
    assert points_at(ro, 0.5, masked=True, steps=8)[:, 0].tolist() == [4, 4, 4]  # reveal steps of S = 8


def test_branch_cost_prefill_clock_times_multi_token_forwards_only_and_restores():
    from benchmarks.suite.branch_cost import prefill_clock
    from benchmarks.suite.common import Context
    from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder

    calls, inner = [], FusedLlamaDecoder.forward

    def fake(self, ids, start, **kwargs):
        calls.append(ids.shape[1])

    FusedLlamaDecoder.forward = fake
    try:
        spent: list[float] = []
        with prefill_clock(Context(), spent):
            for n in (5, 1, 1):
                FusedLlamaDecoder.forward(None, torch.zeros(2, n, dtype=torch.long), 0)
        assert calls == [5, 1, 1] and len(spent) == 1  # every call passed through, the prefill timed
        assert FusedLlamaDecoder.forward is fake  # the clock put back what it found
    finally:
        FusedLlamaDecoder.forward = inner


@pytest.mark.slow
def test_branch_cost_and_tree_step_quick_paths_write_what_the_page_reads(tmp_path):
    from benchmarks.suite.runner import main

    out, page = tmp_path / "suite.json", tmp_path / "performance.md"
    main(
        [
            "--quick",
            "--only",
            "branch_cost,tree_step",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--json",
            str(out),
            "--md",
            str(page),
        ]
    )
    sections = json.loads(out.read_text())["sections"]
    assert list(sections) == ["branch_cost", "tree_step"]
    for sec in sections.values():  # every column the table shows is in every row
        assert all(key in row for row in sec["rows"] for key, _ in sec["columns"])
    branch = sections["branch_cost"]
    shares = {(r["model"], r["expected"]) for r in branch["rows"]}
    for model in ("AR prior", "masked prior"):
        assert {(model, 0.75), (model, 0.5), (model, 0.25)} <= shares  # (T − t)/T, (S − s)/S
    assert all(r["measured"] > 0 for r in branch["rows"])
    # the masked prior has no prefix to re-read and the AR prior forks the rollout's kept cache: neither
    # prefills; the text prior still prefills each continuation's prefix
    assert all(r["prefill_pct"] == 0 for r in branch["rows"] if r["model"] in ("masked prior", "AR prior"))
    assert all(r["prefill_pct"] > 0 for r in branch["rows"] if r["model"].startswith("text"))
    tree = sections["tree_step"]
    by = {r["arm"]: r for r in tree["rows"]}
    factor = tree["summary"]["budget_factor"]
    assert factor == by["vine"]["samples"] / by["dapo"]["samples"] > 1  # vine's logged budget sizes the arm
    assert by["dapo, equal budget"]["samples"] == by["vine"]["samples"]
    assert by["dapo, equal budget"]["group"] == round(by["dapo"]["group"] * factor)
    assert all(by[a]["samples"] == by["dapo"]["samples"] for a in ("tempo", "eg-grpo", "balanced"))
    assert set(tree["summary"]["check"]) == {"ratio", "target", "pass"}
    assert by["vine"]["branch_s"] > 0
    assert by["vine"]["vs_equal"] == pytest.approx(tree["summary"]["check"]["ratio"])
    text = page.read_text()
    assert "(`branch_cost`)" in text and "(`tree_step`)" in text


def test_janus_scale_section_runs_tiny_on_the_cpu(native_bf16):
    """Section janus_scale on the CPU: a tiny Janus through every loop and two steps of the 1B recipe
    (what CI keeps alive; its GPU figures come from benchmarks/gpu_check.py). On a CPU with native bf16 the
    recipe's rollout.autocast 'auto' samples in bf16: the mismatch is then bf16's rounding, not zero."""
    from benchmarks.suite import janus_scale
    from benchmarks.suite.common import Context

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's many small ops: a second thread only waits
    try:
        sec = janus_scale.run(Context(quick=True, threads=1, device="cpu"))
    finally:
        torch.set_num_threads(threads)
    assert {(r["images"], r["loop"]) for r in sec["rows"]} == {
        (b, x) for b in (4, 8) for x in janus_scale.LOOPS
    }
    for r in sec["rows"]:
        assert r["seconds"] > 0 and r["ms_per_step"] == pytest.approx(1e3 * r["seconds"] / 64)
        assert 0 < r["roofline_pct"] < 100
        if r["loop"] == "graph":  # no CUDA: the static step, uncaptured
            assert r["mode"] == "static" and r["captures"] == 0
    (step,) = sec["summary"]["steps"]
    assert step["images"] == 4 and step["rollout_autocast"] == ("bf16" if native_bf16 else "none")
    assert step["step_s"] >= step["rollout_s"] + step["reward_s"] + step["update_s"] - 1e-3
    if native_bf16:  # bf16 sampling, float32 update: bf16's rounding, small
        assert 0 < step["mismatch/k3_pos"] < 1e-2
    else:  # float32 sampling: the update's log-probs are the rollout's
        assert step["mismatch/k3_pos"] < 1e-9
    assert "pending a GPU run" in sec["reading"]


def test_stepwise_gains_step_statistics_by_hand():
    """One group of 2, three reveal steps: r(x̂_s) = (0, 0, 1) and (0, 1, 1) → gains (0, 0, 1), (0, 1, 0)."""
    import torch

    from benchmarks.bench_stepwise_gains import step_statistics

    stats = step_statistics(torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 1.0]]), 2)
    assert stats["changes"] == [0.0, 0.5, 0.5]
    assert stats["groups_differ"] == [0.0, 1.0, 1.0]
    assert stats["abs_centred_gain"] == [0.0, 0.5, 0.5]


def test_rewards_section_runs_quick_on_the_cpu(monkeypatch):
    """Section rewards on the CPU, quick, on 64 px images, for ShapeWorld, the judge and one model reward (the
    others build the same way, and each is tested against its reference in tests/test_rewards_*.py): a row
    each, with every column the page shows."""
    from benchmarks.suite import rewards
    from benchmarks.suite.common import Context

    assert set(rewards.FORMS) == {"shapeworld", "ocr", "judge", "pickscore", "hps", "aesthetic", "vqa"}
    monkeypatch.setattr(rewards, "SIZE", 64)
    monkeypatch.setattr(rewards, "FORMS", ("shapeworld", "judge", "pickscore"))
    sec = rewards.run(Context(quick=True, threads=1, device="cpu"))
    assert [r["reward"] for r in sec["rows"]] == ["shapeworld", "judge", "pickscore"]
    for r in sec["rows"]:
        assert all(key in r for key, _ in sec["columns"]) and r["images_per_s"] > 0 and r["batch"] == 4
    assert "real, random weights" not in {r["shape"] for r in sec["rows"]}  # the real shapes: full runs only


def test_decode_loops_counts_kernels_per_step_not_views():
    """`decode_loops` counts, per call of a token step's callables, the ops that compute (views, allocations
    and metadata excluded), each at its innermost computing op."""
    from benchmarks.suite import decode_loops

    class Model:
        def step(self, x, w):
            h = (x @ w.T).view(-1).reshape(4, 4).transpose(0, 1)  # mm + views
            return torch.softmax(h, -1) + 1  # softmax + add

    model, x, w = Model(), torch.randn(4, 3), torch.randn(4, 3)

    def run():
        for _ in range(3):
            model.step(x, w)

    assert decode_loops.kernels_per_step(run, [(Model, "step")], compiled=False) == 3
