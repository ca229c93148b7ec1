"""Output folders of `sample`, `eval` and `credit-map` from the command line: resuming only into a folder
made for the same prompts and settings (else one clear error, or --overwrite), prompts validated before
anything is written, unusable --out paths refused before any model is loaded, and --limit checked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from t2i_gcpo.cli import cli

from cli_helpers import cli as run_cli
from cli_helpers import error_line


def run(capsys, *args) -> tuple[int, str, str]:
    return run_cli(capsys, *args)


def one_line_error(err: str) -> str:
    return error_line(err, ignore="GenEval generate")


def prompt_file(path: Path, *prompts: str) -> Path:
    path.write_text("".join(p + "\n" for p in prompts))
    return path


def prompt_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.isdigit())


def files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


RED = ("a photo of a red circle", "a photo of two circles", "a photo of a circle left of a square")
BLUE = "a photo of a blue square"


# ---------------------------------------------------------------------------------------------
# sample
# ---------------------------------------------------------------------------------------------


def test_sample_into_a_folder_of_other_prompts_refuses_then_overwrite_regenerates(tmp_path, capsys):
    out = tmp_path / "o"
    red = prompt_file(tmp_path / "red.txt", *RED)
    blue = prompt_file(tmp_path / "blue.txt", BLUE)
    assert run(capsys, "sample", "--prompts", red, "--out", out, "--n", "2")[0] == 0
    before = files(out)
    code, _, err = run(capsys, "sample", "--prompts", blue, "--out", out, "--n", "2")
    line = one_line_error(err)
    assert code != 0 and "00000" in line and "'a photo of a red circle'" in line and "--overwrite" in line
    assert files(out) == before  # nothing touched
    # same first prompt but fewer prompts: the stale folders are refused, not kept in the grid
    one_red = prompt_file(tmp_path / "one_red.txt", RED[0])
    code, _, err = run(capsys, "sample", "--prompts", one_red, "--out", out, "--n", "2")
    assert code != 0 and "00001" in one_line_error(err)
    # the same run again resumes (nothing to do)
    assert run(capsys, "sample", "--prompts", red, "--out", out, "--n", "2")[0] == 0
    assert {p: b for p, b in files(out).items() if p.name != "grid.png"} == {
        p: b for p, b in before.items() if p.name != "grid.png"
    }
    code, stdout, err = run(capsys, "sample", "--prompts", blue, "--out", out, "--n", "2", "--overwrite")
    assert code == 0, err
    assert prompt_dirs(out) == ["00000"]
    assert json.loads((out / "00000" / "metadata.jsonl").read_text())["prompt"] == BLUE
    assert sorted(os.listdir(out / "00000" / "samples")) == ["0000.png", "0001.png"]


@pytest.mark.parametrize(
    "option", [("--seed", "1"), ("--cfg", "5"), ("--n", "3"), ("--temperature", "0.5"), ("--top-k", "4")]
)
def test_sample_refuses_a_folder_made_with_other_settings(tmp_path, capsys, option):
    out = tmp_path / "o"
    p = prompt_file(tmp_path / "p.txt", RED[0])
    assert run(capsys, "sample", "--prompts", p, "--out", out, "--n", "2")[0] == 0
    before = files(out)
    args = ["sample", "--prompts", p, "--out", out, "--n", "2", *option]
    code, _, err = run(capsys, *args)
    line = one_line_error(err)
    assert code != 0 and "--overwrite" in line and "00000" in line
    assert files(out) == before
    assert run(capsys, *args, "--overwrite")[0] == 0


def test_sample_unparseable_prompt_fails_before_writing_anything(tmp_path, capsys):
    """A prompt outside the parseable templates used to be written without a tag, and the command
    then failed reading back its own folder."""
    p = prompt_file(tmp_path / "p.txt", RED[0], "photo of left circle red")
    code, _, err = run(capsys, "sample", "--prompts", p, "--out", tmp_path / "o")
    line = one_line_error(err)
    assert code != 0 and "cannot parse prompt 'photo of left circle red'" in line
    assert f"{p}:2:" in line  # names file and line
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------
# eval shapeworld / geneval / dpg
# ---------------------------------------------------------------------------------------------


def test_eval_shapeworld_one_prompt_into_a_three_prompt_folder(tmp_path, capsys):
    """A one-prompt eval into a folder of other prompts' images must neither score them nor reuse them."""
    out = tmp_path / "ev"
    red = prompt_file(tmp_path / "red.txt", *RED)
    blue = prompt_file(tmp_path / "blue.txt", BLUE)
    assert run(capsys, "eval", "shapeworld", "--prompts", red, "--n", "2", "--out", out)[0] == 0
    before = files(out)
    code, _, err = run(capsys, "eval", "shapeworld", "--prompts", blue, "--n", "2", "--out", out)
    line = one_line_error(err)
    assert code != 0 and "'a photo of a red circle'" in line and "--overwrite" in line
    assert files(out) == before
    code, _, err = run(
        capsys, "eval", "shapeworld", "--prompts", blue, "--n", "2", "--out", out, "--overwrite"
    )
    assert code == 0, err
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and {r["prompt"] for r in rows} == {BLUE}
    assert prompt_dirs(out / "images") == ["00000"]


