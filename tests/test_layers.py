"""Imports inside t2i_gcpo point only downward, and module-level imports form no cycle.

Every module belongs to one package of LAYERS (longest dotted prefix wins; the bare "t2i_gcpo" entry
is the package __init__ only). A module may import its own package or packages on lower layers; an
import of a higher layer, or of a different package on the same layer, is a violation. All imports
count here: module level, inside functions, under `if TYPE_CHECKING:`. The floor modules (FLOOR:
the error type, the version and the extension registry) import nothing from t2i_gcpo but each other, and
anyone may import them.
A module no LAYERS entry covers fails too: a new package has to be placed in the table first.

Separately, imports that run when a module is imported (top level, outside functions and outside
`if TYPE_CHECKING:`) form a graph between t2i_gcpo modules that must have no cycle.

No t2i_gcpo module is imported here: the source is only parsed with `ast`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from repo_paths import REPO

ROOT = REPO / "t2i_gcpo"

# package -> layer, top to bottom
LAYERS = {
    "t2i_gcpo.examples": 15,  # the runnable scripts the docs name (examples/ links here): users of the API
    "t2i_gcpo.cli": 14,  # the console script: the table of commands (commands/registry.py) and its errors
    "t2i_gcpo.commands": 13,
    "t2i_gcpo.api": 12,  # the Python API: train, sample, evaluate, credit maps (the commands call it)
    "t2i_gcpo.analysis": 11,  # credit maps and credit lift outside training (the credit-map command's logic)
    "t2i_gcpo.studies": 10,  # studies over training runs: compare (arms × seeds), the matched-budget study
    "t2i_gcpo.eval": 9,  # benchmark runners: GenEval generate+score, DPG, CompBench, layout; train's peer
    # the question-based suites (GenEval 2, the judge suites) and their asking loop: below train, whose
    # held-out evaluation runs them too (eval_suite); tasks' peer (neither imports the other)
    "t2i_gcpo.eval.suites": 8,
    "t2i_gcpo.train": 9,
    "t2i_gcpo.tasks": 8,  # prompt parsing, held-out evaluation, step metrics; the rollout → score loop
    "t2i_gcpo.rewards": 7,
    "t2i_gcpo.pretrain": 6,  # rebuilding the shipped models on the embedded worlds
    # what an evaluation records (its protocol, its items) and the paired comparison of two: below tasks and
    # train, whose held-out evaluations record themselves the same way; pretrain's peer
    "t2i_gcpo.eval.records": 6,
    "t2i_gcpo.policies": 5,  # may use the worlds' vocabularies; never the other way
    "t2i_gcpo.worlds": 4,  # the embedded worlds: prompts, renders, checkers (no model code)
    "t2i_gcpo.scoring": 3,  # GenEval scoring primitives shared by rewards, worlds and eval
    "t2i_gcpo.tokenizers": 2,
    "t2i_gcpo.viz": 2,
    "t2i_gcpo.config": 1,  # the typed config schema (checks scheme names against core's registry)
    "t2i_gcpo.core": 0,
    "t2i_gcpo.stats": 0,  # confidence intervals and paired tests (scipy)
    "t2i_gcpo.errors": 0,
    "t2i_gcpo.metrics": 0,
    "t2i_gcpo.hardware": 0,  # what the device does natively (bf16), for training and pretraining defaults
    "t2i_gcpo.resources": 0,  # the shipped presets, recipes and prompt files (importlib.resources)
    "t2i_gcpo.outdir": 0,  # one command at a time per output folder (locks)
    "t2i_gcpo.usercode": 0,  # importing a user's file.py:function (--credit)
    "t2i_gcpo.weights": 0,  # the loading check every family's checkpoint goes through
    "t2i_gcpo.version": 0,  # the version string
    "t2i_gcpo.extensions": 0,  # the Registry every extension point is (schemes, rewards, families, …)
    "t2i_gcpo": 0,  # the package __init__ (its lazy `api` / `credit_scheme` attributes; nothing imports it)
}
FLOOR = {"t2i_gcpo.errors", "t2i_gcpo.version", "t2i_gcpo.extensions"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def package_of(module: str) -> str | None:
    """The LAYERS entry covering a module, or None."""
    if module == "t2i_gcpo":
        return module
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return prefix
    return None


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(module: str, path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported t2i_gcpo module, runs at import time) for every import in the file.

    `from X import a` names X.a when that is a module of the package, X otherwise.
    """
    is_package = path.name == "__init__.py"
    found: list[tuple[int, str, bool]] = []

    def resolve(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = module.split(".")
        base = base if is_package else base[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def add(line: int, target: str, top: bool) -> None:
        if (target == "t2i_gcpo" or target.startswith("t2i_gcpo.")) and (line, target, top) not in found:
            found.append((line, target, top))

    def visit(node: ast.AST, top: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node.lineno, alias.name, top)
        elif isinstance(node, ast.ImportFrom):
            source = resolve(node)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                add(node.lineno, sub if sub in MODULES else source, top)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for child in ast.iter_child_nodes(node):
                visit(child, False)
        elif isinstance(node, ast.If) and is_type_checking(node.test):
            visit(node.test, top)
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, top)
        else:
            for child in ast.iter_child_nodes(node):
                visit(child, top)

    visit(ast.parse(path.read_text(), filename=str(path)), True)
    return found


IMPORTS = {m: imports(m, p) for m, p in MODULES.items()}


def where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT.parent)}:{line}"


def test_every_module_is_placed_in_a_layer():
    missing = sorted(m for m in MODULES if package_of(m) is None)
    assert not missing, "modules no LAYERS entry covers (add their package to the table): " + ", ".join(
        missing
    )


def test_floor_modules_import_nothing_from_the_package():
    """Nothing but the floor itself: the registry raises the error type."""
    bad = [
        f"{where(m, line)} -> {t}"
        for m in sorted(FLOOR & MODULES.keys())
        for line, t, _ in IMPORTS[m]
        if t not in FLOOR
    ]
    assert not bad, "floor modules must import nothing of t2i_gcpo but the floor:\n  " + "\n  ".join(bad)


def test_imports_point_only_downward():
    bad = []
    for module in sorted(MODULES):
        src = package_of(module)
        if src is None:
            continue  # reported by test_every_module_is_placed_in_a_layer
        for line, target, _ in IMPORTS[module]:
            dst = package_of(target)
            if dst is None:
                bad.append(f"{where(module, line)} -> {target} (no LAYERS entry)")
            elif dst == src or target in FLOOR:
                continue
            elif LAYERS[dst] > LAYERS[src]:
                bad.append(
                    f"{where(module, line)} -> {target} (layer {LAYERS[src]} {src} imports "
                    f"layer {LAYERS[dst]})"
                )
            elif LAYERS[dst] == LAYERS[src]:
                bad.append(
                    f"{where(module, line)} -> {target} (same layer {LAYERS[src]}: {src} imports {dst})"
                )
    assert not bad, f"{len(bad)} imports against the layering:\n  " + "\n  ".join(bad)


def test_module_level_imports_have_no_cycle():
    graph = {m: sorted({t for _, t, top in IMPORTS[m] if top and t in MODULES and t != m}) for m in MODULES}
    cycles, state = [], {}  # state: 1 on the DFS stack, 2 done

    def dfs(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                dfs(nxt, stack)
        stack.pop()
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m, [])
    assert not cycles, "module-level import cycles:\n  " + "\n  ".join(cycles)
