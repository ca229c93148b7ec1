"""Shipped presets, recipes and prompt files live in the package and are found from any folder; a
file of the user's at the same path wins."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from t2i_gcpo import resources
from t2i_gcpo.config import ALGORITHMS, load_config, preset_path
from t2i_gcpo.errors import UserError
from t2i_gcpo.resources import CONFIG_DIR, PACKAGE_DIR, PROMPTS_DIR, config_file_path, prompt_file
from t2i_gcpo.tasks.registry import get_task

from repo_paths import REPO


def test_shipped_files_sit_inside_the_package():
    assert CONFIG_DIR.parent == PROMPTS_DIR.parent == PACKAGE_DIR == REPO / "t2i_gcpo"
    for algo in ALGORITHMS:
        assert preset_path(algo).is_file() and preset_path(algo).parent == CONFIG_DIR
    assert (PROMPTS_DIR / "shapeworld_train.txt").is_file()
    assert not (REPO / "configs").exists() and not (REPO / "prompts").exists(), "one copy, in the package"


def test_package_data_globs_cover_every_shipped_file():
    """pyproject's package-data must match every file the code finds through resources (else a wheel
    lacks it): each shipped file matches one of the globs."""
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = resources.shipped_files()
    assert len(shipped) >= 17  # 7 presets, 2 recipes, 2 accelerate configs, 6 prompt files
    for name in shipped:
        assert any(_glob_match(name, g) for g in globs["t2i_gcpo"]), name


def _glob_match(name: str, pattern: str) -> bool:
    """setuptools' glob: `**/` any folders (or none), `*` any name part."""
    regex = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*")
    return re.fullmatch(regex, name) is not None


def test_a_shipped_name_resolves_from_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = PROMPTS_DIR / "shapeworld_train.txt"
    assert prompt_file("prompts/shapeworld_train.txt") == shipped
    assert prompt_file("shapeworld_train.txt") == shipped
    assert prompt_file("t2i_gcpo/prompts/shapeworld_train.txt") == shipped
    recipe = CONFIG_DIR / "recipes" / "janus_pro_1b_geneval.yaml"
    assert config_file_path("configs/recipes/janus_pro_1b_geneval.yaml") == recipe
    assert config_file_path("recipes/janus_pro_1b_geneval.yaml") == recipe
    records = get_task("shapeworld").load_prompts("prompts/shapeworld_train.txt")
    assert len(records) == len(shipped.read_text().splitlines())
    cfg = load_config(config_file="configs/recipes/janus_pro_1b_geneval.yaml")
    assert cfg.algo == "gcpo-official" and cfg.rollout.group_size == 16


def test_the_users_file_wins_and_a_missing_one_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "shapeworld_train.txt").write_text("a photo of a red circle\n")
    assert prompt_file("prompts/shapeworld_train.txt") == Path("prompts/shapeworld_train.txt")
    assert [r.text for r in get_task("shapeworld").load_prompts("prompts/shapeworld_train.txt")] == [
        "a photo of a red circle"
    ]
    (tmp_path / "configs" / "recipes").mkdir(parents=True)
    (tmp_path / "configs" / "recipes" / "janus_pro_1b_geneval.yaml").write_text("algo: dapo\nsteps: 7\n")
    cfg = load_config(config_file="configs/recipes/janus_pro_1b_geneval.yaml")
    assert (cfg.algo, cfg.steps) == ("dapo", 7)
    with pytest.raises(UserError, match="config file not found: nope.yaml"):
        load_config(config_file="nope.yaml")
    with pytest.raises(UserError, match="nope.txt"):
        get_task("shapeworld").load_prompts("prompts/nope.txt")


def test_the_path_printer(capsys):
    assert resources.main(["accelerate/ddp.yaml"]) == 0
    assert Path(capsys.readouterr().out.strip()) == CONFIG_DIR / "accelerate" / "ddp.yaml"
    assert resources.main(["configs/accelerate/fsdp.yaml"]) == 0
    assert Path(capsys.readouterr().out.strip()) == CONFIG_DIR / "accelerate" / "fsdp.yaml"
    assert resources.main(["accelerate/none.yaml"]) == 2
    assert capsys.readouterr().err.startswith("error: no shipped file 'accelerate/none.yaml'")
    assert resources.main([]) == 0
    listed = capsys.readouterr().out.split()
    assert "configs/gcpo.yaml" in listed and "prompts/arithmetic_test.jsonl" in listed


def test_the_examples_ship_in_the_package_and_the_clone_links_to_them():
    """One copy of the docs' example scripts, inside the package (a wheel holds them); `examples/` at
    the clone's root is a link to it, so `python examples/custom_credit.py` works as the docs say."""
    assert (REPO / "examples").is_symlink() and (REPO / "examples").resolve() == PACKAGE_DIR / "examples"
    names = {Path(f).name for f in resources.shipped_files() if f.startswith("examples/")}
    assert {
        "custom_credit.py",
        "train_with_python_reward.py",
        "sample_and_evaluate.py",
        "credit_map.py",
    } <= names
    assert resources.main(["examples/custom_credit.py"]) == 0