def test_eval_geneval_resume_checks_prompts_and_settings(tmp_path, capsys, monkeypatch):
    """`eval geneval --model` (the 553 prompts replaced by three ShapeWorld ones, scored by the ShapeWorld
    detector): refuses a folder made with another seed or CFG, or holding other prompts, before loading
    any model, and regenerates with --overwrite."""
    import t2i_gcpo.eval.geneval as geneval
    from t2i_gcpo.worlds.shapeworld import parse_prompt

    prompts = [parse_prompt(p) for p in RED]
    monkeypatch.setattr(geneval, "load_geneval_prompts", lambda: prompts)
    out = tmp_path / "ev"
    args = ["eval", "geneval", "--model", "shapeworld", "--detector", "shapeworld", "--n", "2", "--out", out]
    assert run(capsys, *args)[0] == 0
    assert json.loads((out / "images" / "00002" / "generation.json").read_text())["seed"] == 0
    before = files(out)
    for extra, word in ((["--seed", "3"], "seed"), (["--cfg", "9"], "cfg_scale"), (["--n", "1"], "n=")):
        code, _, err = run(capsys, *args, *extra)
        line = one_line_error(err)
        assert code != 0 and word in line and "--overwrite" in line, line
    assert files(out) == before
    # other prompts: refused before the model is loaded (the model does not even exist)
    monkeypatch.setattr(geneval, "load_geneval_prompts", lambda: [parse_prompt(BLUE)])
    bad_model = ["--model", tmp_path / "no-such-model"]
    code, _, err = run(capsys, *args, *bad_model)
    line = one_line_error(err)
    assert code != 0 and "'a photo of a red circle'" in line and "--overwrite" in line
    assert "no-such-model" in one_line_error(run(capsys, *args, *bad_model, "--overwrite")[2])
    assert files(out) == before
    assert run(capsys, *args, "--overwrite")[0] == 0
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and {r["prompt"] for r in rows} == {BLUE}


def test_eval_dpg_resume_checks_prompts_and_settings(tmp_path, capsys, monkeypatch):
    import t2i_gcpo.eval.dpg as dpg

    class YesVQA:
        name = "yes"

        def answer(self, image, question):
            return "yes"

    monkeypatch.setattr(dpg, "load_dpg_prompts", lambda: [{"item_id": "a", "prompt": RED[0]}])
    monkeypatch.setattr(
        dpg.VQAModel, "from_pretrained", classmethod(lambda cls, path, device="cpu": YesVQA())
    )
    csv_path = tmp_path / "q.csv"
    csv_path.write_text(
        "item_id,text,keywords,proposition_id,dependency,category_broad,category_detailed,tuple,"
        "question_natural_language\n"
        "a,t,k,1,0,entity,entity - whole,t,is there a circle?\n"
        "b,t,k,1,0,entity,entity - whole,t,is there a square?\n"
    )
    out = tmp_path / "dpg"
    args = ["eval", "dpg", "--model", "shapeworld", "--csv", csv_path, "--vqa", "x", "--out", out]
    assert run(capsys, *args)[0] == 0
    before = files(out)
    code, _, err = run(capsys, *args, "--seed", "4")
    line = one_line_error(err)
    assert code != 0 and "seed" in line and "--overwrite" in line
    monkeypatch.setattr(dpg, "load_dpg_prompts", lambda: [{"item_id": "b", "prompt": BLUE}])
    code, _, err = run(capsys, *args)
    line = one_line_error(err)
    assert code != 0 and "a.png" in line and "--overwrite" in line
    assert files(out) == before
    assert run(capsys, *args, "--overwrite")[0] == 0
    assert sorted(p.name for p in (out / "images").glob("*.png")) == ["b.png"]
    assert [json.loads(x)["item_id"] for x in (out / "results.jsonl").read_text().splitlines()] == ["b"]


