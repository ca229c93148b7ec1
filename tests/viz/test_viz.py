"""Tests of t2i_gcpo.viz: credit-map overlays and figures, token heatmaps, credit lift, run report."""

from __future__ import annotations

import base64
import io
import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from t2i_gcpo.errors import UserError  # noqa: E402
from t2i_gcpo.viz.credit_map import credit_figure, weight_entropy, weight_overlay, write_credit_html  # noqa: E402
from t2i_gcpo.viz.lift import credit_lift, lift_table, mean_credit_lift  # noqa: E402
from t2i_gcpo.viz.report import read_metrics, write_run_report  # noqa: E402
from t2i_gcpo.viz.token_heatmap import token_heatmap_html, write_token_heatmaps  # noqa: E402

_VOID = {"img", "meta", "br", "hr", "input", "link", "source", "col", "area", "base", "wbr"}


class _Checker(HTMLParser):
    """Collects structure problems, <img> sources and any reference to an external resource."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.imgs: list[str] = []
        self.external: list[str] = []
        self.spans: list[dict] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("src", "href"):
            if key in a and not str(a[key]).startswith("data:"):
                self.external.append(a[key])
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        if tag == "span" and a.get("class") == "tok":
            self.spans.append(a)
        if tag not in _VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with open {self.stack[-3:]}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _parse(html_text: str) -> _Checker:
    p = _Checker()
    p.feed(html_text)
    p.close()
    assert not p.errors, p.errors
    assert p.stack == [], f"unclosed tags {p.stack}"
    assert not p.external, f"external resources {p.external}"
    assert html_text.lstrip().startswith("<!DOCTYPE html>")
    return p


def _decode_png(src: str) -> Image.Image:
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix)
    data = base64.b64decode(src[len(prefix) :], validate=True)
    im = Image.open(io.BytesIO(data))
    assert im.format == "PNG"
    im.load()
    return im


def _scene(cx: int, cy: int, color=(220, 30, 30)) -> tuple[np.ndarray, np.ndarray]:
    """32×32 gray canvas with a filled disc; returns image and its 8×8 token-grid object mask."""
    img = np.full((32, 32, 3), 153, np.uint8)
    yy, xx = np.mgrid[:32, :32]
    disc = (xx - cx) ** 2 + (yy - cy) ** 2 <= 36
    img[disc] = color
    return img, disc.reshape(8, 4, 8, 4).any(axis=(1, 3))


def _samples(n: int, reveal: bool = False) -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        img, obj = _scene(10 + 4 * i, 16)
        focused = np.where(obj, 3.0, 0.5)
        out.append(
            {
                "image": img,
                "reward": 0.25 * i,
                "advantage": -1.0 + i,
                "weights": {"uniform": np.ones((8, 8)), "gcpo": focused * 64 / focused.sum()},
                "object_grid": obj,
                **({"reveal_step": rng.integers(0, 12, (8, 8))} if reveal else {}),
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# weight_overlay
# ---------------------------------------------------------------------------------------------


def test_overlay_size_and_tensor_input():
    img, _ = _scene(16, 16)
    out = weight_overlay(img, np.ones((8, 8)), scale=8)
    assert out.size == (256, 256) and out.mode == "RGB"
    # float tensor [3, H, W] in [0, 1] gives the same picture (up to uint8 rounding)
    t = torch.from_numpy(img).permute(2, 0, 1).float() / 255.0
    out_t = weight_overlay(t, torch.ones(8, 8), scale=8)
    assert np.abs(np.asarray(out_t, np.int16) - np.asarray(out, np.int16)).max() <= 1
    # uint8 tensors are taken as 0–255; bfloat16 works; out-of-range floats are an error
    assert np.array_equal(
        np.asarray(weight_overlay(torch.from_numpy(img), np.ones((8, 8)), scale=8)), np.asarray(out)
    )
    assert weight_overlay(t.to(torch.bfloat16), torch.ones(8, 8, dtype=torch.bfloat16), scale=1).size == (
        32,
        32,
    )
    with pytest.raises(UserError, match=r"\[0, 1\]"):
        weight_overlay(t * 2 - 1, np.ones((8, 8)))
    # non-square image and grid, other scale: (W·s, H·s)
    assert weight_overlay(np.zeros((16, 24, 3), np.uint8), np.ones((4, 6)), scale=3).size == (72, 48)


def test_overlay_uniform_weights_is_flat_heat_layer():
    alpha = 0.55
    flat = np.full((32, 32, 3), 100, np.uint8)
    out = np.asarray(weight_overlay(flat, np.full((8, 8), 1.0), scale=4, alpha=alpha), np.float64)
    assert out.reshape(-1, 3).std(axis=0).max() == 0.0  # flat image + uniform weights -> one colour
    # on a textured image, the heat layer (out − (1 − α)·image) is the same colour everywhere
    img, _ = _scene(12, 20)
    big = np.repeat(np.repeat(img, 4, 0), 4, 1).astype(np.float64)
    out = np.asarray(weight_overlay(img, np.full((8, 8), 0.7), scale=4, alpha=alpha), np.float64)
    heat = out - (1 - alpha) * big
    assert np.ptp(heat.reshape(-1, 3), axis=0).max() <= 1.0  # uint8 rounding only
    assert np.ptp(out.reshape(-1, 3), axis=0).max() > 50  # … while the picture itself varies


def test_overlay_varies_exactly_where_weights_vary():
    flat = np.full((32, 32, 3), 100, np.uint8)
    w = np.ones((8, 8))
    w[2, 5] = 3.0  # one hot token
    out = np.asarray(weight_overlay(flat, w, scale=2), np.float64)  # 64×64, one token = 8×8 px
    cells = out.reshape(8, 8, 8, 8, 3).transpose(0, 2, 1, 3, 4)  # [row, col, py, px, 3]
    assert cells.reshape(8, 8, -1, 3).std(axis=2).max() == 0.0  # nearest: each cell is flat
    means = cells.mean(axis=(2, 3, 4))  # [8, 8]
    others = np.delete(means.ravel(), 2 * 8 + 5)
    assert np.ptp(others) == 0.0  # equal weights -> equal cells
    assert abs(means[2, 5] - others[0]) > 30  # the hot cell stands out
    # alpha = 1 shows the pure colour map: the hot cell is magma(1.0), the rest magma(1/3)
    import matplotlib

    pure = np.asarray(weight_overlay(flat, w, scale=2, alpha=1.0))
    cm = matplotlib.colormaps["magma"]
    np.testing.assert_allclose(pure[2 * 8, 5 * 8], np.rint(np.array(cm(1.0)[:3]) * 255), atol=1)
    np.testing.assert_allclose(pure[0, 0], np.rint(np.array(cm(1 / 3)[:3]) * 255), atol=1)
    # alpha = 0 leaves the image untouched
    assert np.array_equal(np.asarray(weight_overlay(flat, w, scale=1, alpha=0.0)), flat)


def test_overlay_rejects_bad_shapes():
    img = np.zeros((32, 32, 3), np.uint8)
    with pytest.raises(UserError):
        weight_overlay(img, np.ones(64))
    with pytest.raises(UserError):
        weight_overlay(np.zeros((32, 32, 5)), np.ones((8, 8)))


def test_weight_entropy():
    assert weight_entropy(np.ones((8, 8))) == pytest.approx(1.0)
    one_hot = np.zeros((8, 8))
    one_hot[3, 3] = 64.0
    assert weight_entropy(one_hot) == pytest.approx(0.0)
    assert math.isnan(weight_entropy(np.zeros((8, 8))))


# ---------------------------------------------------------------------------------------------
# credit_figure / write_credit_html
# ---------------------------------------------------------------------------------------------


def test_credit_figure_png_layout(tmp_path):
    p2 = credit_figure(_samples(2, reveal=True), ["uniform", "gcpo"], tmp_path / "a.png", "a red circle")
    p3 = credit_figure(_samples(3, reveal=True), ["uniform", "gcpo"], tmp_path / "b.png", "a red circle")
    p_no = credit_figure(_samples(2), ["uniform", "gcpo"], tmp_path / "sub" / "c.png", "no reveal")
    w2, h2 = Image.open(p2).size
    w3, h3 = Image.open(p3).size
    w_no, h_no = Image.open(p_no).size
    # 4 columns (image, 2 schemes, reveal step) × 2 rows: wider than tall, square panels
    assert w2 > h2 and 1.5 < w2 / h2 < 2.1
    assert w3 == w2 and h3 - h2 == pytest.approx(w2 / 4.6 * 1.0, rel=0.15)  # one more row ≈ one panel
    assert w_no < w2 and h_no == h2  # the reveal column appears only when given
    # not a blank canvas
    assert np.asarray(Image.open(p2).convert("L"), np.float64).std() > 20
    with pytest.raises(UserError):
        credit_figure([], ["gcpo"], tmp_path / "x.png", "")


def test_write_credit_html_self_contained(tmp_path):
    groups = [
        {"prompt": "a photo of a <red> circle & more", "samples": _samples(3)},
        {"prompt": "second", "samples": _samples(1, reveal=True), "schemes": ["gcpo"]},
    ]
    path = write_credit_html(tmp_path, groups)
    assert path == tmp_path / "credit_maps.html"
    text = path.read_text()
    p = _parse(text)
    assert len(p.imgs) == 2
    for src in p.imgs:
        assert _decode_png(src).size[0] > 300
    assert "&lt;red&gt; circle &amp; more" in text and "<red>" not in text
    # tables: header + one row per sample; the uniform lift column reads exactly 1.000
    tables = re.findall(r"<table>(.*?)</table>", text, flags=re.S)
    assert [t.count("<tr>") for t in tables] == [4, 2]
    header = re.findall(r"<th>(.*?)</th>", tables[0])
    assert header == [
        "#",
        "reward",
        "advantage",
        "uniform: max w",
        "uniform: H/ln N",
        "uniform: lift",
        "gcpo: max w",
        "gcpo: H/ln N",
        "gcpo: lift",
    ]
    first = re.findall(r"<td>(.*?)</td>", tables[0].split("</tr>")[1])
    assert first[3:6] == ["1.000", "1.000", "1.000"]  # uniform: max 1, entropy 1, lift 1
    assert float(first[8]) > 1.5  # gcpo-like focused weights lift credit onto the object
    assert not list(tmp_path.glob(".*.tmp"))  # no temp file left behind


# ---------------------------------------------------------------------------------------------
# token heatmaps
# ---------------------------------------------------------------------------------------------


def test_token_heatmap_escapes_and_titles():
    tokens = ["12", "+", "<b>", " 7", "\n", "#### 19"]
    weights = [0.5, 1.0, 2.0, 0.25, 0.0, 4.0]
    frag = token_heatmap_html(tokens, weights, "q<1>", reward=1.0, advantage=-0.5)
    page = "<!DOCTYPE html><html><body>" + frag + "</body></html>"
    p = _parse(page)
    assert "<b>" not in frag and "&lt;b&gt;" in frag and "q&lt;1&gt;" in frag
    assert [s["title"] for s in p.spans] == [f"t={i} w={w:.4f}" for i, w in enumerate(weights)]
    assert "reward 1.000" in frag and "advantage -0.500" in frag
    # colour: the heaviest token gets the top of the colour map, a zero weight the bottom
    import matplotlib

    cm = matplotlib.colormaps["YlOrRd"]
    hexes = [re.search(r"background:(#[0-9a-f]{6})", s["style"]).group(1) for s in p.spans]
    to_hex = lambda c: "#" + "".join(f"{round(255 * v):02x}" for v in c[:3])  # noqa: E731
    assert hexes[5] == to_hex(cm(1.0)) and hexes[4] == to_hex(cm(0.0)) and hexes[2] == to_hex(cm(0.5))
    with pytest.raises(UserError):
        token_heatmap_html(["a", "b"], [1.0], "bad")


def test_write_token_heatmaps_page(tmp_path):
    items = [
        {"tokens": ["a", "<", "c"], "weights": torch.tensor([1.0, 2.0, 0.0]), "title": "one"},
        {"tokens": ["x"], "weights": [1.0], "title": "two", "reward": 0.0},
    ]
    text = write_token_heatmaps(tmp_path / "t" / "tokens.html", items).read_text()
    p = _parse(text)
    assert len(p.spans) == 4 and p.imgs == []
    assert p.spans[1]["title"] == "t=1 w=2.0000"
    with pytest.raises(UserError):
        write_token_heatmaps(tmp_path / "bad.html", [{"tokens": ["a"]}])


# ---------------------------------------------------------------------------------------------
# credit lift
# ---------------------------------------------------------------------------------------------


def test_credit_lift_hand_computed():
    obj = np.zeros((3, 4, 4), bool)
    obj[0, :2, :2] = True  # 4 of 16 tokens
    obj[1, 0, :] = True  # 4 of 16
    obj[2, 1:, 1:] = True  # 9 of 16
    # uniform credit: exactly 1.0 (both w = 1 and any other constant representable exactly)
    assert np.array_equal(credit_lift(np.ones((3, 4, 4)), obj), np.ones(3))
    assert np.array_equal(credit_lift(np.full((3, 16), 0.5), obj.reshape(3, 16)), np.ones(3))
    # all credit on object tokens: lift = 1 / share = N / |O|
    w = np.where(obj, 1.0, 0.0)
    np.testing.assert_allclose(credit_lift(w, obj), [4.0, 4.0, 16 / 9])
    # w = [3, 1, 0, 0], objects = first token: credit share 3/4, token share 1/4 -> 3
    lift = credit_lift(np.array([[3.0, 1.0, 0.0, 0.0]]), np.array([[True, False, False, False]]))
    assert lift[0] == pytest.approx(3.0)
    # a mask drops tokens from both shares: valid = first 3 -> credit 3/4 over token share 1/3 = 2.25
    lift = credit_lift(
        torch.tensor([[3.0, 1.0, 0.0, 5.0]]),
        torch.tensor([[True, False, False, True]]),
        mask=torch.tensor([[True, True, True, False]]),
    )
    assert lift[0] == pytest.approx(2.25)


def test_credit_lift_undefined_samples_are_nan_and_ignored():
    obj = np.array([[False] * 4, [True] * 4, [True, False, False, False], [True, True, False, False]])
    w = np.array([[1.0] * 4, [1.0] * 4, [0.0] * 4, [2.0, 0.0, 1.0, 1.0]])
    lift = credit_lift(w, obj)
    assert np.isnan(lift[:3]).all()  # no object tokens / only object tokens / no credit at all
    assert lift[3] == pytest.approx((2 / 4) / (2 / 4))
    assert mean_credit_lift(lift) == pytest.approx(1.0)
    assert math.isnan(mean_credit_lift([float("nan")]))
    with pytest.raises(UserError):
        credit_lift(-np.ones((1, 4)), np.ones((1, 4), bool))
    with pytest.raises(UserError):
        credit_lift(np.ones((1, 4)), np.ones((1, 5), bool))


def test_lift_table():
    half = 4.302653 * 1.0 / math.sqrt(3)  # t_{0.975, 2} · s / √n with s = 1
    table = lift_table({"uniform": [1.0, 1.0], "gcpo": [1.0, 2.0, 3.0, float("nan")], "none": []})
    lines = table.splitlines()
    assert lines[0].split() == ["scheme", "mean", "95%", "interval", "n", "nan"]
    assert lines[2].split() == ["uniform", "1.000", "[1.000,", "1.000]", "2", "0"]
    assert lines[3].split() == ["gcpo", "2.000", f"[{2 - half:.3f},", f"{2 + half:.3f}]", "3", "1"]
    assert lines[4].split() == ["none", "–", "–", "0", "0"]


# ---------------------------------------------------------------------------------------------
# run report
# ---------------------------------------------------------------------------------------------


def _png_file(path: Path, color, size=(40, 20)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


def make_run_dir(root: Path) -> Path:
    """A synthetic run directory: metrics (with an eval-only key and a truncated last line),
    two sample grids, two credit maps and a config."""
    run = root / "run"
    run.mkdir()
    lines = []
    for s in range(40):
        rec = {
            "step": s,
            "reward/mean": 0.3 + 0.01 * s,
            "reward/std": 0.1,
            "clip_frac": 0.05,
            "kl_k3": 1e-3 * s,
        }
        rec.update({"credit/weight_max": 3.1, "time/rollout": 1.0, "time/update": 0.5, "loss/policy": 0.01})
        if s % 10 == 0:
            rec.update(
                {"strict/overall": 0.5, "strict/counting": 0.4, "strict/colors": 0.6, "credit_lift": 1.4}
            )
        lines.append(json.dumps(rec))
    (run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 40, "rew')
    _png_file(run / "samples" / "step_000100.png", (255, 0, 0))  # newest
    _png_file(run / "samples" / "step_000020.png", (0, 0, 255))
    _png_file(run / "samples" / "notes.png", (0, 255, 0))  # not a step file: ignored
    _png_file(run / "credit_maps" / "step_000090.png", (0, 128, 0), size=(600, 300))
    _png_file(run / "credit_maps" / "step_000095.png", (128, 0, 128), size=(600, 300))
    (run / "config.yaml").write_text("algo: gcpo\nreward: <shapeworld> & co\n")
    return run


def test_read_metrics_merges_steps_and_skips_bad_lines(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "a": 1}\n\n{"step": 0, "a": 0}\nnot json\n{"step": 1, "b": 2}\n[1]\n{"a": 5}\n')
    records, bad = read_metrics(p)
    assert bad == 2
    assert records == [{"step": 0, "a": 0}, {"step": 1, "a": 1, "b": 2}, {"step": 6, "a": 5}]


def test_run_report_from_synthetic_run_dir(tmp_path):
    run = make_run_dir(tmp_path)
    path = write_run_report(run)
    assert path == run / "report.html"
    text = path.read_text()
    p = _parse(text)
    # 3 plots (reward, per tag, time) + samples + credit map; optimisation, credit and other metrics as
    # small multiples (inline SVG panels)
    assert len(p.imgs) == 5
    for section in ("Optimisation", "Credit", "Other metrics"):
        assert '<svg class="spark"' in text.split(f"<h2>{section}</h2>")[1].split("<h2>")[0], section
    ims = [_decode_png(src) for src in p.imgs]
    assert ims[-2].convert("RGB").getpixel((0, 0)) == (255, 0, 0)  # newest sample grid (step 100)
    assert ims[-1].convert("RGB").getpixel((0, 0)) == (128, 0, 128)  # newest credit map (step 95)
    assert "Latest samples (step 100)" in text and "Latest credit map (step 95)" in text
    assert "&lt;shapeworld&gt; &amp; co" in text  # config shown, escaped
    assert "1 unreadable metrics line(s) skipped" in text and "latest step 39" in text
    assert re.search(r"width=\"(\d+)\"", text.split("Latest samples")[-1]).group(1) == str(40 * 19)
    # rewriting during training works and leaves no temp file
    assert write_run_report(run) == path
    assert sorted(x.name for x in run.iterdir() if x.is_file()) == [
        "config.yaml",
        "metrics.jsonl",
        "report.html",
    ]


def test_run_report_skips_a_png_being_written(tmp_path):
    run = make_run_dir(tmp_path)
    good = (run / "samples" / "step_000100.png").read_bytes()
    (run / "samples" / "step_000200.png").write_bytes(good[: len(good) // 2])  # truncated newest
    text = write_run_report(run).read_text()
    assert "Latest samples (step 100)" in text and "step_000200" not in text
    assert len(_parse(text).imgs) == 5


def test_run_report_draws_only_what_is_present(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    p = _parse(write_run_report(run).read_text())  # nothing yet: still a valid page
    assert p.imgs == [] and "No metrics yet" in "".join(p.text)
    (run / "metrics.jsonl").write_text('{"step": 0, "reward/mean": 0.1}\n{"step": 1, "reward/mean": 0.2}\n')
    p = _parse(write_run_report(run).read_text())
    assert len(p.imgs) == 1
    with pytest.raises(UserError):
        write_run_report(tmp_path / "missing")


# --- the report's first screen: the held-out score with its interval ----------------------------------


def _eval_run(root: Path, eval_rows: bool = True) -> Path:
    """A 4-step run as a new user's: training rows every step, the held-out score at steps 0, 2 and 4
    (autoscaled alone, 0.797–0.805 looks like a climb; its interval is ± 0.031)."""
    run = root / "run4"
    run.mkdir()
    rows = [{"step": s, "reward/mean": 0.9, "reward/std": 0.25, "strict/overall": 0.8} for s in range(1, 5)]
    if eval_rows:
        for s, score in ((0, 0.797), (2, 0.801), (4, 0.805)):
            rows.append(
                {"step": s, "eval/strict/overall": score, "eval/strict_se": 0.016, "eval/strict/colors": 0.7}
            )
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_the_report_opens_on_the_held_out_score_and_its_interval(tmp_path):
    text = write_run_report(_eval_run(tmp_path), reward_bounds=(0.0, 1.0), eval_every=2).read_text()
    p = _parse(text)
    headings = re.findall(r"<h2>(.*?)</h2>", text)
    assert headings[0] == "Held-out score" and headings[1] == "Reward on the training batches"
    first = text.split("<h2>")[1]
    assert "<b>0.805 ± 0.031</b> held-out strict score at step 4; 0.797 at step 0" in first  # 1.96 × 0.016
    assert "colors</th><td>0.700" in first  # its tags, at the latest step
    assert 'alt="held-out strict score"' in first.split("<img")[1]  # the first picture is its curve
    assert len(p.imgs) == 2  # held-out, reward (training batches); other metrics (the held-out tag): a panel
    assert 'aria-label="eval/strict/colors"' in text.split("<h2>Other metrics</h2>")[1]


def test_the_held_out_curve_carries_its_interval_within_0_and_1():
    from t2i_gcpo.viz.report import _series, held_out_figure

    s = _series(
        [{"step": k, "eval/strict/overall": v, "eval/strict_se": 0.016} for k, v in ((0, 0.797), (4, 0.99))]
    )
    fig = held_out_figure(s, "eval/strict/overall", "eval/strict_se", "held-out strict score")
    ax = fig.axes[0]
    band = np.concatenate([path.vertices for path in ax.collections[0].get_paths()])
    assert (
        band[:, 1].min() == pytest.approx(0.797 - 1.96 * 0.016) and band[:, 1].max() == 1.0
    )  # 0.99 + 0.031 clipped
    low, high = ax.get_ylim()
    assert low < 0.797 - 0.031 and high >= 1.0  # the axis shows the whole interval, not a zoom on the points


def test_a_run_without_held_out_evaluation_says_so_first(tmp_path):
    run = _eval_run(tmp_path, eval_rows=False)
    first = write_run_report(run, eval_every=-1).read_text().split("<h2>")[1]
    assert (
        first.startswith("Held-out score") and "This run has no held-out evaluation (eval_every: -1" in first
    )
    first = write_run_report(run, eval_every=100).read_text().split("<h2>")[1]
    assert "No held-out evaluation yet: it runs at step 0, every 100 steps and at the end" in first
    assert "it runs at the end of the run" in write_run_report(run, eval_every=0).read_text()


def test_the_reward_band_stays_within_the_rewards_range():
    """reward/mean 0.9 ± std 0.25 for a reward in [0, 1]: the band stops at 1 (it ran to 1.15)."""
    from t2i_gcpo.viz.report import _series, reward_figure

    s = _series([{"step": k, "reward/mean": 0.9, "reward/std": 0.25} for k in range(1, 5)])
    top = {}
    for bounds in ((0.0, 1.0), None):
        ax = reward_figure(s, bounds).axes[0]
        top[bounds] = max(path.vertices[:, 1].max() for path in ax.collections[0].get_paths())
    assert top[(0.0, 1.0)] == 1.0 and top[None] == pytest.approx(1.15)


def test_step_axes_tick_at_whole_steps():
    from t2i_gcpo.viz.report import _multiples, _series, held_out_figure, reward_figure

    s = _series(
        [
            {"step": k, "reward/mean": 0.1 * k, "clip_frac": 0.1, "eval/strict/overall": 0.5}
            for k in range(1, 5)
        ]
    )
    figures = [reward_figure(s), held_out_figure(s, "eval/strict/overall", "eval/strict_se", "held-out")]
    for fig in figures:
        fig.canvas.draw()
        ticks = [t for t in fig.axes[0].get_xticks() if 1 <= t <= 4]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
    assert _multiples(s, ["clip_frac"]) is not None


def test_a_metric_panel_draws_its_points_between_its_lowest_and_highest_values():
    """Small multiples are inline SVG: each panel's polyline runs from the first logged step to the last
    and from the frame's bottom (the lowest value) to its top (the highest), labelled with both; a flat
    metric is one label beside a line across the middle; long curves add a bold moving average."""
    from t2i_gcpo.viz.report import _PAD, _PANEL, _multiples, _series

    (w, h), (left, right, top, bottom) = _PANEL, _PAD
    s = _series([{"step": k, "clip_frac": v, "lr": 3e-3} for k, v in ((2, 0.1), (3, 0.3), (5, 0.2))])
    html = _multiples(s, ["clip_frac", "lr", "absent"])
    clip, lr = re.findall(r"<svg .*?</svg>", html)
    points = [tuple(map(float, p.split(","))) for p in re.search(r'points="([^"]+)"', clip).group(1).split()]
    want = [(left, h - bottom), (left + (w - left - right) / 3, top), (w - right, (top + h - bottom) / 2)]
    assert [c for p in points for c in p] == pytest.approx([c for p in want for c in p], abs=0.05)
    assert ">0.3</text>" in clip and ">0.1</text>" in clip and ">2</text>" in clip and ">5</text>" in clip
    assert clip.count("<circle") == 3 and "<title>clip_frac: 0.2 at step 5</title>" in clip
    flat = [tuple(map(float, p.split(",")))[1] for p in re.search(r'points="([^"]+)"', lr).group(1).split()]
    assert flat == [(top + h - bottom) / 2] * 3 and lr.count("</text>") == 4  # title, 0.003, steps 2 and 5
    long = _multiples(_series([{"step": k, "entropy": float(k % 7)} for k in range(1, 101)]), ["entropy"])
    assert long.count("<polyline") == 2 and "(bold: the average of 5)" in long and "<circle" not in long
    assert _multiples(s, ["absent"]) is None