# ---------------------------------------------------------------------------------------------
# --out that cannot be a folder, and --limit
# ---------------------------------------------------------------------------------------------

COMMANDS = {
    # every model / scorer path is missing: the --out check must come first
    "eval geneval": ["eval", "geneval", "--model", "/no/such/model", "--detector", "/no/such/det"],
    "eval geneval --score-only": ["eval", "geneval", "--score-only", "{tmp}", "--detector", "/no/such/det"],
    "eval dpg": [
        "eval",
        "dpg",
        "--model",
        "/no/such/model",
        "--csv",
        "/no/such.csv",
        "--vqa",
        "/no/such/vqa",
    ],
    "eval shapeworld": ["eval", "shapeworld", "--model", "/no/such/model"],
    "sample": ["sample", "--prompts", "{tmp}/p.txt", "--model", "/no/such/model"],
    "credit-map": ["credit-map", "--prompt", "a photo of a red circle", "--model", "/no/such/model"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("where", ["file", "under a file", "/proc"])
def test_unusable_out_fails_in_one_line_before_any_work(tmp_path, capsys, command, where):
    prompt_file(tmp_path / "p.txt", RED[0])
    (tmp_path / "a_file").write_text("keep me")
    out = {"file": tmp_path / "a_file", "under a file": tmp_path / "a_file" / "sub", "/proc": "/proc/x"}[
        where
    ]
    args = [a.replace("{tmp}", str(tmp_path)) for a in COMMANDS[command]]
    code, _, err = run(capsys, *args, "--out", out)
    line = one_line_error(err)
    assert code != 0 and line.startswith(f"error: --out {out}") and "/no/such" not in line, line
    assert (tmp_path / "a_file").read_text() == "keep me"


def test_writable_dir_check_helper(tmp_path):
    from t2i_gcpo.errors import UserError, check_writable_dir

    assert check_writable_dir(tmp_path / "new" / "deeper", "--out") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checking creates nothing
    assert check_writable_dir(tmp_path, "--out") == tmp_path
    assert os.listdir(tmp_path) == []  # the probe is removed again
    (tmp_path / "f").write_text("")
    with pytest.raises(UserError, match=r"^--out .*/f is a file"):
        check_writable_dir(tmp_path / "f", "--out")
    with pytest.raises(UserError, match=r"^--out .*/f/x: .*/f is a file"):
        check_writable_dir(tmp_path / "f" / "x", "--out")
    with pytest.raises(UserError, match=r"^--out /proc/x .*not writable"):
        check_writable_dir("/proc/x", "--out")
    if os.geteuid() != 0:  # root may write anywhere
        (tmp_path / "ro").mkdir(mode=0o500)
        with pytest.raises(UserError, match="not writable"):
            check_writable_dir(tmp_path / "ro" / "sub", "--out")


@pytest.mark.parametrize("limit", ["-1", "0"])
def test_credit_map_refuses_non_positive_limit(tmp_path, limit):
    p = prompt_file(tmp_path / "p.txt", *RED)
    res = CliRunner().invoke(
        cli, ["credit-map", "--prompts", str(p), "--limit", limit, "--out", str(tmp_path / "m")]
    )
    assert res.exit_code == 2 and "--limit" in res.output and "x>=1" in res.output, res.output
    assert not (tmp_path / "m").exists()


def test_run_credit_maps_refuses_non_positive_limit(tmp_path):
    from t2i_gcpo.analysis.credit_maps import run_credit_maps
    from t2i_gcpo.errors import UserError

    p = prompt_file(tmp_path / "p.txt", *RED)
    with pytest.raises(UserError, match="limit"):
        run_credit_maps(
            [], str(p), -1, "shapeworld", None, ("uniform",), 2, None, "shapeworld", 0, str(tmp_path / "m")
        )


# ---------------------------------------------------------------------------------------------
# resumed folders: never a mix (issue 38 item 14); an option left out means the model's default, and a
# folder made otherwise is refused naming the option that continues it (issue 45)
# ---------------------------------------------------------------------------------------------


def test_a_resumed_masked_sample_continues_with_its_steps_and_order_given_again(
    tmp_path, capsys, monkeypatch
):
    """`sample --model shapeworld-masked --steps 4 --reveal-order random`, interrupted (an image
    missing): re-run without the two flags it is refused naming them; with them the missing image is made
    as the others were, the same bytes as the lost one, and generation.json is not rewritten."""
    from t2i_gcpo.eval import geneval

    seen = []
    real = geneval.sample_and_decode
    monkeypatch.setattr(
        geneval, "sample_and_decode", lambda p, pr, n, s, g: seen.append(s) or real(p, pr, n, s, g)
    )
    out = tmp_path / "m"
    p = prompt_file(tmp_path / "p.txt", *RED[:2])
    args = ["sample", "--model", "shapeworld-masked", "--prompts", p, "--out", out, "--n", "2"]
    assert run(capsys, *args, "--steps", 4, "--reveal-order", "random")[0] == 0
    before = files(out)
    lost = out / "00001" / "samples" / "0001.png"
    lost.unlink()
    seen.clear()
    code, _, err = run(capsys, *args)
    line = one_line_error(err)
    assert code == 2 and "made with steps=4" in line and "(--steps 4 continues them)" in line, line
    assert seen == [] and not lost.exists()
    code, _, err = run(capsys, *args, "--steps", 4)
    assert code == 2 and "(--reveal-order random continues them)" in one_line_error(err)
    code, out_text, err = run(capsys, *args, "--steps", 4, "--reveal-order", "random")
    assert code == 0, err
    assert "wrote 1 image(s), kept 3 made earlier with the same settings" in out_text
    assert [(s.steps, s.reveal_order) for s in seen] == [(4, "random")]
    assert {k: v for k, v in files(out).items() if k.name != "grid.png"} == {
        k: v for k, v in before.items() if k.name != "grid.png"
    }, "the lost image is made again, bit for bit; both records unchanged"
    for other in (["--steps", 8], ["--reveal-order", "confidence"]):
        code, _, err = run(capsys, *args, *other)
        assert code != 0 and "--overwrite" in one_line_error(err)
    assert json.loads((out / "00000" / "generation.json").read_text())["steps"] == 4


def test_sample_into_a_folder_made_with_another_cfg_is_refused_not_kept(tmp_path, capsys):
    """Issue 45: `sample --out samples/` into a folder made with --cfg 3 exited 0 and printed "wrote 76 × 4
    images", kept the cfg-3 images and wrote none; --cfg left out is the model's default (2)."""
    out = tmp_path / "c"
    p = prompt_file(tmp_path / "p.txt", RED[0])
    args = ["sample", "--prompts", p, "--out", out, "--n", "2"]
    assert run(capsys, *args, "--cfg", "3")[0] == 0
    before = files(out)
    code, out_text, err = run(capsys, *args)
    line = one_line_error(err)
    assert code == 2 and out_text == "", out_text
    assert "made with cfg_scale=3.0, this run asks for cfg_scale=2.0 (--cfg 3.0 continues them)" in line, line
    assert files(out) == before
    (out / "00000" / "samples" / "0001.png").unlink()
    code, out_text, _ = run(capsys, *args, "--cfg", "3")
    assert code == 0 and "wrote 1 image(s), kept 1 made earlier" in out_text
    assert files(out) == before
    code, out_text, _ = run(capsys, *args, "--overwrite")
    assert code == 0 and "wrote 2 image(s) to" in out_text
    assert json.loads((out / "00000" / "generation.json").read_text())["cfg_scale"] == 2.0


def test_eval_refuses_a_folder_with_a_stray_image_before_generating(tmp_path, capsys):
    out = tmp_path / "ev"
    red = prompt_file(tmp_path / "red.txt", *RED)
    args = ["eval", "shapeworld", "--prompts", red, "--n", "2", "--out", out]
    assert run(capsys, *args)[0] == 0
    missing = out / "images" / "00002" / "samples" / "0001.png"
    missing.unlink()
    stray = out / "images" / "00000" / "samples" / "0002.png"
    stray.write_bytes((out / "images" / "00000" / "samples" / "0000.png").read_bytes())
    before = files(out)
    code, _, err = run(capsys, *args)
    line = one_line_error(err)
    assert code != 0 and "00000" in line and "0002.png" in line and "n=2" in line, line
    assert files(out) == before and not missing.exists(), "nothing generated into the refused folder"


def test_credit_map_replaces_the_figures_of_an_earlier_run_only_with_overwrite(tmp_path, capsys):
    out = tmp_path / "maps"
    common = ["credit-map", "--schemes", "gcpo,uniform", "--group", "2", "--out", out]
    assert run(capsys, *common, "--prompt", RED[0], "--prompt", RED[1])[0] == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["00000.png", "00001.png"]
    before = files(out)
    code, _, err = run(capsys, *common, "--prompt", BLUE)  # issue 45: silently replaced before
    line = one_line_error(err)
    assert code == 2 and "--prompt" in line and "--overwrite" in line, line
    assert files(out) == before
    assert run(capsys, *common, "--prompt", BLUE, "--overwrite")[0] == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["00000.png"], "no figure of the earlier run is left"
    assert (
        BLUE in (out / "credit_maps.html").read_text()
        and RED[1] not in (out / "credit_maps.html").read_text()
    )
    photos = tmp_path / "photos"  # a folder of someone else's files named like credit-map's: refused
    photos.mkdir()
    (photos / "00000.png").write_bytes(b"my photo")
    code, _, err = run(capsys, *common[:-1], photos, "--prompt", BLUE, "--overwrite")
    assert code == 2 and "no credit_maps.html" in one_line_error(err)
    assert (photos / "00000.png").read_bytes() == b"my photo"


def test_a_resumed_dpg_folder_continues_with_its_cfg_given_again(tmp_path, capsys, monkeypatch):
    import t2i_gcpo.eval.dpg as dpg

    class YesVQA:
        name = "yes"

        def answer(self, image, question):
            return "yes"

    monkeypatch.setattr(
        dpg,
        "load_dpg_prompts",
        lambda: [{"item_id": "a", "prompt": RED[0]}, {"item_id": "b", "prompt": BLUE}],
    )
    monkeypatch.setattr(
        dpg.VQAModel, "from_pretrained", classmethod(lambda cls, path, device="cpu": YesVQA())
    )
    csv_path = tmp_path / "q.csv"
    csv_path.write_text(
        "item_id,text,keywords,proposition_id,dependency,category_broad,category_detailed,tuple,"
        "question_natural_language\n"
        "a,t,k,1,0,entity,entity - whole,t,is there a circle?\n"
        "b,t,k,1,0,entity,entity - whole,t,is there a square?\n"
    )
    out = tmp_path / "dpg"
    args = ["eval", "dpg", "--model", "shapeworld", "--csv", csv_path, "--vqa", "x", "--out", out]
    assert run(capsys, *args, "--cfg", "1.5")[0] == 0
    images = {p.name: p.read_bytes() for p in (out / "images").iterdir()}
    (out / "images" / "b.png").unlink()
    code, _, err = run(capsys, *args)  # --cfg left out: the model's default, not the recorded 1.5
    assert code == 2 and "(--cfg 1.5 continues them)" in one_line_error(err)
    assert run(capsys, *args, "--cfg", "1.5")[0] == 0
    assert {p.name: p.read_bytes() for p in (out / "images").iterdir()} == images, (
        "b.png as before; record kept"
    )
